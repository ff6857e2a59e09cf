# Sourced by the scripts that run on the GPU machine: the repository root as
# the working directory, results under $OUT (or ./gpu-logs), the kernel
# cache, the kiln binary that tools/gpu/build.sh made, and the directory the
# random benchmark model is kept in.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-kernels}
k=.devbin/kiln
# The random model (16 GB) goes to shared memory when it has room: writing
# it to the GPU machine's disk took minutes (2026-11-23).
keep=${KILN_BENCH_DIR:-/tmp/kiln-bench}
if [ -z "${KILN_BENCH_DIR:-}" ] && [ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 20000000 ] 2>/dev/null; then
	keep=/dev/shm/kiln-bench
fi

# The tokenizers of the random models' vocabularies (tools/gpu/build.sh
# copies them from ../shared; kiln refuses a tokenizer whose vocabulary is
# not the model's): Llama 3's 128,256 tokens for llama3-8b and
# llama3.1-8b, GPT-2's 50,257 for moe-7b-a1b (50,304 rows).
llama3_tok=.devbin/shared/tokenizers/llama3.2-bpe/tokenizer.json
gpt2_tok=.devbin/shared/tokenizers/gpt2/tokenizer.json

# random_bf16 makes sure the random Llama-3-8B-shaped bf16 model is in
# $keep (kiln bench model writes it) and sets bf16 to its directory.
random_bf16() {
	bf16=$keep/llama3-8b-bf16
	[ -f "$bf16/config.json" ] && return
	local t0
	t0=$(date +%s)
	$k bench model --random llama3-8b --keep "$keep" --device cuda --pp 0 --tg 1 --batch 1 --reps 1 >"$out/write.txt" 2>&1
	echo "wrote $bf16: rc=$? in $(($(date +%s) - t0)) s"
}

# random_fp8 makes sure the FP8 checkpoint of the random bf16 model
# (`kiln quantize --to fp8`) is in $keep and sets fp8 to its directory.
random_fp8() {
	random_bf16
	fp8=$keep/llama3-8b-fp8
	[ -f "$fp8/config.json" ] && return
	local t0
	t0=$(date +%s)
	$k quantize --to fp8 "$bf16" "$fp8" >"$out/quantize.txt" 2>&1
	echo "quantize: rc=$? in $(($(date +%s) - t0)) s: $(tail -1 "$out/quantize.txt")"
}

# metric prints the value of the Prometheus metric $1 of the kiln serve on
# port 8765; serve_summary one line of a kiln bench serve --output file's
# summary (requests, errors, output tokens/s, TTFT, ITL, TPOT).
metric() { curl -s http://127.0.0.1:8765/metrics | awk -v m="$1" '$1 == m {print $2}'; }
# serve_counters prints the server's steps, generated tokens and step
# seconds so far (differences over a run give its tokens and ms a step).
serve_counters() { echo "steps $(metric kiln:cuda_steps_total), tokens $(metric kiln:generation_tokens_total), step seconds $(metric kiln:engine_step_seconds_total)"; }
serve_summary() {
	python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print('requests', s['requests'], 'errors', s['errors'], 'out tok/s %.0f' % s['output_tokens_per_s'], 'ttft', s['ttft'], 'itl', s['itl'], 'tpot', s['tpot'])" "$1" 2>&1 | head -3
}

# pkg_test DIR NAME ARGS... runs package DIR's test binary (tools/gpu/build.sh
# names it after DIR) with ARGS in DIR (within 200 s) into $out/NAME.log
# and prints its exit status and time; kernels_test is the kernels
# package's, backend_test backend/cuda's.
pkg_test() {
	local dir=$1 name=$2 t0 bin
	shift 2
	bin=$PWD/.devbin/$(echo "$dir" | tr / _).test
	t0=$(date +%s)
	(cd "$dir" && timeout 200 "$bin" -test.v -test.count=1 "$@") >"$out/$name.log" 2>&1
	echo "$name: rc=$? in $(($(date +%s) - t0)) s"
}
kernels_test() { pkg_test backend/cuda/kernels "$@"; }

# experiment x|y|none sets the environment of an experiment of
# fp8-bench.sh and fp8-writers.sh: KILN_NVRTC_OPTIONS from XOPTS (YOPTS;
# NVRTC options, e.g. -DROPE_U=4) and the NAME=VALUE words of XENV (YENV;
# e.g. KILN_MOE_TILE_ROWS=32); none clears both. It fails when neither is
# given for x (y).
experiment() {
	local e opts envs
	unset KILN_NVRTC_OPTIONS
	for e in ${XENV:-} ${YENV:-}; do unset "${e%%=*}"; done
	case $1 in
	x) opts=${XOPTS:-} envs=${XENV:-} ;;
	y) opts=${YOPTS:-} envs=${YENV:-} ;;
	*) return 0 ;;
	esac
	if [ -z "$opts$envs" ]; then
		echo "experiment $1: no ${1^^}OPTS nor ${1^^}ENV" >&2
		return 1
	fi
	[ -n "$opts" ] && export KILN_NVRTC_OPTIONS="$opts"
	for e in $envs; do export "${e?}"; done
	return 0
}
backend_test() { pkg_test backend/cuda "$@"; }

# tp_tests [PATTERN] runs the kernels' peer tests (TestPeer*, and
# TestKernelResources, which logs the peer kernels' local memory) unless
# SKIP_KERNELS is set, then backend/cuda's tensor-parallel tests
# (TestTensorParallel*, TestPeerFormsMatch, and PATTERN's), each into its
# log under $out, and prints their exit status and failures.
tp_tests() {
	if [ -z "${SKIP_KERNELS:-}" ]; then
		kernels_test kernels -test.run 'TestPeer|TestKernelResources'
		grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- (PASS|FAIL|SKIP)|made|waited|bf16 peer_' "$out/kernels.log" | head -40
	fi
	backend_test backend -test.run "TestTensorParallel|TestPeerFormsMatch${1:+|$1}"
	grep -E '^(--- FAIL|FAIL|ok|PASS)|^\s*--- FAIL' "$out/backend.log" | head -10
}

# offline_mixed MODEL FILE runs serving's load offline on MODEL into FILE:
# kiln bench model's fixed step mix (--mixed 256: each step 256 decodes at
# depth 128 and a 256-token prompt), once; it prints its exit status and
# the rate lines.
offline_mixed() {
	$k bench model "$1" --device cuda --pp 0 --tg 128 --depth 128 --batch 256 --mixed 256 --reps 1 >"$2" 2>&1
	echo "bench model --mixed: rc=$? at $(($(date +%s) - t0)) s"
	grep -E '^\| tg|prompt tokens/s' "$2"
}

# serve_up waits (up to ${1:-300} s) for the kiln serve on port 8765.
serve_up() {
	local i
	for i in $(seq 1 "${1:-300}"); do curl -sf http://127.0.0.1:8765/health >/dev/null && return 0; sleep 1; done
	return 1
}

# serve_start LOG WAIT ARGS... starts kiln serve ARGS on port 8765 (its
# output in LOG, its pid in $server) and waits for it up to WAIT s: 0 once
# it answers; else it prints why, stops it and returns 1.
serve_start() {
	local log=$1 wait=$2
	shift 2
	$k serve "$@" --port 8765 >"$log" 2>&1 &
	server=$!
	if ! serve_up "$wait"; then
		echo "the server did not come up in $wait s:"
		tail -20 "$log"
		kill -QUIT $server 2>/dev/null
		return 1
	fi
	echo "server up after $(($(date +%s) - t0)) s"
}

# serve_bound BOUND MODEL ARGS... starts kiln serve on MODEL (serve_start:
# Llama 3's tokenizer $tok, 256 sequences, ARGS) with
# --decode-prefill-tokens BOUND, its log $work/serve-BOUND.log.
serve_bound() {
	local b=$1 model=$2
	shift 2
	echo "bound $b:"
	serve_start "$work/serve-$b.log" 300 "$model" --tokenizer "$tok" --device cuda --max-num-seqs 256 --decode-prefill-tokens "$b" "$@"
}

# serve_run NAME CONCURRENCY REQUESTS WARMUP runs kiln bench serve against
# it (128-token prompts in tokenizer $tok, 128 output tokens; within
# ${SERVE_TIMEOUT:-120} s) into $work/NAME.json, .html and .txt, and prints
# its exit status and the seconds since $t0. Each run draws its prompts
# with a seed of its own (serve_seed counts them), so no run's prompts are
# in the server's prefix cache from an earlier run.
serve_run() {
	serve_seed=$((${serve_seed:-0} + 1))
	timeout "${SERVE_TIMEOUT:-120}" $k bench serve --url http://127.0.0.1:8765 --concurrency "$2" --num-requests "$3" --warmup "$4" --seed "$serve_seed" \
		--prompt-tokens 128 --output-tokens 128 --tokenizer "$tok" --output "$work/$1.json" --html "$work/$1.html" >"$work/$1.txt" 2>&1
	echo "$1: rc=$? at $(($(date +%s) - t0)) s"
}

# tp_env readies a tensor-parallel run: NVLink multicast off (the shared
# machines require it) and the GPUs and their links in $out/env.txt.
tp_env() {
	export NCCL_NVLS_ENABLE=0
	{ nvidia-smi -L; nvidia-smi topo -m; } >"$out/env.txt" 2>&1
}

# pack_out NAME moves everything under $out into the archive $out/NAME:
# the device tool brings back only a few files.
pack_out() { (cd "$out" && tar czf "/tmp/$1" . && rm -rf ./* && mv "/tmp/$1" .); }

# tp_bench NAME TP BATCHES LIMIT [VAR=value...] runs kiln bench model on
# the random bf16 model $bf16 (random_bf16) at tensor-parallel size TP
# (prefill ${PP:-2048}, decode 64 tokens at depth 512 of each batch in
# BATCHES, 2 repetitions; within LIMIT s, VAR=value set; the kiln binary
# ${KILN_BIN:-$k}) into $out/model-NAME.json and .txt, and prints its exit
# status and the seconds since $t0.
tp_bench() {
	local name=$1 n=$2 batches=$3 limit=$4
	shift 4
	env "$@" timeout -s QUIT "$limit" ${KILN_BIN:-$k} bench model "$bf16" --device cuda --tensor-parallel-size "$n" --pp "${PP:-2048}" --tg 64 --depth 512 \
		--batch "$batches" --reps 2 --output "$out/model-$name.json" >"$out/model-$name.txt" 2>&1
	echo "bench model $name: rc=$? at $(($(date +%s) - t0)) s"
}

# ncu is Nsight Compute's command on the GPU machine (empty: none).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

# ncu_prefill NAME MODEL LIMIT profiles a 2048-token prefill of MODEL under
# Nsight Compute (within LIMIT s), kernel by kernel: duration and DRAM
# bytes, caches flushed between kernels, clocks left alone; into
# $out/NAME.csv and .txt, and prints its exit status and
# tools/gpu/ncu_steps.py's summary with each kernel's DRAM rate (also in
# $out/NAME.summary).
ncu_prefill() {
	timeout "$3" "$ncu" --clock-control none --cache-control all --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
		--csv --print-units base --log-file "$out/$1.csv" $k bench model "$2" --device cuda --reps 1 --cuda-graphs=false \
		--pp 2048 --tg 0 >"$out/$1.txt" 2>&1
	echo "$1 ncu: rc=$?"
	python3 tools/gpu/ncu_steps.py "$out/$1.csv" --bytes | tee "$out/$1.summary"
}

# random_ids N prints N random token ids from 1,000 to 99,999, comma-
# separated, the same every time (the speculative scripts' prompts).
random_ids() {
	python3 -c "import random, sys; r=random.Random(5); print(','.join(str(r.randrange(1000, 100000)) for _ in range(int(sys.argv[1]))))" "$1"
}

# tp_serve N [again] serves the random model $bf16 (random_bf16) with kiln
# serve --tensor-parallel-size N on port 8765 and runs kiln bench serve
# against it at 1, 64 and 256 streams of 128/128 tokens (and 256 again
# with "again"), one run after another (serve_run; logs, JSON and charts
# in $work, times since $t0: both the caller's), prints the server's slow
# steps, and stops it.
tp_serve() {
	local server i
	tok=$llama3_tok
	serve_start "$work/serve.log" 90 "$bf16" --tokenizer "$tok" --device cuda --tensor-parallel-size "$1" --max-num-seqs 256 || return 1
	tp_serve_run serve-c1 1 16 2 30
	tp_serve_run serve-c64 64 256 64 40
	tp_serve_run serve-c256 256 768 256 50
	[ "${2:-}" = again ] && tp_serve_run serve-c256-again 256 768 256 50
	grep "slow step" "$work/serve.log" | cut -c1-400
	kill -TERM $server
	for i in $(seq 1 15); do kill -0 $server 2>/dev/null || break; sleep 1; done
	kill -QUIT $server 2>/dev/null
	wait $server
	echo "server exit $? at $(($(date +%s) - t0)) s"
}
tp_serve_run() { SERVE_TIMEOUT=$5 serve_run "$1" "$2" "$3" "$4" && serve_summary "$work/$1.json"; }

# ktrace_build builds the kernel tracer tools/gpu/ktrace/ktrace.c against
# the machine's CUPTI into /tmp/libktrace.so.
ktrace_build() {
	local inc lib rec
	inc=$(dirname "$(find / -name cupti_activity.h -path '*include*' 2>/dev/null | head -1)")
	lib=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | head -1)")
	rec=$(grep -ho 'CUpti_ActivityKernel[0-9]*' "$inc"/cupti_activity*.h | sort -V | tail -1)
	echo "cupti: $inc $lib $rec"
	gcc -O2 -shared -fPIC -I"$inc" -I/usr/local/cuda/include -DKREC="$rec" tools/gpu/ktrace/ktrace.c -L"$lib" -lcupti -lpthread \
		-Wl,-rpath,"$lib" -o /tmp/libktrace.so
}

# trace_setup readies a tracing script: tp_env, $work the output folder,
# $t0 now, the tracer built (ktrace_build) and the random model ($bf16:
# random_bf16); 1 when the tracer does not build.
trace_setup() {
	tp_env
	work=$out
	t0=$(date +%s)
	ktrace_build || return 1
	random_bf16
}

# trace_prefill NAME BIN MODEL runs kiln bench model's 2048-token prefill
# of MODEL on the kiln binary BIN, untraced, then under the tracer
# (ktrace_build) into $out/NAME.csv, both with the tune cache
# /tmp/tune-NAME (the untraced run's races choose), and prints both runs'
# tokens/s and one layer's kernels in order (the first ${LINES_MAX:-16}
# lines).
trace_prefill() {
	local name=$1 bin=$2 dir=$3
	local run=(timeout -s QUIT 120 "$bin" bench model "$dir" --device cuda --pp 2048 --tg 0 --batch 1 --reps 2)
	KILN_TUNE_DIR=/tmp/tune-$name "${run[@]}" >"$out/$name-plain.txt" 2>&1
	KILN_TUNE_DIR=/tmp/tune-$name CUDA_INJECTION64_PATH=/tmp/libktrace.so KTRACE_OUT="$out/$name.csv" "${run[@]}" >"$out/$name.txt" 2>&1
	echo "== prefill $name: rc=$?; plain $(grep -h '^| pp' "$out/$name-plain.txt" | tail -1 | cut -c10-40), traced $(grep -h '^| pp' "$out/$name.txt" | tail -1 | cut -c10-40)"
	python3 tools/gpu/ktrace/ktrace.py "$out/$name.csv" --last 2 --layer | sed -n '/one step/,$p' | head -"${LINES_MAX:-16}"
}

# trace NAME TP MODEL-ARGS... runs kiln bench model (${KILN_BIN:-$k}) at
# batch ${B:-1}, depth 512, 64 tokens, untraced, then under the tracer
# (ktrace_build) into $work/NAME.csv, both with the tune cache
# $TRACE_TUNE_DIR, else /tmp/tune-trace-NAME (new): the untraced run's
# races choose (or the cache's choices stand) and the traced run takes
# them (races under the tracer, whose launches are slower, chose
# differently: session 37). It prints both runs' tokens/s,
# each device's summary by tools/gpu/ktrace/ktrace.py (the first
# ${LINES_MAX:-60} lines; all in $work/NAME-dD.summary) and, over several
# devices, their steps' skew (ktrace.py --skew).
trace() {
	local name=$1 n=$2
	shift 2
	local run=(timeout -s QUIT 120 "${KILN_BIN:-$k}" bench model "$@" --device cuda --tensor-parallel-size "$n" --pp 0 --tg 64
		--depth 512 --batch "${B:-1}" --reps 1)
	local tune=${TRACE_TUNE_DIR:-/tmp/tune-trace-$name}
	[ -n "${TRACE_TUNE_DIR:-}" ] || rm -rf "$tune"
	KILN_TUNE_DIR=$tune "${run[@]}" >"$work/$name-plain.txt" 2>&1
	echo "$name plain: rc=$?; $(grep -h '^| tg' "$work/$name-plain.txt" | tail -1 | cut -c1-80)"
	KILN_TUNE_DIR=$tune CUDA_INJECTION64_PATH=/tmp/libktrace.so KTRACE_OUT="$work/$name.csv" "${run[@]}" >"$work/$name.txt" 2>&1
	echo "$name traced: rc=$? at $(($(date +%s) - t0)) s; $(grep -h '^| tg' "$work/$name.txt" | tail -1 | cut -c1-80)"
	for d in $(seq 0 $((n - 1))); do
		echo "== $name device $d"
		python3 tools/gpu/ktrace/ktrace.py "$work/$name.csv" --device "$d" --layer >"$work/$name-d$d.summary"
		head -"${LINES_MAX:-60}" "$work/$name-d$d.summary"
	done
	if [ "$n" -gt 1 ]; then
		python3 tools/gpu/ktrace/ktrace.py "$work/$name.csv" --skew "$n" | tee "$work/$name-skew.summary"
	fi
}
