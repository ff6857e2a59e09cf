#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the FP8 checkpoint
# of the Llama-3-8B-shaped random model (`kiln quantize --to fp8`) served
# at 256 and then 64 streams of 128/128 tokens (every run's prompts its
# own: serve_run), beside the same load offline (kiln bench model --mixed
# 256 at 256 sequences, depth 128). Prints the offline rate, each run's
# summary and the server's prefix-cache hits and out-of-memory retries.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-fp8.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
work=$(mktemp -d)
t0=$(date +%s)
random_fp8
offline_mixed "$fp8" "$work/offline.txt"
if serve_start "$work/serve.log" 300 "$fp8" --tokenizer "$tok" --device cuda --max-num-seqs 256; then
	SERVE_TIMEOUT=150 serve_run fp8-c256 256 1792 256
	serve_summary "$work/fp8-c256.json"
	SERVE_TIMEOUT=60 serve_run fp8-c64 64 512 64
	serve_summary "$work/fp8-c64.json"
	echo "prefix cache hits $(metric kiln:prefix_cache_hits_total), oom retries $(metric kiln:num_oom_retries_total)"
	kill -TERM $server
	wait $server
fi
mkdir -p "$out"
tar czf "$out/fp8-serve.tgz" -C "$work" .
