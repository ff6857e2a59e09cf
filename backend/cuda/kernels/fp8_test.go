package kernels

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// fp8Device skips on devices without FP8 (compute capability 8.9).
func fp8Device(t testing.TB) *cu.Device {
	d := gpu(t)
	if !d.FP8() {
		t.Skipf("%s has no FP8 (compute capability %d.%d)", d.Name, d.Major, d.Minor)
	}
	return d
}

// TestQuantizeE4M3: QuantizeE4M3 against tensor.F32ToE4M3 of x/s with s =
// max|x|/448 in float32 (the same divisions, correctly rounded), byte for
// byte, and the scale bit for bit, for every activation dtype: normal
// values with an outlier (which maps to ±448, or saturates there when x/s
// rounds above it), values of order 1e-4 (a tiny scale), an all-zero x
// (scale 1), each on fresh scratch; values near zero land on E4M3's
// subnormals in every case. Then the operands it refuses.
func TestQuantizeE4M3(t *testing.T) {
	fp8Device(t)
	rng := newRNG(t)
	for _, act := range allDTypes {
		k := kern(t, act)
		for _, c := range []struct {
			what  string
			n     int
			scale float64
		}{{"normal", 256 * 4096, 1}, {"small", 48, 3}, {"tiny", 4096, 1e-4}, {"zeros", 64, 0}, {"normal again", 16 * 1024, 7}} {
			x := roundTo(act, randn(rng, c.n, c.scale))
			if c.what == "normal" {
				x[12345] = float32(40 * c.scale) // an outlier sets the scale
				roundTo(act, x[12345:12346])
			}
			px := up(t, act, x)
			q, scale, amax := alloc(t, c.n), alloc(t, 4), alloc(t, 4)
			must(t, k.QuantizeE4M3(nil, q, scale, amax, px, c.n))
			got := make([]byte, c.n)
			must(t, gpu(t).Sync())
			must(t, gpu(t).Download(got, q))
			sb := make([]byte, 4)
			must(t, gpu(t).Download(sb, scale))
			gotScale := math.Float32frombits(uint32(sb[0]) | uint32(sb[1])<<8 | uint32(sb[2])<<16 | uint32(sb[3])<<24)
			var a float32
			for _, v := range x {
				a = max(a, float32(math.Abs(float64(v))))
			}
			s := float32(1)
			if a > 0 {
				s = a / tensor.E4M3Max
			}
			if gotScale != s {
				t.Errorf("%v %s: scale %v, want %v", act, c.what, gotScale, s)
			}
			bad := 0
			for i, v := range x {
				if want := tensor.F32ToE4M3(v / s); got[i] != want {
					if bad < 5 {
						t.Errorf("%v %s: q[%d] = %#x for x %v (x/s %v), want %#x", act, c.what, i, got[i], v, v/s, want)
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%v %s: %d of %d wrong", act, c.what, bad, c.n)
			}
		}
		p := alloc(t, 4096)
		for _, c := range []struct {
			what              string
			q, scale, amax, x cu.Ptr
			n                 int
		}{
			{"n 24", p, p + 2048, p + 2052, p, 24},
			{"n 0", p, p + 2048, p + 2052, p, 0},
			{"x off by 8", p + 1024, p + 2048, p + 2052, p + 8, 16},
			{"q off by 4", p + 1028, p + 2048, p + 2052, p, 16},
			{"null scale", p + 1024, 0, p + 2052, p, 16},
			{"scale off by 4", p + 1024, p + 2052, p + 2048, p, 16},
		} {
			if err := k.QuantizeE4M3(nil, c.q, c.scale, c.amax, c.x, c.n); err == nil {
				t.Errorf("%v %s: accepted", act, c.what)
			}
		}
	}
}

// TestFP8ProductSpeed times a Llama-3-8B layer's products as an FP8 path
// would run them, the activation quantized per tensor (QuantizeE4M3) then
// the FP8 product (cuBLASLt, the fastest of its candidates), against the
// bf16 product, at 2048 rows (prefill), 256 and 64 (batched decode). It
// logs, asserts nothing (docs/PERF.md).
func TestFP8ProductSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d := fp8Device(t)
	k := kern(t, cu.BF16)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	const maxT, maxK, maxW = 2048, 14336, 4096 * 28672
	px, pq := alloc(t, maxT*maxK*2), alloc(t, maxT*maxK)
	pw, po := alloc(t, maxW*2), alloc(t, maxT*28672*2)
	scales := alloc(t, 48)
	xs, ws, amax := scales, scales+16, scales+32 // cuBLASLt refuses scales off 16-byte boundaries
	must(t, d.Memset32(px, 0x3c003c00, maxT*maxK/2, nil))
	must(t, d.Memset32(pw, 0x3c003c00, maxW/2, nil))
	must(t, d.Memset32(ws, math.Float32bits(1e-3), 1, nil))
	fastest := func(mm cu.Matmul, pre func() error) float64 {
		n, err := lt.Algorithms(mm)
		must(t, err)
		best := math.Inf(1)
		for a := range n {
			m := mm
			m.Algo = a
			best = min(best, gpuTime(t, 10, 5, func(int) error {
				if pre != nil {
					if err := pre(); err != nil {
						return err
					}
				}
				return lt.Matmul(m)
			}))
		}
		return best
	}
	var lines []string
	for _, rows := range []int{2048, 256, 64} {
		var sum [3]float64
		for _, sh := range []struct {
			name string
			k, n int
		}{{"Q/K/V", 4096, 6144}, {"output", 4096, 4096}, {"gate/up", 4096, 28672}, {"down", 14336, 4096}} {
			bf := cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.BF16, Out: cu.BF16, X: px, W: pw, Dst: po}
			f8 := cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.F8E4M3, Out: cu.BF16, X: pq, W: pw, Dst: po, XScale: xs, WScale: ws}
			quant := func() error { return k.QuantizeE4M3(nil, pq, xs, amax, px, rows*sh.k) }
			tb, tq, tf := fastest(bf, nil), gpuTime(t, 10, 5, func(int) error { return quant() }), fastest(f8, quant)
			sum[0] += tb
			sum[1] += tq
			sum[2] += tf
			lines = append(lines, fmt.Sprintf("| %d | %s (%d, %d) | %.1f | %.1f | %.1f | %.2f× |", rows, sh.name, sh.k, sh.n, tb*1e3, tq*1e3, tf*1e3, tb/tf))
		}
		lines = append(lines, fmt.Sprintf("| %d | the layer's four | %.1f | %.1f | %.1f | %.2f× |", rows, sum[0]*1e3, sum[1]*1e3, sum[2]*1e3, sum[0]/sum[2]))
	}
	t.Logf("device %s; µs a product, bf16 against the activation quantized to E4M3 then the FP8 product (per-tensor scales, bf16 out):\n"+
		"| rows | product (K, N) | bf16 | quantization alone | quantization + FP8 | bf16 ÷ FP8 path |\n|---|---|---|---|---|---|\n%s",
		d.Name, strings.Join(lines, "\n"))
}

// e4m3Weights quantizes w to E4M3 with one scale (max|w|/448), returning
// the bytes, the scale and the values the product sees (byte·scale).
func e4m3Weights(w []float32) ([]byte, float32, []float64) {
	var a float32
	for _, v := range w {
		a = max(a, float32(math.Abs(float64(v))))
	}
	s := a / tensor.E4M3Max
	q := make([]byte, len(w))
	seen := make([]float64, len(w))
	for i, v := range w {
		q[i] = tensor.F32ToE4M3(v / s)
		seen[i] = float64(tensor.E4M3ToF32(q[i])) * float64(s)
	}
	return q, s, seen
}

// e4m3RowWeights quantizes the n rows of w (k values each) to E4M3 with a
// scale a row (its max|w|/448), returning the bytes, the scales and the
// values the product sees.
func e4m3RowWeights(w []float32, n, k int) ([]byte, []float32, []float64) {
	q, ss, seen := make([]byte, len(w)), make([]float32, n), make([]float64, len(w))
	for r := range n {
		qr, s, sr := e4m3Weights(w[r*k : (r+1)*k])
		copy(q[r*k:], qr)
		copy(seen[r*k:], sr)
		ss[r] = s
	}
	return q, ss, seen
}

// TestGEMVF8: RunF8 against a float64 reference of x (rounded to the
// activation dtype) times the E4M3 weights times their row's scale (rows
// of magnitudes 1/4 to 4), 1 to 8 rows,
// every activation dtype, both output dtypes, on decode shapes and odd
// ones (N not a multiple of a warp's rows, K not a multiple of a group of
// loads, K of one chunk), nothing written past the output; then the
// products it refuses.
func TestGEMVF8(t *testing.T) {
	d := fp8Device(t)
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		for _, sh := range []gemvShape{{"O", 4096, 4096}, {"down", 14336, 4096}, {"small", 96, 301}, {"tail", 4160, 33}, {"one chunk", 16, 5}} {
			k, n := sh.k, sh.n
			x := roundTo(act, randn(rng, GEMVVectorMaxT*k, 1/math.Sqrt(float64(k))))
			w := randn(rng, n*k, 1)
			for r := range n { // rows of magnitudes 1/4 to 4, for the scales a row
				for c := range k {
					w[r*k+c] *= float32(math.Ldexp(1, r%5-2))
				}
			}
			q, s, wv := e4m3RowWeights(w, n, k)
			px, pw, ps := up(t, act, x), alloc(t, len(q)), alloc(t, 4*n)
			must(t, d.Upload(pw, q))
			must(t, d.Upload(ps, cu.AsBytes(s)))
			checkWeightOnly(t, act, fmt.Sprintf("gemv_f8 %v %s k=%d n=%d", act, sh.name, k, n), n, weightOnlyRef(f64(x), wv, k, n),
				func(out cu.Ptr, rows int, outF32 bool) error {
					return g.RunF8(nil, out, px, pw, ps, rows, k, n, outF32)
				})
		}
		p := alloc(t, 1<<16)
		for _, c := range []struct {
			what         string
			out, x, w, s cu.Ptr
			rows, k, n   int
		}{
			{"9 rows", p, p, p, p + 4096, 9, 64, 8},
			{"K 24", p, p, p, p + 4096, 1, 24, 8},
			{"x off by 8", p, p + 8, p, p + 4096, 1, 64, 8},
			{"w off by 4", p, p, p + 4, p + 4096, 1, 64, 8},
			{"null scale", p, p, p, 0, 1, 64, 8},
			{"scale off by 2", p, p, p, p + 4098, 1, 64, 8},
		} {
			if err := g.RunF8(nil, c.out, c.x, c.w, c.s, c.rows, c.k, c.n, false); !errors.Is(err, ErrGEMVShape) {
				t.Errorf("%v %s: err %v, want ErrGEMVShape", act, c.what, err)
			}
		}
	}
}

// TestGEMVF8Speed times RunF8 (FP8 weights, a scale a row) against the bf16
// GEMV (Run) on a Llama-3-8B's decode products at 1, 4 and 8 rows, weights
// rotated past the L2, each as bytes of its own weights a second against
// the device-to-device copy of the same run. It logs, asserts nothing
// (docs/PERF.md).
func TestGEMVF8Speed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d := fp8Device(t)
	g := gemvMod(t, cu.BF16, false)
	ps := alloc(t, 4*128256) // a scale a row, for the largest product
	must(t, d.Memset32(ps, math.Float32bits(1e-3), 128256, nil))
	copyBW, lines := weightOnlySpeed(t, func(k, n int) int { return k * n },
		func(x, w, out cu.Ptr, rows, k, n int) error { return g.RunF8(nil, out, x, w, ps, rows, k, n, false) })
	t.Logf("device %s, copy %.0f GB/s; bf16 GEMV against FP8 GEMV, each as bytes of its own weights a second and %% of copy:\n"+
		"| product (K, N) | rows | bf16 | FP8 | bf16 ÷ FP8 time |\n|---|---|---|---|---|\n%s", d.Name, copyBW, strings.Join(lines, "\n"))
}
