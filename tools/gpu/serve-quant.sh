#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: kiln serve on the
# Llama-3-8B-shaped random model's FP8 checkpoint and GGUF Q4_K_M file
# (`kiln quantize` of the random bf16 model), each driven by kiln bench
# serve at 256 (FP8 only), 64 and 1 concurrent streams of 128 prompt / 128
# output tokens one run after another on the same server: the user's path
# for quantized models, checked for failed requests and out-of-memory
# retries. Prints each run's summary line and the server's counters.
#   FORMATS (default "fp8 q4_k_m"): the models to serve.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-quant.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
random_bf16
t0=$(date +%s)
want() { [[ " ${FORMATS:-fp8 q4_k_m} " == *" $1 "* ]]; }
want fp8 && [ ! -f "$keep/llama3-8b-fp8/config.json" ] && $k quantize --to fp8 "$bf16" "$keep/llama3-8b-fp8" >"$out/quantize-fp8.txt" 2>&1
want q4_k_m && [ ! -f "$keep/llama3-8b-q4_k_m.gguf" ] && $k quantize --to q4_k_m "$bf16" "$keep/llama3-8b-q4_k_m.gguf" >"$out/quantize-q4_k_m.txt" 2>&1
echo "models ready at $(($(date +%s) - t0)) s"
for m in fp8:llama3-8b-fp8 q4_k_m:llama3-8b-q4_k_m.gguf; do
	name=${m%%:*}
	want "$name" || continue
	$k serve "$keep/${m#*:}" --tokenizer "$tok" --device cuda --max-num-seqs 256 --port 8765 >"$out/serve-$name.log" 2>&1 &
	server=$!
	for i in $(seq 1 300); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
	echo "$name: server up at $(($(date +%s) - t0)) s"
	runs="c64:64:128:16 c1:1:8:1"
	[ "$name" = fp8 ] && runs="c256:256:512:64 $runs"
	for r in $runs; do
		IFS=: read -r rn c n w <<<"$r"
		$k bench serve --url http://127.0.0.1:8765 --concurrency "$c" --num-requests "$n" --warmup "$w" \
			--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$out/$name-$rn.json" >"$out/$name-$rn.txt" 2>&1
		echo "$name $rn: rc=$? at $(($(date +%s) - t0)) s"
		serve_summary "$out/$name-$rn.json"
	done
	echo "$name: oom retries $(metric kiln:num_oom_retries_total), preemptions $(metric kiln:num_preemptions_total)"
	kill -TERM $server
	wait $server
	echo "$name: server exit $?"
	grep -iE "kv cache|error" "$out/serve-$name.log" | head -3 || true
done
exit 0
