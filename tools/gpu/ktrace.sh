#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: builds the kernel
# tracer tools/gpu/ktrace/ktrace.c against the machine's CUPTI, then traces
# kiln bench model's batch-1 decode on the random Llama-3-8B-shaped bf16
# model at TP=1, at TP=2 and one TP=2 rank's shape alone (no collectives),
# and TP=1 at batch 64, each also
# untraced for the tracer's own cost, and prints
# tools/gpu/ktrace/ktrace.py's summary of each: where a replayed step's wall
# time goes, kernel by kernel, overlaps counted once. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/ktrace.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
trace_setup || exit 1
echo "model at $(($(date +%s) - t0)) s"
trace tp1 1 "$bf16"
trace tp2 2 "$bf16"
trace rank 1 --random llama3-8b-tp2-rank --keep "$keep"
LINES_MAX=45 B=64 trace tp1-b64 1 "$bf16"
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
