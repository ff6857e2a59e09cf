#!/usr/bin/env bash
# Runs on a GPU machine of several GPUs after tools/gpu/build.sh here: tensor
# parallelism (issue 20) on the Llama-3-8B-shaped random bf16 model, at
# TP=1 and every group size up to the GPUs there (2, 4): prefill of 2048
# tokens and decode at depth 512 for batches 1, 64, 128 and 256 (kiln bench
# model), a profiled decode of each TP>1 (the all-reduce's share of a step),
# and kiln serve --tensor-parallel-size N under kiln bench serve at 1, 64 and
# 256 streams of 128/128 tokens, one run after another on the same server.
# Writes its logs, JSON and HTML charts under $OUT and prints a summary table last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-bench.sh",
#   carry [".devpack"], kind nvidia-h200-x2 (or -x4)
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines
work=$out # logs straight to $OUT: they come back even when a call runs out of time
t0=$(date +%s)
gpus=$(nvidia-smi -L | wc -l)
{ nvidia-smi -L; nvidia-smi topo -m; } >"$work/env.txt" 2>&1
random_bf16
sizes="1"
for n in 2 4 8; do [ "$n" -le "$gpus" ] && sizes="$sizes $n"; done
for n in $sizes; do
	timeout -s QUIT 150 $k bench model "$bf16" --device cuda --tensor-parallel-size "$n" --pp 2048 --tg 64 --depth 512 --batch 1,64,128,256 --reps 3 \
		--output "$work/model-tp$n.json" >"$work/model-tp$n.txt" 2>&1
	echo "bench model tp$n: rc=$? at $(($(date +%s) - t0)) s"
done
for n in $sizes; do
	[ "$n" = 1 ] && continue
	timeout -s QUIT 100 $k bench model "$bf16" --device cuda --tensor-parallel-size "$n" --pp 0 --tg 16 --depth 512 --batch 1,64 --reps 1 --profile \
		>"$work/profile-tp$n.txt" 2>&1
	echo "profile tp$n: rc=$? at $(($(date +%s) - t0)) s"
done
tok=$llama3_tok
n=${sizes##* }
$k serve "$bf16" --tokenizer "$tok" --device cuda --tensor-parallel-size "$n" --max-num-seqs 256 --port 8765 >"$work/serve.log" 2>&1 &
server=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
echo "server tp$n up after $(($(date +%s) - t0)) s"
run() { # name concurrency requests warmup
	timeout 120 $k bench serve --url http://127.0.0.1:8765 --concurrency "$2" --num-requests "$3" --warmup "$4" \
		--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$work/$1.json" --html "$work/$1.html" >"$work/$1.txt" 2>&1
	echo "$1: rc=$? at $(($(date +%s) - t0)) s"
}
run serve-tp$n-c1 1 16 2
run serve-tp$n-c64 64 256 64
run serve-tp$n-c256 256 768 256
kill -TERM $server
for i in $(seq 1 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
kill -QUIT $server 2>/dev/null # a stack dump in serve.log if it has not exited
wait $server
echo "server exit $?"
python3 - "$work" $sizes <<'PY'
import json, sys, os, glob
w, sizes = sys.argv[1], sys.argv[2:]
print("| TP | prefill 2048 tok/s | decode b1 tok/s | b64 | b128 | b256 | roofline b1 / b64 (of the group's copy bandwidth) |")
print("|---|---|---|---|---|---|---|")
base = {}
for n in sizes:
    try:
        r = json.load(open(os.path.join(w, f"model-tp{n}.json")))
    except Exception as e:
        print(f"| {n} | failed: {e} |"); continue
    pp = [x for x in r["results"] if x.get("test", "").startswith("pp")]
    tg = {x["batch"]: x for x in r["results"] if x.get("test", "").startswith("tg")}
    cells = [f"{pp[0]['tokens_per_s']:.0f}" if pp else "-"]
    cells += [f"{tg[b]['tokens_per_s']:.0f}" if b in tg else "-" for b in (1, 64, 128, 256)]
    roof = " / ".join(f"{tg[b].get('roofline_fraction', 0):.2f}" for b in (1, 64) if b in tg)
    print(f"| {n} | " + " | ".join(cells) + f" | {roof} |")
for f in sorted(glob.glob(os.path.join(w, "serve-*.json"))):
    s = json.load(open(f))["summary"]
    print(os.path.basename(f), "requests", s["requests"], "errors", s["errors"], "out tok/s %.0f" % s["output_tokens_per_s"],
          "ttft", s["ttft"], "itl", s["itl"], "tpot", s["tpot"])
PY
grep -iE "nccl|all-reduce|all-gather" "$work"/profile-tp*.txt | head -20
