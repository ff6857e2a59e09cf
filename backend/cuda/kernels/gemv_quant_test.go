package kernels

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// weightOnlyRef is the float64 product of x (GEMVVectorMaxT rows of k
// values, as the kernel sees them) with the weights w (n rows of k, as
// decoded).
func weightOnlyRef(x, w []float64, k, n int) []float64 {
	ref := make([]float64, GEMVVectorMaxT*n)
	parallel(GEMVVectorMaxT*n, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			r, j := i/n, i%n
			sum := 0.0
			for c := 0; c < k; c++ {
				sum += x[r*k+c] * w[j*k+c]
			}
			ref[i] = sum
		}
	})
	return ref
}

// checkWeightOnly runs a weight-only product, run(out, rows, outF32), for 1
// to GEMVVectorMaxT rows into both output dtypes (NaN-poisoned, with spare
// room), compares it with ref (weightOnlyRef) and checks that nothing past
// the output was written, and logs the worst errors.
func checkWeightOnly(t *testing.T, act cu.DType, what string, n int, ref []float64, run func(out cu.Ptr, rows int, outF32 bool) error) {
	t.Helper()
	d := gpu(t)
	worst := [2]float64{}
	for rows := 1; rows <= GEMVVectorMaxT; rows++ {
		for i, outF32 := range []bool{false, true} {
			odt := act
			if outF32 {
				odt = cu.F32
			}
			total := (rows+1)*n + 64
			out := outBuf(t, odt, total)
			must(t, run(out, rows, outF32))
			must(t, d.Sync())
			raw := make([]byte, total*odt.Size())
			must(t, d.Download(raw, out))
			w := fmt.Sprintf("%s T=%d outF32=%v", what, rows, outF32)
			worst[i] = max(worst[i], compare(t, w, decode(odt, raw[:rows*n*odt.Size()]), ref[:rows*n], gemvTol(act, outF32)))
			checkPoisonTail(t, w, raw, rows*n*odt.Size(), odt)
		}
	}
	t.Logf("%-48s T=1..8 max err: out %v %.3g (tol %.0e), out f32 %.3g (tol %.0e)",
		what, act, worst[0], gemvTol(act, false), worst[1], gemvTol(act, true))
}

// weightOnlySpeed times, at 1, 4 and 8 rows of each of a Llama-3-8B's
// decode products, the bf16 GEMV (Run) against a weight-only product of
// bytes(k, n) bytes a matrix, run(x, w, out, rows, k, n), and returns the
// copy bandwidth of the run and a table row a case: each kernel's own
// weight bytes a second and % of copy, weights rotated past the L2 (the
// bf16 buffers' first bytes serve as the other format's). KILN_GEMV_SHAPE
// names the one product to time (to profile one).
func weightOnlySpeed(t *testing.T, bytes func(k, n int) int, run func(x, w, out cu.Ptr, rows, k, n int) error) (float64, []string) {
	d := gpu(t)
	g := gemvMod(t, cu.BF16, false)
	const cb = 1 << 30
	src, dst := alloc(t, cb), alloc(t, cb)
	must(t, d.Memset32(src, 0x3f803f80, cb/4, nil))
	cms := gpuTime(t, 3, 11, func(int) error { return d.CopyDtoD(dst, src, cb, nil) })
	copyBW := 2 * cb / (cms * 1e-3) / 1e9
	var lines []string
	for _, sh := range gemvShapes[:5] {
		if only := os.Getenv("KILN_GEMV_SHAPE"); only != "" && only != sh.name {
			continue
		}
		k, n := sh.k, sh.n
		b16, bq := k*n*2, bytes(k, n)
		nbuf := max(2, (200<<20+bq-1)/bq)
		ws := make([]cu.Ptr, nbuf)
		for i := range ws {
			ws[i] = alloc(t, b16)
			must(t, d.Memset32(ws[i], 0x3c003c00^uint32(i*0x00010001), b16/4, nil))
		}
		wAt := func(i int) cu.Ptr { return ws[i%nbuf] }
		x, out := alloc(t, GEMVVectorMaxT*k*2), alloc(t, GEMVVectorMaxT*n*4)
		must(t, d.Memset32(x, 0x3c003c00, GEMVVectorMaxT*k/2, nil))
		per := max(3, min(50, int(1.5e-3/(float64(bq)/3e12))))
		for _, rows := range []int{1, 4, 8} {
			tb := gpuTime(t, per, 20, func(i int) error { return g.Run(nil, out, x, wAt(i), rows, k, n, false) })
			tq := gpuTime(t, per, 20, func(i int) error { return run(x, wAt(i), out, rows, k, n) })
			gb, gq := float64(b16)/(tb*1e-3)/1e9, float64(bq)/(tq*1e-3)/1e9
			lines = append(lines, fmt.Sprintf("| %s (%d, %d) | %d | %.1f µs, %.0f GB/s, %.1f%% | %.1f µs, %.0f GB/s, %.1f%% | %.2f× |",
				sh.name, k, n, rows, tb*1e3, gb, 100*gb/copyBW, tq*1e3, gq, 100*gq/copyBW, tb/tq))
		}
	}
	return copyBW, lines
}

// q8x quantizes x (rows of k) as the K-quant kernels' kq_round8 does: per
// group of 32 values s = max|x|/127 and q = x·(127/max|x|) rounded to even
// (float32 arithmetic), and returns each value as the product sees it, s·q.
func q8x(x []float32) []float64 {
	out := make([]float64, len(x))
	for g := 0; g < len(x); g += 32 {
		var a float32
		for _, v := range x[g : g+32] {
			a = max(a, float32(math.Abs(float64(v))))
		}
		if a == 0 {
			continue
		}
		s, is := a/127, 127/a
		for i, v := range x[g : g+32] {
			q := max(-127, min(127, math.RoundToEven(float64(v*is))))
			out[g+i] = float64(s) * q
		}
	}
	return out
}

// TestGEMVBlocks: RunBlocks (Q4_K and Q6_K weights) against a float64 reference of x (rounded
// to the activation dtype, then to int8 per group of 32 as the kernels'
// kq_quantize does: q8x) times the Q4_K or Q6_K weights as tensor.ToF32
// decodes them (weights quantized by tensor.Quantize from normal values, so
// every scale and minimum is a real one), 1 to 8 rows, every activation
// dtype, both output dtypes, on decode shapes (warps looping over several
// rows) and odd ones (N not a multiple of a block's warps, rows ending in a
// partial unit of super-blocks, fewer rows than warps), nothing written
// past the output; the rows of x in several launches when a block's shared
// memory cannot hold them all; then the products it refuses.
func TestGEMVBlocks(t *testing.T) {
	d := gpu(t)
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		for _, f := range []struct {
			dt     tensor.DType
			bb     int
			shapes []gemvShape
		}{
			{tensor.Q4_K, Q4KBlockBytes, []gemvShape{{"O", 4096, 4096}, {"down", 14336, 4096}, {"nine blocks", 2304, 77},
				{"one block", 256, 301}, {"three blocks", 768, 33}, {"tiny", 512, 3}}},
			// Q6_K: super-blocks of 210 bytes start 2 bytes past a 4-byte
			// boundary every other one, and rows of other than a multiple
			// of 8 super-blocks off the 16-byte grid, which the kernel's
			// copies and reads must handle.
			{tensor.Q6_K, Q6KBlockBytes, []gemvShape{{"O", 4096, 4096}, {"down", 14336, 4096}, {"nine blocks", 2304, 77},
				{"one block", 256, 301}, {"three blocks", 768, 33}, {"tiny", 512, 3}}},
		} {
			upload := func(k, n int) (x []float32, pw cu.Ptr, ref []float64) {
				x = roundTo(act, randn(rng, GEMVVectorMaxT*k, 1/math.Sqrt(float64(k))))
				q, err := tensor.Quantize(f.dt, randn(rng, n*k, 1))
				must(t, err)
				wf := make([]float32, n*k)
				must(t, tensor.ToF32(f.dt, q, wf))
				pw = alloc(t, len(q))
				must(t, d.Upload(pw, q))
				return x, pw, weightOnlyRef(q8x(x), f64(wf), k, n)
			}
			for _, sh := range f.shapes {
				k, n := sh.k, sh.n
				x, pw, ref := upload(k, n)
				px := up(t, act, x)
				checkWeightOnly(t, act, fmt.Sprintf("gemv %v %v %s k=%d n=%d", f.dt, act, sh.name, k, n), n, ref,
					func(out cu.Ptr, rows int, outF32 bool) error {
						return g.RunBlocks(nil, f.dt, out, px, pw, rows, k, n, outF32)
					})
			}
			// Shared memory for 3 rows of x at K 4096: 8 rows in three
			// launches (3, 3, 2).
			const k, n = 4096, 520
			x, pw, ref := upload(k, n)
			px := up(t, act, x)
			g.kqSharedLimit = kqShared(f.bb, 3, k)
			checkWeightOnly(t, act, fmt.Sprintf("gemv %v %v 3 rows a launch k=%d n=%d", f.dt, act, k, n), n, ref,
				func(out cu.Ptr, rows int, outF32 bool) error {
					return g.RunBlocks(nil, f.dt, out, px, pw, rows, k, n, outF32)
				})
			g.kqSharedLimit = kqShared(f.bb, 1, k) - 1
			if err := g.RunBlocks(nil, f.dt, pw, px, pw, 1, k, n, false); !errors.Is(err, ErrGEMVShape) {
				t.Errorf("%v %v: x of one row past the shared memory: err %v, want ErrGEMVShape", f.dt, act, err)
			}
			g.kqSharedLimit = 0
		}
		p := alloc(t, 1<<16)
		for _, c := range []struct {
			what       string
			format     tensor.DType
			out, x, w  cu.Ptr
			rows, k, n int
		}{
			{"9 rows", tensor.Q4_K, p, p, p, 9, 256, 8},
			{"K 128", tensor.Q4_K, p, p, p, 1, 128, 8},
			{"Q6_K K 128", tensor.Q6_K, p, p, p, 1, 128, 8},
			{"Q5_K", tensor.Q5_K, p, p, p, 1, 256, 8},
			{"x off by 8", tensor.Q4_K, p, p + 8, p, 1, 256, 8},
			{"w off by 4", tensor.Q4_K, p, p, p + 4, 1, 256, 8},
			{"null w", tensor.Q4_K, p, p, 0, 1, 256, 8},
		} {
			if err := g.RunBlocks(nil, c.format, c.out, c.x, c.w, c.rows, c.k, c.n, false); !errors.Is(err, ErrGEMVShape) {
				t.Errorf("%v %s: err %v, want ErrGEMVShape", act, c.what, err)
			}
		}
	}
}

// TestGEMVBlocksFolded: RunBlocksFolded's forms (Q4_K and Q6_K weights,
// bf16 and f16) against float64 references, 1 to 8 rows, three rows a
// launch too: with a norm's gain, x (unnormalized sums, of unit scale)
// times the gain column by column in float, then rounded to int8 per 32
// (q8x); with a residual, the plain product plus the addend (out of the
// activation dtype), also into the addend's own place. Folds it cannot
// take are refused with ErrGEMVShape.
func TestGEMVBlocksFolded(t *testing.T) {
	d := gpu(t)
	for _, act := range []cu.DType{cu.BF16, cu.F16} {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		for _, f := range []struct {
			dt tensor.DType
			bb int
		}{{tensor.Q4_K, Q4KBlockBytes}, {tensor.Q6_K, Q6KBlockBytes}} {
			for _, sh := range []gemvShape{{"O", 4096, 4096}, {"nine blocks", 2304, 77}} {
				k, n := sh.k, sh.n
				x := roundTo(act, randn(rng, GEMVVectorMaxT*k, 1))
				gain := roundTo(act, randn(rng, k, 0.5))
				q, err := tensor.Quantize(f.dt, randn(rng, n*k, 1))
				must(t, err)
				wf := make([]float32, n*k)
				must(t, tensor.ToF32(f.dt, q, wf))
				pw := alloc(t, len(q))
				must(t, d.Upload(pw, q))
				px, pg := up(t, act, x), up(t, act, gain)
				xg := make([]float32, len(x))
				for i := range x {
					xg[i] = x[i] * gain[i%k]
				}
				refGain := weightOnlyRef(q8x(xg), f64(wf), k, n)
				runGain := func(out cu.Ptr, rows int, outF32 bool) error {
					return g.RunBlocksFolded(nil, f.dt, out, px, pw, rows, k, n, outF32, BlocksFold{Gain: pg})
				}
				checkWeightOnly(t, act, fmt.Sprintf("gemv %v %v gain %s k=%d n=%d", f.dt, act, sh.name, k, n), n, refGain, runGain)
				g.kqSharedLimit = kqShared(f.bb, 3, k)
				checkWeightOnly(t, act, fmt.Sprintf("gemv %v %v gain, 3 rows a launch, %s", f.dt, act, sh.name), n, refGain, runGain)
				g.kqSharedLimit = 0

				ref := weightOnlyRef(q8x(x), f64(wf), k, n)
				add := roundTo(act, randn(rng, GEMVVectorMaxT*n, 1))
				refAdd := make([]float64, len(ref))
				for i := range ref {
					refAdd[i] = ref[i] + float64(add[i])
				}
				worst := 0.0
				for rows := 1; rows <= GEMVVectorMaxT; rows++ {
					for _, inPlace := range []bool{false, true} {
						padd := up(t, act, add)
						out := outBuf(t, act, (rows+1)*n+64)
						if inPlace {
							out = padd
						}
						must(t, g.RunBlocksFolded(nil, f.dt, out, px, pw, rows, k, n, false, BlocksFold{Add: padd}))
						must(t, d.Sync())
						raw := make([]byte, rows*n*act.Size())
						must(t, d.Download(raw, out))
						what := fmt.Sprintf("gemv %v %v residual %s T=%d in place %v", f.dt, act, sh.name, rows, inPlace)
						worst = max(worst, compare(t, what, decode(act, raw), refAdd[:rows*n], gemvTol(act, false)))
					}
				}
				t.Logf("gemv %v %v residual %s: T=1..8 max err %.3g (tol %.0e)", f.dt, act, sh.name, worst, gemvTol(act, false))
			}
		}
		p := alloc(t, 1<<16)
		for _, c := range []struct {
			what   string
			outF32 bool
			fold   BlocksFold
		}{
			{"a residual and a gain", false, BlocksFold{Add: p, Gain: p}},
			{"a residual into f32", true, BlocksFold{Add: p}},
			{"a residual off its elements", false, BlocksFold{Add: p + 1}},
			{"a gain off 16 bytes", false, BlocksFold{Gain: p + 8}},
		} {
			if err := g.RunBlocksFolded(nil, tensor.Q4_K, p, p, p, 1, 256, 8, c.outF32, c.fold); !errors.Is(err, ErrGEMVShape) {
				t.Errorf("%v %s: err %v, want ErrGEMVShape", act, c.what, err)
			}
		}
	}
}

// TestGEMVBlocksSpeed times RunBlocks (Q4_K and Q6_K weights; x's
// quantization included) against the bf16 GEMV (Run) on a Llama-3-8B's
// decode products at 1, 4 and 8 rows, weights rotated past the L2, each as
// bytes of its own weights a second against the device-to-device copy of
// the same run (issue 16's target: batch 1 at 85% of copy). It logs,
// asserts nothing (docs/PERF.md).
func TestGEMVBlocksSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	g := gemvMod(t, cu.BF16, false)
	for _, f := range []struct {
		dt tensor.DType
		bb int
	}{{tensor.Q4_K, Q4KBlockBytes}, {tensor.Q6_K, Q6KBlockBytes}} {
		copyBW, lines := weightOnlySpeed(t, func(k, n int) int { return n * k / 256 * f.bb },
			func(x, w, out cu.Ptr, rows, k, n int) error {
				return g.RunBlocks(nil, f.dt, out, x, w, rows, k, n, false)
			})
		t.Logf("device %s, copy %.0f GB/s; bf16 GEMV against %v GEMV, each as bytes of its own weights a second and %% of copy:\n"+
			"| product (K, N) | rows | bf16 | %v | bf16 ÷ %v time |\n|---|---|---|---|---|\n%s", gpu(t).Name, copyBW, f.dt, f.dt, f.dt, strings.Join(lines, "\n"))
	}
}
