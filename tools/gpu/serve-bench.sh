#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: kiln serve on the
# Llama-3-8B-shaped random bf16 model, driven by kiln bench serve.
#  1. 256 concurrent requests of 128 prompt / 128 output tokens: output
#     tokens/s, to compare with the offline batched decode of the same shape
#     (kiln bench model --tg 128 --depth 128 --batch 256, run here too).
#  2. 64 concurrent streams: the share of the scheduler's time spent outside
#     engine steps, from the server's /metrics before and after.
# The random model has no tokenizer: prompts are encoded with the demo
# model's (ids below 4096 are valid ids of the 128256-token vocabulary).
#   run tool: command "tools/gpu/serve-bench.sh", carry [".devbin"]
source "$(dirname "$0")/env.sh"
tok=demo/files/tokenizer.json
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 128 --batch 256 --reps 2 \
	--output "$out/offline.json" >"$out/offline.txt" 2>&1
model="$keep/llama3-8b-bf16"
[ -d "$model" ] || model=$(ls -d "$keep"/llama3-8b-* | head -1)
$k serve "$model" --tokenizer "$tok" --device cuda --max-num-seqs 256 --port 8765 >"$out/serve.log" 2>&1 &
server=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
metric() { curl -s http://127.0.0.1:8765/metrics | awk -v m="$1" '$1 == m {print $2}'; }
$k bench serve --url http://127.0.0.1:8765 --concurrency 256 --num-requests 768 --warmup 256 \
	--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$out/serve256.json" >"$out/serve256.txt" 2>&1
a0=$(metric kiln:kv_cache_slots_allocated_total); u0=$(metric kiln:kv_cache_slots_used_total)
s0=$(metric kiln:engine_step_seconds_total); l0=$(metric kiln:scheduler_loop_seconds_total)
$k bench serve --url http://127.0.0.1:8765 --concurrency 64 --num-requests 256 --warmup 64 \
	--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$out/serve64.json" >"$out/serve64.txt" 2>&1
s1=$(metric kiln:engine_step_seconds_total); l1=$(metric kiln:scheduler_loop_seconds_total)
a1=$(metric kiln:kv_cache_slots_allocated_total); u1=$(metric kiln:kv_cache_slots_used_total)
curl -s http://127.0.0.1:8765/metrics >"$out/metrics.txt"
kill -TERM $server; wait $server
grep -E '^\| tg' "$out/offline.txt"
head -3 "$out/serve256.txt"; head -3 "$out/serve64.txt"
python3 -c "
s0,l0,s1,l1,a0,u0,a1,u1=map(float,'$s0 $l0 $s1 $l1 $a0 $u0 $a1 $u1'.split())
print(f'256 streams: allocated KV slots left empty {100*(1-u0/a0):.2f}%')
print(f'64 streams: scheduler time outside engine steps {100*((l1-l0)-(s1-s0))/(l1-l0):.2f}%; allocated KV slots left empty {100*(1-(u1-u0)/(a1-a0)):.2f}%')"
