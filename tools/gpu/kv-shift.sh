#!/usr/bin/env bash
# Runs on 2× H100/H200 after `BASE=<rev before the shift> tools/gpu/build.sh
# ./backend/cuda ./backend/cuda/kernels` here (session 45): kv_page's block
# index by a shift (every attention kernel, session 44's review commit)
# under the kernels' attention tests and the backend's tensor-parallel tests,
# then batch-1 decode at TP=1 and TP=2 against kiln-base (the division),
# two rounds taking turns (tools/gpu/tp-race.sh's runs).
# Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/kv-shift.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test attn -test.run 'TestDecodeAttention$|TestPrefillAttention$|TestKernelResources'
grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- FAIL|decode_|prefill_wg' "$out/attn.log" | head -30
grep -q '^ok\|^PASS' "$out/attn.log" || { pack_out logs.tgz; exit 1; }
SKIP_KERNELS=1 NOTRACE=1 TESTS=1 OUT=$out tools/gpu/tp-race.sh
echo "done at $(($(date +%s) - t0)) s"
