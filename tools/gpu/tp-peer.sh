#!/usr/bin/env bash
# Runs on a GPU machine of two or more GPUs after tools/gpu/build.sh here:
# the one-shot all-reduce over peer memory (issue 20). The kernels' tests
# (TestPeerAllReduce*: one device and two), the tensor-parallel
# tests of backend/cuda (TestTensorParallel*, both all-reduces) and
# cu's NCCL test; then kiln bench model on the random Llama-3-8B-shaped bf16
# model at TP=1, TP=2 with the peer all-reduce and TP=2 with NCCL's
# (KILN_PEER_ALLREDUCE=0), one after another; a profiled TP=2 decode; and
# kiln serve --tensor-parallel-size 2 under kiln bench serve at 1, 64 and
# 256 streams of 128/128 tokens. Logs (in logs.tgz) and JSON under $OUT, a
# table last. SKIP_TESTS=1 skips the tests; PEER_ENV (e.g. VAR=value) is
# set for the peer runs (bench, profile, serve).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-peer.sh",
#   carry [".devpack"], kind nvidia-h200-x2 (or nvidia-h100-x2)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
if [ -z "${SKIP_TESTS:-}" ]; then
	kernels_test peer -test.run 'TestPeerAllReduce'
	(cd backend/cuda && timeout 240 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run "${TESTS:-TestTensorParallel|TestSpeculativeGreedy}") >"$work/backend.log" 2>&1
	echo "backend tests: rc=$? at $(($(date +%s) - t0)) s"
	(cd backend/cuda/cu && timeout 60 ../../../.devbin/backend_cuda_cu.test -test.v -test.count=1 -test.run 'TestNCCL') >"$work/cu.log" 2>&1
	echo "cu tests: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^(--- |FAIL|ok|PASS)' "$work"/peer.log "$work"/backend.log "$work"/cu.log | grep -v '^.*--- PASS' | head -20
fi
random_bf16
tp_bench tp2-peer 2 1,64,128,256 120 ${PEER_ENV:-}
tp_bench tp2-nccl 2 1,64,128,256 120 KILN_PEER_ALLREDUCE=0
tp_bench tp1 1 1,64,128,256 120
env ${PEER_ENV:-} timeout -s QUIT 90 $k bench model "$bf16" --device cuda --tensor-parallel-size 2 --pp 0 --tg 16 --depth 512 --batch 1,64 --reps 1 --profile \
	>"$work/profile-tp2.txt" 2>&1
echo "profile tp2: rc=$? at $(($(date +%s) - t0)) s"
python3 tools/gpu/tp_table.py "$work" tp1 tp2-nccl tp2-peer
grep -iE "all-reduce|all-gather|add_rmsnorm" "$work"/profile-tp2.txt | head -20
tok=$llama3_tok
env ${PEER_ENV:-} $k serve "$bf16" --tokenizer "$tok" --device cuda --tensor-parallel-size 2 --max-num-seqs 256 --port 8765 >"$work/serve.log" 2>&1 &
server=$!
serve_up
echo "server up after $(($(date +%s) - t0)) s"
run() { SERVE_TIMEOUT=100 serve_run "$@" && serve_summary "$work/$1.json"; }
run serve-c1 1 16 2
run serve-c64 64 256 64
run serve-c256 256 768 256
kill -TERM $server
for i in $(seq 1 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
kill -QUIT $server 2>/dev/null
wait $server
echo "server exit $?"
# The device tool brings back a few files: the logs go in one archive.
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
