#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the Llama-3-8B-shaped
# random bf16 model against its FP8 checkpoint (`kiln quantize --to fp8`:
# the layers' matrices in E4M3 with a scale a row) on the same GPU, taking
# turns: prefill of 2048 tokens and decode at depth 512 of batches 1, 64 and
# 256 (issue 16's FP8 targets: prefill ≥ 1.6×, batch-256 decode ≥ 1.4× the
# bf16 model). Logs under $OUT (or ./gpu-logs).
#   ROUNDS (default 2) rounds; BATCH (1,64,256); PP (2048); TG (64).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fp8-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
random_bf16
fp8=$keep/llama3-8b-fp8
args=(--device cuda --pp "${PP:-2048}" --tg "${TG:-64}" --depth 512 --batch "${BATCH:-1,64,256}" --reps 1)
if [ ! -f "$fp8/config.json" ]; then
	t0=$(date +%s)
	$k quantize --to fp8 "$bf16" "$fp8" >"$out/quantize.txt" 2>&1
	echo "quantize: rc=$? in $(($(date +%s) - t0)) s: $(tail -1 "$out/quantize.txt")"
fi
for r in $(seq "${ROUNDS:-2}"); do
	for v in bf16 fp8; do
		t0=$(date +%s)
		if [ "$v" = bf16 ]; then
			$k bench model --random llama3-8b --keep "$keep" "${args[@]}" --output "$out/$v-$r.json" >"$out/$v-$r.txt" 2>&1
		else
			$k bench model "$fp8" "${args[@]}" --output "$out/$v-$r.json" >"$out/$v-$r.txt" 2>&1
		fi
		echo "== $v, round $r: rc=$? in $(($(date +%s) - t0)) s"
		grep -E '^\| |roofline|busy' "$out/$v-$r.txt" | head -20
	done
done
