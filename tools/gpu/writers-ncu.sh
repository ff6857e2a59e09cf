#!/usr/bin/env bash
# Runs on one GPU after tools/gpu/build.sh here (issue 16's FP8 prefill):
# Nsight Compute's full sections on the kernels around an FP8 prefill's
# products (by name, ${KERNELS}: the FP8-form writers and RoPE by default),
# the first ${COUNT:-8} launches of a 2048-token prefill of the random
# Llama-3-8B shape's FP8 checkpoint, clocks and caches left alone: whether
# each is bound by memory, issue or latency. Also the bf16 model's
# (MODELS="bf16 fp8"). Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/writers-ncu.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -n "$ncu" ] || { echo "no ncu" >&2; exit 2; }
t0=$(date +%s)
random_fp8
kernels=${KERNELS:-swiglu_packed_qr|add_rmsnorm_rq_wf32|rope_qkv_write_r|swiglu_packed|add_rmsnorm}
for m in ${MODELS:-fp8}; do
	dir=$bf16
	[ $m = fp8 ] && dir=$fp8
	$k bench model "$dir" --device cuda --pp 2048 --tg 0 --batch 1 --reps 1 >"$out/$m-bench.txt" 2>&1
	echo "$m bench: rc=$? at $(($(date +%s) - t0)) s"
	timeout 200 "$ncu" --clock-control none --cache-control none --set full -k "regex:^($kernels)\$" -c "${COUNT:-8}" \
		$k bench model "$dir" --device cuda --reps 1 --cuda-graphs=false --pp 2048 --tg 0 >"$out/$m-ncu.txt" 2>&1
	echo "$m ncu: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Registers Per Thread|Dynamic Shared Memory Per Block|Block Limit|Warp Cycles Per Issued Instruction|Executed Ipc Active|One or More Eligible|Stall' "$out/$m-ncu.txt" | head -${LINES_MAX:-150}
done
pack_out logs.tgz
