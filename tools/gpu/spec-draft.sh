#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: speculative
# decoding with a draft model whose keys and values share the target's KV
# cache, in kiln run and kiln serve (issue 19).
#  1. kiln run, the demo model drafting for itself (--draft-model
#     demo/files, 4 drafts), greedy, 256 tokens, a War and Peace passage:
#     the draft's entries are read back through its target's block tables,
#     so every draft should be kept; the text is compared with plain's.
#  2. kiln serve of the random Llama-3-8B shape (bf16) under kiln bench
#     serve (random 128-token prompts, 128 tokens out) at STREAMS (default
#     "1 4 16 64"), one run after another on each server: plain, prompt
#     lookup (4 drafts) and a random Llama-3.2-1B-shaped draft model (4
#     drafts; random, so its drafts are few kept: the cost of drafting
#     where it does not pay), each --speculative-max-seqs MAX_SPECS
#     (default 4, kiln serve's).
#  3. kiln serve of the demo model, plain and drafting for itself (its
#     drafts all kept but for rounding: the shared cache's entries are
#     right on the GPU), at 1, 64 and 256 streams on one server each,
#     drafting at any batch (--speculative-max-seqs 256).
# Prints tables of output tokens/s and the spec_decode counters; logs
# under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/spec-draft.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
work=$out
corpus=.devbin/shared/corpora/war-and-peace.txt
prompt=$(python3 -c "import sys; t=open(sys.argv[1], encoding='utf-8').read(); s=len(t)//2; print(t[s:s+600])" "$corpus")
for mode in plain draft; do
	spec=()
	[ $mode = draft ] && spec=(--draft-model demo/files --num-speculative-tokens 4)
	timeout 120 $k run --device cuda --temperature 0 --max-tokens 256 --verbose --prompt "$prompt" "${spec[@]}" \
		>"$work/run-$mode.out" 2>"$work/run-$mode.err"
	echo "run $mode: rc=$? at $(($(date +%s) - t0)) s; $(grep -E '^eval rate|drafted tokens' "$work/run-$mode.err" | tr '\n' ' ')"
done
cmp -s "$work/run-plain.out" "$work/run-draft.out" && echo "run: the same text" || echo "run: the texts differ"

# serve_mode NAME STREAMS MODEL SERVE-ARGS... starts kiln serve on MODEL,
# runs kiln bench serve at each of STREAMS (4 requests a stream, at least
# 24), saves the spec_decode counters and stops it.
serve_mode() {
	local name=$1 streams=$2 model=$3
	shift 3
	$k serve "$model" --tokenizer "$tok" --device cuda --port 8765 "$@" >"$work/serve-$name.log" 2>&1 &
	local server=$!
	serve_up 180 || echo "server $name did not come up"
	echo "server $name up at $(($(date +%s) - t0)) s"
	for c in $streams; do
		SERVE_TIMEOUT=90 serve_run "serve-$name-c$c" "$c" $((c * 4 > 24 ? c * 4 : 24)) "$c"
	done
	curl -s http://127.0.0.1:8765/metrics | grep -E '^kiln:spec_decode' >"$work/metrics-$name.txt"
	kill -TERM $server
	timeout 30 tail --pid=$server -f /dev/null || kill -KILL $server
	wait $server
	grep -iE "error|panic|out of memory" "$work/serve-$name.log" | head -3
}

random_bf16
tok=$llama3_tok
draft=$keep/llama3.2-1b-bf16
[ -f "$draft/config.json" ] || $k bench model --random llama3.2-1b --keep "$keep" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 >"$work/write-1b.txt" 2>&1
streams=${STREAMS:-1 4 16 64}
max_specs=${MAX_SPECS:-4}
serve_mode 8b-plain "$streams" "$bf16" --max-num-seqs 64
serve_mode 8b-ngram "$streams" "$bf16" --max-num-seqs 64 --speculative ngram --num-speculative-tokens 4 --speculative-max-seqs "$max_specs"
serve_mode 8b-draft "$streams" "$bf16" --max-num-seqs 64 --draft-model "$draft" --num-speculative-tokens 4 --speculative-max-seqs "$max_specs"

tok=demo/files/tokenizer.json
serve_mode demo-plain "1 64 256" demo/files --max-num-seqs 256
serve_mode demo-draft "1 64 256" demo/files --max-num-seqs 256 --draft-model demo/files --num-speculative-tokens 4 --speculative-max-seqs 256

python3 - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
def summary(name, c):
    try:
        return json.load(open(os.path.join(w, f"serve-{name}-c{c}.json")))["summary"]
    except Exception:
        return None
def counters(name):
    d = {}
    try:
        for line in open(os.path.join(w, f"metrics-{name}.txt")):
            k, v = line.split()
            d[k.split("kiln:spec_decode_")[1]] = float(v)
    except Exception:
        pass
    return d
for model, modes, streams in (("8b", ("ngram", "draft"), (1, 4, 16, 64)), ("demo", ("draft",), (1, 64, 256))):
    print(f"\n{model}: | streams | plain out tok/s | " + " | ".join(f"{m} | ratio | errors" for m in modes) + " |")
    for c in streams:
        p = summary(f"{model}-plain", c)
        if p is None:
            continue
        cells = [f"{p['output_tokens_per_s']:.0f}"]
        for m in modes:
            s = summary(f"{model}-{m}", c)
            if s is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{s['output_tokens_per_s']:.0f}", f"{s['output_tokens_per_s'] / p['output_tokens_per_s']:.3f}×", f"{s['errors']}"]
        print(f"| {c} | " + " | ".join(cells) + " |")
    for m in modes:
        d = counters(f"{model}-{m}")
        if d:
            print(f"{model} {m}: {d.get('num_drafts_total', 0):.0f} drafts, {d.get('num_draft_tokens_total', 0):.0f} drafted, "
                  f"{d.get('num_accepted_tokens_total', 0):.0f} kept")
PY
echo "done at $(($(date +%s) - t0)) s"
