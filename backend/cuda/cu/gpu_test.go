package cu

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/backend/cuda/kcache"
	"kiln/tensor"
)

var (
	devOnce sync.Once
	dev     *Device
	devErr  error
)

// gpu returns the shared test device, or skips when CUDA is unavailable.
func gpu(t *testing.T) *Device {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	devOnce.Do(func() { dev, devErr = Open(0) })
	if devErr != nil {
		t.Fatalf("Open(0): %v", devErr)
	}
	return dev
}

func TestDeviceInfo(t *testing.T) {
	d := gpu(t)
	free, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device %d: %s, compute %d.%d (%s), %d SMs, %.1f GiB (%.1f GiB free)",
		d.Ordinal, d.Name, d.Major, d.Minor, d.Arch(), d.SMs, float64(total)/(1<<30), float64(free)/(1<<30))
	if err := NVRTCAvailable(); err != nil {
		t.Errorf("nvrtc: %v", err)
	}
	if err := BlasLtAvailable(); err != nil {
		t.Errorf("cublasLt: %v", err)
	}
	l := Loaded()
	t.Logf("driver %s (version %d)", l.Driver, l.DriverVersion)
	t.Logf("nvrtc %s (version %d.%d)", l.NVRTC, l.NVRTCVersion[0], l.NVRTCVersion[1])
	t.Logf("cublasLt %s (version %d)", l.BlasLt, l.BlasLtVersion)
}

func TestRoundTrip(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	n := 3<<20 + 13
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	if err := d.Memset8(p, 0xA5, n, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Upload(p, src); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.Download(got, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("upload/download round trip differs")
	}

	// Device to device, pinned buffers, a stream and timing events.
	q, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(q)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, err := d.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	for i := range h.Bytes() {
		h.Bytes()[i] = 0x5A
	}
	e0, _ := d.NewEvent(true)
	e1, _ := d.NewEvent(true)
	defer e0.Close()
	defer e1.Close()
	must(t, d.Memset8(q, 0, n, s))
	must(t, e0.Record(s))
	must(t, d.CopyDtoD(q, p, n, s))
	must(t, e1.Record(s))
	must(t, d.CopyDtoHAsync(h, 0, q, n, s))
	must(t, s.Sync())
	if !bytes.Equal(h.Bytes(), src) {
		t.Fatal("device-to-device then pinned download differs")
	}
	ms, err := Elapsed(e0, e1)
	must(t, err)
	t.Logf("device-to-device copy of %d bytes: %.3f ms", n, ms)
	// Pinned upload of a shifted range.
	must(t, d.CopyHtoDAsync(q.Add(1), h, 0, n-1, s))
	must(t, s.Sync())
	must(t, d.Download(got, q))
	if got[0] != src[0] || !bytes.Equal(got[1:], src[:n-1]) {
		t.Fatal("pinned upload at an offset differs")
	}
	if err := d.CopyHtoDAsync(q, h, 1, n, s); err == nil {
		t.Fatal("out-of-range host buffer copy accepted")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

const saxpySrc = `
// bf16 in, f32 out: out[i] = a*x[i] + y[i]
extern "C" __global__ void saxpy_bf16(const unsigned short* x, const unsigned short* y, float* out, float a, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) {
		float xf = __uint_as_float(((unsigned)x[i]) << 16);
		float yf = __uint_as_float(((unsigned)y[i]) << 16);
		out[i] = a * xf + yf;
	}
}
__device__ int kiln_counter;
`

func randBF16(rng *rand.Rand, n int) []uint16 {
	s := make([]uint16, n)
	for i := range s {
		s[i] = tensor.F32ToBF16(float32(rng.NormFloat64()))
	}
	return s
}

func upload[T float32 | uint16](t *testing.T, d *Device, s []T) Ptr {
	t.Helper()
	p, err := d.Alloc(len(AsBytes(s)))
	must(t, err)
	t.Cleanup(func() { d.Free(p) })
	must(t, d.Upload(p, AsBytes(s)))
	return p
}

// runSaxpy launches saxpy_bf16 from m on fresh random inputs and checks it.
func runSaxpy(t *testing.T, d *Device, m *Module) {
	t.Helper()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	n := 100003
	x, y := randBF16(rng, n), randBF16(rng, n)
	a := float32(rng.NormFloat64())
	px, py := upload(t, d, x), upload(t, d, y)
	out := make([]float32, n)
	po, err := d.Alloc(4 * n)
	must(t, err)
	defer d.Free(po)
	must(t, d.Memset32(po, 0x7fc00001, n, nil)) // NaN poison: every element must be written
	must(t, m.Launch("saxpy_bf16", D1((n+255)/256), D1(256), 0, nil, px, py, po, a, int32(n)))
	must(t, d.Sync())
	must(t, d.Download(AsBytes(out), po))
	var worst float64
	for i := range out {
		ref := float64(a)*float64(tensor.BF16ToF32(x[i])) + float64(tensor.BF16ToF32(y[i]))
		e := math.Abs(float64(out[i])-ref) / (math.Abs(ref) + 1e-3)
		if math.IsNaN(float64(out[i])) || e > 1e-6 {
			t.Fatalf("out[%d] = %v, want %v", i, out[i], ref)
		}
		worst = max(worst, e)
	}
	t.Logf("saxpy_bf16 n=%d: worst relative error %.2g (limit 1e-6)", n, worst)
}

func TestSaxpyAndCache(t *testing.T) {
	d := gpu(t)
	old := d.KernelCache()
	defer d.SetKernelCache(old)
	dir := t.TempDir()
	c := kcache.New(dir)
	d.SetKernelCache(c)
	// A nonce keeps the source unique, so the cache starts cold.
	src := saxpySrc + fmt.Sprintf("// nonce %d\n", time.Now().UnixNano())

	t0 := time.Now()
	m, err := d.Compile("saxpy", src)
	must(t, err)
	t.Logf("first compile: %v, cubin %v, hit %v", time.Since(t0), m.Cubin, m.Hit)
	if m.Hit || c.Stats().Compiled != 1 || !m.Cubin {
		t.Fatalf("first compile: hit %v cubin %v stats %+v", m.Hit, m.Cubin, c.Stats())
	}
	runSaxpy(t, d, m)
	if p, size, err := m.Global("kiln_counter"); err != nil || p == 0 || size != 4 {
		t.Fatalf("Global: %v %d %v", p, size, err)
	}
	must(t, m.Close())

	// Same key, same process: a hit.
	m2, err := d.Compile("saxpy", src)
	must(t, err)
	if !m2.Hit || c.Stats().Compiled != 1 || c.Stats().Hits != 1 {
		t.Fatalf("second compile: hit %v stats %+v", m2.Hit, c.Stats())
	}
	m2.Close()

	// A second start (a fresh cache on the same directory) compiles nothing.
	c2 := kcache.New(dir)
	d.SetKernelCache(c2)
	t0 = time.Now()
	m3, err := d.Compile("saxpy", src)
	must(t, err)
	if !m3.Hit || c2.Stats().Compiled != 0 {
		t.Fatalf("second start: hit %v stats %+v", m3.Hit, c2.Stats())
	}
	t.Logf("second start: loaded from disk in %v", time.Since(t0))
	runSaxpy(t, d, m3)
	m3.Close()

	// A corrupted entry is recompiled, never loaded.
	var files []string
	walk(dir, &files)
	if len(files) != 1 {
		t.Fatalf("cache dir holds %v", files)
	}
	b, err := os.ReadFile(files[0])
	must(t, err)
	b[len(b)-100] ^= 0xff
	must(t, os.WriteFile(files[0], b, 0o644))
	c3 := kcache.New(dir)
	d.SetKernelCache(c3)
	m4, err := d.Compile("saxpy", src)
	must(t, err)
	if m4.Hit || c3.Stats().Compiled != 1 || c3.Stats().Corrupt != 1 {
		t.Fatalf("corrupt entry: hit %v stats %+v", m4.Hit, c3.Stats())
	}
	runSaxpy(t, d, m4)
	m4.Close()
}

func walk(dir string, out *[]string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := dir + "/" + e.Name()
		if e.IsDir() {
			walk(p, out)
		} else {
			*out = append(*out, p)
		}
	}
}

func TestErrors(t *testing.T) {
	d := gpu(t)
	old := d.KernelCache()
	defer d.SetKernelCache(old)
	d.SetKernelCache(kcache.New(t.TempDir()))

	// Bad source: the NVRTC log comes with the error.
	_, err := d.Compile("broken", `extern "C" __global__ void k(float* p) { p[0] = undeclared_thing; }`)
	var ce *Error
	if !errors.As(err, &ce) || ce.Lib != "nvrtc" || !strings.Contains(err.Error(), "nvrtcCompileProgram(broken)") ||
		!strings.Contains(err.Error(), "NVRTC_ERROR_COMPILATION") || !strings.Contains(ce.Log, "undeclared_thing") {
		t.Fatalf("bad source: %v", err)
	}
	t.Logf("bad source: %v", err)

	// Bad option.
	_, err = d.Compile("badopt", `extern "C" __global__ void k() {}`, "--no-such-option")
	if err == nil || !strings.Contains(err.Error(), "nvrtc") {
		t.Fatalf("bad option: %v", err)
	}
	t.Logf("bad option: %v", err)

	m, err := d.Compile("saxpy", saxpySrc)
	must(t, err)
	defer m.Close()

	// Missing function.
	err = m.Launch("nosuch", D1(1), D1(1), 0, nil)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), `cuModuleGetFunction("nosuch")`) || ce.Name != "CUDA_ERROR_NOT_FOUND" {
		t.Fatalf("missing function: %v", err)
	}
	t.Logf("missing function: %v", err)

	// Block too large: the launch error names the kernel.
	p, err := d.Alloc(1024)
	must(t, err)
	defer d.Free(p)
	err = m.Launch("saxpy_bf16", D1(1), D1(4096), 0, nil, p, p, p, float32(1), int32(0))
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cuLaunchKernel(saxpy_bf16") || ce.Name != "CUDA_ERROR_INVALID_VALUE" {
		t.Fatalf("bad block: %v", err)
	}
	t.Logf("bad block: %v", err)

	// Too much shared memory.
	err = m.Launch("saxpy_bf16", D1(1), D1(32), 1<<30, nil, p, p, p, float32(1), int32(0))
	if err == nil || !strings.Contains(err.Error(), "cuLaunchKernel(saxpy_bf16") {
		t.Fatalf("bad shared: %v", err)
	}
	t.Logf("bad shared memory: %v", err)

	// Argument of an ambiguous type.
	if err := m.Launch("saxpy_bf16", D1(1), D1(32), 0, nil, p, p, p, 1.0, 0); err == nil || !strings.Contains(err.Error(), "argument 4 has type int") {
		t.Fatalf("int argument: %v", err)
	}

	// Out of memory names the call and the size.
	_, err = d.Alloc(1 << 50)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cuMemAlloc_v2") || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Fatalf("huge alloc: %v", err)
	}
	t.Logf("huge alloc: %v", err)

	// Bad module image.
	if _, err := d.LoadModule("junk", []byte("not a cubin")); err == nil || !strings.Contains(err.Error(), "cuModuleLoadData(junk)") {
		t.Fatalf("junk module: %v", err)
	}

	// The device still works after all that.
	runSaxpy(t, d, m)
}

func TestConcurrentDo(t *testing.T) {
	d := gpu(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				// Nested calls from inside Do run inline on the worker.
				errs <- d.Do(func() error {
					p, err := d.Alloc(4096)
					if err != nil {
						return err
					}
					return d.Free(p)
				})
			}
		}()
	}
	go func() { wg.Wait(); close(errs) }()
	for err := range errs {
		must(t, err)
	}
}

// ref computes out[T,N] = x[T,K]·w[N,K]ᵀ (+ bias) in float64.
func ref(x, w []float64, bias []float64, T, K, N int) []float64 {
	out := make([]float64, T*N)
	for i := 0; i < T; i++ {
		for j := 0; j < N; j++ {
			s := 0.0
			for k := 0; k < K; k++ {
				s += x[i*K+k] * w[j*K+k]
			}
			if bias != nil {
				s += bias[j]
			}
			out[i*N+j] = s
		}
	}
	return out
}

func relErr(got, want []float64) float64 {
	var num, den float64
	for i := range got {
		if math.IsNaN(got[i]) {
			return math.Inf(1)
		}
		num += (got[i] - want[i]) * (got[i] - want[i])
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// encode rounds v to dtype t, returning the device bytes and the rounded values.
func encode(t DType, v []float64) ([]byte, []float64) {
	r := make([]float64, len(v))
	switch t {
	case F32:
		s := make([]float32, len(v))
		for i := range v {
			s[i] = float32(v[i])
			r[i] = float64(s[i])
		}
		return AsBytes(s), r
	default:
		s := make([]uint16, len(v))
		for i := range v {
			if t == BF16 {
				s[i] = tensor.F32ToBF16(float32(v[i]))
				r[i] = float64(tensor.BF16ToF32(s[i]))
			} else {
				s[i] = tensor.F32ToF16(float32(v[i]))
				r[i] = float64(tensor.F16ToF32(s[i]))
			}
		}
		return AsBytes(s), r
	}
}

func decode(t DType, b []byte) []float64 {
	switch t {
	case F32:
		s := make([]float32, len(b)/4)
		copy(AsBytes(s), b)
		r := make([]float64, len(s))
		for i := range s {
			r[i] = float64(s[i])
		}
		return r
	default:
		s := make([]uint16, len(b)/2)
		copy(AsBytes(s), b)
		r := make([]float64, len(s))
		for i := range s {
			if t == BF16 {
				r[i] = float64(tensor.BF16ToF32(s[i]))
			} else {
				r[i] = float64(tensor.F16ToF32(s[i]))
			}
		}
		return r
	}
}

func TestBlasLtMatmul(t *testing.T) {
	d := gpu(t)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	randv := normals(3)
	cases := []struct {
		in, out DType
		T, K, N int
		bias    bool
		acc     bool
		tol     float64
	}{
		// Products of bf16/f16 values are exact in f32; f32 accumulation
		// error over K≤4096 is far under 1e-5. Rounding the output to
		// bf16 (8 bits of mantissa) costs up to 2^-9 relative; f16 2^-12.
		{BF16, F32, 7, 96, 130, false, false, 1e-5},
		{BF16, F32, 7, 96, 130, true, false, 1e-5},
		{BF16, BF16, 7, 96, 130, true, false, 4e-3},
		{BF16, F32, 1, 4096, 33, false, true, 1e-5},
		{BF16, BF16, 24, 512, 256, false, true, 4e-3},
		{F16, F32, 5, 200, 77, true, false, 1e-5},
		{F16, F16, 64, 512, 300, false, false, 1e-3},
		{F32, F32, 7, 96, 130, true, false, 1e-5},
		{BF16, F32, 300, 1000, 257, true, false, 1e-5},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s->%s_T%d_K%d_N%d_bias%v_acc%v", c.in, c.out, c.T, c.K, c.N, c.bias, c.acc)
		t.Run(name, func(t *testing.T) {
			xb, x := encode(c.in, randv(c.T*c.K))
			wb, w := encode(c.in, randv(c.N*c.K))
			px, pw := upload(t, d, bytesU16(xb)), upload(t, d, bytesU16(wb))
			var pb Ptr
			var bias []float64
			if c.bias {
				var bb []byte
				bb, bias = encode(c.out, randv(c.N))
				pb = upload(t, d, bytesU16(bb))
			}
			var prior []float64
			ob := make([]byte, c.T*c.N*c.out.Size())
			po, err := d.Alloc(len(ob))
			must(t, err)
			defer d.Free(po)
			if c.acc {
				var pbytes []byte
				pbytes, prior = encode(c.out, randv(c.T*c.N))
				must(t, d.Upload(po, pbytes))
			} else {
				must(t, d.Memset8(po, 0xff, len(ob), nil)) // NaN poison
			}
			must(t, lt.Matmul(Matmul{T: c.T, K: c.K, N: c.N, In: c.in, Out: c.out, X: px, W: pw, Dst: po, Bias: pb, Accumulate: c.acc}))
			must(t, d.Sync())
			must(t, d.Download(ob, po))
			want := ref(x, w, bias, c.T, c.K, c.N)
			if prior != nil {
				for i := range want {
					want[i] += prior[i]
				}
			}
			e := relErr(decode(c.out, ob), want)
			t.Logf("%s: ‖out−ref‖/‖ref‖ = %.3g (tolerance %.0g)", name, e, c.tol)
			if !(e <= c.tol) {
				t.Fatalf("relative error %.3g over %.0g", e, c.tol)
			}
			if !c.acc {
				return
			}
			// The addend in a buffer of its own (Add): Dst written, the
			// addend left as it was.
			pbytes, _ := encode(c.out, prior) // prior holds values of c.out: the same bytes
			pa, err := d.Alloc(len(ob))
			must(t, err)
			defer d.Free(pa)
			must(t, d.Upload(pa, pbytes))
			must(t, d.Memset8(po, 0xff, len(ob), nil))
			must(t, lt.Matmul(Matmul{T: c.T, K: c.K, N: c.N, In: c.in, Out: c.out, X: px, W: pw, Dst: po, Bias: pb, Accumulate: true, Add: pa}))
			must(t, d.Sync())
			must(t, d.Download(ob, po))
			if e := relErr(decode(c.out, ob), want); !(e <= c.tol) {
				t.Fatalf("with the addend apart: relative error %.3g over %.0g", e, c.tol)
			}
			after := make([]byte, len(ob))
			must(t, d.Download(after, pa))
			if !bytes.Equal(after, pbytes) {
				t.Fatalf("with the addend apart: the addend changed")
			}
		})
	}

	// A product in two column slices of one output (LDD: Dst's rows N
	// apart), with the bias, as products of chunks of W's rows run.
	t.Run("column slices", func(t *testing.T) {
		const T, K, N, n1 = 37, 256, 300, 136
		xb, x := encode(BF16, randv(T*K))
		wb, w := encode(BF16, randv(N*K))
		bb, bias := encode(BF16, randv(N))
		px, pw, pb := upload(t, d, bytesU16(xb)), upload(t, d, bytesU16(wb)), upload(t, d, bytesU16(bb))
		ob := make([]byte, T*N*2)
		po, err := d.Alloc(len(ob))
		must(t, err)
		defer d.Free(po)
		must(t, d.Memset8(po, 0xff, len(ob), nil))
		for _, c := range [][2]int{{0, n1}, {n1, N}} {
			m := Matmul{T: T, K: K, N: c[1] - c[0], LDD: N, In: BF16, Out: BF16, X: px, W: pw.Add(2 * c[0] * K), Dst: po.Add(2 * c[0]), Bias: pb.Add(2 * c[0])}
			must(t, lt.Matmul(m))
		}
		must(t, d.Sync())
		must(t, d.Download(ob, po))
		e := relErr(decode(BF16, ob), ref(x, w, bias, T, K, N))
		t.Logf("column slices: ‖out−ref‖/‖ref‖ = %.3g (tolerance 4e-3)", e)
		if !(e <= 4e-3) {
			t.Fatalf("relative error %.3g over 4e-3", e)
		}
		if err := lt.Matmul(Matmul{T: 1, K: 16, N: 8, LDD: 4, In: BF16, Out: BF16, X: 1, W: 1, Dst: 1}); err == nil {
			t.Error("output rows closer than N accepted")
		}
	})

	// Bad combination is refused before cuBLASLt.
	if err := lt.Matmul(Matmul{T: 1, K: 1, N: 1, In: BF16, Out: F16, X: 1, W: 1, Dst: 1}); err == nil {
		t.Fatal("bf16→f16 accepted")
	}
}

// TestBlasLtAlgorithms runs every candidate algorithm cuBLASLt's heuristic
// offers (what a timing may pick instead of its first choice) on fresh
// random inputs, each into a NaN-poisoned output, against a float64
// reference, with the workspace given and the default (the candidates of
// smaller workspace limits included, each within lt's workspace); and refuses
// an index past the candidates. For a batched-decode product some candidates split K (on the
// H100 and H200; Config says how each computes).
func TestBlasLtAlgorithms(t *testing.T) {
	d := gpu(t)
	hopper := d.Major == 9
	randv := normals(5)
	cases := []struct {
		in, out DType
		T, K, N int
		tol     float64
		ws      int
		split   bool // some candidate splits K (checked where the device is a Hopper)
	}{
		{BF16, BF16, 256, 2048, 768, 4e-3, 32 << 20, false}, // a prefill-like product
		{BF16, F32, 33, 1000, 257, 1e-5, 32 << 20, false},   // odd sizes
		{F16, F16, 64, 512, 300, 1e-3, 32 << 20, false},
		{BF16, BF16, 64, 4096, 4096, 4e-3, 32 << 20, true}, // batched decode's output projection
		{BF16, BF16, 64, 4096, 4096, 4e-3, 0, true},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s->%s_T%d_K%d_N%d_ws%d", c.in, c.out, c.T, c.K, c.N, c.ws)
		t.Run(name, func(t *testing.T) {
			lt, err := d.NewBlasLt(c.ws)
			must(t, err)
			defer lt.Close()
			xb, x := encode(c.in, randv(c.T*c.K))
			wb, w := encode(c.in, randv(c.N*c.K))
			px, pw := upload(t, d, bytesU16(xb)), upload(t, d, bytesU16(wb))
			ob := make([]byte, c.T*c.N*c.out.Size())
			po, err := d.Alloc(len(ob))
			must(t, err)
			defer d.Free(po)
			want := ref(x, w, nil, c.T, c.K, c.N)
			mm := Matmul{T: c.T, K: c.K, N: c.N, In: c.in, Out: c.out, X: px, W: pw, Dst: po}
			n, err := lt.Algorithms(mm)
			must(t, err)
			if n < 1 || n > 16 {
				t.Fatalf("%d candidate algorithms", n)
			}
			splits := 0
			for i := 0; i < n; i++ {
				cfg, err := lt.Config(mm, i)
				must(t, err)
				if cfg.SplitK > 1 {
					splits++
				}
				if ws := lt.wsSize; cfg.WorkspaceKiB < 0 || cfg.WorkspaceKiB > (ws+1023)/1024 {
					t.Fatalf("algorithm %d (%v) needs a workspace past the %d bytes the heuristic was given", i, cfg, ws)
				}
				must(t, d.Memset8(po, 0xff, len(ob), nil)) // NaN poison
				mm.Algo = i
				must(t, lt.Matmul(mm))
				must(t, d.Sync())
				must(t, d.Download(ob, po))
				e := relErr(decode(c.out, ob), want)
				t.Logf("algorithm %d of %d (%v): ‖out−ref‖/‖ref‖ = %.3g (tolerance %.0g)", i, n, cfg, e, c.tol)
				if !(e <= c.tol) {
					t.Fatalf("algorithm %d (%v): relative error %.3g over %.0g", i, cfg, e, c.tol)
				}
			}
			if c.split && hopper && splits == 0 {
				t.Errorf("none of %d candidates splits K", n)
			}
			mm.Algo = n
			if err := lt.Matmul(mm); err == nil {
				t.Fatalf("algorithm %d of %d accepted", n, n)
			}
			if _, err := lt.Config(mm, n); err == nil {
				t.Fatalf("config of algorithm %d of %d given", n, n)
			}
		})
	}
}

// TestBlasLtFind: an algorithm chosen among one product's candidates is
// found among another's of the same shape (other rows of its bucket,
// another output alignment: other lists) by its configuration, at an
// index whose Config is that configuration, or not at all (-1), never at
// an index past the list; found, it runs. (A choice kept by its index
// once ran past a shorter list: "no such algorithm", H100, session 19.)
func TestBlasLtFind(t *testing.T) {
	d := gpu(t)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	const K, N = 4096, 4096
	randv := normals(9)
	xb, _ := encode(BF16, randv(64*K))
	wb, _ := encode(BF16, randv(N*K))
	px, pw := upload(t, d, bytesU16(xb)), upload(t, d, bytesU16(wb))
	po, err := d.Alloc(64*N*2 + 256)
	must(t, err)
	defer d.Free(po)
	chosen := Matmul{T: 64, K: K, N: N, In: BF16, Out: BF16, X: px, W: pw, Dst: po}
	n, err := lt.Algorithms(chosen)
	must(t, err)
	found, lists := 0, map[int]bool{}
	for _, T := range []int{33, 48, 64} {
		for _, off := range []int{0, 2} {
			m := chosen
			m.T, m.Dst = T, po.Add(off)
			mn, err := lt.Algorithms(m)
			must(t, err)
			lists[mn] = true
			for a := range n {
				cfg, err := lt.Config(chosen, a)
				must(t, err)
				i, err := lt.Find(m, cfg.Key())
				must(t, err)
				if i >= mn {
					t.Fatalf("T=%d, +%d bytes: %v found at %d of %d", T, off, cfg, i, mn)
				}
				if i < 0 {
					continue
				}
				got, err := lt.Config(m, i)
				must(t, err)
				if got.Key() != cfg.Key() {
					t.Fatalf("T=%d, +%d bytes: looked for %v, found %v", T, off, cfg, got)
				}
				m.Algo = i
				must(t, lt.Matmul(m))
				found++
			}
		}
	}
	must(t, d.Sync())
	if i, err := lt.Find(chosen, "no such configuration"); err != nil || i != -1 {
		t.Fatalf("an unknown configuration: %d, %v", i, err)
	}
	t.Logf("%d of %d configurations found again; lists of %v candidates", found, 6*n, lists)
	if found == 0 {
		t.Errorf("no configuration was found again in any list")
	}
}

// normals returns a source of fresh N(0,1) vectors (a new seed each run,
// stream names the test's stream).
func normals(stream uint64) func(n int) []float64 {
	rng := rand.New(rand.NewPCG(rand.Uint64(), stream))
	return func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		return v
	}
}

func bytesU16(b []byte) []uint16 {
	s := make([]uint16, (len(b)+1)/2)
	copy(AsBytes(s), b)
	return s
}

// TestBlasLtSpeed times a large bf16 product (a figure, not a check).
func TestBlasLtSpeed(t *testing.T) {
	d := gpu(t)
	if testing.Short() {
		t.Skip("short")
	}
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	const M = 8192
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	x := randBF16(rng, M*M)
	px, pw := upload(t, d, x[:len(x)/2]), upload(t, d, x[len(x)/2:])
	po, err := d.Alloc(M * M * 2)
	must(t, err)
	defer d.Free(po)
	mm := Matmul{T: M, K: M / 2, N: M, In: BF16, Out: BF16, X: px, W: pw, Dst: po}
	for i := 0; i < 3; i++ {
		must(t, lt.Matmul(mm))
	}
	med := medianMs(t, d, 5, 10, func() error { return lt.Matmul(mm) })
	t.Logf("bf16 %dx%dx%d product: median %.3f ms, %.0f TFLOP/s", M, M/2, M, med, 2*float64(M)*float64(M/2)*float64(M)/(med*1e-3)/1e12)
}

// medianMs is the median over reps repetitions of the time of n calls of
// f on the default stream, between two events, divided by n (ms a call).
func medianMs(t *testing.T, d *Device, reps, n int, f func() error) float64 {
	e0, err := d.NewEvent(true)
	must(t, err)
	defer e0.Close()
	e1, err := d.NewEvent(true)
	must(t, err)
	defer e1.Close()
	var times []float64
	for r := 0; r < reps; r++ {
		must(t, e0.Record(nil))
		for i := 0; i < n; i++ {
			must(t, f())
		}
		must(t, e1.Record(nil))
		must(t, e1.Sync())
		ms, err := Elapsed(e0, e1)
		must(t, err)
		times = append(times, float64(ms)/float64(n))
	}
	slicesSort(times)
	return times[len(times)/2]
}

func slicesSort(s []float64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func TestOpenClose(t *testing.T) {
	gpu(t)
	d2, err := Open(0) // a second handle on the same primary context
	must(t, err)
	p, err := d2.Alloc(256)
	must(t, err)
	must(t, d2.Free(p))
	must(t, d2.Close())
	if err := d2.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	// The shared device still works: the primary context is reference counted.
	d := gpu(t)
	p, err = d.Alloc(256)
	must(t, err)
	must(t, d.Free(p))
	if _, err := Open(99); err == nil {
		t.Fatal("Open(99) succeeded")
	}
}

// TestPTXPath compiles to PTX (the path taken when NVRTC does not know the
// device) and lets the driver compile it at load time.
func TestPTXPath(t *testing.T) {
	d := gpu(t)
	old := d.KernelCache()
	defer d.SetKernelCache(old)
	d.SetKernelCache(kcache.New(t.TempDir()))
	d.forcePTX = true
	defer func() { d.forcePTX = false }()
	m, err := d.Compile("saxpy_ptx", saxpySrc)
	must(t, err)
	defer m.Close()
	if m.Cubin {
		t.Fatal("forced PTX path produced a CUBIN")
	}
	runSaxpy(t, d, m)
}

// TestDiscoverOnMachine lists the library files the directory scan finds
// (CUDA_HOME, /usr/local/cuda, pip wheels) and checks that each one found in
// a pip wheel's layout loads.
func TestDiscoverOnMachine(t *testing.T) {
	gpu(t)
	for _, lib := range []Library{libCUDA, libNVRTC, libLt} {
		for _, p := range candidates(lib)[len(lib.Sonames):] {
			msg := "found"
			if strings.Contains(p, "site-packages") || strings.Contains(p, "dist-packages") {
				if err := tryOpen(p); err != nil {
					t.Errorf("%s: %v", p, err)
					continue
				}
				msg = "found in a pip wheel; loads"
			}
			t.Logf("%s: %s %s", lib.Name, p, msg)
		}
	}
}
