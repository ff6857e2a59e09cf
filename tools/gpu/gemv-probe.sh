#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the GEMV's tile
# kernels (9 to 64 rows) alone. Their GPU tests, TestGEMVSpeed at 16, 32 and
# 64 rows (every configuration of the sweep module against cuBLASLt's
# candidates), then Nsight Compute's view of one launch of every kernel
# configuration at 64 rows of the output and down projections (the tile
# kernels and cuBLASLt's; speed of light, memory, warp stalls, occupancy).
# Logs under $OUT (or ./gpu-logs).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/gemv-probe.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
kernels_test gemv-tests -test.run 'TestGEMV$|TestGEMVSweepCorrect|TestGEMVErrors|TestGEMVSwiGLU|TestGEMVRoPEQKV|TestGEMVEpilogueErrors'
grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)' "$out/gemv-tests.log" | head -40
KILN_GEMV_ROWS=16,32,64 kernels_test gemv-speed -test.run 'TestGEMVSpeed'
grep -E '^\| ' "$out/gemv-speed.log" | sort -u
if command -v ncu >/dev/null; then
	for sh in O down; do
		t0=$(date +%s)
		(cd backend/cuda/kernels && KILN_GEMV_ROWS=64 timeout 120 ncu --clock-control none --filter-mode per-launch-config --launch-skip 3 --launch-count 1 \
			--kernel-name regex:'gemv_tile|sm90|gemm|xmma|cutlass' \
			--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
			../../../.devbin/backend_cuda_kernels.test -test.count=1 -test.run "TestGEMVSpeed/$sh\$") >"$out/ncu-$sh.txt" 2>&1
		echo "ncu $sh: rc=$? in $(($(date +%s) - t0)) s, $(grep -c '^  [a-z_0-9]*(' "$out/ncu-$sh.txt") kernels"
	done
fi
