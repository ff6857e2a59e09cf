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
tp_env
work=$out # logs straight to $OUT: they come back even when a call runs out of time
t0=$(date +%s)
gpus=$(nvidia-smi -L | wc -l)
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
serve_up
echo "server tp$n up after $(($(date +%s) - t0)) s"
run() { serve_run "$@"; }
run serve-tp$n-c1 1 16 2
run serve-tp$n-c64 64 256 64
run serve-tp$n-c256 256 768 256
kill -TERM $server
for i in $(seq 1 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
kill -QUIT $server 2>/dev/null # a stack dump in serve.log if it has not exited
wait $server
echo "server exit $?"
python3 tools/gpu/tp_table.py "$work" $(for n in $sizes; do echo tp$n; done)
for f in "$work"/serve-*.json; do echo "$(basename "$f"): $(serve_summary "$f")"; done
grep -iE "nccl|all-reduce|all-gather" "$work"/profile-tp*.txt | head -20
