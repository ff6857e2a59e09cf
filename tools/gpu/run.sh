#!/usr/bin/env bash
# Runs on the GPU machine (no Go there): every .devbin/*.test with -test.v,
# one log per binary under $OUT (or ./gpu-logs), and a summary last.
#   run tool: command "tar xJf .devpack/bin.tar.xz && tools/gpu/run.sh", carry [".devpack"]
#   extra arguments go to every test binary, e.g. -test.run TestBlasLt;
#   BINS picks binaries by name (e.g. "backend_cuda_kernels", or
#   "backend_cuda backend_cuda_cu backend_cuda_kcache"): all of them take
#   more than one call's 10 minutes on an H200 with a cold kernel cache.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
	ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc\.so|libcublasLt\.so' || true
	ls -l /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda/lib64/libcublasLt.so* 2>&1 | head -20 || true
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-kernels}
# The shared test data that tools/gpu/build.sh copied.
if [ -z "${KILN_SHARED_DIR:-}" ] && [ -d .devbin/shared ]; then
	export KILN_SHARED_DIR=$(pwd)/.devbin/shared
fi
status=0
summary=()
for b in .devbin/*.test; do
	[ -e "$b" ] || { echo "no test binaries: run tools/gpu/build.sh first" >&2; exit 2; }
	name=$(basename "$b" .test)
	if [ -n "${BINS:-}" ] && [[ " $BINS " != *" $name "* ]]; then continue; fi
	bin=$(pwd)/$b
	# Run in the package's directory, as go test does (testdata paths).
	dir=$(echo "$name" | tr _ /)
	[ -d "$dir" ] || dir=.
	(cd "$dir" && "$bin" -test.v -test.count=1 "$@") >"$out/$name.log" 2>&1
	rc=$?
	[ $rc -ne 0 ] && status=1
	summary+=("$(printf '%-28s rc=%d  pass=%d fail=%d skip=%d' "$name" $rc \
		"$(grep -c -- '^--- PASS\|^    --- PASS' "$out/$name.log")" \
		"$(grep -c -- '--- FAIL' "$out/$name.log")" \
		"$(grep -c -- '--- SKIP' "$out/$name.log")")")
	cat "$out/$name.log"
done
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
