#!/usr/bin/env bash
# One call of the device tool for a whole GPU check, after tools/gpu/build.sh
# here: the steps named (default: tests bench), each under a time limit so
# that the call ends inside the tool's 10 minutes, their logs packed into
# $OUT/all.tgz (the tool brings back at most 8 files) and a summary printed
# last.
#   tests    every GPU test binary (tools/gpu/run.sh; about 200 s on a
#            fresh H200, 2026-11-25: NVRTC compiles the three kernel
#            modules, about 40 s each since the tensor-core decode)
#   bench    kiln bench model and the PyTorch peer (tools/gpu/bench.sh;
#            3.5–6.5 minutes on a fresh H100 or H200, 2026-11-23, writing
#            the 16 GB random model to /dev/shm included)
# The two limits add up to 590 s, inside the tool's 600; when a fresh
# machine's tests step is cut, run the steps in separate calls.
#   profile  the kernel-by-kernel profile (tools/gpu/profile.sh)
#   quant    the quantized products' figures (tools/gpu/quant-bench.sh)
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/all.sh tests bench", carry [".devpack"]
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-gpu-logs}
work=$(mktemp -d)
steps=${*:-tests bench}
limit() { case $1 in tests) echo 260 ;; bench) echo 330 ;; profile) echo 300 ;; quant) echo 200 ;; *) echo 0 ;; esac; }
summary=()
for step in $steps; do
	t=$(limit "$step")
	[ "$t" -gt 0 ] || { echo "unknown step $step (tests, bench, profile, quant)" >&2; exit 2; }
	mkdir -p "$work/$step"
	t0=$(date +%s)
	case $step in
	tests) OUT=$work/$step timeout "$t" tools/gpu/run.sh -test.skip 'Ldm|GEMVSweep|Speed' >"$work/$step/out.txt" 2>&1 ;;
	bench) OUT=$work/$step timeout "$t" tools/gpu/bench.sh >"$work/$step/out.txt" 2>&1 ;;
	profile) OUT=$work/$step timeout "$t" tools/gpu/profile.sh >"$work/$step/out.txt" 2>&1 ;;
	quant) OUT=$work/$step timeout "$t" tools/gpu/quant-bench.sh >"$work/$step/out.txt" 2>&1 ;;
	esac
	rc=$?
	summary+=("$step: rc=$rc in $(($(date +%s) - t0)) s (limit $t s)")
	tail -40 "$work/$step/out.txt"
done
mkdir -p "$final"
tar czf "$final/all.tgz" -C "$work" .
echo "== all.sh"
printf '%s\n' "${summary[@]}"
