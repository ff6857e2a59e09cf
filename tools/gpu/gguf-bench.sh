#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the Llama-3-8B-shaped
# random bf16 model against its GGUF Q4_K_M and Q8_0 files (`kiln quantize`)
# on the same GPU, the files' matrices kept in their blocks on the device:
# prefill and decode at depth 512 (issue 16: Q4_K batch-1 decode against the
# copy roofline of its own bytes). Logs under $OUT (or ./gpu-logs).
#   FORMATS (default "q4_k_m q8_0"); BATCH (1,16); PP (512); TG (64).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/gguf-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
random_bf16
args=(--device cuda --pp "${PP:-512}" --tg "${TG:-64}" --depth 512 --batch "${BATCH:-1,16}" --reps 1)
$k bench model --random llama3-8b --keep "$keep" "${args[@]}" --output "$out/bf16.json" >"$out/bf16.txt" 2>&1
echo "== bf16: rc=$?"
grep -E '^\| |busy' "$out/bf16.txt" | head -12
for f in ${FORMATS:-q4_k_m q8_0}; do
	g=$keep/llama3-8b-$f.gguf
	if [ ! -f "$g" ]; then
		t0=$(date +%s)
		$k quantize --to "$f" "$bf16" "$g" >"$out/quantize-$f.txt" 2>&1
		echo "quantize $f: rc=$? in $(($(date +%s) - t0)) s: $(tail -1 "$out/quantize-$f.txt")"
	fi
	t0=$(date +%s)
	$k bench model "$g" "${args[@]}" --output "$out/$f.json" >"$out/$f.txt" 2>&1
	echo "== $f: rc=$? in $(($(date +%s) - t0)) s"
	grep -E '^\| |busy|blocks' "$out/$f.txt" | head -16
done
