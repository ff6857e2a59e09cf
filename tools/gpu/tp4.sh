#!/usr/bin/env bash
# Runs on a GPU machine of four GPUs after tools/gpu/build.sh here (issue 20,
# TP=4): the tensor-parallel tests of backend/cuda (TestTensorParallel*:
# over 2 and 4 ranks, both all-reduces); then kiln bench model on the random
# Llama-3-8B-shaped bf16 model at TP=4 (peer all-reduce), TP=1, TP=2 (peer)
# and TP=4 with NCCL's all-reduce, one after another (the batch grown with
# the GPUs for weak scaling: 64 and 128 sequences a GPU); a profiled TP=4
# decode; and kiln serve --tensor-parallel-size 4 under kiln bench serve at
# 1, 64, 256 and again 256 streams of 128/128 tokens (the server's slow
# steps printed). Every step is bounded so the whole stays within the device
# tool's 600 s. SKIP_TESTS=1 skips the tests, SKIP_TP2=1 the TP=2 benchmark.
# Logs in logs.tgz, JSON and the table under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4.sh",
#   carry [".devpack"], kind nvidia-h100-x4 (or nvidia-h200-x4)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
if [ -z "${SKIP_TESTS:-}" ]; then
	(cd backend/cuda && timeout 150 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestTensorParallel') >"$work/backend.log" 2>&1
	echo "backend tests: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|--- (PASS|FAIL): TestTensorParallel[A-Za-z]*/.*tp4' "$work/backend.log" | head -20
fi
random_bf16
echo "model at $(($(date +%s) - t0)) s"
tp_bench tp4-peer 4 1,64,128,256,512 110
tp_bench tp1 1 1,64,128 80
[ -z "${SKIP_TP2:-}" ] && tp_bench tp2-peer 2 1,64,128,256 90
python3 tools/gpu/tp_table.py "$work" tp1 tp2-peer tp4-peer
timeout -s QUIT 50 $k bench model "$bf16" --device cuda --tensor-parallel-size 4 --pp 0 --tg 16 --depth 512 --batch 1 --reps 1 --profile \
	>"$work/profile-tp4.txt" 2>&1
echo "profile tp4: rc=$? at $(($(date +%s) - t0)) s"
grep -iE "all-reduce|all-gather|add_rmsnorm|step" "$work"/profile-tp4.txt | head -12
tp_serve 4 again
# What time is left: TP=4 through NCCL's all-reduce, for the all-reduce's share.
left=$((560 - ($(date +%s) - t0)))
if [ $left -gt 30 ]; then
	tp_bench tp4-nccl 4 1,256 $left KILN_PEER_ALLREDUCE=0
	python3 tools/gpu/tp_table.py "$work" tp4-nccl
fi
# The device tool brings back a few files: the logs go in one archive.
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
