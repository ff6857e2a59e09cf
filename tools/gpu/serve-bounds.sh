#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: kiln serve on the
# Llama-3-8B-shaped random bf16 model with each of the step bounds
# ${BOUNDS:-"256 0"} (--decode-prefill-tokens: a step's prompt tokens while
# sequences decode; 0: the step budget alone) and the step budget
# ${BUDGET:-0} (--max-num-batched-tokens; 0: the server's default), a
# server a bound, under kiln bench serve at 256, 64 and 1 streams of
# 128/128 tokens (every run's prompts its own: serve_run), and prints a
# table of throughput, TTFT, ITL and TPOT, and the server's steps, CUDA
# graphs and time outside its steps, a bound and run.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-bounds.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
work=$(mktemp -d)
t0=$(date +%s)
random_bf16
# snap NAME appends the server's step, graph and scheduler counters to
# $work/snaps.txt.
snap() {
	echo "$1 $(metric kiln:cuda_steps_total) $(metric kiln:cuda_graph_captures_total) $(metric kiln:cuda_graph_replays_total) $(metric kiln:engine_step_seconds_total) $(metric kiln:scheduler_loop_seconds_total)" >>"$work/snaps.txt"
}
for b in ${BOUNDS:-256 0}; do
	serve_bound "$b" "$bf16" --max-num-batched-tokens "${BUDGET:-0}" || continue
	snap "b$b-c256-start"
	SERVE_TIMEOUT=100 serve_run "b$b-c256" 256 1792 256
	snap "b$b-c256-end"
	SERVE_TIMEOUT=60 serve_run "b$b-c64" 64 512 64
	snap "b$b-c64-end"
	SERVE_TIMEOUT=60 serve_run "b$b-c1" 1 24 2
	snap "b$b-c1-end"
	grep -E 'warmed up|slow step' "$work/serve-$b.log" | cut -c1-300
	kill -TERM $server
	wait $server
done
python3 - "$work" ${BOUNDS:-256 0} <<'PY'
import json, sys, os
sys.path.insert(0, "tools/gpu")
from snaps import load
w = sys.argv[1]
snaps = load(w)
print("| bound | streams | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | ITL p50 ÷ TPOT | ITL p99 ÷ TPOT | errors | steps | graph captures | replays | mean step ms | outside steps |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for b in sys.argv[2:]:
    for c, before in (("256", "c256-start"), ("64", "c256-end"), ("1", "c64-end")):
        a, z = snaps.get(f"b{b}-{before}"), snaps.get(f"b{b}-c{c}-end")
        extra = ""
        if a and z and len(a) == 5 and len(z) == 5:
            st = z[0] - a[0]
            extra = f" {st:.0f} | {z[1]-a[1]:.0f} | {z[2]-a[2]:.0f} | {1e3*(z[3]-a[3])/st:.2f} | {100*(1-(z[3]-a[3])/(z[4]-a[4])):.1f}% |" if st else ""
        try:
            s = json.load(open(os.path.join(w, f"b{b}-c{c}.json")))["summary"]
        except Exception as e:
            print(f"| {b} | {c} | failed: {e} |"); continue
        t, i, p = s["ttft"], s["itl"], s["tpot"]
        print(f"| {b} | {c} | {s['output_tokens_per_s']:.0f} | {t['p50_ms']:.1f} / {t['p99_ms']:.1f} | {i['p50_ms']:.2f} / {i['p99_ms']:.2f} | {p['p50_ms']:.2f} | {i['p50_ms']/p['p50_ms']:.2f} | {i['p99_ms']/p['p50_ms']:.2f} | {s['errors'] or 0} |" + extra)
PY
mkdir -p "$out"
tar czf "$out/budget.tgz" -C "$work" .
