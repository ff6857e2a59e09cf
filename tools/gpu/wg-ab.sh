#!/usr/bin/env bash
# Runs on one H100/H200 after `tools/gpu/build.sh ./backend/cuda/kernels`
# here (session 45): BenchmarkPrefillAttention plain and under the
# experiments XOPTS and YOPTS (NVRTC options), ROUNDS rounds (default 2)
# taking turns (and .devbin/kbase.test's, another revision's kernels
# tests, where present); then TestPrefillAttention under each experiment.
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && XOPTS=... YOPTS=... tools/gpu/wg-ab.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
for r in $(seq 1 "${ROUNDS:-2}"); do
	for x in none x y base; do
		(
			if [ $x = base ]; then
				# .devbin/kbase.test: the kernels' tests of another revision.
				[ -x .devbin/kbase.test ] || exit 0
				(cd backend/cuda/kernels && timeout 200 ../../../.devbin/kbase.test -test.v -test.count=1 -test.run '^$' \
					-test.bench "${BENCH:-PrefillAttention}" -test.benchtime 1x) >"$out/bench-$x-r$r.log" 2>&1
			else
				experiment $x || exit 0
				kernels_test bench-$x-r$r -test.run '^$' -test.bench "${BENCH:-PrefillAttention}" -test.benchtime 1x
			fi
			grep -E 'TFLOP/s|FAIL|panic' "$out/bench-$x-r$r.log" | grep -E "${SHOW:-bf16 (causal|full)[0-9]+/(wg128|mma),}" | sed 's/.*bench_test.go:[0-9]*: device NVIDIA H[0-9]*: //'
		)
	done
done
for x in x y; do
	(
		experiment $x || exit 0
		kernels_test test-$x -test.run "${TESTS:-TestPrefillAttention\$}"
		grep -E '^(--- FAIL|FAIL|ok|PASS)' "$out/test-$x.log" | head -5
	)
done
echo "done at $(($(date +%s) - t0)) s"
pack_out logs.tgz
