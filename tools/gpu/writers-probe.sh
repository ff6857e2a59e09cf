#!/usr/bin/env bash
# Runs on one GPU after `BASE=<rev> tools/gpu/build.sh ./backend/cuda
# ./backend/cuda/kernels` here (issues 15 and 16, session 41): whether the
# kernels around the products (RoPE, SwiGLU, the add+norms, in both
# formats) lose or win against the base in the run itself, and what bounds
# them. The bf16 model's 2048-token prefill and its batch-${B:-64} decode
# (depth 512) traced on this tree's kiln and on kiln-base in turns
# (tools/gpu/ktrace: one layer's kernels in order), the FP8 prefill traced
# on both, then Nsight Compute's sections on the writers of both formats
# (tools/gpu/writers-ncu.sh's, the first ${COUNT:-6} launches of
# $NCU_KERNELS in each model). First, when
# given, the kernels' GPU tests matching $KTESTS and the backend's
# matching $BTESTS. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/writers-probe.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
trace_setup || exit 1
if [ -n "${KTESTS:-}" ]; then
	kernels_test probe-ktests -test.v -test.run "$KTESTS"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|resources_test' "$out/probe-ktests.log" | head -60
fi
if [ -n "${BTESTS:-}" ]; then
	backend_test probe-btests -test.run "$BTESTS"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS' "$out/probe-btests.log" | head -12
fi
random_fp8
for m in bf16 fp8; do
	dir=$bf16
	[ $m = fp8 ] && dir=$fp8
	for kb in kiln kiln-base; do
		trace_prefill "pp-$m-$kb" .devbin/$kb "$dir"
	done
done
for kb in kiln kiln-base; do
	B=${B:-64} KILN_BIN=.devbin/$kb LINES_MAX=4 trace "b${B:-64}-$kb" 1 "$bf16" | grep -v '^=='
	python3 tools/gpu/ktrace/ktrace.py "$work/b${B:-64}-$kb.csv" --last 2 --layer | sed -n '/one step/,$p' | head -"${LINES_MAX:-16}"
done
echo "traces done at $(($(date +%s) - t0)) s"
if [ -n "$ncu" ] && [ $(($(date +%s) - t0)) -lt 400 ]; then
	OUT=$out/ncu MODELS="fp8 bf16" COUNT=${COUNT:-6} \
		KERNELS="${NCU_KERNELS:-swiglu_packed_qr|swiglu_packed_n|add_rmsnorm_rq_wf32}" \
		timeout $((560 - ($(date +%s) - t0))) tools/gpu/writers-ncu.sh | grep -E '^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|One or More Eligible'
fi
pack_out logs.tgz
