#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the mixture of
# experts' kernels (issue 18). First the GPU tests of the expert kernels and
# of Gemma's (kernels TestMoE, with the tensor-core tiles; Gemma's kernel
# tests passed on the H200 on 2026-11-26; backend TestMoEMatchesCPU, TestGemmaMatchesCPU and the transformers fixtures),
# then `kiln bench model --random moe-7b-a1b` (prefill of 512 tokens,
# decode at depth 512 of batch 1 and 64; the roofline counts the experts a
# step reads) with the expert products on the tensor-core tiles (the
# default, from one row) and on the CUDA cores throughout, beside transformers' Mixtral of
# the same shape (tools/gpu/moe_peer.py). Logs and JSON under $OUT; a
# summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/moe-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test kernels-moe -test.run 'TestMoE$'
(cd backend/cuda && timeout 200 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestMoEMatchesCPU|TestGemmaMatchesCPU|TestHFTransformersFixtures') \
	>"$out/backend-moe.log" 2>&1
echo "backend moe/gemma/fixture tests: rc=$? at $(($(date +%s) - t0)) s"
# The expert products on the tensor-core tiles from one row (the default)
# and on the CUDA cores at every step (KILN_MOE_TILE_ROWS=0), one after
# the other on the same model.
for tiles in 1 0; do
	KILN_MOE_TILE_ROWS=$tiles timeout -s QUIT 150 $k bench model --random moe-7b-a1b --keep "$keep" --device cuda --pp 512 --tg 32 --depth 512 \
		--batch 1,64 --reps 3 --output "$out/moe-tiles$tiles.json" >"$out/moe-tiles$tiles.txt" 2>&1
	echo "bench model moe-7b-a1b, tiles from $tiles rows: rc=$? at $(($(date +%s) - t0)) s"
done
timeout 150 python3 tools/gpu/moe_peer.py --depth 512 --tg 32 --batch 1,64 --pp 512 --reps 2 >"$out/moe-peer.json" 2>"$out/moe-peer.err"
echo "transformers peer: rc=$? at $(($(date +%s) - t0)) s"
grep -hE "^(--- FAIL|    --- FAIL|FAIL|ok|PASS)" "$out/kernels-moe.log" "$out/backend-moe.log" | head -20
for tiles in 1 0; do echo "tiles from $tiles rows:"; grep -E "^\| (pp|tg)" "$out/moe-tiles$tiles.txt"; done
cat "$out/moe-peer.json"
