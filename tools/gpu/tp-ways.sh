#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after BASE=<rev> tools/gpu/build.sh
# here: the kernels' GEMV tests (the tensor-core GEMV now loads its first
# weights before its programmatic-launch wait), then traced batch-1 decode
# steps (tools/gpu/ktrace) of the random Llama-3-8B-shaped bf16 model at
# TP=1 and TP=2 with every vector product on tensor cores, on CUDA cores
# (KILN_CUDA_VECTOR_WAY), as the race chose, and kiln-base as its race
# chose; then the plain figures, two rounds taking turns. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-ways.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
kernels_test gemv -test.run 'TestGEMV$|TestGEMVSweepCorrect|TestGEMVSwiGLU|TestGEMVRoPEQKV'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- FAIL' "$out/gemv.log" | head -10
ktrace_build || exit 1
random_bf16
echo "model at $(($(date +%s) - t0)) s"
for n in 1 2; do
	LINES_MAX=14 KILN_CUDA_VECTOR_WAY="tensor cores" trace tp$n-tc $n "$bf16"
	LINES_MAX=14 KILN_CUDA_VECTOR_WAY="cuda cores" trace tp$n-cc $n "$bf16"
	LINES_MAX=14 trace tp$n-race $n "$bf16"
	LINES_MAX=14 KILN_BIN=.devbin/kiln-base trace tp$n-base $n "$bf16"
done
for r in 1 2; do
	for n in 1 2; do
		PP=0 tp_bench tp$n-tc-r$r $n 1 60 KILN_CUDA_VECTOR_WAY="tensor cores"
		PP=0 tp_bench tp$n-cc-r$r $n 1 60 KILN_CUDA_VECTOR_WAY="cuda cores"
		PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp$n-base-r$r $n 1 60
	done
done
python3 tools/gpu/tp_table.py "$work" tp1-tc-r1 tp1-cc-r1 tp1-base-r1 tp2-tc-r1 tp2-cc-r1 tp2-base-r1 \
	tp1-tc-r2 tp1-cc-r2 tp1-base-r2 tp2-tc-r2 tp2-cc-r2 tp2-base-r2
grep -h "T≤1\|T=1 " "$work"/tp1-race.txt "$work"/tp1-base.txt "$work"/tp2-race.txt | cut -c1-200
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
