#!/usr/bin/env bash
# Runs on a GPU machine of two GPUs after tools/gpu/build.sh here (issue 20):
# the all-reduce's forms at TP=2 against each other, taking turns on one
# machine: kiln bench model on the random bf16 Llama-3-8B shape (decode at
# depth 512, batches $BATCH, default 1,64) with KILN_PEER_ALLREDUCE unset
# (the Lamport form) and =flags (the flag form, as before session 30) (or
# the forms $FORMS names), $ROUNDS rounds (default 2), then TP=1 once, and
# a profiled TP=2 batch-1 decode of each of those forms
# (SKIP_PROFILE=1: none). With .devbin/kiln-base (BASE=<rev>
# tools/gpu/build.sh) each round also runs TP=2 by that kiln ("base"), so
# that a machine's own spread shows against the code's. Each run's host
# share of a step is printed beside it (a busy host shows as time outside
# device work and a wide spread).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/tp-forms.sh",
#   carry [".devpack"], kind nvidia-h200-x2
source "$(dirname "$0")/env.sh"
tp_env
t0=$(date +%s)
random_bf16
echo "model at $(($(date +%s) - t0)) s"
b=${BATCH:-1,64}
bench() { # name tp mode [binary]
	local v=$3
	[ "$v" = default ] && v=
	PP=0 KILN_BIN=${4:-$k} tp_bench "$1" "$2" "$b" 70 KILN_PEER_ALLREDUCE=$v
	grep -E "^\| tg|device is busy" "$out/model-$1.txt" | sed 's/^/    /'
}
names=()
for r in $(seq "${ROUNDS:-2}"); do
	if [ -x .devbin/kiln-base ]; then
		bench tp2-base-$r 2 default .devbin/kiln-base
		names+=(tp2-base-$r)
	fi
	for m in ${FORMS:-default flags}; do
		bench tp2-$m-$r 2 $m
		names+=(tp2-$m-$r)
	done
done
bench tp1 1 default
python3 tools/gpu/tp_table.py "$out" "${names[@]}" tp1
for m in $([ -z "${SKIP_PROFILE:-}" ] && echo ${FORMS:-default flags}); do
	v=$m
	[ "$v" = default ] && v=
	env KILN_PEER_ALLREDUCE=$v timeout -s QUIT 50 $k bench model "$bf16" --device cuda --tensor-parallel-size 2 --pp 0 --tg 16 --depth 512 \
		--batch 1 --reps 1 --profile >"$out/profile-$m.txt" 2>&1
	echo "profile $m: rc=$? at $(($(date +%s) - t0)) s"
	grep -iE "all-reduce|add_rmsnorm|step" "$out/profile-$m.txt" | head -8
done
pack_out logs.tgz
