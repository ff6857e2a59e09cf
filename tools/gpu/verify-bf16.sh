#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the open question of
# session 24 (backend/cuda/NOTES.md, "Speculative verification in bf16").
# backend/cuda TestVerifyRowsMatchDecode (a verifying step's rows against
# one-token steps and the CPU, f32 and bf16, 32/8 heads of 128) and
# TestSpeculativeGreedy; then kiln bench spec on the random Llama-3-8B shape
# in bf16 at 2 drafts and p 1 and 0.8, to see whether its runs still leave
# plain greedy's tokens. Logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/verify-bf16.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
export KILN_SHARED_DIR=$PWD/.devbin/shared
t0=$(date +%s)
(cd backend/cuda && timeout 240 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestVerifyRowsMatchDecode|TestSpeculativeGreedy') >"$out/verify.log" 2>&1
echo "tests: rc=$? at $(($(date +%s) - t0)) s"
grep -E '^(--- |FAIL|ok|PASS)|    --- |spec_gpu_test' "$out/verify.log" | head -60
random_bf16
ids=$(python3 -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1000, 100000)) for _ in range(64)))")
timeout 120 $k bench spec "$bf16" --device cuda --ids "$ids" --tg 128 --num-speculative-tokens 2 --accept 1,0.8 --reps 2 2>"$out/spec.err"
echo "bench spec: rc=$? at $(($(date +%s) - t0)) s"
