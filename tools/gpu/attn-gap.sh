#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: decode attention
# in its own benchmark against the same attention inside the model's decode
# step (backend/cuda/NOTES.md, session 30: 36.8–39.5 µs in the benchmark at
# 64 × 512–544, 45.8 µs under Nsight and 50.5 µs in `--profile` in the
# model). First the kernels benchmark at the model's shapes (bf16, 32/8
# heads of 128; K/V copies rotated past the L2), then `kiln bench model
# --profile` of the random Llama-3-8B-shaped model at batch 64 and 256,
# depth 512, with the decode-attention plans its races kept. Prints a
# summary; logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/attn-gap.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
(cd backend/cuda/kernels && timeout 200 ../../../.devbin/backend_cuda_kernels.test -test.run '^$' \
	-test.bench 'DecodeAttention$/batch=(64|256)$/ctx=(512|544)$' -test.benchtime 1x) >"$out/attn-bench.log" 2>&1
echo "benchmark: rc=$? at $(($(date +%s) - t0)) s"
grep -E '^Benchmark' "$out/attn-bench.log" | cut -c1-220
random_bf16
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 --depth 512 --batch 64,256 --reps 2 --profile \
	>"$out/profile.txt" 2>&1
echo "model: rc=$? at $(($(date +%s) - t0)) s"
grep -E '^\| tg|decode attention|^profile of|timed steps|split' "$out/profile.txt" | cut -c1-220 | head -30
