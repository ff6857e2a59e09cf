#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: what a serving
# step that mixes a prompt chunk into the running decodes costs (kiln bench
# model --mixed) on the Llama-3-8B-shaped random bf16 model at depth 128,
# beside decode alone and a prefill of the chunk's size; then one mixed
# step kernel by kernel (--profile). Prints the tables; logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/mixed-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
random_bf16
bm() { # name args...
	local name=$1
	shift
	timeout -s QUIT 200 $k bench model "$bf16" --device cuda --depth 128 --reps 2 "$@" >"$out/$name.txt" 2>&1
	echo "$name: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^\| (pp|tg)|prompt tokens/s|TFLOP/s' "$out/$name.txt"
}
bm alone --pp 256 --tg 32 --batch 64,256
for c in ${CHUNKS:-256 768 1792}; do bm "mixed-256-$c" --pp 0 --tg 32 --batch 256 --mixed "$c"; done
bm mixed-64-448 --pp 0 --tg 32 --batch 64 --mixed 448
if [ -z "${NOPROFILE:-}" ]; then
	bm profile --pp 0 --tg 16 --batch 256 --mixed "${PROFILE_CHUNK:-256}" --reps 1 --profile
	sed -n '/^profile of/,/timed steps/p' "$out/profile.txt" | head -45
fi
