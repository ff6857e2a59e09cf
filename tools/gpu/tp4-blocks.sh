#!/usr/bin/env bash
# Runs on a GPU machine of two or more GPUs after tools/gpu/build.sh here
# (issue 20: the grid of the Lamport all-reduces, kernels.PeerGroup.Blocks):
# the kernels' back-to-back peer test (grids of PeerSlots, one and two
# blocks a multiprocessor), BenchmarkPeerAllReduce (µs a call and bus GB/s
# at 1/64/256/512 rows of 4096 bf16 over 2 and all GPUs in each grid),
# then kiln bench model on the random Llama-3-8B-shaped bf16 model at
# TP=1 and at TP=<all GPUs> under each KILN_PEER_BLOCKS (same call).
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp4-blocks.sh",
#   carry [".devpack"], kind nvidia-h200-x4 (or any of two or more GPUs)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
n=$(nvidia-smi -L | wc -l)
kernels_test kernels-b2b -test.run 'TestPeerAllReduceBackToBack'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- (PASS|FAIL|SKIP)|made|waited' "$out/kernels-b2b.log" | head -12
(cd backend/cuda/kernels && timeout 200 ../../../.devbin/backend_cuda_kernels.test -test.run '^$' -test.bench PeerAllReduce -test.benchtime 1x) \
	>"$out/bench-peer.txt" 2>&1
echo "bench peer: rc=$? at $(($(date +%s) - t0)) s"
grep -E 'Benchmark|FAIL|panic' "$out/bench-peer.txt" | sed 's/BenchmarkPeerAllReduce\///' | head -40
random_bf16
echo "model at $(($(date +%s) - t0)) s"
PP=0 tp_bench tp1 1 64,128 60
runs=(tp1)
for b in 64 sm 2sm; do
	PP=0 tp_bench "tp$n-$b" "$n" 256,512 60 KILN_PEER_BLOCKS=$b
	runs+=("tp$n-$b")
done
python3 tools/gpu/tp_table.py "$work" "${runs[@]}"
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
