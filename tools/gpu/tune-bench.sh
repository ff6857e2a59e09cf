#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: issue 17's
# end-to-end figure. kiln tune on the Llama-3-8B-shaped random bf16 model
# (every first-use choice raced again at batches 1, 16, 64 and 256 and
# kept, with its table of gains), then kiln bench model with the kept
# choices (--tune cached) and untuned (--tune defaults: every choice's
# built-in default, nothing timed), taking turns: prefill of PP tokens and
# decode at depth 512 of each batch. Logs under $OUT (or ./gpu-logs).
#   ROUNDS (default 2) rounds; BATCH (1,16,64,256); PP (2048); TG (64);
#   MODES ("defaults cached"; off: every choice raced at first use, none kept).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tune-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
random_bf16
export KILN_TUNE_DIR=$keep/tune
rm -rf "$KILN_TUNE_DIR"
batch=${BATCH:-1,16,64,256}
t0=$(date +%s)
$k tune "$bf16" --device cuda --prefill "${PP:-2048}" --depth 512 --batch "$batch" >"$out/tune.txt" 2>&1
echo "== kiln tune: rc=$? in $(($(date +%s) - t0)) s"
sed -n '/^family/,$p' "$out/tune.txt"
$k tune list --device cuda >"$out/list.txt" 2>&1
head -3 "$out/list.txt"
args=(--device cuda --pp "${PP:-2048}" --tg "${TG:-64}" --depth 512 --batch "$batch" --reps 1)
for r in $(seq "${ROUNDS:-2}"); do
	for v in ${MODES:-defaults cached}; do
		t0=$(date +%s)
		$k bench model "$bf16" "${args[@]}" --tune "$v" --output "$out/$v-$r.json" >"$out/$v-$r.txt" 2>&1
		echo "== --tune $v, round $r: rc=$? in $(($(date +%s) - t0)) s"
		grep -E '^\| |roofline' "$out/$v-$r.txt" | head -12
		grep -c "(tune cache)" "$out/$v-$r.txt" | sed 's/^/choices from the cache: /'
	done
done
