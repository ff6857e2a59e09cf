#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the mixture of
# experts' kernels (issue 18). First the GPU tests of the expert kernels and
# of Gemma's (written without a GPU in session 21: kernels TestMoE,
# TestElementwise, TestEmbedShard, the soft-capped attention cases; backend
# TestMoEMatchesCPU and TestGemmaMatchesCPU), then `kiln bench model
# --random moe-7b-a1b` (prefill of 512 tokens, decode at depth 512 of batch
# 1 and 64; the roofline counts the experts a step reads) beside
# transformers' Mixtral of the same shape (tools/gpu/moe_peer.py). Logs and
# JSON under $OUT; a summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/moe-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test kernels-moe -test.run 'TestMoE$|TestElementwise|TestEmbedShard|TestPrefillAttention|TestDecodeAttention'
(cd backend/cuda && timeout 200 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestMoEMatchesCPU|TestGemmaMatchesCPU') \
	>"$out/backend-moe.log" 2>&1
echo "backend moe/gemma tests: rc=$? at $(($(date +%s) - t0)) s"
timeout -s QUIT 300 $k bench model --random moe-7b-a1b --keep "$keep" --device cuda --pp 512 --tg 32 --depth 512 --batch 1,64 --reps 3 \
	--output "$out/moe.json" >"$out/moe.txt" 2>&1
echo "bench model moe-7b-a1b: rc=$? at $(($(date +%s) - t0)) s"
timeout 300 python3 tools/gpu/moe_peer.py --depth 512 --tg 32 --batch 1,64 --pp 512 >"$out/moe-peer.json" 2>"$out/moe-peer.err"
echo "transformers peer: rc=$? at $(($(date +%s) - t0)) s"
grep -E "^(--- |ok|FAIL|PASS)" "$out/kernels-moe.log" "$out/backend-moe.log" | grep -v "^.*--- PASS" | head -20
cat "$out/moe.txt" | tail -12
cat "$out/moe-peer.json"
