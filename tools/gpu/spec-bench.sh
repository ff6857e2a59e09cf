#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here (or on this machine
# with DEVICE=cpu): speculative decoding at batch 1 (issue 19). kiln run
# --verbose, greedy, 256 tokens, plain and with prompt-lookup drafts of 2, 4
# and 8 tokens, interleaved, on (1) the random Llama-3-8B-shaped bf16 model
# with a repetitive prompt (64 random ids three times: its greedy output
# repeats too) and (2) the demo model with passages of the corpus as
# prompts; then kiln serve with and without speculation under kiln bench
# serve at 1, 4, 16 and 64 streams of 128/128 tokens (random prompts: the
# low-acceptance case, in a warm process; and where it stops paying, with
# --speculative-max-seqs 64 so it never switches itself off), plain then
# speculating (4 drafts), on the 8B shape. Then kiln bench spec (acceptance
# rates set by drafting the model's own tokens, made wrong with chance 1-p)
# on both models at 2, 4 and 8 drafts. SERVE=0 skips the serving part,
# ORACLE=0 the bench spec part, RUNS=0 the kiln run part; STREAMS (default
# "1 4 16 64") the serving runs' concurrencies. Writes logs under $OUT and prints tables of
# eval rates and acceptance, and of the serving runs.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/spec-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
device=${DEVICE:-cuda}
work=$out
corpus=${CORPUS:-.devbin/shared/corpora/war-and-peace.txt}
[ -f "$corpus" ] || corpus=../shared/corpora/war-and-peace.txt
runs() { # label model-args...
	local label=$1
	shift
	for rep in 1 2; do
		for k in 0 2 4 8; do
			local spec=()
			[ "$k" -gt 0 ] && spec=(--speculative ngram --num-speculative-tokens "$k")
			timeout 300 $k_bin run "$@" --device "$device" --temperature 0 --max-tokens 256 --verbose "${spec[@]}" \
				>"$work/$label-k$k-r$rep.out" 2>"$work/$label-k$k-r$rep.err"
		done
	done
}
k_bin=$k
t0=$(date +%s)
if [ "$device" = cuda ] && [ "${SERVE:-1}" != 0 ]; then
	random_bf16
	tok=$llama3_tok
	for mode in plain spec; do
		spec=()
		[ $mode = spec ] && spec=(--speculative ngram --num-speculative-tokens 4 --speculative-max-seqs 64)
		$k serve "$bf16" --tokenizer "$tok" --device cuda --max-num-seqs 64 --port 8765 "${spec[@]}" >"$work/serve-$mode.log" 2>&1 &
		server=$!
		serve_up 90
		echo "server $mode up after $(($(date +%s) - t0)) s"
		for c in "1 24 4" "4 48 8" "16 96 16" "64 192 64"; do
			set -- $c
			[[ " ${STREAMS:-1 4 16 64} " == *" $1 "* ]] || continue
			SERVE_TIMEOUT=60 serve_run "serve-$mode-c$1" "$1" "$2" "$3"
		done
		curl -s http://127.0.0.1:8765/metrics | grep -E '^kiln:spec_decode' >"$work/metrics-$mode.txt"
		kill -TERM $server
		timeout 30 tail --pid=$server -f /dev/null || kill -KILL $server
		wait $server
	done
	python3 - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
print("| streams | plain out tok/s | speculating | ratio | TPOT p50 plain / spec (ms) |")
print("|---|---|---|---|---|")
for c in (1, 4, 16, 64):
    if not os.path.exists(os.path.join(w, f"serve-plain-c{c}.json")) and not os.path.exists(os.path.join(w, f"serve-spec-c{c}.json")):
        continue
    try:
        p = json.load(open(os.path.join(w, f"serve-plain-c{c}.json")))["summary"]
        s = json.load(open(os.path.join(w, f"serve-spec-c{c}.json")))["summary"]
    except Exception as e:
        print(f"| {c} | failed: {e} |")
        continue
    print(f"| {c} | {p['output_tokens_per_s']:.0f} | {s['output_tokens_per_s']:.0f} | {s['output_tokens_per_s'] / p['output_tokens_per_s']:.3f}× | {p['tpot']['p50_ms']:.2f} / {s['tpot']['p50_ms']:.2f} |")
PY
	cat "$work/metrics-spec.txt"
fi
# kiln bench spec: the verifying steps at acceptance rates set by drafting
# the model's own greedy tokens, each made wrong with chance 1-p: the 8B
# shape in bf16 and in f32 (where a verifying step's rows round as a plain
# step's closely enough to keep plain greedy's tokens), then the demo
# model, at 2, 4 and 8 drafts. ORACLE=0 skips it.
if [ "${ORACLE:-1}" != 0 ]; then
	ids=$(random_ids 64)
	oracle() { # label kk model-args...
		local label=$1 kk=$2
		shift 2
		echo "$label, $kk drafts a step:"
		timeout 150 $k bench spec "$@" --tg 128 --num-speculative-tokens "$kk" --accept 1,0.9,0.8,0.7,0.6,0.4,0.2 --reps 2 2>"$work/oracle-$label-k$kk.err" |
			grep -v '^model'
	}
	if [ "$device" = cuda ]; then
		random_bf16
		f32=$keep/llama3-8b-f32
		[ -f "$f32/config.json" ] || $k bench model --random llama3-8b --dtype f32 --keep "$keep" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 >"$work/write-f32.txt" 2>&1
		for kk in 2 4 8; do
			oracle 8b-bf16 $kk "$bf16" --device cuda --ids "$ids"
			oracle 8b-f32 $kk "$f32" --device cuda --dtype f32 --ids "$ids"
		done
	fi
	for kk in 2 4 8; do oracle demo $kk --device "$device"; done
	echo "oracle part done at $(($(date +%s) - t0)) s"
fi
[ "${RUNS:-1}" = 0 ] && exit 0
if [ "$device" = cuda ]; then
	random_bf16
	ids=$(random_ids 64)
	ids="$ids,$ids,$ids"
	runs llama3-8b "$bf16" --ids "$ids"
fi
for i in 1 2 3; do
	prompt=$(python3 -c "import sys; t=open(sys.argv[1], encoding='utf-8').read(); n=len(t); s=int(sys.argv[2])*n//4; print(t[s:s+600])" "$corpus" "$i")
	runs demo-p$i --prompt "$prompt"
done
python3 - "$work" <<'PY'
import glob, os, re, sys, collections
w = sys.argv[1]
rows = collections.defaultdict(list)
acc = collections.defaultdict(list)
for f in glob.glob(os.path.join(w, "*.err")):
    m = re.match(r"(.*)-k(\d+)-r\d+\.err", os.path.basename(f))
    t = open(f).read()
    rate = re.search(r"eval rate:\s+([\d.]+)", t.split("prompt eval rate")[-1])
    if rate:
        rows[(m.group(1), int(m.group(2)))].append(float(rate.group(1)))
    a = re.search(r"(\d+) drafted tokens, (\d+) kept", t)
    if a:
        acc[(m.group(1), int(m.group(2)))].append((int(a.group(1)), int(a.group(2))))
print("| workload | drafts a step | eval tok/s (median) | vs plain | drafted | kept |")
print("|---|---|---|---|---|---|")
for (label, k) in sorted(rows):
    v = sorted(rows[(label, k)])[len(rows[(label, k)]) // 2]
    base = sorted(rows[(label, 0)])[len(rows[(label, 0)]) // 2] if rows.get((label, 0)) else 0
    d = sum(x for x, _ in acc[(label, k)]); kept = sum(y for _, y in acc[(label, k)])
    print(f"| {label} | {k} | {v:.1f} | {v / base:.2f}× | {d} | {kept} ({100 * kept / max(d, 1):.0f}%) |")
PY
