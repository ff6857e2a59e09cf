#!/usr/bin/env bash
# Runs on one GPU after tools/gpu/build.sh ./backend/cuda ./backend/cuda/kernels
# here (issue 16's FP8 prefill, session 42): the many-row FP8 norm at four
# rows a block (add_rmsnorm_rq, the default) against two
# (add_rmsnorm_rq2, KILN_NORM_ROWS_Q=2). The kernels' FP8 writer tests and
# the model's FP8 test with two rows; the FP8 prefill traced both ways (a
# layer's kernels in order); then 2048-token prefills of the FP8 and bf16
# models, ${REPS:-30} a run, the forms taking turns over ${ROUNDS:-3}
# rounds. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/norm-rows.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
ktrace_build >/dev/null || echo "no tracer"
KILN_NORM_ROWS_Q=2 kernels_test norm2-ktests -test.run 'TestE4M3Writers|TestKernelResources'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|differ|rq2?_w' "$out/norm2-ktests.log" | head -20
KILN_NORM_ROWS_Q=2 backend_test norm2-btests -test.run 'TestFP8Weights'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS' "$out/norm2-btests.log" | head -6
echo "tests done at $(($(date +%s) - t0)) s"
random_fp8
if [ -f /tmp/libktrace.so ]; then
	LINES_MAX=14 trace_prefill trace-rows4 .devbin/kiln "$fp8"
	KILN_NORM_ROWS_Q=2 LINES_MAX=14 trace_prefill trace-rows2 .devbin/kiln "$fp8"
fi
for r in $(seq "${ROUNDS:-3}"); do
	for v in fp8 fp8-rows2 bf16; do
		case $v in
		fp8) model=$fp8 ;;
		fp8-rows2) model=$fp8; export KILN_NORM_ROWS_Q=2 ;;
		bf16) model=$bf16 ;;
		esac
		$k bench model "$model" --device cuda --pp 2048 --tg 0 --batch 1 --reps "${REPS:-30}" >"$out/$v-$r.txt" 2>&1
		echo "== $v, round $r: rc=$? $(grep -h '^| pp' "$out/$v-$r.txt" | tail -1)"
		unset KILN_NORM_ROWS_Q
	done
done
pack_out logs.tgz
