#!/usr/bin/env bash
# Runs on the GPU machine after `BASE=<rev> tools/gpu/build.sh` here:
# batched decode of the random Llama-3-8B-shaped model by kiln as of <rev>
# (.devbin/kiln-base) and by this tree's (.devbin/kiln), taking turns in one
# call, so that a change is measured against its base on one machine (H200s
# differ by 1–2 points of the roofline between machines). Logs under $OUT
# (or ./gpu-logs): base-<round>.txt, new-<round>.txt and their JSON.
#   ROUNDS (default 2) rounds of `kiln bench model --pp 0 --tg $TG (64)
#   --depth $DEPTH (512) --batch $BATCH (16,64) --reps 1`.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/ab.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -x .devbin/kiln-base ] || { echo "no .devbin/kiln-base: run BASE=<rev> tools/gpu/build.sh" >&2; exit 2; }
for r in $(seq "${ROUNDS:-2}"); do
	for v in base new; do
		bin=.devbin/kiln
		[ "$v" = base ] && bin=.devbin/kiln-base
		t0=$(date +%s)
		$bin bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg "${TG:-64}" --depth "${DEPTH:-512}" \
			--batch "${BATCH:-16,64}" --reps 1 --output "$out/$v-$r.json" >"$out/$v-$r.txt" 2>&1
		echo "== $v, round $r: rc=$? in $(($(date +%s) - t0)) s"
		grep -v '^.loading' "$out/$v-$r.txt" | tail -30
	done
done
