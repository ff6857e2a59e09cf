#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: kiln serve on the
# Llama-3-8B-shaped random bf16 model, driven by kiln bench serve at 256, 64,
# 1 and again 256 concurrent streams of 128 prompt / 128 output tokens, one
# run after another on the same server (where out-of-memory failures and
# bursty streams showed up, issue 15; each run's prompts are its own, and a
# last 256-stream run repeats the first's, which the prefix cache serves),
# beside the offline batched decode of the same shape (kiln bench model --tg
# 128 --depth 128 --batch 256, the same with a 256-token prompt in every
# step, and batch 64 at depth 512). Writes $OUT/serve.tgz (JSON, HTML
# charts, logs, the server's metrics) and prints a summary table last.
# The random model has no tokenizer: prompts are encoded with Llama 3's
# (tools/gpu/env.sh: kiln refuses another vocabulary's); the server
# streams every token as a chunk, text or not.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
work=$(mktemp -d)
t0=$(date +%s)
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 128 --batch 256 --reps 2 \
	--output "$work/offline256.json" >"$work/offline256.txt" 2>&1
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 512 --batch 64 --reps 2 \
	--output "$work/offline64.json" >"$work/offline64.txt" 2>&1
# The same load offline: every step 256 decodes and a 256-token prompt,
# about what a 128/128 workload at 256 streams asks (a prompt token for
# each output token).
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 128 --batch 256 --mixed 256 --reps 2 \
	--output "$work/offline-mixed.json" >"$work/offline-mixed.txt" 2>&1
echo "offline done in $(($(date +%s) - t0)) s"
model="$keep/llama3-8b-bf16"
[ -d "$model" ] || model=$(ls -d "$keep"/llama3-8b-* | head -1)
$k serve "$model" --tokenizer "$tok" --device cuda --max-num-seqs 256 --port 8765 >"$work/serve.log" 2>&1 &
server=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
echo "server up after $(($(date +%s) - t0)) s"
snap() { echo "$1 $(metric kiln:engine_step_seconds_total) $(metric kiln:scheduler_loop_seconds_total) $(metric kiln:kv_cache_slots_allocated_total) $(metric kiln:kv_cache_slots_used_total) $(metric kiln:num_oom_retries_total) $(metric kiln:num_preemptions_total) $(metric kiln:prefix_cache_hits_total) $(metric kiln:prefix_cache_queries_total)" >>"$work/snaps.txt"; }
run() { # name concurrency requests warmup seed
	snap "$1-start"
	$k bench serve --url http://127.0.0.1:8765 --concurrency "$2" --num-requests "$3" --warmup "$4" --seed "$5" \
		--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$work/$1.json" --html "$work/$1.html" >"$work/$1.txt" 2>&1
	echo "$1: rc=$? at $(($(date +%s) - t0)) s"
	snap "$1-end"
}
# Each run draws its prompts with a seed of its own, so none is in the
# prefix cache from an earlier run; the last repeats the first's prompts
# (its seed), which the prefix cache then serves.
run c256 256 1792 256 1
run c64 64 512 64 2
run c1 1 24 2 3
run c256b 256 1792 256 4
run c256same 256 1792 256 1
# With BASE set at build: the earlier sessions' prompts (kiln-base's bench
# serve before da5dc24's successor drew them at random: rotations of one
# sentence, so nearly all of them in the prefix cache).
if [ -x .devbin/kiln-base ]; then k0=$k k=.devbin/kiln-base; run c256old 256 1792 256 1; k=$k0; fi
curl -s http://127.0.0.1:8765/metrics >"$work/metrics.txt"
kill -TERM $server
wait $server
echo "server exit $?"
grep -E 'kv cache|KV cache' "$work/serve.log" | head -3
# The warm-up, and the steps that stalled every stream (kiln serve's log).
grep -E 'warmed up|slow step' "$work/serve.log" | cut -c1-400
grep -E '^\| tg|prompt tokens/s' "$work/offline256.txt" "$work/offline64.txt" "$work/offline-mixed.txt"
python3 - "$work" <<'PY'
import json, sys, os
sys.path.insert(0, "tools/gpu")
from snaps import load
w = sys.argv[1]
snaps = load(w)
print("| run | out tok/s | TTFT p50/p99 ms | ITL p50/p99 ms | TPOT p50/p99 ms | ITL p50/TPOT p50 | ITL p99/TPOT p50 | errors | outside steps | KV empty | OOM retries | preemptions | prompt tokens from the prefix cache |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in ["c256", "c64", "c1", "c256b", "c256same", "c256old"]:
    if not os.path.exists(os.path.join(w, name + ".json")) and name == "c256old": continue
    try:
        s = json.load(open(os.path.join(w, name + ".json")))["summary"]
    except Exception as e:
        print(f"| {name} | failed: {e} |"); continue
    a, b = snaps.get(name + "-start"), snaps.get(name + "-end")
    extra = ["", "", "", "", ""]
    if a and b and len(a) == 8 and len(b) == 8:
        st, lp = b[0] - a[0], b[1] - a[1]
        al, us = b[2] - a[2], b[3] - a[3]
        extra = [f"{100*(lp-st)/lp:.2f}%" if lp else "", f"{100*(1-us/al):.2f}%" if al else "", f"{b[4]-a[4]:.0f}", f"{b[5]-a[5]:.0f}",
                 f"{100*(b[6]-a[6])/(b[7]-a[7]):.1f}%" if b[7] > a[7] else ""]
    t, i, p = s["ttft"], s["itl"], s["tpot"]
    print(f"| {name} | {s['output_tokens_per_s']:.0f} | {t['p50_ms']:.1f} / {t['p99_ms']:.1f} | {i['p50_ms']:.2f} / {i['p99_ms']:.2f} | {p['p50_ms']:.2f} / {p['p99_ms']:.2f} | {i['p50_ms']/p['p50_ms']:.2f} | {i['p99_ms']/p['p50_ms']:.2f} | {s['errors'] or 0} ({100*s['error_rate']:.1f}%) | " + " | ".join(extra) + " |")
PY
mkdir -p "$out"
tar czf "$out/serve.tgz" -C "$work" .
