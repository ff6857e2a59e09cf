#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: a 2048-token
# prefill of the random Llama-3-8B-shaped bf16 model and of its FP8
# checkpoint (kiln quantize --to fp8) under Nsight Compute, kernel by kernel
# (duration and DRAM bytes, caches flushed between kernels, clocks left
# alone), summarised by tools/gpu/ncu_steps.py with each kernel's DRAM rate:
# where the FP8 prefill's time goes beside its products (issue 16's 1.6×).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fp8-profile.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -n "$ncu" ] || { echo "no ncu" >&2; exit 2; }
t0=$(date +%s)
random_bf16
fp8=$keep/llama3-8b-fp8
$k quantize --to fp8 "$bf16" "$fp8" >"$out/quantize.txt" 2>&1
echo "quantize: rc=$? at $(($(date +%s) - t0)) s"
for m in bf16 fp8; do
	dir=$bf16
	[ $m = fp8 ] && dir=$fp8
	# The kernels compiled and the products' first-use races run outside the profiler.
	$k bench model "$dir" --device cuda --pp 2048 --tg 1 --batch 1 --reps 2 >"$out/$m-bench.txt" 2>&1
	echo "$m bench: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^\| pp' "$out/$m-bench.txt"
	ncu_prefill "$m" "$dir" 240 | head -40
done
pack_out logs.tgz
