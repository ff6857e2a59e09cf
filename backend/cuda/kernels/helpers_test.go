package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

var (
	devOnce sync.Once
	dev     *cu.Device
	devErr  error
	kmu     sync.Mutex
	kset    = map[kernKey]*Kernels{}
)

var allDTypes = []cu.DType{cu.F32, cu.F16, cu.BF16}

// gpu returns the shared test device, or skips when CUDA is unavailable.
func gpu(t testing.TB) *cu.Device {
	t.Helper()
	if err := cu.Available(); err != nil {
		t.Skipf("no GPU (these tests run on the GPU machine: tools/gpu/build.sh, tools/gpu/run.sh): %v", err)
	}
	if err := cu.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	devOnce.Do(func() { dev, devErr = cu.Open(0) })
	if devErr != nil {
		t.Fatalf("Open(0): %v", devErr)
	}
	return dev
}

// kernKey names a module of the tests: its activation dtype and the
// KV-cache block size its attention kernels were built for (0: any).
type kernKey struct {
	act cu.DType
	bs  int
}

// kern returns the (cached) kernels of activation dtype act, built as the
// engine builds them: for the tests' caches of testBlockSize tokens a
// block (NewFor).
func kern(t testing.TB, act cu.DType) *Kernels { return kernFor(t, act, testBlockSize) }

// kernAny returns the (cached) kernels of act whose attention takes any
// block size (New).
func kernAny(t testing.TB, act cu.DType) *Kernels { return kernFor(t, act, 0) }

func kernFor(t testing.TB, act cu.DType, bs int) *Kernels {
	t.Helper()
	d := gpu(t)
	kmu.Lock()
	defer kmu.Unlock()
	key := kernKey{act, bs}
	if k := kset[key]; k != nil {
		return k
	}
	t0 := time.Now()
	k, err := NewFor(d, act, 0, bs)
	if err != nil {
		t.Fatalf("compile %v kernels (blocks of %d): %v", act, bs, err)
	}
	t.Logf("%v kernels for %s (%s), blocks of %d tokens (0: any): %v, cubin %v, from cache %v", act, d.Name, d.Arch(), bs, time.Since(t0), k.M.Cubin, k.M.Hit)
	kset[key] = k
	return k
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newRNG returns a fresh random source and logs its seed on failure;
// KILN_TEST_SEED (a number, e.g. the 0x… a failure logged) replays one.
func newRNG(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	if s := os.Getenv("KILN_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("KILN_TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %#x", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, 7))
}

func randn(rng *rand.Rand, n int, scale float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64() * scale)
	}
	return s
}

// roundTo rounds x to dtype t (in place) and returns it.
func roundTo(t cu.DType, x []float32) []float32 {
	for i, v := range x {
		switch t {
		case cu.BF16:
			x[i] = tensor.BF16ToF32(tensor.F32ToBF16(v))
		case cu.F16:
			x[i] = tensor.F16ToF32(tensor.F32ToF16(v))
		}
	}
	return x
}

func encode(t cu.DType, x []float32) []byte {
	b := make([]byte, len(x)*t.Size())
	for i, v := range x {
		switch t {
		case cu.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case cu.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], tensor.F32ToBF16(v))
		case cu.F16:
			binary.LittleEndian.PutUint16(b[2*i:], tensor.F32ToF16(v))
		}
	}
	return b
}

func decode(t cu.DType, b []byte) []float32 {
	x := make([]float32, len(b)/t.Size())
	for i := range x {
		switch t {
		case cu.F32:
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case cu.BF16:
			x[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		case cu.F16:
			x[i] = tensor.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return x
}

// alloc allocates n bytes on the device, zeroed (as the decode attention's
// workspace must be).
func alloc(t testing.TB, n int) cu.Ptr {
	t.Helper()
	return allocOn(t, gpu(t), n)
}

// allocOn is alloc on device d.
func allocOn(t testing.TB, d *cu.Device, n int) cu.Ptr {
	t.Helper()
	p, err := d.Alloc((n + 3) &^ 3)
	must(t, err)
	t.Cleanup(func() { d.Free(p) })
	must(t, d.Memset8(p, 0, (n+3)&^3, nil))
	return p
}

// up uploads x as dtype dt (rounding it) and returns the device copy.
func up(t testing.TB, dt cu.DType, x []float32) cu.Ptr {
	t.Helper()
	return upOn(t, gpu(t), dt, x)
}

// upOn is up on device d.
func upOn(t testing.TB, d *cu.Device, dt cu.DType, x []float32) cu.Ptr {
	t.Helper()
	b := encode(dt, x)
	p := allocOn(t, d, max(len(b), 4))
	must(t, d.Upload(p, b))
	return p
}

func upI32(t testing.TB, x []int32) cu.Ptr {
	t.Helper()
	p := alloc(t, max(4*len(x), 4))
	if len(x) > 0 {
		must(t, gpu(t).Upload(p, cu.AsBytes(x)))
	}
	return p
}

// poison fills n elements of dtype dt at p with NaN.
func poison(t testing.TB, dt cu.DType, p cu.Ptr, n int) {
	t.Helper()
	pat := map[cu.DType]uint32{cu.F32: 0x7fc00001, cu.F16: 0x7e017e01, cu.BF16: 0x7fc17fc1}[dt]
	words := (n*dt.Size() + 3) / 4
	must(t, gpu(t).Memset32(p, pat, words, nil))
}

// outBuf allocates n poisoned elements of dtype dt.
func outBuf(t testing.TB, dt cu.DType, n int) cu.Ptr {
	t.Helper()
	p := alloc(t, max(n*dt.Size(), 4))
	poison(t, dt, p, n)
	return p
}

func down(t testing.TB, dt cu.DType, p cu.Ptr, n int) []float32 {
	t.Helper()
	d := gpu(t)
	must(t, d.Sync())
	b := make([]byte, n*dt.Size())
	must(t, d.Download(b, p))
	return decode(dt, b)
}

// tol is the accepted error per activation dtype, relative to |ref| + rms(ref).
func tol(dt cu.DType) float64 {
	return map[cu.DType]float64{cu.F32: 1e-5, cu.F16: 2e-3, cu.BF16: 1e-2}[dt]
}

// compare checks got against ref (float64, computed from the rounded
// inputs): every element written (no NaN), error |got-ref|/(|ref|+rms(ref))
// within tol. It returns the worst error.
func compare(t testing.TB, what string, got []float32, ref []float64, limit float64) float64 {
	t.Helper()
	if len(got) != len(ref) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(ref))
	}
	var ss float64
	for _, r := range ref {
		ss += r * r
	}
	rms := math.Sqrt(ss/float64(max(len(ref), 1))) + 1e-30
	worst := 0.0
	bad := 0
	for i, g := range got {
		e := math.Abs(float64(g)-ref[i]) / (math.Abs(ref[i]) + rms)
		if math.IsNaN(float64(g)) || math.IsInf(float64(g), 0) || !(e <= limit) {
			if bad < 5 {
				t.Errorf("%s: [%d] = %v, want %v (error %.3g, limit %.3g)", what, i, g, ref[i], e, limit)
			}
			bad++
			if math.IsNaN(e) {
				e = math.Inf(1)
			}
		}
		worst = max(worst, e)
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d values wrong", what, bad, len(got))
	}
	return worst
}

// report logs the worst error of a case (the GPU run's record).
func report(t testing.TB, dt cu.DType, what string, worst float64) {
	t.Helper()
	t.Logf("%-5v %-60s max err %.3g (tol %.0e)", dt, what, worst, tol(dt))
}

func f64(x []float32) []float64 {
	r := make([]float64, len(x))
	for i, v := range x {
		r[i] = float64(v)
	}
	return r
}

func name(parts ...any) string { return fmt.Sprint(parts...) }
