#!/usr/bin/env bash
# Runs on one H100/H200 after `BASE=<rev> tools/gpu/build.sh ./backend/cuda
# ./backend/cuda/kernels` here (session 44): the prefill attention on
# Hopper's wgmma (prefill_wg.cu) under the kernels' tests
# (TestPrefillAttention checks every build PrefillVariants lists on each
# case; TestKernelResources logs its registers and local memory; WG_TESTS
# replaces the pattern), then BenchmarkPrefillAttention (every build, 4096
# and 2048 tokens, 32/8 heads ×128; WG_BENCH replaces the pattern, e.g.
# 'PrefillAttention|DecodeAttention'), both again under XOPTS when given,
# then tools/gpu/fp8-writers.sh (the model's tests, bf16 and FP8 prefill on
# this kiln and on kiln-base, taking turns, and traces; its XOPTS variants
# where VARIANTS names them).
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/prefill-wg.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
# CU_TESTS: the cu package's tests of that pattern first (e.g.
# TestTensorMapCopy; build.sh must have built ./backend/cuda/cu).
if [ -n "${CU_TESTS:-}" ]; then
	pkg_test backend/cuda/cu cu-tests -test.run "$CU_TESTS"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- (PASS|SKIP)|tensor map|box at' "$out/cu-tests.log" | head -20
fi
# The kernels' tests and benchmarks; again with the experiment's NVRTC
# options where XOPTS is given (env.sh's experiment: e.g.
# XOPTS=-DKV_ROW_DIV=1, kv_page's division back in every attention kernel).
# XONLY=1: only the experiment's run.
for x in "" x; do
	[ -z "$x" ] || [ -n "${XOPTS:-}" ] || continue
	[ -n "$x" ] || [ -z "${XONLY:-}" ] || continue
	(
		[ -z "$x" ] || experiment x
		kernels_test wg-ktests$x -test.run "${WG_TESTS:-TestPrefillAttention\$|TestKernelResources}"
		grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|prefill_wg|prefill_mma_128|C75' "$out/wg-ktests$x.log" | head -30
		kernels_test wg-bench$x -test.run '^$' -test.bench "${WG_BENCH:-PrefillAttention}" -test.benchtime 1x
		grep -E 'TFLOP/s|GB/s|FAIL|panic' "$out/wg-bench$x.log" | grep -v '^Benchmark' | sed 's/.*bench_test.go:[0-9]*: //' | head -40
	)
done
echo "kernels done at $(($(date +%s) - t0)) s"
pack_out logs-k.tgz
# The model's runs only where a wgmma build beats mma.sync's at 2048 causal
# tokens (MODEL=1: always; KONLY=1: never).
faster=$(tar xzOf "$out/logs-k.tgz" ./wg-bench.log | python3 -c '
import re, sys
t = {m.group(1): float(m.group(2)) for m in re.finditer(r"causal2048/(\w+), .*?: ([0-9.]+) ms", sys.stdin.read())}
wg = min((v for k, v in t.items() if k.startswith("wg")), default=1e9)
print(1 if wg < 0.97 * t.get("mma", 0) else 0)')
echo "a wgmma build beats mma.sync at 2048 tokens: $faster"
[ "$faster" = 1 ] || [ "${MODEL:-0}" = 1 ] || exit 0
[ -z "${KONLY:-}" ] || exit 0 # KONLY=1: the kernels alone
OUT=$out/model KTESTS='TestKernelResources' BTESTS="${BTESTS-TestHFTransformersFixtures|TestBatchedMatchesCPU|TestFP8Weights|TestGraphsMatchDirect}" \
	VARIANTS="${VARIANTS:-bf16 fp8 bf16-base fp8-base}" BATCH=${BATCH:-1} TG=16 REPS=${REPS:-30} ROUNDS=${ROUNDS:-2} tools/gpu/fp8-writers.sh
