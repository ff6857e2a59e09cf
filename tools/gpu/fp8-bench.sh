#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the Llama-3-8B-shaped
# random bf16 model against its FP8 checkpoint (`kiln quantize --to fp8`:
# the layers' matrices in E4M3 with a scale a row) on the same GPU, taking
# turns: prefill of 2048 tokens and decode at depth 512 of batches 1, 64 and
# 256 (issue 16's FP8 targets: prefill ≥ 1.6×, batch-256 decode ≥ 1.4× the
# bf16 model). Logs under $OUT (or ./gpu-logs).
#   ROUNDS (default 2) rounds; BATCH (1,64,256); PP (2048); TG (64); REPS
#   (3: a single prefill moved by ±5% between runs in session 41). With
#   .devbin/kiln-base (BASE=<rev> tools/gpu/build.sh) the FP8 checkpoint also
#   runs on that kiln in each round (fp8-base). VARIANTS replaces the list
#   (bf16, fp8, fp8-base; bf16-base; fp8-kv8 and bf16-kv8: with
#   --kv-cache-dtype fp8);
#   a variant named with -x (bf16-x, fp8-x, ...) is that variant compiled
#   with KILN_NVRTC_OPTIONS=$XOPTS (an experiment's macro, e.g.
#   XOPTS=-DROPE_U=4: the same binary with and without it) and run with
#   the NAME=VALUE words of $XENV in its environment (e.g.
#   XENV=KILN_MOE_TILE_ROWS=32), and one named with -y with $YOPTS and
#   $YENV (a second experiment beside it; env.sh's experiment);
#   PROFILE=1 adds --profile (the kernels' device times after each test).
#   It ends with tools/gpu/ratio_table.py: each variant ÷ bf16 a round.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/fp8-bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
random_fp8
args=(--device cuda --pp "${PP:-2048}" --tg "${TG:-64}" --depth 512 --batch "${BATCH:-1,64,256}" --reps "${REPS:-3}")
[ "${PROFILE:-0}" = 1 ] && args+=(--profile)
variants="bf16 fp8"
[ -x .devbin/kiln-base ] && variants="bf16 fp8 fp8-base"
for r in $(seq "${ROUNDS:-2}"); do
	for v in ${VARIANTS:-$variants}; do
		t0=$(date +%s)
		name=$v
		exp=none
		case $v in
		*-x) exp=x v=${v%-x} ;;
		*-y) exp=y v=${v%-y} ;;
		esac
		experiment $exp || exit 1
		case $v in
		bf16) $k bench model --random llama3-8b --keep "$keep" "${args[@]}" --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		bf16-kv8) $k bench model --random llama3-8b --keep "$keep" "${args[@]}" --kv-cache-dtype fp8 --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		fp8) $k bench model "$fp8" "${args[@]}" --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		fp8-kv8) $k bench model "$fp8" "${args[@]}" --kv-cache-dtype fp8 --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		fp8-base) .devbin/kiln-base bench model "$fp8" "${args[@]}" --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		bf16-base) .devbin/kiln-base bench model "$bf16" "${args[@]}" --output "$out/$name-$r.json" >"$out/$name-$r.txt" 2>&1 ;;
		esac
		echo "== $name, round $r: rc=$? in $(($(date +%s) - t0)) s"
		grep -E '^\| |roofline|busy' "$out/$name-$r.txt" | head -20
	done
done
# Each variant against bf16 in the same round, and the ratios' range.
python3 tools/gpu/ratio_table.py "$out"
