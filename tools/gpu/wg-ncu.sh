#!/usr/bin/env bash
# Runs on one H100/H200 after `tools/gpu/build.sh ./backend/cuda/kernels`
# here (session 46): Nsight Compute's full sections on the wgmma prefill
# attention (BenchmarkPrefillAttention's full 4,096-token case, 32/8 heads
# × 128, bf16), one launch of each build in BUILDS (default: the plain
# `wg128`, the TMA `wgt128` and the ping-pong `wgp128`, the module built
# with -DWG_TMA): where its warps stall, how busy the tensor pipe is, what
# shared memory and L2 carry.
# First PyTorch's attention on the same shapes, each SDPA backend alone
# (tools/gpu/torch_peer.py --attention-only: the peer in the same call).
# SOURCE=1: also each build's SASS with its warps' stall samples an
# instruction (ncu's source page, ncu-<build>-sass.csv) and every metric
# (the raw page, ncu-<build>-raw.csv), summed here by tools/gpu/ncu_stalls.py;
# NOPEER=1 skips PyTorch.
# Logs in logs-ncu.tgz (with what $OUT held before: e.g. wg-ab.sh's logs.tgz).
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/wg-ncu.sh", carry [".devpack"]
source "$(dirname "$0")/env.sh"
[ -n "$ncu" ] || { echo "no ncu" >&2; exit 2; }
t0=$(date +%s)
if [ -z "${NOPEER:-}" ]; then
	timeout 120 python3 tools/gpu/torch_peer.py --attention-only >"$out/torch-attn.json" 2>"$out/torch-attn.log"
	echo "torch peer: rc=$? at $(($(date +%s) - t0)) s"
	python3 -c 'import json, sys
a = json.load(open(sys.argv[1]))["attention"]
for k, v in a.items():
    print(k, {n: round(x, 1) if isinstance(x, float) else x for n, x in v.items()})' "$out/torch-attn.json"
fi
export KILN_NVRTC_OPTIONS=${NCU_OPTS:--DWG_TMA=1} # NCU_OPTS: other NVRTC options
bin=$PWD/.devbin/backend_cuda_kernels.test
for b in ${BUILDS:-wg128 wgt128 wgp128}; do
	case $b in
	wgt128) kern=prefill_wgt_128_128_2 ;;
	wgp128) kern=prefill_wgp_128_128_3 ;;
	*) kern=prefill_wg_128_128_2 ;;
	esac
	rep=()
	[ -n "${SOURCE:-}" ] && rep=(-o "/tmp/ncu-$b" -f)
	(cd backend/cuda/kernels && timeout 240 "$ncu" --clock-control none --set full "${rep[@]}" -k "regex:^$kern\$" -c 1 \
		"$bin" -test.count=1 -test.run '^$' -test.bench "PrefillAttention/${CASE:-full4096}/$b\$" -test.benchtime 1x) >"$out/ncu-$b.txt" 2>&1
	echo "$b ncu: rc=$? at $(($(date +%s) - t0)) s"
	if [ -n "${SOURCE:-}" ]; then
		"$ncu" -i "/tmp/ncu-$b.ncu-rep" --page details --print-details all >"$out/ncu-$b.txt" 2>&1
		"$ncu" -i "/tmp/ncu-$b.ncu-rep" --page source --csv --print-source sass >"$out/ncu-$b-sass.csv" 2>&1
		echo "$b source page: rc=$? $(wc -l <"$out/ncu-$b-sass.csv") lines"
		"$ncu" -i "/tmp/ncu-$b.ncu-rep" --page raw --csv >"$out/ncu-$b-raw.csv" 2>&1
		echo "$b raw page: rc=$?"
	fi
	grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|No Eligible|One or More Eligible|Stall|stall|Tensor|tensor|pipe|Pipe|Shared Memory|Bank' "$out/ncu-$b.txt" | head -${LINES_MAX:-60}
done
pack_out logs-ncu.tgz
