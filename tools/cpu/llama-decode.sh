#!/usr/bin/env bash
# llama.cpp's batch-1 CPU decode on a GGUF file without node (a peer for
# kiln's): builds tools/cpu/llama_decode.c against node-llama-cpp's prebuilt
# llama.cpp libraries in LLAMA_LIBDIR (`npm install node-llama-cpp@3.22.1`
# puts them there) into KILN_BENCH_DIR, then runs it and prints its JSON line,
#   {"tokens": N, "seconds": S, "tokens_per_s": R, "threads": T, "first_ids": [...]}
#   tools/cpu/llama-decode.sh FILE.gguf [tokens] [threads]
set -euo pipefail
lib=${LLAMA_LIBDIR:-/tmp/nlcjs/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
dir=${KILN_BENCH_DIR:-/tmp/kiln-cpu-peer}
src=$(dirname "$0")/llama_decode.c
mkdir -p "$dir"
gcc -std=c11 -O2 -o "$dir/llama_decode" "$src" -L"$lib" \
	-l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -Wl,-rpath,"$lib"
exec "$dir/llama_decode" "$1" "${2:-64}" "${3:-1}"
