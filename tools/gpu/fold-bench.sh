#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the norm folds
# (backend/cuda/normfold.go) checked and measured in one call. First the
# tests of their kernels (TestRowRMSReaders, TestFoldGain, the plain readers
# beside them), of cuBLASLt's addend (TestBlasLtMatmul) and of the folded
# model against the CPU (TestNormFolds, with TestGraphsMatchDirect); then
# batched decode of the random Llama-3-8B-shaped bf16 model with the folds
# on and off (KILN_CUDA_FOLD_NORMS), taking turns, ROUNDS (default 2) rounds
# of `kiln bench model --pp 0 --tg 64 --depth $DEPTH (512) --batch $BATCH
# (64,256) --reps 1`, each variant with a tune cache of its own. Prints a
# summary; logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fold-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
kernels_test kernels -test.run 'TestRowRMSReaders|TestFoldGain|TestSwiGLUPacked$|TestRoPEQKVWrite$'
grep -E '^(--- |ok|FAIL|PASS)|panic' "$out/kernels.log" | head -20
grep -E 'max err' "$out/kernels.log" | grep -E '_n ' | sort -k6 -g | tail -4
(cd backend/cuda/cu && timeout 120 ../../../.devbin/backend_cuda_cu.test -test.v -test.count=1 -test.run 'TestBlasLtMatmul$') >"$out/cu.log" 2>&1
echo "cu: rc=$?"
grep -E '^(--- |ok|FAIL|PASS)|panic' "$out/cu.log" | head -20
(cd backend/cuda && timeout 240 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestNormFolds|TestGraphsMatchDirect|TestMoEMatchesCPU') >"$out/cuda.log" 2>&1
echo "cuda: rc=$? at $(($(date +%s) - t0)) s"
grep -E '^\s*(--- |ok|FAIL|PASS)|panic|norms folded|model_test.go' "$out/cuda.log" | cut -c1-400 | head -40
random_bf16
for r in $(seq "${ROUNDS:-2}"); do
	for v in 1 0; do
		# Within the call's 600 s: no run started past BUDGET (default 480) s.
		if [ $(($(date +%s) - t0)) -gt "${BUDGET:-480}" ]; then echo "out of time: round $r, $v skipped"; continue; fi
		t1=$(date +%s)
		KILN_TUNE_DIR=/tmp/tune-fold$v KILN_CUDA_FOLD_NORMS=$v timeout -s QUIT 150 $k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 \
			--depth "${DEPTH:-512}" --batch "${BATCH:-64,256}" --reps 1 --output "$out/fold$v-$r.json" >"$out/fold$v-$r.txt" 2>&1
		echo "== folds $v, round $r: rc=$? in $(($(date +%s) - t1)) s"
		grep -E "^\| tg|norms folded" "$out/fold$v-$r.txt"
	done
done
echo "done at $(($(date +%s) - t0)) s"
