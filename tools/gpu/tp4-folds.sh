#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after BASE=<rev> tools/gpu/build.sh
# ./backend/cuda here (issue 20): the norms folded over four GPUs. The
# backend's tensor-parallel tests (env.sh's tp_tests without the kernels'),
# then batch-1 and batch-64 decode of the random Llama-3-8B-shaped bf16
# model at TP=4, this tree against kiln-base, two rounds taking turns, each
# run with a tune cache of its own, and how many norms each folded. Logs in
# logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4-folds.sh",
#   carry [".devpack"], kind nvidia-h200-x4
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
SKIP_KERNELS=1 tp_tests
random_bf16
echo "model at $(($(date +%s) - t0)) s"
for r in 1 2; do
	PP=0 tp_bench tp4-r$r 4 1,64 90 KILN_TUNE_DIR=/tmp/tune-tp4-r$r
	PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp4-base-r$r 4 1,64 90 KILN_TUNE_DIR=/tmp/tune-tp4-base-r$r
done
python3 tools/gpu/tp_table.py "$work" tp4-r1 tp4-base-r1 tp4-r2 tp4-base-r2
grep -H "norms folded" "$work"/model-tp4-*.txt | sed 's|.*/model-||'
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
