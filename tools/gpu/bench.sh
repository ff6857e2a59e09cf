#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/build.sh here: the GPU benchmarks of
# docs/PERF.md, kiln and its PyTorch/transformers peer in the same run, on a
# Llama-3-8B-shaped model with random bf16 weights. Results under $OUT (or
# ./gpu-logs). ABLATIONS=1 adds decode with CUDA graphs off, with
# programmatic dependent launches off and with the GEMV epilogues off.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/bench.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/env.txt" 2>&1
# Prefill of 2048 tokens and decode at context 512, batches 1 to 256.
$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 2048 --tg 128 --depth 512 \
	--batch 1,16,64,256 --reps 5 --output "$out/kiln.json" >"$out/kiln.txt" 2>&1
if [ -n "${ABLATIONS:-}" ]; then
	# The same decode with CUDA graphs off: what replaying graphs saves.
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 512 \
		--batch 1,16 --reps 3 --cuda-graphs=false --output "$out/kiln-nographs.json" >"$out/kiln-nographs.txt" 2>&1
	# The same decode with programmatic dependent launches off: what they save.
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 512 \
		--batch 1,16 --reps 3 --cuda-pdl=false --output "$out/kiln-nopdl.json" >"$out/kiln-nopdl.txt" 2>&1
	# The same decode with SwiGLU and RoPE as kernels of their own: what
	# computing them in the GEMV's epilogue saves.
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 128 --depth 512 \
		--batch 1,16 --reps 3 --cuda-epilogues=false --output "$out/kiln-noepi.json" >"$out/kiln-noepi.txt" 2>&1
fi
# PyTorch eager, and batch-1 decode through torch.compile (about a minute
# to compile and warm up on an H100).
python3 tools/gpu/torch_peer.py --batch 1,16,64,256 --compile >"$out/torch.json" 2>"$out/torch.err"
grep -v '^.loading' "$out/kiln.txt" | tail -20
[ -n "${ABLATIONS:-}" ] && tail -12 "$out/kiln-nographs.txt" "$out/kiln-nopdl.txt" "$out/kiln-noepi.txt"
cat "$out/torch.json"
