package cu

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"kiln/backend/cuda/kcache"
)

const graphSrc = `
// y[i] = y[i]*a + x[i]
extern "C" __global__ void fma_step(float* y, const float* x, float a, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] = y[i] * a + x[i];
}
// acc[i] += y[i]
extern "C" __global__ void accum(float* acc, const float* y, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) acc[i] += y[i];
}
// One block of 32 threads, each adding 1 to its word: the launch-overhead kernel.
extern "C" __global__ void tick(float* p) { p[threadIdx.x] += 1.0f; }
`

// graphChain queues the order-dependent chain of TestGraphReplay on s:
// y = 0; y = y*a + x for a in 2, -3, 5, 4 (y = -35x); z = y; z = z*-1 + x
// (z = 36x); acc += z.
func graphChain(t *testing.T, d *Device, m *Module, s *Stream, n int, px, py, pz, pacc Ptr) {
	t.Helper()
	grid, block := D1((n+127)/128), D1(128)
	must(t, d.Memset32(py, 0, n, s))
	for _, a := range []float32{2, -3, 5, 4} {
		must(t, m.Launch("fma_step", grid, block, 0, s, py, px, a, int32(n)))
	}
	must(t, d.CopyDtoD(pz, py, 4*n, s))
	must(t, m.Launch("fma_step", grid, block, 0, s, pz, px, float32(-1), int32(n)))
	must(t, m.Launch("accum", grid, block, 0, s, pacc, pz, int32(n)))
}

func download32(t *testing.T, d *Device, p Ptr, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	must(t, d.Download(AsBytes(out), p))
	return out
}

func checkExact(t *testing.T, what string, got []float32, want func(i int) float32) {
	t.Helper()
	for i := range got {
		if w := want(i); got[i] != w {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], w)
		}
	}
}

func capturing(t *testing.T, s *Stream) bool {
	t.Helper()
	c, err := s.Capturing()
	must(t, err)
	return c
}

// TestGraphReplay captures a chain of launches, a memset and a copy whose
// result depends on their order, replays it, and checks that replays read
// the buffers' current data (a graph bakes in pointers, not data).
func TestGraphReplay(t *testing.T) {
	d := gpu(t)
	m, err := d.Compile("graph", graphSrc)
	must(t, err)
	defer m.Close()
	const n = 4099
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%7 - 3)
	}
	px := upload(t, d, x)
	py, pz, pacc := upload(t, d, make([]float32, n)), upload(t, d, make([]float32, n)), upload(t, d, make([]float32, n))
	s, err := d.NewStream()
	must(t, err)
	defer s.Close()

	// Warm-up: the chain run directly once (acc = 36x).
	graphChain(t, d, m, s, n, px, py, pz, pacc)
	must(t, s.Sync())
	checkExact(t, "direct acc", download32(t, d, pacc, n), func(i int) float32 { return 36 * x[i] })
	must(t, d.Memset32(pacc, 0, n, s))
	must(t, s.Sync())

	must(t, s.BeginCapture())
	if !capturing(t, s) {
		t.Fatal("Capturing() false after BeginCapture")
	}
	graphChain(t, d, m, s, n, px, py, pz, pacc)
	g, err := s.EndCapture()
	must(t, err)
	defer g.Close()
	if capturing(t, s) {
		t.Fatal("Capturing() true after EndCapture")
	}
	// Capture ran nothing.
	must(t, s.Sync())
	checkExact(t, "acc after capture", download32(t, d, pacc, n), func(int) float32 { return 0 })

	for range 3 {
		must(t, g.Launch(s))
	}
	must(t, s.Sync())
	checkExact(t, "y", download32(t, d, py, n), func(i int) float32 { return -35 * x[i] })
	checkExact(t, "z", download32(t, d, pz, n), func(i int) float32 { return 36 * x[i] })
	checkExact(t, "acc after 3 replays", download32(t, d, pacc, n), func(i int) float32 { return 3 * 36 * x[i] })

	// New data in the same buffer; replay on another stream.
	x2 := make([]float32, n)
	for i := range x2 {
		x2[i] = float32((i*5)%11 - 5)
	}
	must(t, d.Upload(px, AsBytes(x2)))
	s2, err := d.NewStream()
	must(t, err)
	defer s2.Close()
	must(t, g.Launch(s2))
	must(t, s2.Sync())
	checkExact(t, "y (new x)", download32(t, d, py, n), func(i int) float32 { return -35 * x2[i] })
	checkExact(t, "z (new x)", download32(t, d, pz, n), func(i int) float32 { return 36 * x2[i] })
	checkExact(t, "acc (new x)", download32(t, d, pacc, n), func(i int) float32 { return 3*36*x[i] + 36*x2[i] })
	t.Logf("graph of memset + 5 launches + copy + 1 launch, n=%d: 3 replays and 1 replay after new data, all exact", n)

	must(t, g.Close())
	must(t, g.Close()) // twice is fine
	if err := g.Launch(s); err == nil {
		t.Fatal("launch of a closed graph accepted")
	}
}

// TestGraphColdCapture captures the first-ever launch of a freshly compiled
// kernel (no warm-up). It logs whether the driver allows that; either way
// the stream must end up usable.
func TestGraphColdCapture(t *testing.T) {
	d := gpu(t)
	old := d.KernelCache()
	defer d.SetKernelCache(old)
	d.SetKernelCache(kcache.New(t.TempDir()))
	m, err := d.Compile("graph_cold", graphSrc+fmt.Sprintf("// nonce %d\n", time.Now().UnixNano()))
	must(t, err)
	defer m.Close()
	const n = 1000
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%5 - 2)
	}
	px, py := upload(t, d, x), upload(t, d, make([]float32, n))
	s, err := d.NewStream()
	must(t, err)
	defer s.Close()
	must(t, s.BeginCapture())
	lerr := m.Launch("fma_step", D1((n+127)/128), D1(128), 0, s, py, px, float32(2), int32(n))
	g, err := s.EndCapture()
	if capturing(t, s) {
		t.Fatal("stream still capturing")
	}
	if lerr != nil || err != nil {
		t.Logf("cold capture (first launch of a new kernel inside a capture) FAILED: launch: %v; end: %v", lerr, err)
		if g != nil {
			t.Fatal("EndCapture returned a graph with an error")
		}
		must(t, m.Launch("fma_step", D1((n+127)/128), D1(128), 0, s, py, px, float32(2), int32(n)))
		must(t, s.Sync())
		checkExact(t, "y", download32(t, d, py, n), func(i int) float32 { return x[i] })
		return
	}
	defer g.Close()
	must(t, g.Launch(s))
	must(t, g.Launch(s))
	must(t, s.Sync())
	checkExact(t, "y", download32(t, d, py, n), func(i int) float32 { return 3 * x[i] }) // (0*2+x)*2+x
	t.Logf("cold capture (first launch of a new kernel inside a capture) works")
}

// TestGraphMatmul captures cuBLASLt products (bf16→f32 with bias, then
// f32→f32 on its output) and replays them. The first capture uses a fresh
// handle and shape, so the plan (descriptors, heuristic) is made during the
// capture; its outcome is logged. Then the products are warmed up, captured
// and checked.
func TestGraphMatmul(t *testing.T) {
	d := gpu(t)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	randv := normals(5)
	const T, K, N, N2 = 5, 320, 96, 40
	xb, x := encode(BF16, randv(T*K))
	wb, w := encode(BF16, randv(N*K))
	bb, bias := encode(F32, randv(N))
	w2b, w2 := encode(F32, randv(N2*N))
	px, pw, pb, pw2 := upload(t, d, bytesU16(xb)), upload(t, d, bytesU16(wb)), upload(t, d, bytesU16(bb)), upload(t, d, bytesU16(w2b))
	ph, err := d.Alloc(T * N * 4)
	must(t, err)
	defer d.Free(ph)
	po, err := d.Alloc(T * N2 * 4)
	must(t, err)
	defer d.Free(po)
	s, err := d.NewStream()
	must(t, err)
	defer s.Close()
	mm1 := Matmul{T: T, K: K, N: N, In: BF16, Out: F32, X: px, W: pw, Dst: ph, Bias: pb, Stream: s}
	mm2 := Matmul{T: T, K: N, N: N2, In: F32, Out: F32, X: ph, W: pw2, Dst: po, Stream: s}
	want := func(x []float64) []float64 { return ref(ref(x, w, bias, T, K, N), w2, nil, T, N, N2) }
	check := func(what string, x []float64) {
		t.Helper()
		must(t, s.Sync())
		ob := make([]byte, T*N2*4)
		must(t, d.Download(ob, po))
		e := relErr(decode(F32, ob), want(x))
		t.Logf("%s: ‖out−ref‖/‖ref‖ = %.3g", what, e)
		if !(e <= 1e-5) {
			t.Fatalf("%s: relative error %.3g over 1e-5", what, e)
		}
	}
	poison := func() {
		t.Helper()
		must(t, d.Memset8(po, 0xff, T*N2*4, nil))
		must(t, d.Memset8(ph, 0xff, T*N*4, nil))
		must(t, d.Sync())
	}

	// Cold: plans made inside the capture.
	poison()
	must(t, s.BeginCapture())
	e1 := lt.Matmul(mm1)
	e2 := lt.Matmul(mm2)
	g, err := s.EndCapture()
	if capturing(t, s) {
		t.Fatal("stream still capturing")
	}
	if e1 != nil || e2 != nil || err != nil {
		t.Logf("cold capture (cuBLASLt plan made during the capture) FAILED: matmul: %v / %v; end: %v", e1, e2, err)
		if g != nil {
			t.Fatal("EndCapture returned a graph with an error")
		}
	} else {
		must(t, g.Launch(s))
		check("cold capture (plan made during the capture) works; replay", x)
		must(t, g.Close())
	}

	// Warm-up, then capture.
	poison()
	must(t, lt.Matmul(mm1))
	must(t, lt.Matmul(mm2))
	check("direct", x)
	poison()
	must(t, s.BeginCapture())
	must(t, lt.Matmul(mm1))
	must(t, lt.Matmul(mm2))
	g, err = s.EndCapture()
	must(t, err)
	defer g.Close()
	for range 2 {
		must(t, g.Launch(s))
	}
	check("warm capture, 2 replays", x)
	xb2, x2 := encode(BF16, randv(T*K))
	must(t, d.Upload(px, xb2))
	poison()
	must(t, g.Launch(s))
	check("replay after new X", x2)
}

// TestGraphErrors: the nil stream, unbalanced calls, and an illegal call
// during a capture, after which the stream and device must still work.
func TestGraphErrors(t *testing.T) {
	d := gpu(t)
	m, err := d.Compile("saxpy", saxpySrc)
	must(t, err)
	defer m.Close()
	var nilStream *Stream
	if err := nilStream.BeginCapture(); err == nil || !strings.Contains(err.Error(), "default stream") {
		t.Fatalf("BeginCapture on the nil stream: %v", err)
	} else {
		t.Logf("nil stream: %v", err)
	}
	s, err := d.NewStream()
	must(t, err)
	defer s.Close()
	if g, err := s.EndCapture(); err == nil || g != nil {
		t.Fatalf("EndCapture without BeginCapture: %v", err)
	}
	p, err := d.Alloc(4096)
	must(t, err)
	defer d.Free(p)
	launch := func() error {
		return m.Launch("saxpy_bf16", D1(4), D1(256), 0, s, p, p, p.Add(2048), float32(1), int32(512))
	}

	// Stream.Sync of the capturing stream.
	must(t, s.BeginCapture())
	must(t, launch())
	if err := s.BeginCapture(); err == nil {
		t.Fatal("second BeginCapture accepted")
	}
	serr := s.Sync()
	var ce *Error
	if !errors.As(serr, &ce) || !strings.Contains(serr.Error(), "cuStreamSynchronize") {
		t.Fatalf("Stream.Sync during capture: %v", serr)
	}
	t.Logf("Stream.Sync during capture: %v", serr)
	g, err := s.EndCapture()
	if err == nil || g != nil {
		t.Fatalf("EndCapture after an illegal call: graph %v, err %v", g, err)
	}
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cuStreamEndCapture") || !strings.Contains(err.Error(), "cuStreamSynchronize") {
		t.Fatalf("EndCapture error does not name the calls: %v", err)
	}
	t.Logf("EndCapture: %v", err)
	if capturing(t, s) {
		t.Fatal("stream still capturing after a failed EndCapture")
	}
	must(t, launch())
	must(t, s.Sync())

	// Other unsafe calls during a capture: logged, not checked; the stream
	// must come out of each usable.
	probes := []struct {
		name string
		f    func() error
	}{
		{"Device.Sync", d.Sync},
		{"Alloc+Free", func() error {
			q, err := d.Alloc(256)
			if err == nil {
				err = d.Free(q)
			}
			return err
		}},
		{"Upload", func() error { return d.Upload(p, make([]byte, 64)) }},
		{"Download", func() error { return d.Download(make([]byte, 64), p) }},
		{"Event.Record+Sync", func() error {
			e, err := d.NewEvent(false)
			if err != nil {
				return err
			}
			defer e.Close()
			if err := e.Record(s); err != nil {
				return err
			}
			return e.Sync()
		}},
	}
	for _, pr := range probes {
		must(t, s.BeginCapture())
		must(t, launch())
		perr := pr.f()
		g, err := s.EndCapture()
		t.Logf("%s during capture: call: %v; EndCapture: graph %v, %v", pr.name, perr, g != nil, err)
		if (g == nil) == (err == nil) {
			t.Fatalf("EndCapture: graph %v and error %v", g, err)
		}
		must(t, g.Close())
		if capturing(t, s) {
			t.Fatalf("after %s: stream still capturing", pr.name)
		}
		must(t, launch())
		must(t, s.Sync())
	}

	// A stream closed while capturing.
	s3, err := d.NewStream()
	must(t, err)
	must(t, s3.BeginCapture())
	must(t, s3.Close())

	// The device still works.
	runSaxpy(t, d, m)
}

// TestGraphLaunchOverhead times one step of 200 tiny kernels launched
// directly against one replay of a graph of the same 200 kernels (GPU time
// between events, median of 20; a figure, not a check).
func TestGraphLaunchOverhead(t *testing.T) {
	d := gpu(t)
	m, err := d.Compile("graph", graphSrc)
	must(t, err)
	defer m.Close()
	f, err := m.Function("tick")
	must(t, err)
	p, err := d.Alloc(32 * 4)
	must(t, err)
	defer d.Free(p)
	must(t, d.Memset32(p, 0, 32, nil))
	must(t, d.Sync())
	s, err := d.NewStream()
	must(t, err)
	defer s.Close()
	const kernels, reps, warm = 200, 20, 3
	total := 0
	step := func() error {
		for range kernels {
			if err := f.Launch(D1(1), D1(32), 0, s, p); err != nil {
				return err
			}
		}
		total += kernels
		return nil
	}
	must(t, step()) // warm-up
	must(t, s.BeginCapture())
	must(t, step())
	total -= kernels // captured, not run
	g, err := s.EndCapture()
	must(t, err)
	defer g.Close()
	e0, err := d.NewEvent(true)
	must(t, err)
	defer e0.Close()
	e1, err := d.NewEvent(true)
	must(t, err)
	defer e1.Close()

	measure := func(name string, run func() error) float64 {
		var gpuMs, hostUs []float64
		for r := range warm + reps {
			t0 := time.Now()
			must(t, e0.Record(s))
			must(t, run())
			must(t, e1.Record(s))
			host := time.Since(t0)
			must(t, e1.Sync())
			ms, err := Elapsed(e0, e1)
			must(t, err)
			if r >= warm {
				gpuMs = append(gpuMs, float64(ms))
				hostUs = append(hostUs, float64(host.Microseconds()))
			}
		}
		slicesSort(gpuMs)
		slicesSort(hostUs)
		med := gpuMs[len(gpuMs)/2]
		t.Logf("%-38s %8.3f ms per step (%6.2f µs per kernel; host enqueue %6.0f µs); min %.3f max %.3f ms",
			name+":", med, med*1e3/kernels, hostUs[len(hostUs)/2], gpuMs[0], gpuMs[len(gpuMs)-1])
		return med
	}
	perCall := measure("direct, one Do per launch", step)
	inline := measure("direct, all launches in one Do", func() error { return d.Do(step) })
	graph := measure("graph replay", func() error {
		total += kernels
		return g.Launch(s)
	})
	t.Logf("%s, driver %d: %d kernels of 1 block × 32 threads, median of %d: graph %.1f× faster than direct in one Do, %.1f× than one Do per launch",
		d.Name, Loaded().DriverVersion, kernels, reps, inline/graph, perCall/graph)

	must(t, s.Sync())
	checkExact(t, "tick count", download32(t, d, p, 32), func(int) float32 { return float32(total) })
}
