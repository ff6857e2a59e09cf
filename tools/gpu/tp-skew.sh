#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after tools/gpu/build.sh here (issue
# 20): where a TP=2 batch-1 step's time goes between the devices. Traces
# (tools/gpu/ktrace) kiln bench model's batch-1 decode of the random
# Llama-3-8B-shaped bf16 model at TP=2 (env.sh's trace: untraced first, the
# traced run taking its choices) and prints each device's summary and
# ktrace.py --skew: the devices' step starts and ends against each other,
# their first collective's wait, and their idle time between steps. The
# trace itself comes back compressed (tp2.csv.gz) for a closer look.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-skew.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
trace_setup || exit 1
LINES_MAX=16 trace tp2 2 "$bf16"
LINES_MAX=8 trace tp1 1 "$bf16"
python3 tools/gpu/ktrace/ktrace.py "$work/tp1.csv" --skew 1 | tail -1
gzip -9 "$work/tp2.csv"
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.csv' --exclude '*.gz' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.gz' -delete)
