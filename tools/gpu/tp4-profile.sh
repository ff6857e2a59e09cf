#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after tools/gpu/build.sh here (issue 20,
# TP=4 weak scaling at 128 sequences a GPU): kiln bench model --profile on
# the random Llama-3-8B-shaped bf16 model at TP=4 batch 512 and 256 and
# TP=1 batch 128 and 64 (each kernel's µs a step, side by side), then TP=4
# batch 512 decode under NCCL settings (protocol, algorithm, channels) that
# change how its 4 MiB all-reduces go. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4-profile.sh",
#   carry [".devpack"], kind nvidia-h100-x4 (or nvidia-h200-x4)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
random_bf16
profile() {
	timeout -s QUIT 80 $k bench model "$bf16" --device cuda --tensor-parallel-size "$1" --pp 0 --tg 16 --depth 512 --batch "$2" --reps 1 --profile \
		>"$work/profile-tp$1-b$2.txt" 2>&1
	echo "profile tp$1 b$2: rc=$? at $(($(date +%s) - t0)) s"
	sed -n '/^| kernel/,/^the timed/p' "$work/profile-tp$1-b$2.txt" | head -20
}
profile 4 512
profile 1 128
profile 4 256
profile 1 64
PP=0
for v in NCCL_PROTO=Simple NCCL_PROTO=LL128 NCCL_PROTO=LL NCCL_ALGO=Tree NCCL_MIN_NCHANNELS=32 NCCL_DEFAULT=1; do
	left=$((560 - ($(date +%s) - t0)))
	[ $left -lt 40 ] && break
	tp_bench "tp4-${v//=/-}" 4 512 40 "$v"
	grep -E "^\| tg64" "$work/model-tp4-${v//=/-}.txt"
done
(cd "$work" && tar czf logs.tgz --exclude logs.tgz * && find . -maxdepth 1 -type f ! -name logs.tgz -delete)
