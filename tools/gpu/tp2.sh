#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after tools/gpu/build.sh here (issue 20,
# TP=2). In one call:
#   - the kernels' tests named by $KTESTS (default the peer all-reduce's)
#     and the tensor-parallel tests (TestTensorParallel*,
#     TestPeerFormsMatch) unless SKIP_TESTS=1 (TESTS_ONLY=1: nothing
#     more, the logs in tests.tgz);
#   - kiln bench model on the random bf16 Llama-3-8B shape (prefill 2048,
#     decode at depth 512) at TP=2 (the all-reduce over peer memory in the
#     Lamport form), TP=2 in the flag form (KILN_PEER_ALLREDUCE=flags, as
#     before session 30) and TP=1, one after another; with RANK=1 also the
#     shape one TP=2 rank holds (llama3-8b-tp2-rank: half the heads, KV
#     heads, MLP and vocabulary) on one GPU without collectives: TP=2's
#     step less that one is what the all-reduces cost a step;
#   - unless SKIP_SERVE=1, kiln serve --tensor-parallel-size 2 under kiln
#     bench serve at 1, 64 and 256 streams of 128/128 tokens, one run after
#     another on the same server (its slow steps printed).
# Logs in logs.tgz (the serving runs' JSON and HTML charts among them); the
# tables on stdout. It took 225 s on 2× H200 (session 30); each step is
# bounded, but the bounds together pass the device tool's 600 s: give the
# call the most it may have.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp2.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
if [ -z "${SKIP_TESTS:-}" ]; then
	(cd backend/cuda/kernels && timeout 120 ../../../.devbin/backend_cuda_kernels.test -test.v -test.count=1 -test.run "${KTESTS:-TestPeer}") >"$work/ktests.log" 2>&1
	echo "kernels tests: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS|^    --- FAIL|allreduce_test.go:3' "$work/ktests.log" | head -20
	(cd backend/cuda && timeout 120 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestTensorParallel|TestPeerFormsMatch') >"$work/tp-tests.log" 2>&1
	echo "tensor-parallel tests: rc=$? at $(($(date +%s) - t0)) s, subtests passed $(grep -c -- '--- PASS: Test[A-Za-z]*/' "$work/tp-tests.log"), failed $(grep -c -- '--- FAIL: Test[A-Za-z]*/' "$work/tp-tests.log")"
	grep -E '^(--- FAIL|FAIL|ok)|--- FAIL|differ' "$work/tp-tests.log" | head -16
fi
if [ -n "${TESTS_ONLY:-}" ]; then
	pack_out tests.tgz
	exit 0
fi
random_bf16
echo "model at $(($(date +%s) - t0)) s"
tp_bench tp2 2 ${TP_BATCH:-1,64,128,256} 80
tp_bench tp2-flags 2 1,64 50 KILN_PEER_ALLREDUCE=flags
tp_bench tp1 1 ${TP1_BATCH:-1,64,128} 70
names=(tp1 tp2 tp2-flags)
if [ -n "${RANK:-}" ]; then
	t1=$(date +%s)
	timeout -s QUIT 80 $k bench model --random llama3-8b-tp2-rank --keep "$keep" --device cuda --pp 2048 --tg 64 --depth 512 --batch ${TP1_BATCH:-1,64,128} \
		--reps 2 --output "$work/model-rank2.json" >"$work/model-rank2.txt" 2>&1
	echo "bench model rank2 (one GPU): rc=$? in $(($(date +%s) - t1)) s"
	names+=(rank2)
fi
python3 tools/gpu/tp_table.py "$work" "${names[@]}"
grep -h "device is busy" "$work"/model-tp2*.txt
[ -z "${SKIP_SERVE:-}" ] && tp_serve 2
pack_out logs.tgz
echo "done at $(($(date +%s) - t0)) s"
