#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: a mixture of
# experts through the path a user runs (issue 18). `kiln bench model
# --random moe-7b-a1b` (prefill 512, decode at depth 512 of batch 1 and 64,
# the default expert kernels), then kiln serve on that model driven by
# kiln bench serve at 256, 64, 1 and again 256 concurrent streams of 128
# prompt / 128 output tokens, one after another on the same server
# (prompts in GPT-2's vocabulary: tools/gpu/env.sh). Logs and JSON under
# $OUT; a summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/moe-serve.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
timeout -s QUIT 150 $k bench model --random moe-7b-a1b --keep "$keep" --device cuda --pp 512 --tg 32 --depth 512 --batch 1,64 --reps 3 \
	--output "$out/moe.json" >"$out/moe.txt" 2>&1
echo "bench model moe-7b-a1b: rc=$? at $(($(date +%s) - t0)) s"
grep -E "^\| (pp|tg)" "$out/moe.txt"
$k serve "$keep/moe-7b-a1b-bf16" --tokenizer "$gpt2_tok" --device cuda --max-num-seqs 256 --port 8765 >"$out/serve.log" 2>&1 &
server=$!
for i in $(seq 1 120); do
	curl -sf http://127.0.0.1:8765/health >/dev/null && break
	kill -0 $server 2>/dev/null || break
	sleep 1
done
echo "server up after $(($(date +%s) - t0)) s"
n=0
for c in "256 1024 128" "64 384 32" "1 16 2" "256 1024 128"; do
	set -- $c
	n=$((n + 1))
	timeout 150 $k bench serve --url http://127.0.0.1:8765 --concurrency "$1" --num-requests "$2" --warmup "$3" \
		--prompt-tokens 128 --output-tokens 128 --tokenizer "$gpt2_tok" --output "$out/serve-$n-c$1.json" >"$out/serve-$n-c$1.txt" 2>&1
	echo "c$1: rc=$? at $(($(date +%s) - t0)) s"
	serve_summary "$out/serve-$n-c$1.json"
done
curl -s http://127.0.0.1:8765/metrics >"$out/metrics.txt"
kill -TERM $server
timeout 30 tail --pid=$server -f /dev/null || { echo "server still up 30 s after SIGTERM: killed"; kill -KILL $server; }
wait $server
echo "server exit $?"
grep -iE "error|panic|out of memory" "$out/serve.log" | head -5
