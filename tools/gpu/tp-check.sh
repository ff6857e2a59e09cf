#!/usr/bin/env bash
# Runs on a GPU machine of two or more GPUs after tools/gpu/build.sh here:
# the peer all-reduce's tests (the kernels' on one device and across two),
# then the tensor-parallel fixtures and TestTensorParallelBatched several
# times over (RUNS, default 3) and once with NCCL's all-reduce
# (KILN_PEER_ALLREDUCE=0). Logs in check.tgz under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-check.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
tp_env
kernels_test peer -test.run 'TestPeerAllReduce'
grep -E '^(--- |FAIL|ok|PASS)|allreduce_test' "$out/peer.log" | head -20
cd backend/cuda
fx() { # name env...
	local name=$1
	shift
	env "$@" timeout 100 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestTensorParallelFixtures|TestTensorParallelBatched' >"$OUT/fx-$name.log" 2>&1
	echo "$name: rc=$? subtests passed $(grep -c -- '--- PASS: TestTensorParallel[A-Za-z]*/' "$OUT/fx-$name.log"), failed $(grep -c -- '--- FAIL: TestTensorParallel[A-Za-z]*/' "$OUT/fx-$name.log")"
}
for i in $(seq 1 "${RUNS:-3}"); do fx peer-$i; done
fx nccl KILN_PEER_ALLREDUCE=0
cd "$OUT" && tar czf check.tgz ./*.log && rm -f ./*.log
