#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after tools/gpu/build.sh here (issue
# 20: the residual add and RMSNorm after each all-reduce in the peer
# all-reduce's kernel, kernels.PeerAllReduceNorm): the kernels' tests of it
# and of back-to-back calls, the tensor-parallel tests (TestPeerFormsMatch:
# the norm in the kernel, apart, and the flag form bit for bit); then kiln
# bench model on the random Llama-3-8B-shaped bf16 model at TP=1, TP=4
# (the default: the norms in the two-shot calls' kernel) and TP=4 with the
# norms apart (KILN_PEER_ALLREDUCE=apart), taking turns; and a profiled
# TP=4 batch-512 decode.
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4-norm.sh",
#   carry [".devpack"], kind nvidia-h200-x4
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
kernels_test kernels -test.run 'TestPeerAllReduceNorm|TestPeerAllReduceBackToBack'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- (PASS|FAIL|SKIP)|waited|apart|bit for bit|Error' "$out/kernels.log" | head -20
grep -E 'peer all-reduce \+ norm, 4 ranks' "$out/kernels.log" | head -4
SKIP_KERNELS=1 tp_tests
random_bf16
echo "model at $(($(date +%s) - t0)) s"
PP=0 tp_bench tp1 1 64,128 40
PP=0 tp_bench tp4 4 256,512 45
PP=0 tp_bench tp4-apart 4 256,512 45 KILN_PEER_ALLREDUCE=apart
PP=0 tp_bench tp4-r2 4 256,512 45
python3 tools/gpu/tp_table.py "$work" tp1 tp4 tp4-apart tp4-r2
timeout -s QUIT 60 $k bench model "$bf16" --device cuda --tensor-parallel-size 4 --pp 0 --tg 16 --depth 512 --batch 512 --reps 1 --profile \
	>"$work/profile-tp4-b512.txt" 2>&1
echo "profile tp4 b512: rc=$? at $(($(date +%s) - t0)) s"
sed -n '/^| kernel/,/^| total/p' "$work/profile-tp4-b512.txt" | head -12
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
