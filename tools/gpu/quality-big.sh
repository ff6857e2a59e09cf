#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here, with Debian's
# bible-kjv installed here (build.sh then carries the King James Bible in
# .devbin/data/kjv): issue 16's quality check on a model bigger than the
# demo and trained, not random. tools/demo-model/train.py trains a Llama of
# about 27M parameters (hidden 512, 8 layers, 8 heads, 4 KV heads, SwiGLU
# 1536: every matrix is whole 256-blocks, so every k-quant applies) on the
# demo's training books; kiln quantize writes it in each format, and kiln
# perplexity scores the four held-out books (one file) in each on the CPU
# (the kernels TestQuantizedQuality checks), the bf16 model with the FP8
# KV cache too. It prints a table (perplexity, mean NLL − bf16's) and exits
# 1 when a format's mean NLL rises past its bound (bounds below).
#   STEPS (default 800) the training schedules (train.py --steps);
#   FORMATS (default "q8_0 q6_k q5_k_m q4_k_m q4_k q4_0 fp8 kv8").
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/quality-big.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/env.txt" 2>&1
[ -f .devbin/data/kjv/kjv.txt ] || { echo "no .devbin/data/kjv/kjv.txt: install bible-kjv where build.sh runs"; exit 2; }
dir=$keep/kjv-big
if [ ! -f "$dir/files/config.json" ]; then
	t0=$(date +%s)
	PYTHONUNBUFFERED=1 python3 tools/demo-model/train.py --data .devbin/data/kjv --out "$dir" --seed 1234 \
		--steps "${STEPS:-800}" --hidden 512 --layers 8 --heads 8 --kv-heads 4 --intermediate 1536 >"$out/train.log" 2>&1
	echo "train: rc=$? in $(($(date +%s) - t0)) s"
	grep -E "params|best|heldout overall" "$out/train.log" | tail -5
fi
cat "$dir"/testdata/heldout/*.txt >"$dir/heldout.txt"
ppl() { # model [flags...]: mean NLL a token and perplexity, one line
	$k perplexity "$@" --file "$dir/heldout.txt" --device cpu --threads 16 --json 2>/dev/null |
		python3 -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(r["nll"]/r["predicted"], r["perplexity"])'
}
bound() {
	case $1 in
	q8_0) echo 0.002 ;; q6_k) echo 0.005 ;; kv8) echo 0.01 ;; fp8) echo 0.02 ;;
	q5_k_m) echo 0.015 ;; q4_k_m) echo 0.03 ;; q4_k) echo 0.05 ;; q4_0) echo 0.06 ;;
	esac
}
read -r base bppl < <(ppl "$dir/files")
echo "| format | perplexity | mean NLL − bf16's (nats a token) | bound |"
echo "|---|---|---|---|"
printf "| bf16 | %.3f | | |\n" "$bppl"
fail=0
for f in ${FORMATS:-q8_0 q6_k q5_k_m q4_k_m q4_k q4_0 fp8 kv8}; do
	case $f in
	kv8) read -r n p < <(ppl "$dir/files" --kv-cache-dtype fp8) ;;
	fp8)
		[ -f "$dir/fp8/config.json" ] || $k quantize "$dir/files" "$dir/fp8" --to fp8 >/dev/null
		read -r n p < <(ppl "$dir/fp8") ;;
	*)
		[ -f "$dir/$f.gguf" ] || $k quantize "$dir/files" "$dir/$f.gguf" --to "$f" >/dev/null
		read -r n p < <(ppl "$dir/$f.gguf") ;;
	esac
	d=$(python3 -c "print(f'{$n - $base:+.4f}')")
	b=$(bound "$f")
	printf "| %s | %.3f | %s | %s |\n" "$f" "$p" "$d" "$b"
	if python3 -c "import sys; sys.exit(0 if $n - $base <= $b else 1)"; then :; else
		echo "FAIL: $f's mean NLL rose by $d, past $b"
		fail=1
	fi
done
exit $fail
