#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here (BASE=<rev> also
# builds .devbin/kiln-base): how long a start takes on the Llama-3-8B-shaped
# random bf16 model, the whole process, with every cache empty ("cold":
# kiln's kernel and tune caches and the driver's compute cache) and again
# with the caches that start filled ("warm"), each binary in turn; then kiln serve's time to /health, cold. Each
# start prints its parts (kiln bench model's "start:" and "weights:" lines,
# the serve log's startup line). Logs under $OUT (or ./gpu-logs).
#   ROUNDS (default 2) cold starts of each binary.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/start-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/env.txt"
random_bf16
secs() { python3 -c "import time; print(f'{time.time() - $1:.1f}')"; }
fresh() { export KILN_CACHE_DIR=$(mktemp -d) KILN_TUNE_DIR=$(mktemp -d) CUDA_CACHE_PATH=$(mktemp -d); }
start() { # name, binary
	local t
	t=$(date +%s.%N)
	$2 bench model "$bf16" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 >"$out/start-$1.txt" 2>&1
	echo "start $1: rc=$? in $(secs "$t") s; $(grep -E '^start:|^weights:' "$out/start-$1.txt" | tr '\n' ' ')"
}
bins=(kiln)
[ -x .devbin/kiln-base ] && bins+=(kiln-base)
for r in $(seq "${ROUNDS:-2}"); do
	for b in "${bins[@]}"; do
		fresh
		start "$b-cold-$r" ".devbin/$b"
		start "$b-warm-$r" ".devbin/$b" # the caches its cold start filled
	done
done
fresh
t=$(date +%s.%N)
$k serve "$bf16" --tokenizer "$llama3_tok" --device cuda --max-num-seqs 64 --port 8765 >"$out/serve.log" 2>&1 &
server=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 0.1; done
echo "serve, cold, ready in $(secs "$t") s; $(grep -o 'msg=startup.*' "$out/serve.log" | head -1)"
kill -TERM $server
wait $server
