#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the open question of
# session 24 (backend/cuda/NOTES.md, "Speculative verification in bf16").
# backend/cuda TestVerifyRowsMatchDecode (a verifying step's rows against
# one-token steps and the CPU, f32 and bf16, 32/8 heads of 128) and
# TestSpeculativeGreedy; then kiln bench spec on the random Llama-3-8B shape
# in bf16 at 2 drafts and p 1 and 0.8, to see whether its runs still leave
# plain greedy's tokens; and whether plain greedy itself changes when the
# prompt shares a decode step with 7 copies of itself. Logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/verify-bf16.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
export KILN_SHARED_DIR=$PWD/.devbin/shared
t0=$(date +%s)
(cd backend/cuda && timeout 240 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestVerifyRowsMatchDecode|TestSpeculativeGreedy') >"$out/verify.log" 2>&1
echo "tests: rc=$? at $(($(date +%s) - t0)) s"
grep -E '^(--- |FAIL|ok|PASS)|    --- |spec_gpu_test' "$out/verify.log" | head -60
random_bf16
ids=$(random_ids 64)
timeout 120 $k bench spec "$bf16" --device cuda --ids "$ids" --tg 128 --num-speculative-tokens 2 --accept 1,0.8 --reps 2 2>"$out/spec.err"
echo "bench spec: rc=$? at $(($(date +%s) - t0)) s"
# Does plain greedy in bf16 change with the batch it shares? The same prompt
# alone, then as 8 requests at once (a decode step of 8 rows), greedy, no
# speculation: the texts compared.
$k serve "$bf16" --tokenizer "$llama3_tok" --device cuda --max-num-seqs 16 --port 8765 >"$out/serve.log" 2>&1 &
server=$!
serve_up 120
req() { curl -s http://127.0.0.1:8765/v1/completions -d '{"prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 64, "temperature": 0}'; }
req >"$out/alone.json"
pids=()
for i in $(seq 1 8); do
	req >"$out/batch-$i.json" &
	pids+=($!)
done
wait "${pids[@]}"
python3 - "$out" <<'PY'
import json, os, sys
w = sys.argv[1]
text = lambda f: json.load(open(os.path.join(w, f)))["choices"][0]["text"]
alone = text("alone.json")
same = [text(f"batch-{i}.json") == alone for i in range(1, 9)]
print(f"plain greedy, bf16: alone vs in a batch of 8: {sum(same)} of 8 the same text")
PY
kill -TERM $server
wait $server
