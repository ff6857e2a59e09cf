#!/usr/bin/env bash
# Runs on the GPU machine after `BASE=<rev> tools/gpu/build.sh` here: the
# norms folded into the GEMV's CUDA-core kernels (kernels.Fold). The GEMV
# kernels' tests (TestGEMVFold and the unfolded forms' tests), the model's
# TestNormFolds (4 sequences on the CUDA cores) and its other checks
# against the CPU and transformers, then batch-1/4/64 decode of the random
# Llama-3-8B-shaped bf16 model by kiln as of <rev> (.devbin/kiln-base) and
# this tree's in turns, ROUNDS (2) rounds of `kiln bench model --pp 0 --tg
# 64 --depth 512 --batch $BATCH (1,4,64) --reps 2`, each run with a tune
# cache of its own, then a kernel timeline of this tree's step at batch
# $TRACE_B (1; env.sh's trace, with the choices of the first round's run).
# Since session 37 also the tile kernels' folds (TestGEMVTileFold, and
# TestNormFolds' 20 sequences). NOTESTS=1: no tests; TRACE_BASE=1: the
# base's step traced too (with its first round's choices). Logs in
# logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fold-gemv.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -x .devbin/kiln-base ] || { echo "no .devbin/kiln-base: run BASE=<rev> tools/gpu/build.sh" >&2; exit 2; }
if [ -z "${NOTESTS:-}" ]; then
	kernels_test gemv-fold -test.run 'TestGEMVFold|TestGEMVTileFold|TestGEMV$|TestGEMVSwiGLU|TestGEMVRoPEQKV|TestGEMVEpilogueErrors'
	grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)|gemv fold|\.go:[0-9]+: .*(differs|want)' "$out/gemv-fold.log" | head -40
	backend_test model-fold -test.run 'TestNormFolds|TestBatchedMatchesCPU|TestHFTransformersFixtures'
	grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)|GEMV|\.go:[0-9]+: .*(differ|want|limit)' "$out/model-fold.log" | head -30
fi
random_bf16
for r in $(seq "${ROUNDS:-2}"); do
	for v in base new; do
		bin=.devbin/kiln
		[ "$v" = base ] && bin=.devbin/kiln-base
		KILN_TUNE_DIR=/tmp/tune-$v-$r $bin bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 --depth 512 \
			--batch "${BATCH:-1,4,64}" --reps 2 >"$out/$v-$r.txt" 2>&1
		echo "$v-$r: rc=$? $(grep -E '^\| tg' "$out/$v-$r.txt" | awk -F'|' '{printf "b%d %s (%s) ", $3, $4, $6}')"
		grep -E '^norms folded' "$out/$v-$r.txt"
	done
done
t0=$(date +%s)
tb=${TRACE_B:-1}
ktrace_build && work=$out && TRACE_TUNE_DIR=/tmp/tune-new-1 LINES_MAX=24 KILN_BIN=.devbin/kiln B=$tb trace new-b$tb 1 "$bf16"
[ -n "${TRACE_BASE:-}" ] && TRACE_TUNE_DIR=/tmp/tune-base-1 LINES_MAX=24 KILN_BIN=.devbin/kiln-base B=$tb trace base-b$tb 1 "$bf16"
(cd "$out" && tar czf logs.tgz --exclude logs.tgz --exclude '*.csv' * && find . -maxdepth 1 -type f ! -name logs.tgz -delete)
