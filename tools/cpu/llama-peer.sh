#!/usr/bin/env bash
# Batch-1 decode on the CPU, kiln against llama.cpp on the same GGUF files
# and threads, interleaved (issue 16): a random model of the demo-110m shape
# (stories110M's, with the demo's vocabulary) written by kiln quantize as
# F16, Q8_0, Q6_K and Q4_K. llama.cpp comes from node-llama-cpp's prebuilt
# binaries: NLC_DIR must hold `npm install node-llama-cpp@3.22.1`.
#   NLC_DIR=/tmp/nlcjs tools/cpu/llama-peer.sh [threads] [tokens] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${1:-2} tokens=${2:-64} rounds=${3:-2}
dir=${KILN_BENCH_DIR:-/tmp/kiln-cpu-peer}
mkdir -p "$dir"
go build -o "$dir/kiln" ./cmd/kiln
k=$dir/kiln
src=$dir/demo-110m-f32
if [ ! -f "$src/config.json" ]; then
	$k bench model --random demo-110m --dtype f32 --keep "$dir" --pp 0 --tg 1 --batch 1 --reps 1 --device cpu >/dev/null
fi
cp demo/files/tokenizer.json demo/files/tokenizer_config.json "$src/"
cp tools/cpu/llama_peer.mjs "$NLC_DIR/"
for f in f16 q8_0 q6_k q4_k; do
	[ -f "$dir/$f.gguf" ] || $k quantize "$src" "$dir/$f.gguf" --to "$f" >/dev/null
done
# llama.cpp runs at 1 thread and at THREADS, and its faster figure counts:
# through node-llama-cpp on a 2-core machine, 2 threads were 2-3 times
# slower than 1 (its worker thread and ggml's compete for the cores).
llama() { # file threads
	node "$NLC_DIR/llama_peer.mjs" "$1" "$tokens" "$2" 2>/dev/null | tail -1 |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])'
}
echo "| format | round | kiln tokens/s ($threads threads) | llama.cpp tokens/s (1 thread / $threads) | kiln ÷ llama.cpp's best |"
echo "|---|---|---|---|---|"
for r in $(seq "$rounds"); do
	for f in f16 q8_0 q6_k q4_k; do
		kt=$($k bench model "$dir/$f.gguf" --device cpu --threads "$threads" --pp 0 --tg "$tokens" --batch 1 --reps 1 --json |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["tokens_per_s"])')
		l1=$(llama "$dir/$f.gguf" 1)
		ln=$(llama "$dir/$f.gguf" "$threads")
		python3 -c "print('| $f | $r | %.1f | %.1f / %.1f | %.2f |' % ($kt, $l1, $ln, $kt / max($l1, $ln)))"
	done
done
