#!/usr/bin/env bash
# Batch-1 decode on the CPU, kiln against llama.cpp on the same GGUF files,
# at the same thread counts, interleaved (issue 16): a random model of the
# demo-110m shape (stories110M's, with the demo's vocabulary) written by
# kiln quantize as F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_K and Q4_0 (FORMATS,
# a space-separated list, picks others). llama.cpp is
# tools/cpu/llama_decode.c on node-llama-cpp's prebuilt libraries
# (tools/cpu/llama-decode.sh; LLAMA_LIBDIR, default where
# `npm install node-llama-cpp@3.22.1` in /tmp/nlcjs puts them): its C API,
# no node, greedy steps after 8 of warm-up as kiln bench model --tg times
# them. Both generate TOKENS tokens after the BOS token; each figure is one
# run, and the rounds interleave the two programs so that drifts of the
# machine hit both. SHAPE picks another random shape (moe-demo: a mixture
# of experts of the demo's vocabulary).
#   [SHAPE=demo-110m] [FORMATS=...] tools/cpu/llama-peer.sh [threads, e.g. "1 2"] [tokens] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${1:-1 2} tokens=${2:-64} rounds=${3:-3}
dir=${KILN_BENCH_DIR:-/tmp/kiln-cpu-peer}
mkdir -p "$dir"
go build -o "$dir/kiln" ./cmd/kiln
k=$dir/kiln
shape=${SHAPE:-demo-110m}
src=$dir/$shape-f32
if [ ! -f "$src/config.json" ]; then
	$k bench model --random "$shape" --dtype f32 --keep "$dir" --pp 0 --tg 1 --batch 1 --reps 1 --device cpu >/dev/null
fi
cp demo/files/tokenizer.json demo/files/tokenizer_config.json "$src/"
formats=${FORMATS:-f16 q8_0 q6_k q5_k_m q4_k_m q4_k q4_0}
pre=$dir/
[ "$shape" = demo-110m ] || pre=$dir/$shape-
for f in $formats; do
	[ -f "$pre$f.gguf" ] || $k quantize "$src" "$pre$f.gguf" --to "$f" >/dev/null
done
tokps() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"])'; }
kiln() { # file threads
	$k bench model "$1" --device cpu --threads "$2" --pp 0 --tg "$tokens" --batch 1 --reps 1 --json |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["tokens_per_s"])'
}
llama() { tools/cpu/llama-decode.sh "$1" "$tokens" "$2" 2>/dev/null | tokps; }
echo "| format | threads | round | kiln tokens/s | llama.cpp tokens/s | kiln ÷ llama.cpp |"
echo "|---|---|---|---|---|---|"
for r in $(seq "$rounds"); do
	for f in $formats; do
		for th in $threads; do
			kt=$(kiln "$pre$f.gguf" "$th")
			lt=$(llama "$pre$f.gguf" "$th")
			python3 -c "print('| $f | $th | $r | %.1f | %.1f | %.2f |' % ($kt, $lt, $kt / $lt))"
		done
	done
done
