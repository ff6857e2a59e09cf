#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: issue 17's
# ahead-of-time artifact on the Llama-3-8B-shaped random bf16 model.
#   1. kiln compile MODEL --device cuda -o DIR (timed);
#   2. the start of kiln bench model (--pp 0 --tg 1 --batch 1) with empty
#      kernel, tune and driver caches, without the artifact and with it,
#      and with warm caches (the time a start takes beside compiling);
#   3. kiln serve --artifact with empty caches: the time to /health, then
#      kiln bench serve at 1 and 64 streams, and kiln:jit_fallback_total
#      before and after; the same without the artifact;
#   4. the artifact with one byte of a kernel image changed: refused.
# Logs under $OUT (or ./gpu-logs).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/artifact-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/env.txt"
random_bf16
tok=$llama3_tok
art=$(mktemp -d)/artifact
# fresh empties every cache a start reads: kiln's kernel and tune caches,
# and the driver's compute cache (~/.nv/ComputeCache), where NVRTC 13's
# compiles of a source already compiled on this machine are found again
# (a compile of the Llama-3-8B shape's modules: 18 s summed the first time
# on an H100, 0.5 s after, with a fresh KILN_CACHE_DIR).
fresh() { export KILN_CACHE_DIR=$(mktemp -d) KILN_TUNE_DIR=$(mktemp -d) CUDA_CACHE_PATH=$(mktemp -d); }
secs() { python3 -c "import time; print(f'{time.time() - $1:.1f}')"; }
fresh
t=$(date +%s.%N)
$k compile "$bf16" --device cuda -o "$art" >"$out/compile.txt" 2>&1
echo "kiln compile: rc=$? in $(secs $t) s"
tail -1 "$out/compile.txt"
du -sh "$art"
start() { # name, then kiln bench model's extra arguments
	local name=$1 t
	shift
	t=$(date +%s.%N)
	$k bench model "$bf16" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 "$@" >"$out/start-$name.txt" 2>&1
	echo "start $name: rc=$? in $(secs $t) s; $(grep 'compiled and timed' "$out/start-$name.txt")"
}
fresh
start cold
start warm
fresh
start artifact --artifact "$art"
fresh
start cold-again
fresh
start artifact-again --artifact "$art"
serve() { # name, then kiln serve's extra arguments
	local name=$1 t server
	shift
	fresh
	t=$(date +%s.%N)
	$k serve "$bf16" --tokenizer "$tok" --device cuda --max-num-seqs 64 --port 8765 "$@" >"$out/serve-$name.log" 2>&1 &
	server=$!
	for i in $(seq 1 300); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 0.2; done
	echo "serve $name: ready in $(secs $t) s; kiln:jit_fallback_total $(metric kiln:jit_fallback_total)"
	for c in 1 64; do
		$k bench serve --url http://127.0.0.1:8765 --concurrency $c --num-requests $((c * 8)) --warmup $c \
			--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$out/serve-$name-c$c.json" >"$out/serve-$name-c$c.txt" 2>&1
		echo "  $c streams: rc=$? $(serve_summary "$out/serve-$name-c$c.json"); kiln:jit_fallback_total $(metric kiln:jit_fallback_total)"
	done
	kill -TERM $server
	wait $server
}
serve artifact --artifact "$art"
serve jit
f=$(find "$art/kernels" -name '*.kc' | head -1)
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-1]^=1; open(p,'wb').write(b)" "$f"
fresh
start tampered --artifact "$art"
tail -1 "$out/start-tampered.txt"
