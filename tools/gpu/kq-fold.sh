#!/usr/bin/env bash
# Runs on one GPU after `BASE=<rev> tools/gpu/build.sh ./backend/cuda
# ./backend/cuda/kernels` here: the norms folded into the K-quant GEMV
# (kernels.BlocksFold). The K-quant kernels' GPU tests (plain and folded
# forms), the model's (a Q4_K_M file with the folds and without, and
# against its widened form; the bf16 folds), then tools/gpu/kq-bench.sh
# (this tree's kiln against kiln-base on the Q4_K_M file of the random
# Llama-3-8B shape, taking turns). Logs under $OUT.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/kq-fold.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test kq-tests -test.run 'TestGEMVBlocks$|TestGEMVBlocksFolded'
grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)|max err' "$out/kq-tests.log" | head -30
backend_test kq-model -test.run 'TestGGUFBlocks$|TestGGUFBlocksFoldNorms|TestNormFolds|TestHFTransformersFixtures'
grep -E -- '^(--- |    --- )(FAIL|PASS)|^(ok|FAIL)|norms folded' "$out/kq-model.log" | head -30
echo "tests done at $(($(date +%s) - t0)) s"
OUT=$out/bench BATCH=${BATCH:-1,4,8} ROUNDS=${ROUNDS:-2} tools/gpu/kq-bench.sh
echo "bench done at $(($(date +%s) - t0)) s"
