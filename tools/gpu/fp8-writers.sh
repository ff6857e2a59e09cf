#!/usr/bin/env bash
# Runs on one GPU after `BASE=<rev> tools/gpu/build.sh ./backend/cuda
# ./backend/cuda/kernels` here (issue 16's FP8 prefill, session 40): the
# kernels around an FP8 prefill's products (RoPE in vectors, the FP8
# writers' division, swiglu_packed_qr's last vectors in registers, the
# many-row norm at four blocks a multiprocessor). Their GPU tests and the
# model's FP8 tests; then tools/gpu/fp8-bench.sh (bf16, FP8 on this tree's
# kiln and on kiln-base, taking turns; prefill 2048, decode at depth 512 of
# $BATCH); then the FP8 prefill traced (env.sh's trace_prefill), one layer's
# kernels in order; with NCU=1 and time left, Nsight Compute's sections on
# the writers of both formats (tools/gpu/writers-ncu.sh's). NOTRACE=1
# skips the trace, BTESTS= (empty) the model's tests. XOPTS (NVRTC
# options of an experiment, e.g. -DROPE_U=4) and XENV (its environment,
# e.g. KILN_MOE_TILE_ROWS=32; env.sh's experiment) run the kernels'
# tests again with them, name the -x variants of fp8-bench.sh (VARIANTS=
# "bf16 bf16-x fp8 fp8-x") and trace this kiln with and without them;
# YOPTS and YENV likewise a second experiment (the -y variants).
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fp8-writers.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
[ -n "${NOTRACE:-}" ] || ktrace_build >/dev/null || echo "no tracer"
kernels_test writer-ktests -test.run "${KTESTS:-TestRoPEQKVWrite|TestE4M3Writers|TestQuantizeRowsE4M3|TestSwiGLUPacked|TestRowRMSReaders|TestFP8KVWrite|TestGEMVRoPEQKV|TestGEMVFold}"
grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|differ' "$out/writer-ktests.log" | head -20
# The experiments' kernels (XOPTS/XENV, YOPTS/YENV: env.sh's experiment)
# under the same tests.
for x in x y; do
	opts=${x^^}OPTS envs=${x^^}ENV
	[ -n "${!opts:-}${!envs:-}" ] || continue
	(experiment $x && kernels_test writer-ktests-$x -test.run "${KTESTS:-TestSwiGLUPacked|TestRowRMSReaders|TestGEMVFold|TestE4M3Writers}")
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|differ' "$out/writer-ktests-$x.log" | head -20
done
btests=${BTESTS-TestFP8Weights|TestFP8KVCache|TestNormFolds|TestBatchedMatchesCPU|TestHFTransformersFixtures}
if [ -n "$btests" ]; then
	backend_test writer-btests -test.run "$btests"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS' "$out/writer-btests.log" | head -12
fi
echo "tests done at $(($(date +%s) - t0)) s"
OUT=$out/bench ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-64,256} VARIANTS="${VARIANTS:-bf16 fp8 fp8-base}" tools/gpu/fp8-bench.sh 2>&1 | grep -E '^==|^\| (pp|tg)|÷ bf16'
echo "bench done at $(($(date +%s) - t0)) s"
random_fp8
if [ -f /tmp/libktrace.so ]; then
	traced="kiln kiln-base"
	[ -n "${XOPTS:-}${XENV:-}" ] && traced="kiln kiln-x"
	[ -n "${YOPTS:-}${YENV:-}" ] && traced="$traced kiln-y"
	for kb in $traced; do
		bin=.devbin/$kb
		case $kb in
		kiln-x) bin=.devbin/kiln; experiment x ;;
		kiln-y) bin=.devbin/kiln; experiment y ;;
		esac
		LINES_MAX=14 trace_prefill "trace-$kb" "$bin" "$fp8"
		experiment none
	done
fi
if [ -n "${NCU:-}" ] && [ $(($(date +%s) - t0)) -lt 420 ]; then
	OUT=$out/ncu MODELS="fp8 bf16" KERNELS="${NCU_KERNELS:-rope_qkv_write_v|swiglu_packed_qr|swiglu_packed_n|add_rmsnorm_rq_wf32}" \
		timeout $((570 - ($(date +%s) - t0))) tools/gpu/writers-ncu.sh | grep -E '^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per'
fi
pack_out logs.tgz
