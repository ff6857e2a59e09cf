#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after `BASE=<rev> tools/gpu/build.sh
# ./backend/cuda ./backend/cuda/kernels` here (issue 20, the logits
# exchanged by rows): the kernels' peer tests (TestPeer*), the
# tensor-parallel tests of backend/cuda (TestTensorParallelSampledRows
# among them); then kiln bench model at TP=2 on the random
# Llama-3-8B-shaped bf16 model, this tree's kiln and kiln-base taking
# turns (decode at depth 512 of batches 1, 64, 128 and 256; prefill 2048;
# ROUNDS rounds, default 2), and a profiled TP=2 batch-256 decode of each.
# SKIP_KERNELS=1 leaves out the kernels' tests. Logs in logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp2-scatter.sh",
#   carry [".devpack"], kind nvidia-h100-x2 (or nvidia-h200-x2)
source "$(dirname "$0")/env.sh"
tp_env
work=$out
t0=$(date +%s)
tp_tests TestDeviceSampling
random_bf16
for r in $(seq "${ROUNDS:-2}"); do
	tp_bench tp2-r$r 2 1,64,128,256 60
	KILN_BIN=.devbin/kiln-base tp_bench tp2-base-r$r 2 1,64,128,256 60
done
python3 tools/gpu/tp_table.py "$work" $(for r in $(seq "${ROUNDS:-2}"); do echo tp2-r$r tp2-base-r$r; done)
for v in kiln kiln-base; do
	timeout -s QUIT 60 .devbin/$v bench model "$bf16" --device cuda --tensor-parallel-size 2 --pp 0 --tg 16 --depth 512 --batch 256 --reps 1 --profile \
		>"$work/profile-$v.txt" 2>&1
	echo "profile $v: rc=$? at $(($(date +%s) - t0)) s"
	grep -E "all-gather|scatter|sampler|^\| total" "$work/profile-$v.txt" | head -6
done
(cd "$work" && tar czf logs.tgz --exclude logs.tgz --exclude '*.json' * && find . -maxdepth 1 -type f ! -name logs.tgz ! -name '*.json' -delete)
