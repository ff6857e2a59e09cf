#!/usr/bin/env bash
# Runs on the GPU machine after `BASE=<rev> tools/gpu/build.sh` here: the
# GGUF Q4_K_M file of the random Llama-3-8B-shaped model (`kiln quantize`),
# decoded by this tree's kiln and by kiln-base on the same GPU, taking turns
# (issue 16: Q4_K batch-1 decode against the copy roofline of its own
# bytes), after the bf16 model. Logs under $OUT (or ./gpu-logs).
#   BATCH (1,4,8); TG (64); ROUNDS (2); PROFILE (set: --profile at batch 1).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/kq-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
random_bf16
g=$keep/llama3-8b-q4_k_m.gguf
if [ ! -f "$g" ]; then
	t0=$(date +%s)
	$k quantize --to q4_k_m "$bf16" "$g" >"$out/quantize.txt" 2>&1
	echo "quantize: rc=$? in $(($(date +%s) - t0)) s: $(tail -1 "$out/quantize.txt")"
fi
args=(--device cuda --pp 0 --tg "${TG:-64}" --depth 512 --batch "${BATCH:-1,4,8}" --reps 1)
$k bench model --random llama3-8b --keep "$keep" "${args[@]}" >"$out/bf16.txt" 2>&1
echo "== bf16: rc=$?"
grep -E '^\| ' "$out/bf16.txt" | head -8
for r in $(seq "${ROUNDS:-2}"); do
	for b in kiln kiln-base; do
		[ -x .devbin/$b ] || continue
		.devbin/$b bench model "$g" "${args[@]}" >"$out/$b-$r.txt" 2>&1
		echo "== $b round $r: rc=$?"
		grep -E '^\| ' "$out/$b-$r.txt" | head -8
	done
done
# PROFILE=1: where a batch-1 step of the Q4_K_M file goes, kernel by kernel.
if [ -n "${PROFILE:-}" ]; then
	$k bench model "$g" --device cuda --pp 0 --tg 64 --depth 512 --batch 1 --reps 1 --profile >"$out/profile.txt" 2>&1
	echo "== profile: rc=$?"
	grep -v '^  ' "$out/profile.txt" | grep -v 'loading' | cut -c1-160 | tail -40
fi
