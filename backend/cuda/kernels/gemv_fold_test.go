package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
)

// TestGEMVFold: the CUDA-core kernels with a norm folded in (Fold), at
// every row count 1..8 on that way, the Llama-3-8B shape and odd ones:
//   - Eps: against the float64 product of each x row divided by its rms,
//     rsqrt(mean(x²) + eps) (x rows of rms about 3, far from 1, so a
//     missing or doubled 1/rms shows);
//   - Add: against the float64 product plus the residual, rounded once;
//   - the SwiGLU and RoPE epilogues with NormEps: bit for bit RunFolded
//     with that Eps followed by SwiGLUPacked and RoPEQKVWrite (the same
//     scaled sums, rounded the same way), as their unfolded forms are to
//     Run followed by them (TestGEMVSwiGLU, TestGEMVRoPEQKV).
func TestGEMVFold(t *testing.T) {
	const eps = 1e-5
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		kk := kern(t, act)
		rng := newRNG(t)
		for _, sh := range []gemvShape{{"llama3-8b q/k/v", 4096, 6144}, {"odd", 96, 301}, {"tiny", 136, 6}} {
			k, n := sh.k, sh.n
			f := newFoldCase(t, g, kk, act, rng, GEMVVectorMaxT, k, n, eps)
			worst := 0.0
			for rows := 1; rows <= GEMVVectorMaxT; rows++ {
				if act != cu.F32 {
					must(t, g.SetVectorWay(rows, k, n, WayCUDACores))
					must(t, g.SetVectorWay(rows, k, 2*(n/2), WayCUDACores))
				}
				if !g.Folds(rows, k, n) {
					t.Fatalf("%v: %d rows on the CUDA cores do not fold", act, rows)
				}
				worst = max(worst, f.check(t, fmt.Sprintf("%v gemv fold %s k=%d n=%d T=%d", act, sh.name, k, n, rows), rows))
			}
			report(t, act, fmt.Sprintf("gemv fold %s k=%d n=%d T=1..%d", sh.name, k, n, GEMVVectorMaxT), worst)
		}
	}
}

// TestGEMVTileFold: the tile kernels with a norm folded in (more than
// GEMVVectorMaxT rows, f16 and bf16), as TestGEMVFold checks the CUDA-core
// kernels, at 9 to 64 rows and every split of K TileSplits offers (the
// squares of x's rows summed over the splits as the products are): Eps
// against the float64 product of each row divided by its rms, Add against
// the product plus the residual, the SwiGLU and RoPE epilogues with
// NormEps bit for bit the folded product followed by SwiGLUPacked and
// RoPEQKVWrite.
func TestGEMVTileFold(t *testing.T) {
	const eps = 1e-5
	for _, act := range []cu.DType{cu.F16, cu.BF16} {
		g := gemvMod(t, act, false)
		kk := kern(t, act)
		rng := newRNG(t)
		for _, sh := range []gemvShape{{"llama3-8b q/k/v", 4096, 6144}, {"odd, tiles", 192, 301}} {
			k, n := sh.k, sh.n
			f := newFoldCase(t, g, kk, act, rng, GEMVMaxT, k, n, eps)
			worst := 0.0
			for _, rows := range []int{9, 16, 40, 64} {
				if !g.Folds(rows, k, n) {
					t.Fatalf("%v: %d rows on the tile kernels do not fold", act, rows)
				}
				for _, splits := range g.TileSplits(rows, k, n) {
					g.SetTileSplits(rows, k, n, splits)
					worst = max(worst, f.check(t, fmt.Sprintf("%v gemv tile fold %s k=%d n=%d T=%d splits %d", act, sh.name, k, n, rows, splits), rows))
					g.ForgetTileSplits(rows, k, n)
				}
			}
			report(t, act, fmt.Sprintf("gemv tile fold %s k=%d n=%d T=9..64, every split", sh.name, k, n), worst)
		}
	}
}

// foldCase is a product's operands for the folded forms' checks: x (rows
// of xs, at px), w (at pw), their float64 product prod, and a residual
// (adds, at padd), for products of k columns and n outputs.
type foldCase struct {
	g      *GEMV
	kk     *Kernels
	act    cu.DType
	xs     []float32
	prod   []float64
	adds   []float32
	px, pw cu.Ptr
	padd   cu.Ptr
	k, n   int
	eps    float32
}

// newFoldCase draws the operands of a foldCase of up to rows rows: x of
// rms about 3 (far from 1, so that a missing or doubled 1/rms shows), w,
// and a residual, rounded to act.
func newFoldCase(t *testing.T, g *GEMV, kk *Kernels, act cu.DType, rng *rand.Rand, rows, k, n int, eps float32) foldCase {
	t.Helper()
	xs := roundTo(act, randn(rng, rows*k, 3))
	ws, wb := gemvRand(rng.Uint64(), n*k, act)
	pw := alloc(t, len(wb))
	must(t, gpu(t).Upload(pw, wb))
	adds := roundTo(act, randn(rng, rows*n, 1))
	return foldCase{g: g, kk: kk, act: act, xs: xs, prod: gemvRef(xs, ws, rows, k, n), adds: adds, px: up(t, act, xs), pw: pw,
		padd: up(t, act, adds), k: k, n: n, eps: eps}
}

// check runs the folded forms on the first rows of x, as the way set for
// them runs: Eps against the float64 product of each row divided by its
// rms, rsqrt(mean(x²) + eps); Add against the product plus the residual;
// the SwiGLU epilogue (and, at Llama-3's 6144 outputs, the RoPE one) with
// NormEps bit for bit the folded product followed by SwiGLUPacked
// (RoPEQKVWrite). It returns the worst error.
func (c foldCase) check(t *testing.T, what string, rows int) float64 {
	t.Helper()
	act, k, n := c.act, c.k, c.n
	inv := rowInvRMS(c.xs, rows, k, float64(c.eps))
	normed, added := make([]float64, rows*n), make([]float64, rows*n)
	for i := range normed {
		normed[i] = c.prod[i] * inv[i/n]
		added[i] = c.prod[i] + float64(c.adds[i])
	}
	total := rows*n + n + 64
	out := outBuf(t, act, total)
	must(t, c.g.RunFolded(nil, out, c.px, c.pw, rows, k, n, false, Fold{Eps: c.eps}))
	got := bytesOf(t, act, out, total)
	worst := compare(t, what+" eps", decode(act, got[:rows*n*act.Size()]), normed, tol(act))
	checkPoisonTail(t, what+" eps", got, rows*n*act.Size(), act)
	scaled := got[:rows*n*act.Size()]

	out2 := outBuf(t, act, total)
	must(t, c.g.RunFolded(nil, out2, c.px, c.pw, rows, k, n, false, Fold{Add: c.padd}))
	got2 := bytesOf(t, act, out2, total)
	worst = max(worst, compare(t, what+" add", decode(act, got2[:rows*n*act.Size()]), added, tol(act)))
	checkPoisonTail(t, what+" add", got2, rows*n*act.Size(), act)

	// SwiGLU of the first 2f outputs' rows, folded, against RunFolded +
	// SwiGLUPacked.
	f := n / 2
	sw := outBuf(t, act, rows*f)
	must(t, c.g.RunSwiGLU(nil, sw, c.px, c.pw, rows, k, f, c.eps))
	prodBuf, sw2 := outBuf(t, act, rows*2*f), outBuf(t, act, rows*f)
	must(t, c.g.RunFolded(nil, prodBuf, c.px, c.pw, rows, k, 2*f, false, Fold{Eps: c.eps}))
	must(t, c.kk.SwiGLUPacked(nil, sw2, prodBuf, ProductScales{}, rows, f))
	if a, b := bytesOf(t, act, sw, rows*f), bytesOf(t, act, sw2, rows*f); !bytes.Equal(a, b) {
		t.Errorf("%s: swiglu with the norm differs from the folded product + swiglu_packed", what)
	}
	if n == 6144 {
		checkFoldedRoPE(t, c.g, c.kk, act, c.px, c.pw, scaled, rows, k, c.eps)
	}
	return worst
}

// rowInvRMS is each of the first rows rows of x (rows of dim)'s
// 1/sqrt(mean(x²) + eps), in float64.
func rowInvRMS(x []float32, rows, dim int, eps float64) []float64 {
	inv := make([]float64, rows)
	for r := range inv {
		ss := 0.0
		for _, v := range x[r*dim : (r+1)*dim] {
			ss += float64(v) * float64(v)
		}
		inv[r] = 1 / math.Sqrt(ss/float64(dim)+eps)
	}
	return inv
}

// checkFoldedRoPE runs RunRoPEQKV with NormEps on Llama-3-8B's heads (32/8
// of 128, n = 6144 outputs) and RoPEQKVWrite on scaled (the bytes of
// RunFolded with that eps) and requires the same q, k cache and v cache.
func checkFoldedRoPE(t *testing.T, g *GEMV, kk *Kernels, act cu.DType, px, pw cu.Ptr, scaled []byte, rows, k int, eps float32) {
	t.Helper()
	const heads, kvHeads, hd, maxPos = 32, 8, 128, 4096
	rng := newRNG(t)
	qw, width := heads*hd, kvHeads*hd
	nslot, slots, pos := randSlots(rng, rows, 1, maxPos)
	pslots, ppos := upI32(t, slots), upI32(t, pos)
	ptab := up(t, cu.F32, ropeTable(maxPos, hd, 500000))
	kc0, vc0 := roundTo(act, randn(rng, nslot*width, 1)), roundTo(act, randn(rng, nslot*width, 1))
	r := RoPEQKV{Q: outBuf(t, act, rows*qw), KCache: up(t, act, kc0), VCache: up(t, act, vc0), Pos: ppos, Slots: pslots,
		Table: ptab, Heads: heads, KVHeads: kvHeads, HeadDim: hd, NormEps: eps}
	must(t, g.RunRoPEQKV(nil, r, px, pw, rows, k))
	prodBuf := alloc(t, len(scaled))
	must(t, gpu(t).Upload(prodBuf, scaled))
	q2, kc2, vc2 := outBuf(t, act, rows*qw), up(t, act, kc0), up(t, act, vc0)
	must(t, kk.RoPEQKVWrite(nil, q2, kc2, vc2, prodBuf, ProductScales{}, ppos, pslots, ptab, rows, heads, kvHeads, hd, false))
	got := [3][]byte{bytesOf(t, act, r.Q, rows*qw), bytesOf(t, act, r.KCache, nslot*width), bytesOf(t, act, r.VCache, nslot*width)}
	want := [3][]byte{bytesOf(t, act, q2, rows*qw), bytesOf(t, act, kc2, nslot*width), bytesOf(t, act, vc2, nslot*width)}
	for i, part := range []string{"q", "k cache", "v cache"} {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("%v T=%d: rope with the norm: %s differs from the folded product + rope_qkv_write", act, rows, part)
		}
	}
}

// TestGEMVFoldRefuses: a fold where neither the CUDA-core kernels nor the
// tile kernels run (the tensor cores' way), a residual added to an f32
// product, into an epilogue or with an eps, and a negative eps (also at
// the tile kernels' rows) are refused with ErrGEMVShape before anything is
// queued.
func TestGEMVFoldRefuses(t *testing.T) {
	act := cu.BF16
	g := gemvMod(t, act, false)
	p := alloc(t, 1<<20)
	must(t, g.SetVectorWay(2, 64, 64, WayTensorCores))
	r := RoPEQKV{Q: p, KCache: p, VCache: p, Pos: p, Slots: p, Table: p, Heads: 2, KVHeads: 1, HeadDim: 16, NormEps: -1}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"tensor cores", g.RunFolded(nil, p, p, p, 2, 64, 64, false, Fold{Eps: 1e-5})},
		{"tile rows, add and eps", g.RunFolded(nil, p, p, p, 16, 64, 64, false, Fold{Add: p, Eps: 1e-5})},
		{"tile rows, add to f32", g.RunFolded(nil, p, p, p, 16, 64, 64, true, Fold{Add: p})},
		{"add to f32", g.RunFolded(nil, p, p, p, 1, 64, 64, true, Fold{Add: p})},
		{"negative eps", g.RunFolded(nil, p, p, p, 1, 64, 64, false, Fold{Eps: -1})},
		{"add misaligned", g.RunFolded(nil, p, p, p, 1, 64, 64, false, Fold{Add: p.Add(1)})},
		{"add and eps", g.RunFolded(nil, p, p, p, 1, 64, 64, false, Fold{Add: p, Eps: 1e-5})},
		{"swiglu, tile rows, negative eps", g.RunSwiGLU(nil, p, p, p, 16, 64, 32, -1)},
		{"rope, tile rows, negative eps", g.RunRoPEQKV(nil, r, p, p, 16, 64)},
	} {
		if !errors.Is(c.err, ErrGEMVShape) {
			t.Errorf("%s: err %v, want ErrGEMVShape", c.what, c.err)
		}
	}
	must(t, gpu(t).Sync())
}
