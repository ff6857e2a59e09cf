#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after BASE=<rev> tools/gpu/build.sh
# here (issue 20): batch-1 decode of the random Llama-3-8B-shaped bf16
# model at TP=1 and TP=2, this tree against kiln-base, two rounds taking
# turns, each run's races as they choose on a fresh machine (a tune cache
# of its own a run), TP=4 once
# (four GPUs), traced steps (tools/gpu/ktrace) of this tree's TP=1 and
# TP=2; then, on four GPUs, kiln serve
# --tensor-parallel-size 4 under kiln bench serve at 1, 64 and 256
# streams, one run after another. TESTS=1: the tensor-parallel tests
# first (env.sh's tp_tests, without the kernels' with SKIP_KERNELS=1);
# NOTRACE=1: no traces. SERVE=N: kiln serve at TP=N under kiln bench serve
# (default 4 on four GPUs, none on two).
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-race.sh",
#   carry [".devpack"], kind nvidia-h200-x4 (or x2: no TP=4)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
[ -n "${TESTS:-}" ] && tp_tests
[ -n "${NOTRACE:-}" ] || ktrace_build || exit 1
random_bf16
echo "model at $(($(date +%s) - t0)) s"
for r in 1 2; do
	for n in 1 2; do
		PP=0 tp_bench tp$n-r$r $n 1 60 KILN_TUNE_DIR=/tmp/tune-tp$n-r$r
		PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp$n-base-r$r $n 1 60 KILN_TUNE_DIR=/tmp/tune-tp$n-base-r$r
	done
done
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 4 ] && PP=0 tp_bench tp4 4 1,64 60
python3 tools/gpu/tp_table.py "$work" tp1-r1 tp1-base-r1 tp2-r1 tp2-base-r1 tp1-r2 tp1-base-r2 tp2-r2 tp2-base-r2 tp4
for f in tp1-r1 tp1-r2 tp2-r1 tp2-r2 tp1-base-r1 tp1-base-r2 tp2-base-r1 tp2-base-r2; do
	echo "== $f: $(grep -h "T=1 K" "$work/model-$f.txt" | grep -v "gemv kept" | cut -c1-200)"
	grep -h "outside device work" "$work/model-$f.txt" | sed 's/^tg64@d512 //'
done
if [ -z "${NOTRACE:-}" ]; then
	LINES_MAX=14 trace tp1 1 "$bf16"
	LINES_MAX=14 trace tp2 2 "$bf16"
fi
serve_tp=${SERVE:-}
[ -z "$serve_tp" ] && [ "$gpus" -ge 4 ] && serve_tp=4
[ -n "$serve_tp" ] && tp_serve "$serve_tp"
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' --exclude '*.csv' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
