#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the K-quant GEMVs
# (Q4_K, Q6_K) alone. Their GPU test (TestGEMVBlocks), their speed against the
# bf16 GEMV at 1, 4 and 8 rows (TestGEMVBlocksSpeed), then
# Nsight Compute's view of one launch of each at one row of the output and
# gate/up products (speed of light, memory, warp stalls, occupancy;
# NCU_SHAPE names one product, e.g. gate+up; NCU_TEST the speed test;
# NCU=0 skips it).
# Logs under $OUT (or ./gpu-logs).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/q4k-probe.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
kernels_test q4k-tests -test.run 'TestGEMVBlocks$'
grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)' "$out/q4k-tests.log" | head -20
kernels_test q4k-speed -test.run 'TestGEMVBlocksSpeed'
grep -E '\| ' "$out/q4k-speed.log"
if [ "${NCU:-1}" != 0 ] && command -v ncu >/dev/null; then
	t0=$(date +%s)
	(cd backend/cuda/kernels && timeout 240 ncu --clock-control none --filter-mode per-launch-config --launch-skip 2 --launch-count 1 \
		--kernel-name regex:'gemv_q[46]k|quant_q8' \
		--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
		env KILN_GEMV_SHAPE="${NCU_SHAPE:-}" ../../../.devbin/backend_cuda_kernels.test -test.count=1 -test.run "${NCU_TEST:-TestGEMVBlocksSpeed}") >"$out/ncu.txt" 2>&1
	echo "ncu: rc=$? in $(($(date +%s) - t0)) s"
	grep -E '^  [a-z_0-9]+ ?\(|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Limit Reg|Warp Cycles Per Issued|Issue Slots Busy|Eligible Warps|[Ss]tall' "$out/ncu.txt" | head -150
fi
