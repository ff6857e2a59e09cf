#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: a GGUF mixture's
# experts kept in their blocks on the device (Backend.ExpertBlocks,
# --cuda-expert-blocks; backend/cuda/moe.go). First the tests: kernels
# TestDequantizeExperts and TestDequantize, backend TestGGUFExperts (kept
# against widened at upload) and TestMoEMatchesCPU, with the experts'
# products on the tiles and on the CUDA cores; then the random
# moe-7b-a1b written as Q4_K_M (`kiln quantize`) and benchmarked with the
# experts kept and widened at upload, taking turns (prefill 512, decode at
# depth 512 of batch 1 and 64), with the GPU memory each takes. Logs under
# $OUT; a summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/expert-blocks.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
t0=$(date +%s)
kernels_test kernels-dequant -test.run 'TestDequantizeExperts|TestDequantize$'
grep -E '^(--- |ok|FAIL|PASS)|panic' "$out/kernels-dequant.log" | head -10
# The experts' products on the tensor-core tiles (the default) and on the
# CUDA cores (KILN_MOE_TILE_ROWS=0).
for tiles in 1 0; do
	(cd backend/cuda && KILN_MOE_TILE_ROWS=$tiles timeout 200 ../../.devbin/backend_cuda.test -test.v -test.count=1 -test.run 'TestGGUFExperts|TestMoEMatchesCPU') \
		>"$out/backend-experts$tiles.log" 2>&1
	echo "backend, tiles from $tiles rows: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^\s*(--- |ok|FAIL|PASS)|panic|quant_test.go' "$out/backend-experts$tiles.log" | cut -c1-300 | head -30
done
moe=$keep/moe-7b-a1b-bf16
[ -f "$moe/config.json" ] || $k bench model --random moe-7b-a1b --keep "$keep" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 >"$out/moe-write.txt" 2>&1
g=$keep/moe-7b-a1b-q4_k_m.gguf
if [ ! -f "$g" ]; then
	t1=$(date +%s)
	$k quantize --to q4_k_m "$moe" "$g" >"$out/quantize.txt" 2>&1
	echo "quantize: rc=$? in $(($(date +%s) - t1)) s: $(tail -1 "$out/quantize.txt")"
fi
for r in 1 2; do
	for v in 1 0; do
		# Within the call's 600 s: no run started past BUDGET (default 480) s.
		if [ $(($(date +%s) - t0)) -gt "${BUDGET:-480}" ]; then echo "out of time: round $r, $v skipped"; continue; fi
		t1=$(date +%s)
		KILN_CUDA_EXPERT_BLOCKS=$v timeout -s QUIT 150 $k bench model "$g" --device cuda --pp 512 --tg 32 --depth 512 --batch 1,64 --reps 1 \
			--output "$out/experts$v-$r.json" >"$out/experts$v-$r.txt" 2>&1
		echo "== experts in blocks $v, round $r: rc=$? in $(($(date +%s) - t1)) s"
		grep -E '^\| (pp|tg)|weights|GGUF blocks|GiB|MiB' "$out/experts$v-$r.txt" | head -10
	done
done
echo "done at $(($(date +%s) - t0)) s"
