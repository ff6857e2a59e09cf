#!/usr/bin/env bash
# Runs on a GPU machine of two or more GPUs after tools/gpu/build.sh here:
# the peer all-reduce's tests (the kernels' on one device; the
# tensor-parallel fixtures on two, several runs, under the knobs that tell
# where a fault is: the fused kernel off, PDL off, graphs off). Logs in
# check.tgz under $OUT.
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0
kernels_test peer -test.run 'TestPeerAllReduce'
grep -E '^(--- |FAIL|ok|PASS)|allreduce_test' "$out/peer.log" | head -20
cd backend/cuda
fx() { # name env...
	local name=$1
	shift
	env "$@" timeout 100 ../../.devbin/backend_cuda.test -test.count=1 -test.run 'TestTensorParallelFixtures|TestTensorParallelBatched' >"$OUT/fx-$name.log" 2>&1
	echo "$name: rc=$? failed: $(grep -c -- '--- FAIL: TestTensorParallel[A-Za-z]*/' "$OUT/fx-$name.log")"
}
for i in ${PEER_RUNS:-1 2}; do fx peer-$i; done
for i in ${NOFUSE_RUNS:-1 2}; do fx nofuse-$i KILN_PEER_ALLREDUCE=nofuse; done
for i in ${KNOB_RUNS:-1 2}; do
	fx nopdl-$i KILN_TEST_NO_PDL=1
	fx nographs-$i KILN_TEST_NO_GRAPHS=1
done
for i in ${NCCL_RUNS:-1}; do fx nccl-$i KILN_PEER_ALLREDUCE=0; done
cd "$OUT" && tar czf check.tgz ./*.log && rm -f ./*.log
