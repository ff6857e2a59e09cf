#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: a kernel-by-kernel
# profile of the Llama-3-8B-shaped model's steps under Nsight Compute (the
# duration of every kernel, caches flushed between them, clocks left alone),
# summarised per step kind by tools/gpu/ncu_steps.py: a 2048-token prefill
# step, and batch-1 decode steps at context 512 (graphs off, so that each
# kernel is its own launch; the kernels are the same). Decode kernels run
# without the cache flush: in a real step the small activations stay in L2
# and the weights never fit in it. The steps to profile can be named:
# prefill, or decodeB (batch B at depth 512) or decodeB@D (at depth D):
#   tools/gpu/profile.sh [prefill] [decode1] [decode16] [decode256@128]   (default the first three)
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/profile.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -n "$ncu" ] || { echo "no ncu" >&2; exit 2; }
# Make the model once (and compile the kernels) outside the profiler.
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 64 --tg 2 --batch 1 --reps 1 >"$out/warm.txt" 2>&1
prof() { # name, cache control, bench arguments...
	local name=$1 cache=$2
	shift 2
	"$ncu" --clock-control none --cache-control "$cache" --metrics gpu__time_duration.sum --csv --print-units base \
		--log-file "$out/$name.csv" $k bench model --random llama3-8b --keep "$keep" --device cuda --reps 1 \
		--cuda-graphs=false "$@" >"$out/$name.txt" 2>&1
	python3 tools/gpu/ncu_steps.py "$out/$name.csv" | tee "$out/$name.summary"
}
for step in ${*:-prefill decode1 decode16}; do
	case $step in
	prefill) prof prefill all --pp 2048 --tg 0 ;;
	decode[0-9]*)
		b=${step#decode} d=512
		[[ $b == *@* ]] && d=${b#*@} b=${b%@*}
		prof "decode$b-$d" none --pp 0 --tg 4 --depth "$d" --batch "$b" ;;
	*) echo "unknown step $step (prefill, decodeB, decodeB@D)" >&2; exit 2 ;;
	esac
done
