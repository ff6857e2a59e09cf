#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after tools/gpu/build.sh here (issue 20,
# TP=4 weak scaling at 128 sequences a GPU: the two-shot all-reduce and the
# logits exchanged by rows): the
# kernels' peer all-reduce tests (TestPeer*: one device's streams as 2 to 8
# ranks, and back to back over 2 and over all GPUs), the tensor-parallel
# tests of backend/cuda; then kiln bench model on the random
# Llama-3-8B-shaped bf16 model at TP=4 (peer all-reduces: two shots past
# 512 KiB), TP=1, TP=4 with NCCL's all-reduce and TP=4 with 32 NCCL
# channels (same call); where kiln-base was built (BASE=<rev>), TP=4 on it
# and TP=2 batch 1 against it, taking turns; and a profiled TP=4 batch-512
# decode. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4-twoshot.sh",
#   carry [".devpack"], kind nvidia-h100-x4 (or nvidia-h200-x4)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
[ -z "${SKIP_TESTS:-}" ] && tp_tests
random_bf16
echo "model at $(($(date +%s) - t0)) s"
tp_bench tp4-peer 4 1,64,128,256,512 100
PP=0 tp_bench tp1 1 1,64,128 80
PP=0 tp_bench tp4-nccl 4 256,512 60 KILN_PEER_ALLREDUCE=0
tp_bench tp4-ch32 4 256,512 60 NCCL_MIN_NCHANNELS=32
python3 tools/gpu/tp_table.py "$work" tp1 tp4-peer tp4-nccl tp4-ch32
# The one-shot form's kernels now keep 4 blocks a multiprocessor: TP=2
# batch 1 against kiln-base (BASE=<rev> tools/gpu/build.sh), taking turns.
if [ -x .devbin/kiln-base ]; then
	PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp4-base 4 256,512 60
	python3 tools/gpu/tp_table.py "$work" tp4-base
	for r in 1 2; do
		PP=0 tp_bench tp2-r$r 2 1 40
		PP=0 KILN_BIN=.devbin/kiln-base tp_bench tp2-base-r$r 2 1 40
	done
	python3 tools/gpu/tp_table.py "$work" tp2-r1 tp2-base-r1 tp2-r2 tp2-base-r2
fi
timeout -s QUIT 80 $k bench model "$bf16" --device cuda --tensor-parallel-size 4 --pp 0 --tg 16 --depth 512 --batch 512 --reps 1 --profile \
	>"$work/profile-tp4-b512.txt" 2>&1
echo "profile tp4 b512: rc=$? at $(($(date +%s) - t0)) s"
sed -n '/^| kernel/,/^| total/p' "$work/profile-tp4-b512.txt" | head -8
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
