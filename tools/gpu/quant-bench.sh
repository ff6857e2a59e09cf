#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the quantized
# products' figures of docs/PERF.md (issue 16). FP8 through cuBLASLt
# against bf16 (TestBlasLtFP8Speed), with the activation's quantization
# (TestFP8ProductSpeed), and the decode GEMV on FP8 and Q4_K weights
# against the bf16 GEMV (TestGEMVF8Speed, TestGEMVBlocksSpeed). About 2
# minutes on a fresh H200 (the kernel modules compile first). Logs under
# $OUT (or ./gpu-logs); the tables are printed.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/quant-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
root=$(pwd)
(cd backend/cuda/cu && "$root/.devbin/backend_cuda_cu.test" -test.v -test.count=1 -test.run 'TestBlasLtFP8Speed') >"$out/quant-cu.log" 2>&1
echo "cu: rc=$?"
(cd backend/cuda/kernels && "$root/.devbin/backend_cuda_kernels.test" -test.v -test.count=1 \
	-test.run 'TestFP8ProductSpeed|TestGEMVF8Speed|TestGEMVBlocksSpeed') >"$out/quant-kernels.log" 2>&1
echo "kernels: rc=$?"
grep -hE '^\s+\||device|--- ' "$out/quant-cu.log" "$out/quant-kernels.log"
