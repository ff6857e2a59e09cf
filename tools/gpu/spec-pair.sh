#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here, with Debian's
# bible-kjv installed here (build.sh carries the King James Bible in
# .devbin/data/kjv): speculative decoding on trained models (issue 19).
#  1. kiln bench spec on the random Llama-3-8B shape in bf16 (acceptance
#     set by drafting its own greedy tokens; where a run's rounding leaves
#     them the drafter re-derives the plain continuation), 2 and 4 drafts
#     (ORACLE=0 skips it).
#  2. A target for the demo model to draft for: tools/demo-model/train.py
#     trains a deeper Llama on the demo's books with the demo's tokenizer
#     settings (the same BPE, checked: the two tokenizer.json are compared),
#     hidden 512, 16 layers, SwiGLU 1536 (about 52M parameters).
#  3. kiln run on that target, greedy, 256 tokens, three passages of the
#     corpus and three of the held-out books as prompts: plain, prompt
#     lookup (2 and 4 drafts) and the demo model as draft model (2 and 4),
#     REPS (default 3) repetitions interleaved; a table of median eval
#     rates, kept drafts, and where a speculative run's text first left
#     plain's (rounding in bf16).
# Logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/spec-pair.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
if [ "${ORACLE:-1}" != 0 ]; then
	random_bf16
	ids=$(random_ids 64)
	for kk in 2 4; do
		echo "8B bf16, $kk drafts a step:"
		timeout 150 $k bench spec "$bf16" --device cuda --ids "$ids" --tg 128 --num-speculative-tokens "$kk" \
			--accept 1,0.9,0.8,0.7,0.6,0.4,0.2 --reps 2 2>"$out/oracle-k$kk.err" | grep -v '^model'
	done
	echo "bench spec done at $(($(date +%s) - t0)) s"
fi
[ -f .devbin/data/kjv/kjv.txt ] || { echo "no .devbin/data/kjv/kjv.txt: install bible-kjv where build.sh runs"; exit 2; }
target=$keep/kjv-deep
if [ ! -f "$target/files/config.json" ]; then
	PYTHONUNBUFFERED=1 python3 tools/demo-model/train.py --data .devbin/data/kjv --out "$target" --seed 1234 \
		--steps "${STEPS:-800}" --hidden 512 --layers 16 --heads 8 --kv-heads 4 --intermediate 1536 >"$out/train.log" 2>&1
	echo "train: rc=$? at $(($(date +%s) - t0)) s"
	grep -E "params|best|heldout overall" "$out/train.log" | tail -4
fi
if cmp -s "$target/files/tokenizer.json" demo/files/tokenizer.json; then
	echo "tokenizer: the target's is the demo's"
else
	echo "tokenizer: the target's differs from the demo's; the draft model's figures are not meaningful"
fi
corpus=.devbin/shared/corpora/war-and-peace.txt
[ -f "$corpus" ] || corpus=../shared/corpora/war-and-peace.txt
cat "$target"/testdata/heldout/*.txt >"$out/heldout.txt"
prompts=()
for i in 1 2 3; do
	prompts+=("$(python3 -c "import sys; t=open(sys.argv[1], encoding='utf-8').read(); n=len(t); s=int(sys.argv[2])*n//4; print(t[s:s+600])" "$corpus" "$i")")
done
for i in 1 2 3; do
	prompts+=("$(python3 -c "import sys; t=open(sys.argv[1], encoding='utf-8').read(); n=len(t); s=int(sys.argv[2])*n//4; print(t[s:s+600])" "$out/heldout.txt" "$i")")
done
modes=("plain" "ngram 2" "ngram 4" "draft 2" "draft 4")
for p in 0 1 2 3 4 5; do
	label=war-p$((p + 1))
	[ $p -ge 3 ] && label=kjv-p$((p - 2))
	for rep in $(seq 1 "${REPS:-3}"); do
		for mode in "${modes[@]}"; do
			set -- $mode
			spec=()
			[ "$1" = ngram ] && spec=(--speculative ngram --num-speculative-tokens "$2")
			[ "$1" = draft ] && spec=(--draft-model demo/files --num-speculative-tokens "$2")
			name=$label-${mode// /}-r$rep
			timeout 120 $k run "$target/files" --device cuda --temperature 0 --max-tokens 256 --verbose "${spec[@]}" \
				--prompt "${prompts[$p]}" >"$out/$name.out" 2>"$out/$name.err"
		done
	done
done
echo "runs done at $(($(date +%s) - t0)) s"
python3 - "$out" <<'PY'
import glob, os, re, sys, collections
w = sys.argv[1]
rows, acc, same = collections.defaultdict(list), collections.defaultdict(list), {}
diff = collections.defaultdict(list)
for f in glob.glob(os.path.join(w, "*-r[0-9]*.err")):
    m = re.match(r"(.*)-(plain|ngram\d|draft\d)-r(\d)\.err", os.path.basename(f))
    label, mode, rep = m.groups()
    t = open(f).read()
    rate = re.search(r"eval rate:\s+([\d.]+)", t.split("prompt eval rate")[-1])
    if rate:
        rows[(label, mode)].append(float(rate.group(1)))
    a = re.search(r"(\d+) drafted tokens, (\d+) kept", t)
    if a:
        acc[(label, mode)].append((int(a.group(1)), int(a.group(2))))
    try:
        out = open(f[:-4] + ".out").read()
        plain = open(os.path.join(w, f"{label}-plain-r{rep}.out")).read()
    except OSError:
        continue
    if out != plain:
        diff[(label, mode)].append(next(i for i in range(min(len(out), len(plain)) + 1) if i == min(len(out), len(plain)) or out[i] != plain[i]))
print("| prompt | drafts | eval tok/s (median) | vs plain | drafted | kept | plain's text (runs that left it: at character) |")
print("|---|---|---|---|---|---|---|")
for (label, mode) in sorted(rows):
    med = lambda v: sorted(v)[len(v) // 2]
    v, base = med(rows[(label, mode)]), med(rows[(label, "plain")]) if rows.get((label, "plain")) else 0
    d = sum(x for x, _ in acc[(label, mode)]); kept = sum(y for _, y in acc[(label, mode)])
    print(f"| {label} | {mode} | {v:.1f} | {v / base if base else float('nan'):.2f}× | {d} | {kept} ({100 * kept / max(d, 1):.0f}%) | {'same' if not diff[(label, mode)] else 'left at ' + ', '.join(map(str, sorted(diff[(label, mode)])))} |")
PY
# kiln serve speculating on the target warms its verifying steps before it
# answers: its log says so.
$k serve "$target/files" --device cuda --speculative ngram --num-speculative-tokens 4 --port 8765 >"$out/serve.log" 2>&1 &
server=$!
serve_up 90
grep -E 'warmed up' "$out/serve.log" | cut -c1-400
kill -TERM $server
wait $server
