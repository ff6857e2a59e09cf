#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: where a batched
# decode step's time goes, kernel by kernel (`kiln bench model --profile`),
# on the Llama-3-8B-shaped random bf16 model, at the batches and depths of
# docs/PERF.md's issue-15 tables. Results under $OUT (or ./gpu-logs).
# (tools/gpu/profile.sh does the same under Nsight Compute, graphs off.)
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/bench-profile.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 --depth 512 \
	--batch ${BATCHES:-1,16,64,256} --reps 2 --profile >"$out/profile-d512.txt" 2>&1
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 64 --depth 128 \
	--batch 256 --reps 2 --profile >"$out/profile-d128.txt" 2>&1
grep -v '^  ' "$out/profile-d512.txt" "$out/profile-d128.txt" | grep -v '^.*loading' | cut -c1-150
