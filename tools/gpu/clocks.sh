#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the GPU's clocks,
# power and the reasons its clocks are held down (nvidia-smi, every 100 ms)
# while kiln bench model decodes the random Llama-3-8B-shaped bf16 model at
# depth 512, batch $BATCHES (1 64 256) one after another, $TG (256) tokens
# each; tools/gpu/clocks.py summarizes each run's samples. Logs in
# logs.tgz.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/clocks.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi -q -d CLOCK,POWER | grep -E -i 'max|limit|default|current|sm|mem' | head -40 >"$out/smi-q.txt"
head -40 "$out/smi-q.txt"
random_bf16
export KILN_TUNE_DIR=/tmp/tune-clocks
for b in ${BATCHES:-1 64 256}; do
	# once to race and cache the choices, then sampled
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 16 --depth 512 --batch "$b" --reps 1 >"$out/warm-$b.txt" 2>&1
	nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
		--format=csv,noheader,nounits -lms 100 >"$out/smi-$b.csv" 2>"$out/smi-$b.err" &
	smi=$!
	sleep 1
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg "${TG:-256}" --depth 512 --batch "$b" --reps 2 >"$out/b$b.txt" 2>&1
	echo "batch $b: rc=$?; $(grep -E '^\| tg' "$out/b$b.txt" | cut -c1-80)"
	sleep 1
	kill $smi
	python3 tools/gpu/clocks.py "$out/smi-$b.csv"
done
(cd "$out" && tar czf logs.tgz --exclude logs.tgz * && find . -maxdepth 1 -type f ! -name logs.tgz -delete)
