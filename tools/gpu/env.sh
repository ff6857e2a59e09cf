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
keep=${KILN_BENCH_DIR:-/tmp/kiln-bench}
