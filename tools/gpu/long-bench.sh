#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: long prefills
# (issue 18, Llama 3.1's context): `kiln bench model --random llama3.1-8b`
# (the 8B shape with 131,072 positions by llama3 RoPE scaling; the default
# context is the model's own, bounded by memory) prefilling one prompt of
# 8,192, 16,384 and 32,768 tokens, beside transformers' (tools/gpu/torch_peer.py
# --llama31) on the same shape. Logs and JSON under $OUT; a summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/long-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
for pp in 8192 16384 32768; do
	timeout -s QUIT 200 $k bench model --random llama3.1-8b --keep "$keep" --device cuda --pp "$pp" --tg 0 --reps 2 \
		--output "$out/long-pp$pp.json" >"$out/long-pp$pp.txt" 2>&1
	echo "bench model pp$pp: rc=$? at $(($(date +%s) - t0)) s"
	grep -E "^\| pp" "$out/long-pp$pp.txt"
done
for pp in 8192 32768; do
	timeout 300 python3 tools/gpu/torch_peer.py --llama31 --pp "$pp" --batch "" --reps 2 >"$out/long-peer-pp$pp.json" 2>"$out/long-peer-pp$pp.err"
	echo "transformers pp$pp: rc=$? at $(($(date +%s) - t0)) s"
	python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('pp'))" "$out/long-peer-pp$pp.json" 2>&1 | tail -1
done
