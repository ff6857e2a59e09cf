#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the steady state of
# serving 256 streams of 128/128 tokens, where the closed loop's start and
# end weigh less than in serve-bench.sh's runs: ${REQUESTS:-5120} requests
# (the first 256 left out) on kiln serve with each bound of ${BOUNDS:-"256
# 512"} (--decode-prefill-tokens), a server a bound, beside the same load
# offline (kiln bench model --mixed 256 at 256 sequences, depth 128). Prints
# the offline rate, each run's summary and the server's steps, generated
# tokens and step time over the run.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/serve-long.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
tok=$llama3_tok
work=$(mktemp -d)
t0=$(date +%s)
random_bf16
offline_mixed "$bf16" "$work/offline.txt"
for b in ${BOUNDS:-256 512}; do
	serve_bound "$b" "$bf16" || continue
	echo "bound $b: $(serve_counters)"
	SERVE_TIMEOUT=200 serve_run "long-$b" 256 "${REQUESTS:-5120}" 256
	echo "bound $b: $(serve_counters)"
	serve_summary "$work/long-$b.json"
	kill -TERM $server
	wait $server
done
mkdir -p "$out"
tar czf "$out/long.tgz" -C "$work" .
