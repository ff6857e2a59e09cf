#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the FP8 KV cache
# (--kv-cache-dtype fp8). STEPS (default "tests attn decode serve"; KTESTS
# and BTESTS replace the kernels' and the backend's test patterns):
#   tests   the GPU tests of the FP8 cache, and those of the kernels and
#           model paths it touches;
#   attn    decode attention alone over bf16 and FP8 caches
#           (BenchmarkDecodeAttention{,FP8}, batches 16/64/256);
#   decode  kiln bench model on the random Llama-3-8B-shaped bf16 model with
#           the bf16 cache and the FP8 cache taking turns: prefill 2048,
#           decode at depth 2048 (batch 1, 64) and 512 (batch 256);
#   capacity the caches kiln serve sizes in each dtype at --max-num-seqs 1024;
#   serve   kiln serve --kv-cache-dtype fp8 (the cache it sizes, against
#           the bf16 cache's) under kiln bench serve at 256, 64 and 1
#           streams of 128/128 on the same server.
# Logs under $OUT (or ./gpu-logs).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/kvfp8.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/env.txt"
bin=$(pwd)/.devbin
t0=$(date +%s)
for step in ${STEPS:-tests attn decode serve}; do
	case $step in
	tests)
		(cd backend/cuda/kernels && timeout 300 "$bin/backend_cuda_kernels.test" -test.v -test.count=1 \
			-test.run "${KTESTS:-TestFP8KVWrite|TestFP8CacheAttention|TestFP8Widening|TestFP8OK|TestElementwise|TestDecodeAttention\$|TestPrefillAttention\$|TestKVWrite|TestRoPEQKVWrite}" \
			>"$out/kernels.log" 2>&1)
		echo "kernels tests: rc=$? at $(($(date +%s) - t0)) s"
		grep -E '^(--- |FAIL|ok|PASS)' "$out/kernels.log" | head -30
		(cd backend/cuda && timeout 300 "$bin/backend_cuda.test" -test.v -test.count=1 \
			-test.run "${BTESTS:-TestFP8KVCache|TestGraphsMatchDirect|TestFP8Weights}" >"$out/backend.log" 2>&1)
		echo "backend tests: rc=$? at $(($(date +%s) - t0)) s"
		grep -E '^(--- |    --- |FAIL|ok|PASS)|‖Δ‖' "$out/backend.log" | head -80
		;;
	attn)
		(cd backend/cuda/kernels && timeout 200 "$bin/backend_cuda_kernels.test" -test.run '^$' \
			-test.bench 'DecodeAttention(FP8)?/batch=(16|64|256)/ctx=(512|2048)' -test.benchtime 1x >"$out/attn.log" 2>&1)
		echo "attention benchmark: rc=$? at $(($(date +%s) - t0)) s"
		grep -E 'us/call' "$out/attn.log" | awk '{print $1, $3, $5, $7}' | sort -t' ' -k1,1 | head -80
		;;
	decode)
		random_bf16
		for r in 1 2; do
			for c in auto fp8; do
				$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 2048 --tg 64 --depth 2048 --batch 1,64 \
					--reps 1 --kv-cache-dtype $c --output "$out/decode-$c-$r.json" >"$out/decode-$c-$r.txt" 2>&1
				echo "== decode, cache $c, round $r: rc=$? at $(($(date +%s) - t0)) s"
				grep -E '^\| ' "$out/decode-$c-$r.txt" | head -8
				$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 --depth 512 --batch 256 \
					--reps 1 --kv-cache-dtype $c --output "$out/decode256-$c-$r.json" >"$out/decode256-$c-$r.txt" 2>&1
				grep -E '^\| (tg|test)' "$out/decode256-$c-$r.txt" | head -4
			done
		done
		;;
	capacity)
		# The caches kiln serve sizes when the sequences could use more
		# than the memory holds (--max-num-seqs 1024).
		random_bf16
		for c in auto fp8; do
			timeout 120 $k serve "$bf16" --tokenizer "$llama3_tok" --device cuda --max-num-seqs 1024 --port 8766 \
				--kv-cache-dtype $c >"$out/capacity-$c.log" 2>&1 &
			server=$!
			for i in $(seq 1 100); do curl -sf http://127.0.0.1:8766/health >/dev/null && break; sleep 1; done
			echo "capacity, cache $c: $(grep -oE 'kv_cache_[a-z]+=[0-9]+' "$out/capacity-$c.log" | head -3 | tr '\n' ' ')"
			kill -TERM $server
			wait $server
		done
		;;
	serve)
		random_bf16
		tok=$llama3_tok
		for c in fp8 auto; do
			$k serve "$bf16" --tokenizer "$tok" --device cuda --max-num-seqs 256 --port 8765 --kv-cache-dtype $c >"$out/serve-$c.log" 2>&1 &
			server=$!
			for i in $(seq 1 300); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
			echo "serve, cache $c: up at $(($(date +%s) - t0)) s: $(grep -oE 'kv_cache_[a-z]+=[0-9]+' "$out/serve-$c.log" | head -3 | tr '\n' ' ')"
			runs="c256:256:1792:256 c64:64:512:64 c1:1:24:2"
			[ "$c" = auto ] && runs="" # the bf16 cache's size only
			for r in $runs; do
				IFS=: read -r rn n num w <<<"$r"
				$k bench serve --url http://127.0.0.1:8765 --concurrency "$n" --num-requests "$num" --warmup "$w" \
					--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$out/serve-$c-$rn.json" \
					--html "$out/serve-$c-$rn.html" >"$out/serve-$c-$rn.txt" 2>&1
				echo "serve $c $rn: rc=$? at $(($(date +%s) - t0)) s"
				serve_summary "$out/serve-$c-$rn.json"
			done
			echo "serve $c: oom retries $(metric kiln:num_oom_retries_total), preemptions $(metric kiln:num_preemptions_total)"
			kill -TERM $server
			wait $server
			echo "serve $c: exit $?"
			grep -iE "error|panic" "$out/serve-$c.log" | head -3 || true
		done
		;;
	esac
done
exit 0
