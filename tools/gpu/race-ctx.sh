#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after BASE=<rev> tools/gpu/build.sh
# here: the vector products' races now time each candidate after a
# latency-bound kernel (SpinDep), as a step runs them. The backend's
# TestTuneCache; then batch-1 decode of the random Llama-3-8B-shaped bf16
# model at TP=1 and TP=2, this tree against kiln-base, two rounds taking
# turns, each binary racing on the fresh machine; the races' lines; and a
# traced TP=1 step (tools/gpu/ktrace). Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/race-ctx.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
backend_test tune -test.run 'TestTuneCache'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- FAIL' "$out/tune.log" | head -5
ktrace_build || exit 1
random_bf16
echo "model at $(($(date +%s) - t0)) s"
grep -h "T=1 K\|T≤1 K" "$out/write.txt" | cut -c1-330
for r in 1 2; do
	for n in 1 2; do
		PP=0 tp_bench tp$n-r$r $n 1 60
		PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp$n-base-r$r $n 1 60
	done
done
python3 tools/gpu/tp_table.py "$work" tp1-r1 tp1-base-r1 tp2-r1 tp2-base-r1 tp1-r2 tp1-base-r2 tp2-r2 tp2-base-r2
grep -h "T=1 K\|T≤1 K" "$work"/model-tp2-r1.txt "$work"/model-tp1-base-r1.txt | cut -c1-330
LINES_MAX=14 trace tp1 1 "$bf16"
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' --exclude '*.csv' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
