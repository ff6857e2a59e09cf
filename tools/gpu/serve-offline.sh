#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: issue 15's "serve
# ≥ 95% of offline at the same load", each side measured in one call on the
# random Llama-3-8B shape in each of ${FORMATS:-bf16} (bf16, fp8: its `kiln
# quantize --to fp8` checkpoint), 128/128-token requests, at most 256
# running (kiln serve's defaults otherwise):
#   - offline: kiln bench throughput (${REQUESTS:-5120} requests handed to
#     serve's scheduler at once, in process: vLLM's bench throughput), and
#     kiln bench model --mixed 256 (every step 256 decodes and a 256-token
#     prompt, depth 128);
#   - served: kiln bench serve against kiln serve, 256 closed-loop streams
#     (the first 256 requests left out), then, unless ALL=0, every request
#     sent at once (--rate 1000000: the server's queue holds them all).
# Every run draws prompts of its own seed. Prints each run's figures and the
# server's steps, output tokens and step seconds over each served run.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-offline.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
work=$(mktemp -d)
t0=$(date +%s)
n=${REQUESTS:-5120}
serve_seed=${serve_seed:-0}
random_bf16
for f in ${FORMATS:-bf16}; do
	model=$bf16
	if [ "$f" = fp8 ]; then
		random_fp8
		model=$fp8
	fi
	echo "== $f"
	$k bench throughput "$model" --tokenizer "$tok" --device cuda --max-num-seqs 256 --num-requests "$n" --seed "9$((++serve_seed))" \
		--output "$work/$f-throughput.json" >"$work/$f-throughput.txt" 2>&1
	echo "bench throughput: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^\|' "$work/$f-throughput.txt"
	offline_mixed "$model" "$work/$f-mixed.txt"
	serve_bound 256 "$model" --max-queued-requests "$n" || continue
	echo "before: $(serve_counters)"
	SERVE_TIMEOUT=200 serve_run "$f-closed" 256 "$n" 256
	echo "closed loop: $(serve_counters)"
	serve_summary "$work/$f-closed.json"
	if [ "${ALL:-1}" != 0 ]; then
		serve_seed=$((serve_seed + 1))
		timeout 200 $k bench serve --url http://127.0.0.1:8765 --rate 1000000 --num-requests "$n" --seed "$serve_seed" \
			--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$work/$f-all.json" >"$work/$f-all.txt" 2>&1
		echo "all at once: rc=$? at $(($(date +%s) - t0)) s: $(serve_counters)"
		serve_summary "$work/$f-all.json"
	fi
	kill -TERM $server
	wait $server
done
mkdir -p "$out"
tar czf "$out/offline.tgz" -C "$work" .
