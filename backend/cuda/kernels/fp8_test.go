package kernels

import (
	"bytes"
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

// TestQuantizeRowsE4M3: QuantizeRowsE4M3 against tensor.F32ToE4M3 of x/s
// with s = max|x|/448 of each row in float32 (the same divisions, correctly
// rounded), byte for byte, and each row's scale bit for bit, for every
// activation dtype: rows of magnitudes 1/16 to 16 with an outlier (which
// maps to ±448, or saturates there when x/s rounds above it), values of
// order 1e-4 (tiny scales), an all-zero row among others (scale 1), rows
// shorter and longer than a block's pass, each on fresh scratch; values
// near zero land on E4M3's subnormals in every case. Then the operands it
// refuses.
func TestQuantizeRowsE4M3(t *testing.T) {
	fp8Device(t)
	rng := newRNG(t)
	for _, act := range allDTypes {
		k := kern(t, act)
		for _, c := range []struct {
			what       string
			rows, cols int
			scale      float64
		}{{"normal", 256, 4096, 1}, {"small", 3, 48, 3}, {"tiny", 5, 4096, 1e-4}, {"zero row", 4, 64, 1}, {"long rows", 9, 14336, 7}, {"one row", 1, 16, 1}} {
			n := c.rows * c.cols
			x := randn(rng, n, c.scale)
			for r := range c.rows {
				for i := range c.cols {
					x[r*c.cols+i] *= float32(math.Ldexp(1, r%9-4))
				}
			}
			switch c.what {
			case "normal":
				x[12345] = float32(40 * c.scale) // an outlier sets its row's scale
			case "zero row":
				clear(x[2*c.cols : 3*c.cols])
			}
			roundTo(act, x)
			px := up(t, act, x)
			q, scales := alloc(t, n), alloc(t, 4*c.rows)
			must(t, k.QuantizeRowsE4M3(nil, q, scales, px, c.rows, c.cols))
			got := make([]byte, n)
			must(t, gpu(t).Sync())
			must(t, gpu(t).Download(got, q))
			gotScales := make([]float32, c.rows)
			must(t, gpu(t).Download(cu.AsBytes(gotScales), scales))
			bad := 0
			for r := range c.rows {
				row := x[r*c.cols : (r+1)*c.cols]
				var a float32
				for _, v := range row {
					a = max(a, float32(math.Abs(float64(v))))
				}
				s := float32(1)
				if a > 0 {
					s = a / tensor.E4M3Max
				}
				if gotScales[r] != s {
					t.Errorf("%v %s: row %d scale %v, want %v", act, c.what, r, gotScales[r], s)
				}
				for i, v := range row {
					if want := tensor.F32ToE4M3(v / s); got[r*c.cols+i] != want {
						if bad < 5 {
							t.Errorf("%v %s: q[%d, %d] = %#x for x %v (x/s %v), want %#x", act, c.what, r, i, got[r*c.cols+i], v, v/s, want)
						}
						bad++
					}
				}
			}
			if bad > 0 {
				t.Errorf("%v %s: %d of %d wrong", act, c.what, bad, n)
			}
		}
		p := alloc(t, 4096)
		for _, c := range []struct {
			what         string
			q, scales, x cu.Ptr
			rows, cols   int
		}{
			{"cols 24", p, p + 2048, p, 1, 24},
			{"cols 0", p, p + 2048, p, 1, 0},
			{"rows 0", p, p + 2048, p, 0, 16},
			{"x off by 8", p + 1024, p + 2048, p + 8, 1, 16},
			{"q off by 4", p + 1028, p + 2048, p, 1, 16},
			{"null scales", p + 1024, 0, p, 1, 16},
			{"scales off by 2", p + 1024, p + 2050, p, 1, 16},
		} {
			if err := k.QuantizeRowsE4M3(nil, c.q, c.scales, c.x, c.rows, c.cols); err == nil {
				t.Errorf("%v %s: accepted", act, c.what)
			}
		}
	}
}

// TestFP8ProductSpeed times a Llama-3-8B layer's products as the FP8 path
// runs them, the activation quantized a token (QuantizeRowsE4M3) then the
// FP8 product (cuBLASLt, the fastest of its candidates) with unit scales,
// against the bf16 product, at 2048 rows (prefill), 256 and 64 (batched
// decode); and the pass that applies the scales where no reader takes
// them (ScaleRowsCols in place). It logs, asserts nothing (docs/PERF.md).
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
	one, rs, cs := alloc(t, 16), alloc(t, 4*maxT), alloc(t, 4*28672) // cuBLASLt refuses scales off 16-byte boundaries
	must(t, d.Memset32(one, math.Float32bits(1), 1, nil))
	must(t, d.Memset32(cs, math.Float32bits(1e-3), 28672, nil))
	must(t, d.Memset32(px, 0x3c003c00, maxT*maxK/2, nil))
	must(t, d.Memset32(pw, 0x3c003c00, maxW/2, nil))
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
		var sum [4]float64
		for _, sh := range []struct {
			name string
			k, n int
		}{{"Q/K/V", 4096, 6144}, {"output", 4096, 4096}, {"gate/up", 4096, 28672}, {"down", 14336, 4096}} {
			bf := cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.BF16, Out: cu.BF16, X: px, W: pw, Dst: po}
			f8 := cu.Matmul{T: rows, K: sh.k, N: sh.n, In: cu.F8E4M3, Out: cu.BF16, X: pq, W: pw, Dst: po, XScale: one, WScale: one}
			quant := func() error { return k.QuantizeRowsE4M3(nil, pq, rs, px, rows, sh.k) }
			scale := func(int) error { return k.ScaleRowsCols(nil, po, po, ProductScales{rs, cs}, rows, sh.n) }
			tb, tq, tf, ts := fastest(bf, nil), gpuTime(t, 10, 5, func(int) error { return quant() }), fastest(f8, quant), gpuTime(t, 10, 5, scale)
			for i, v := range []float64{tb, tq, tf, ts} {
				sum[i] += v
			}
			lines = append(lines, fmt.Sprintf("| %d | %s (%d, %d) | %.1f | %.1f | %.1f | %.2f× | %.1f | %.2f× |", rows, sh.name, sh.k, sh.n,
				tb*1e3, tq*1e3, tf*1e3, tb/tf, ts*1e3, tb/(tf+ts)))
		}
		lines = append(lines, fmt.Sprintf("| %d | the layer's four | %.1f | %.1f | %.1f | %.2f× | %.1f | %.2f× |", rows,
			sum[0]*1e3, sum[1]*1e3, sum[2]*1e3, sum[0]/sum[2], sum[3]*1e3, sum[0]/(sum[2]+sum[3])))
	}
	t.Logf("device %s; µs a product, bf16 against the activation quantized to E4M3 a token then the FP8 product (unit scales, bf16 out), and with the scales' pass:\n"+
		"| rows | product (K, N) | bf16 | quantization alone | quantization + FP8 | bf16 ÷ that | scales' pass | bf16 ÷ all three |\n|---|---|---|---|---|---|---|---|\n%s",
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

// TestE4M3Writers: the kernels that write their output in FP8 form for the
// product after them (RMSNormE4M3, AddRMSNormE4M3, SwiGLUPackedE4M3, with
// an FP8 product's scales for SwiGLU) write bit for bit the codes and
// scales that QuantizeRowsE4M3 writes from the output of the plain kernel
// (and AddRMSNorm's sum), for every activation dtype, on the register path
// for few rows and many, and past it (rows too long: the plain kernel and
// the quantization); SwiGLU's one kernel from 256 rows; from 1,024 rows the
// kernels of a block for several rows (an odd last block among them).
func TestE4M3Writers(t *testing.T) {
	d := fp8Device(t)
	rng := newRNG(t)
	get := func(p cu.Ptr, n int) []byte {
		b := make([]byte, n)
		must(t, d.Sync())
		must(t, d.Download(b, p))
		return b
	}
	same := func(what string, a, b []byte) {
		t.Helper()
		if !bytes.Equal(a, b) {
			n := 0
			for i := range a {
				if a[i] != b[i] {
					n++
				}
			}
			t.Errorf("%s: %d of %d bytes differ from the plain kernel then QuantizeRowsE4M3", what, n, len(a))
		}
	}
	for _, act := range allDTypes {
		k := kern(t, act)
		es := act.Size()
		for _, sh := range [][2]int{{3, 4096}, {300, 4096}, {1027, 4096}, {5, 14336}, {256, 14336}, {1025, 14336}, {9, 96}, {4, 16400}, {260, 16400}, {1030, 16400}} {
			rows, dim := sh[0], sh[1]
			what := fmt.Sprintf("%v %d×%d", act, rows, dim)
			x, r := up(t, act, roundTo(act, randn(rng, rows*dim, 2))), up(t, act, roundTo(act, randn(rng, rows*dim, 2)))
			w := up(t, cu.BF16, roundTo(cu.BF16, randn(rng, dim, 1)))
			q1, s1, q2, s2 := alloc(t, rows*dim), alloc(t, 4*rows), alloc(t, rows*dim), alloc(t, 4*rows)
			out, sum1, sum2 := outBuf(t, act, rows*dim), outBuf(t, act, rows*dim), outBuf(t, act, rows*dim)

			must(t, k.RMSNormE4M3(nil, E4M3Rows{q1, s1}, out, x, w, cu.BF16, rows, dim, 1e-5))
			must(t, k.RMSNorm(nil, out, x, w, cu.BF16, rows, dim, 1e-5))
			must(t, k.QuantizeRowsE4M3(nil, q2, s2, out, rows, dim))
			same(what+" rmsnorm codes", get(q1, rows*dim), get(q2, rows*dim))
			same(what+" rmsnorm scales", get(s1, 4*rows), get(s2, 4*rows))

			for _, xs := range []ProductScales{{}, productScales(t, rng, rows, dim, 3)} {
				what := fmt.Sprintf("%s add_rmsnorm (x scaled %v)", what, xs.Rows != 0)
				must(t, k.AddRMSNormE4M3(nil, sum1, out, E4M3Rows{q1, s1}, x, r, xs, w, cu.BF16, rows, dim, 1e-5))
				must(t, k.AddRMSNorm(nil, sum2, out, x, r, xs, w, cu.BF16, rows, dim, 1e-5))
				must(t, k.QuantizeRowsE4M3(nil, q2, s2, out, rows, dim))
				same(what+" sum", get(sum1, rows*dim*es), get(sum2, rows*dim*es))
				same(what+" codes", get(q1, rows*dim), get(q2, rows*dim))
				same(what+" scales", get(s1, 4*rows), get(s2, 4*rows))
			}

			gu := up(t, act, roundTo(act, randn(rng, rows*2*dim, 2)))
			for which := 0; which <= 3; which++ {
				sc := productScales(t, rng, rows, 2*dim, which)
				must(t, k.SwiGLUPackedE4M3(nil, E4M3Rows{q1, s1}, out, gu, sc, rows, dim))
				must(t, k.SwiGLUPacked(nil, out, gu, sc, rows, dim))
				must(t, k.QuantizeRowsE4M3(nil, q2, s2, out, rows, dim))
				same(fmt.Sprintf("%s swiglu_packed scales %d codes", what, which), get(q1, rows*dim), get(q2, rows*dim))
				same(fmt.Sprintf("%s swiglu_packed scales %d scales", what, which), get(s1, 4*rows), get(s2, 4*rows))
			}
			// In place, as in an FP8 product's epilogue: the output's
			// scales over the product's rows' scales.
			sr := make([]float32, rows)
			for i := range sr {
				sr[i] = float32(math.Ldexp(1+rng.Float64(), rng.IntN(7)-4))
			}
			a, b, cols := up(t, cu.F32, sr), up(t, cu.F32, sr), productScales(t, rng, rows, 2*dim, 2).Cols
			must(t, k.SwiGLUPackedE4M3(nil, E4M3Rows{q1, a}, out, gu, ProductScales{a, cols}, rows, dim))
			must(t, k.SwiGLUPacked(nil, out, gu, ProductScales{b, cols}, rows, dim))
			must(t, k.QuantizeRowsE4M3(nil, q2, s2, out, rows, dim))
			same(what+" swiglu_packed in place codes", get(q1, rows*dim), get(q2, rows*dim))
			same(what+" swiglu_packed in place scales", get(a, 4*rows), get(s2, 4*rows))
		}
	}
}
