#!/usr/bin/env bash
# Runs on one GPU after tools/gpu/build.sh here (issue 16's FP8 prefill):
# a 2048-token prefill of the random Llama-3-8B-shaped bf16 model and of
# its FP8 checkpoint (kiln quantize --to fp8), untraced, then under the
# kernel tracer (tools/gpu/ktrace), and tools/gpu/ktrace/ktrace.py's
# summary of each: where a prefill's wall time goes in the run itself
# (kernels as they overlap, the idle time between them), not kernel by
# kernel with the caches flushed as tools/gpu/fp8-profile.sh measures.
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/prefill-trace.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
trace_setup || exit 1
random_fp8
echo "models at $(($(date +%s) - t0)) s"
for m in bf16 fp8; do
	dir=$bf16
	[ $m = fp8 ] && dir=$fp8
	run=(timeout -s QUIT 150 $k bench model "$dir" --device cuda --pp 2048 --tg 0 --batch 1 --reps 3)
	KILN_TUNE_DIR=/tmp/tune-$m "${run[@]}" >"$work/$m-plain.txt" 2>&1
	echo "$m plain: rc=$?; $(grep -h '^| pp' "$work/$m-plain.txt" | tail -1 | cut -c1-100)"
	KILN_TUNE_DIR=/tmp/tune-$m CUDA_INJECTION64_PATH=/tmp/libktrace.so KTRACE_OUT="$work/$m.csv" "${run[@]}" >"$work/$m.txt" 2>&1
	echo "$m traced: rc=$? at $(($(date +%s) - t0)) s; $(grep -h '^| pp' "$work/$m.txt" | tail -1 | cut -c1-100)"
	python3 tools/gpu/ktrace/ktrace.py "$work/$m.csv" --last 3 --layer >"$work/$m.summary"
	head -"${LINES_MAX:-40}" "$work/$m.summary"
done
(cd "$work" && tar czf logs.tgz --exclude logs.tgz * && find . -maxdepth 1 -type f ! -name logs.tgz -delete)
