#!/usr/bin/env bash
# Runs on one GPU after `BASE=<rev> tools/gpu/build.sh` here (issue 16's
# FP8 prefill): the kernels' and backend's FP8 tests, then
# tools/gpu/fp8-bench.sh (bf16, FP8 on this tree's kiln and on kiln-base,
# taking turns; prefill 2048 and decode at depth 512 of $BATCH), then, time
# permitting, the FP8 prefill under Nsight Compute (tools/gpu/fp8-profile.sh's
# summary). Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fp8-prefill.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test fp8-ktests -test.run "${KTESTS:-TestE4M3Writers|TestSwiGLUPacked|TestRoPEQKVWrite|TestRowRMSReaders|TestFP8KVWrite|TestQuantizeRowsE4M3}"
grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|differ' "$out/fp8-ktests.log" | head -20
[ -x .devbin/backend_cuda.test ] && (cd backend/cuda && timeout 200 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run "${BTESTS:-TestFP8Weights|TestFP8KVCache}") >"$out/fp8-tests.log" 2>&1
[ -f "$out/fp8-tests.log" ] && grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS' "$out/fp8-tests.log" | head -10
OUT=$out/bench ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-64,256} VARIANTS="${VARIANTS:-bf16 fp8 fp8-base}" tools/gpu/fp8-bench.sh
echo "bench done at $(($(date +%s) - t0)) s"
if [ $(($(date +%s) - t0)) -lt 470 ]; then
	ncu_prefill fp8 "$keep/llama3-8b-fp8" $((560 - ($(date +%s) - t0))) | sed -n '/ncu: rc=/p; /prefill step/,$p'
fi
pack_out logs.tgz
