package kernels

import (
	"fmt"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
)

// l2ProbeSource streams a buffer much larger than the L2 (standing in for
// decode attention's K/V reads) and, per mode, asks the L2 to fetch a
// product's weights meanwhile: 0 none; 1/2 all lines first; 3/4 a line
// every so many loads, spread over the stream; 5/6 all lines after the
// stream; even modes with the evict_last priority.
const l2ProbeSource = `
__device__ __forceinline__ void pf_line(const char* p, int last) {
	if (last) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
	else asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
extern "C" __global__ void l2_stream(const uint4* src, long long n, uint4* sink, const char* pf, long long pfLines, int mode) {
	const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, nth = (long long)gridDim.x * blockDim.x;
	const int last = mode > 0 && mode % 2 == 0;
	if (mode == 1 || mode == 2)
		for (long long l = tid; l < pfLines; l += nth) pf_line(pf + 128 * l, last);
	const long long per = (n + nth - 1) / nth, lines = (pfLines + nth - 1) / nth;
	const long long step = (mode == 3 || mode == 4) && lines > 0 ? (per + lines - 1) / lines : 0;
	long long pl = tid;
	unsigned acc = 0;
	long long j = 0;
	for (long long i = tid; i < n; i += 4 * nth, j += 4) {
		uint4 v[4];
#pragma unroll
		for (int u = 0; u < 4; u++) v[u] = i + u * nth < n ? src[i + u * nth] : make_uint4(0, 0, 0, 0);
#pragma unroll
		for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
		if (step > 0 && j % step < 4 && pl < pfLines) {
			pf_line(pf + 128 * pl, last);
			pl += nth;
		}
	}
	if (mode == 5 || mode == 6)
		for (long long l = tid; l < pfLines; l += nth) pf_line(pf + 128 * l, last);
	if (acc == 0x9e3779b9u) sink[0] = make_uint4(acc, 0, 0, 0);
}
// l2_norm_pf stands in for the add + RMSNorm before a product of 64 rows
// (one block a row reads and writes a row of dim bf16 values) and asks the
// L2 for the first prefix bytes of each of the product's n weight rows of
// rowBytes each.
extern "C" __global__ void l2_norm_pf(const uint4* x, uint4* y, int dim16, const char* w, int n, long long rowBytes, long long prefix) {
	for (int i = threadIdx.x; i < dim16; i += blockDim.x) {
		uint4 v = x[(long long)blockIdx.x * dim16 + i];
		v.x ^= 1;
		y[(long long)blockIdx.x * dim16 + i] = v;
	}
	const long long per = prefix / 128, total = per * n;
	for (long long l = blockIdx.x * (long long)blockDim.x + threadIdx.x; l < total; l += (long long)gridDim.x * blockDim.x)
		pf_line(w + (l / per) * rowBytes + 128 * (l % per), 0);
}
`

// TestL2PrefetchSpeed measures whether a product's weights fetched into
// the L2 while a memory-bound kernel streams other data (as decode
// attention streams K and V before the output projection) make the
// product faster by more than they slow the stream: the stream of 142 MB
// (64 sequences' K and V of a Llama-3-8B layer at context 544) then the
// output projection of 64 rows through cuBLASLt (4096×4096 bf16, weights
// rotated over 4 copies so that they are cold unless fetched), each mode
// of l2ProbeSource. It logs, asserts nothing.
func TestL2PrefetchSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d, m, lt := l2Probe(t)
	for _, sh := range []struct {
		name           string
		streamMB, k, n int
	}{{"O after attention", 142, 4096, 4096}, {"QKV after attention", 142, 4096, 6144}, {"down, 30 MB stream", 30, 14336, 4096}} {
		t.Run(sh.name, func(t *testing.T) {
			const rows, nw = 64, 4
			n16 := sh.streamMB << 20 / 16
			src, sink := alloc(t, n16*16), alloc(t, 64)
			wbytes := sh.k * sh.n * 2
			ws := make([]cu.Ptr, nw)
			for i := range ws {
				ws[i] = alloc(t, wbytes)
				must(t, d.Memset32(ws[i], 0x3c003c00^uint32(i*0x00010001), wbytes/4, nil))
			}
			x, out := alloc(t, rows*sh.k*2), alloc(t, rows*sh.n*2)
			must(t, d.Memset32(x, 0x3c003c00, rows*sh.k/2, nil))
			var lines []string
			for _, mode := range []int{0, 1, 2, 3, 4, 5, 6, 0} {
				pfLines := int64(wbytes / 128)
				sMs, pMs := timeBeforeProduct(t, d, lt, ws, 30, func(w cu.Ptr) error {
					return m.Launch("l2_stream", cu.D1(d.SMs*4), cu.D1(512), 0, nil, src, int64(n16), sink, w, pfLines, int32(mode))
				}, cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.BF16, Out: cu.BF16, X: x, Dst: out})
				lines = append(lines, fmt.Sprintf("mode %d: stream %.1f µs (%.0f GB/s), product %.1f µs, both %.1f µs",
					mode, 1e3*sMs, float64(n16*16)/(sMs*1e-3)/1e9, 1e3*pMs, 1e3*(sMs+pMs)))
			}
			t.Logf("%s (stream %d MB, product 64×%d×%d, weights %.1f MB):\n%s", sh.name, sh.streamMB, sh.k, sh.n, float64(wbytes)/1e6, strings.Join(lines, "\n"))
		})
	}
}

// TestL2PrefetchAfterNorm measures whether the kernel before a product of
// 64 rows (an add + RMSNorm, short and far from the memory's bandwidth)
// can make the cuBLASLt product that follows faster by asking the L2 for
// the first part of each weight row (every block of the product starts its
// rows at K = 0): the pair's time for prefixes of 0 to all of K, weights
// rotated over copies so that they are cold unless fetched. It logs,
// asserts nothing.
func TestL2PrefetchAfterNorm(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d, m, lt := l2Probe(t)
	for _, sh := range []struct {
		name string
		k, n int
	}{{"QKV", 4096, 6144}, {"O", 4096, 4096}, {"gate/up", 4096, 28672}, {"down", 14336, 4096}} {
		t.Run(sh.name, func(t *testing.T) {
			const rows, nw = 64, 4
			wbytes := sh.k * sh.n * 2
			ws := make([]cu.Ptr, nw)
			for i := range ws {
				ws[i] = alloc(t, wbytes)
				must(t, d.Memset32(ws[i], 0x3c003c00^uint32(i*0x00010001), wbytes/4, nil))
			}
			x, y, out := alloc(t, rows*sh.k*2), alloc(t, rows*sh.k*2), alloc(t, rows*sh.n*2)
			must(t, d.Memset32(x, 0x3c003c00, rows*sh.k/2, nil))
			var lines []string
			for _, eighths := range []int{0, 1, 2, 3, 4, 6, 8, 0} {
				prefix := int64(sh.k*2*eighths/8) &^ 127
				nMs, pMs := timeBeforeProduct(t, d, lt, ws, 40, func(w cu.Ptr) error {
					return m.Launch("l2_norm_pf", cu.D1(rows), cu.D1(512), 0, nil, x, y, int32(sh.k/8), w, int32(sh.n), int64(sh.k*2), prefix)
				}, cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.BF16, Out: cu.BF16, X: y, Dst: out})
				lines = append(lines, fmt.Sprintf("prefix %d/8 (%.1f MB): norm %.1f µs, product %.1f µs (%.0f GB/s), both %.1f µs",
					eighths, float64(prefix)*float64(sh.n)/1e6, 1e3*nMs, 1e3*pMs, float64(wbytes)/(pMs*1e-3)/1e9, 1e3*(nMs+pMs)))
			}
			t.Logf("%s (product 64×%d×%d, weights %.1f MB):\n%s", sh.name, sh.k, sh.n, float64(wbytes)/1e6, strings.Join(lines, "\n"))
		})
	}
}

// timeBeforeProduct times a kernel (launch, given the run's weights) and
// the cuBLASLt product mm after it on those weights, rotated over ws: the
// mean time of each over reps runs after 3 warm-ups, in ms.
func timeBeforeProduct(t *testing.T, d *cu.Device, lt *cu.BlasLt, ws []cu.Ptr, reps int, launch func(w cu.Ptr) error, mm cu.Matmul) (float64, float64) {
	ev := make([]*cu.Event, 3)
	for i := range ev {
		var err error
		ev[i], err = d.NewEvent(true)
		must(t, err)
		defer ev[i].Close()
	}
	var sumA, sumB float64
	for r := 0; r < reps+3; r++ {
		mm.W = ws[r%len(ws)]
		must(t, ev[0].Record(nil))
		must(t, launch(mm.W))
		must(t, ev[1].Record(nil))
		must(t, lt.Matmul(mm))
		must(t, ev[2].Record(nil))
		must(t, ev[2].Sync())
		a, err1 := cu.Elapsed(ev[0], ev[1])
		b, err2 := cu.Elapsed(ev[1], ev[2])
		must(t, err1)
		must(t, err2)
		if r >= 3 {
			sumA += float64(a)
			sumB += float64(b)
		}
	}
	return sumA / float64(reps), sumB / float64(reps)
}

// l2Probe compiles l2ProbeSource and opens cuBLASLt, both closed when the
// test ends.
func l2Probe(t *testing.T) (*cu.Device, *cu.Module, *cu.BlasLt) {
	d := gpu(t)
	m, err := d.Compile("kiln_l2_probe", l2ProbeSource, "--std=c++17")
	must(t, err)
	t.Cleanup(func() { m.Close() })
	lt, err := d.NewBlasLt(0)
	must(t, err)
	t.Cleanup(func() { lt.Close() })
	return d, m, lt
}
