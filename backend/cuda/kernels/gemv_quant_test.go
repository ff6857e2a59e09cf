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

// q8x quantizes x (rows of k) as quant_q8_32 does: per group of 32 values
// s = max|x|/127 and q = x/s rounded to even (float32 divisions), and
// returns each value as the product sees it, s·q.
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
		s := a / 127
		for i, v := range x[g : g+32] {
			q := max(-127, min(127, math.RoundToEven(float64(v/s))))
			out[g+i] = float64(s) * q
		}
	}
	return out
}

// TestGEMVQ4K: RunQ4K against a float64 reference of x (rounded to the
// activation dtype, then to int8 per group of 32 as quant_q8_32 does: q8x)
// times the Q4_K weights as tensor.ToF32 decodes them (weights quantized
// by tensor.Quantize from normal values, so every scale and minimum is a
// real one), 1 to 8 rows, every activation dtype,
// both output dtypes, on decode shapes and odd ones (N not a multiple of
// a block's warps, K of one to three super-blocks, fewer than a group of
// loads), nothing written past the output; then the products it refuses.
func TestGEMVQ4K(t *testing.T) {
	d := gpu(t)
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		for _, sh := range []gemvShape{{"O", 4096, 4096}, {"down", 14336, 4096}, {"one block", 256, 301}, {"three blocks", 768, 33}, {"tiny", 512, 3}} {
			k, n := sh.k, sh.n
			x := roundTo(act, randn(rng, GEMVVectorMaxT*k, 1/math.Sqrt(float64(k))))
			q, err := tensor.Quantize(tensor.Q4_K, randn(rng, n*k, 1))
			must(t, err)
			wf := make([]float32, n*k)
			must(t, tensor.ToF32(tensor.Q4_K, q, wf))
			px, pw, scratch := up(t, act, x), alloc(t, len(q)), alloc(t, Q4KScratchBytes(GEMVVectorMaxT, k))
			must(t, d.Upload(pw, q))
			xs := q8x(x)
			ref := make([]float64, GEMVVectorMaxT*n)
			parallel(GEMVVectorMaxT*n, func(_, lo, hi int) {
				for i := lo; i < hi; i++ {
					r, j := i/n, i%n
					sum := 0.0
					for c := 0; c < k; c++ {
						sum += xs[r*k+c] * float64(wf[j*k+c])
					}
					ref[i] = sum
				}
			})
			worst := [2]float64{}
			for rows := 1; rows <= GEMVVectorMaxT; rows++ {
				for i, outF32 := range []bool{false, true} {
					odt := act
					if outF32 {
						odt = cu.F32
					}
					total := (rows+1)*n + 64
					out := outBuf(t, odt, total)
					must(t, g.RunQ4K(nil, out, px, pw, scratch, rows, k, n, outF32))
					must(t, d.Sync())
					raw := make([]byte, total*odt.Size())
					must(t, d.Download(raw, out))
					what := fmt.Sprintf("gemv_q4k %v %s T=%d k=%d n=%d outF32=%v", act, sh.name, rows, k, n, outF32)
					worst[i] = max(worst[i], compare(t, what, decode(odt, raw[:rows*n*odt.Size()]), ref[:rows*n], gemvTol(act, outF32)))
					checkPoisonTail(t, what, raw, rows*n*odt.Size(), odt)
				}
			}
			t.Logf("%-5v gemv_q4k %-12s k=%-5d n=%-5d T=1..8 max err: out %v %.3g (tol %.0e), out f32 %.3g (tol %.0e)",
				act, sh.name, k, n, act, worst[0], gemvTol(act, false), worst[1], gemvTol(act, true))
		}
		p := alloc(t, 1<<16)
		for _, c := range []struct {
			what               string
			out, x, w, scratch cu.Ptr
			rows, k, n         int
		}{
			{"9 rows", p, p, p, p, 9, 256, 8},
			{"K 128", p, p, p, p, 1, 128, 8},
			{"x off by 8", p, p + 8, p, p, 1, 256, 8},
			{"w off by 4", p, p, p + 4, p, 1, 256, 8},
			{"scratch off by 4", p, p, p, p + 4, 1, 256, 8},
			{"null w", p, p, 0, p, 1, 256, 8},
		} {
			if err := g.RunQ4K(nil, c.out, c.x, c.w, c.scratch, c.rows, c.k, c.n, false); !errors.Is(err, ErrGEMVShape) {
				t.Errorf("%v %s: err %v, want ErrGEMVShape", act, c.what, err)
			}
		}
	}
}

// TestGEMVQ4KSpeed times RunQ4K (Q4_K weights; x's quantization included)
// against the bf16 GEMV (Run)
// on a Llama-3-8B's decode products at 1, 4 and 8 rows, weights rotated
// past the L2, each as bytes of its own weights a second against the
// device-to-device copy of the same run (issue 16's target: batch 1 at 85%
// of copy). It logs, asserts nothing (docs/PERF.md).
func TestGEMVQ4KSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d := gpu(t)
	g := gemvMod(t, cu.BF16, false)
	const cb = 1 << 30
	src, dst := alloc(t, cb), alloc(t, cb)
	must(t, d.Memset32(src, 0x3f803f80, cb/4, nil))
	cms := gpuTime(t, 3, 11, func(int) error { return d.CopyDtoD(dst, src, cb, nil) })
	copyBW := 2 * cb / (cms * 1e-3) / 1e9
	var lines []string
	for _, sh := range gemvShapes[:5] {
		k, n := sh.k, sh.n
		b16, bq := k*n*2, n*k/256*Q4KBlockBytes
		nbuf := max(2, (200<<20+bq-1)/bq)
		ws := make([]cu.Ptr, nbuf)
		for i := range ws {
			ws[i] = alloc(t, b16) // bf16 for Run; its first bytes serve as Q4_K blocks for RunQ4K
			must(t, d.Memset32(ws[i], 0x3c003c00^uint32(i*0x00010001), b16/4, nil))
		}
		x, out := alloc(t, GEMVVectorMaxT*k*2), alloc(t, GEMVVectorMaxT*n*4)
		scratch := alloc(t, Q4KScratchBytes(GEMVVectorMaxT, k))
		must(t, d.Memset32(x, 0x3c003c00, GEMVVectorMaxT*k/2, nil))
		per := max(3, min(50, int(1.5e-3/(float64(bq)/3e12))))
		for _, rows := range []int{1, 4, 8} {
			tb := gpuTime(t, per, 20, func(i int) error { return g.Run(nil, out, x, ws[i%nbuf], rows, k, n, false) })
			tq := gpuTime(t, per, 20, func(i int) error { return g.RunQ4K(nil, out, x, ws[i%nbuf], scratch, rows, k, n, false) })
			gb, gq := float64(b16)/(tb*1e-3)/1e9, float64(bq)/(tq*1e-3)/1e9
			other := ""
			if rows == 1 { // the other groups of loads in flight (GEMV_Q4K(1, U))
				for _, u := range []int{1, 4} {
					c := gemvQ4KCfg(1)
					c.u = u
					tu := gpuTime(t, per, 20, func(i int) error { return g.runQ4K(nil, c, out, x, ws[i%nbuf], scratch, 1, k, n, false) })
					other += fmt.Sprintf(" U=%d %.1f%%", u, 100*float64(bq)/(tu*1e-3)/1e9/copyBW)
				}
			}
			lines = append(lines, fmt.Sprintf("| %s (%d, %d) | %d | %.1f µs, %.0f GB/s, %.1f%% | %.1f µs, %.0f GB/s, %.1f%% | %.2f× |%s |",
				sh.name, k, n, rows, tb*1e3, gb, 100*gb/copyBW, tq*1e3, gq, 100*gq/copyBW, tb/tq, other))
		}
	}
	t.Logf("device %s, copy %.0f GB/s; bf16 GEMV against Q4_K GEMV, each as bytes of its own weights a second and %% of copy:\n"+
		"| product (K, N) | rows | bf16 | Q4_K (U=2) | bf16 ÷ Q4_K time | other U |\n|---|---|---|---|---|---|\n%s", d.Name, copyBW, strings.Join(lines, "\n"))
}
