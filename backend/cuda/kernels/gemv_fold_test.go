package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math"
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
			xs := roundTo(act, randn(rng, GEMVVectorMaxT*k, 3))
			ws, wb := gemvRand(rng.Uint64(), n*k, act)
			px, pw := up(t, act, xs), alloc(t, len(wb))
			must(t, gpu(t).Upload(pw, wb))
			prod := gemvRef(xs, ws, GEMVVectorMaxT, k, n)
			adds := roundTo(act, randn(rng, GEMVVectorMaxT*n, 1))
			padd := up(t, act, adds)
			worst := 0.0
			for rows := 1; rows <= GEMVVectorMaxT; rows++ {
				if act != cu.F32 {
					must(t, g.SetVectorWay(rows, k, n, WayCUDACores))
					must(t, g.SetVectorWay(rows, k, 2*(n/2), WayCUDACores))
				}
				if !g.Folds(rows, k, n) {
					t.Fatalf("%v: %d rows on the CUDA cores do not fold", act, rows)
				}
				what := fmt.Sprintf("%v gemv fold %s k=%d n=%d T=%d", act, sh.name, k, n, rows)
				inv := make([]float64, rows)
				for r := range inv {
					ss := 0.0
					for _, v := range xs[r*k : (r+1)*k] {
						ss += float64(v) * float64(v)
					}
					inv[r] = 1 / math.Sqrt(ss/float64(k)+eps)
				}
				normed, added := make([]float64, rows*n), make([]float64, rows*n)
				for i := range normed {
					normed[i] = prod[i] * inv[i/n]
					added[i] = prod[i] + float64(adds[i])
				}
				total := rows*n + n + 64
				out := outBuf(t, act, total)
				must(t, g.RunFolded(nil, out, px, pw, rows, k, n, false, Fold{Eps: eps}))
				got := bytesOf(t, act, out, total)
				worst = max(worst, compare(t, what+" eps", decode(act, got[:rows*n*act.Size()]), normed, tol(act)))
				checkPoisonTail(t, what+" eps", got, rows*n*act.Size(), act)
				scaled := got[:rows*n*act.Size()]

				out2 := outBuf(t, act, total)
				must(t, g.RunFolded(nil, out2, px, pw, rows, k, n, false, Fold{Add: padd}))
				got2 := bytesOf(t, act, out2, total)
				worst = max(worst, compare(t, what+" add", decode(act, got2[:rows*n*act.Size()]), added, tol(act)))
				checkPoisonTail(t, what+" add", got2, rows*n*act.Size(), act)

				// SwiGLU of the first 2f outputs' rows, folded, against
				// RunFolded + SwiGLUPacked.
				f := n / 2
				sw := outBuf(t, act, rows*f)
				must(t, g.RunSwiGLU(nil, sw, px, pw, rows, k, f, eps))
				prodBuf, sw2 := outBuf(t, act, rows*2*f), outBuf(t, act, rows*f)
				must(t, g.RunFolded(nil, prodBuf, px, pw, rows, k, 2*f, false, Fold{Eps: eps}))
				must(t, kk.SwiGLUPacked(nil, sw2, prodBuf, ProductScales{}, rows, f))
				if a, b := bytesOf(t, act, sw, rows*f), bytesOf(t, act, sw2, rows*f); !bytes.Equal(a, b) {
					t.Errorf("%s: swiglu with the norm differs from the folded product + swiglu_packed", what)
				}
				if sh.n == 6144 {
					checkFoldedRoPE(t, g, kk, act, px, pw, scaled, rows, k, eps)
				}
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
			xs := roundTo(act, randn(rng, GEMVMaxT*k, 3))
			ws, wb := gemvRand(rng.Uint64(), n*k, act)
			px, pw := up(t, act, xs), alloc(t, len(wb))
			must(t, gpu(t).Upload(pw, wb))
			prod := gemvRef(xs, ws, GEMVMaxT, k, n)
			adds := roundTo(act, randn(rng, GEMVMaxT*n, 1))
			padd := up(t, act, adds)
			worst := 0.0
			for _, rows := range []int{9, 16, 40, 64} {
				if !g.Folds(rows, k, n) {
					t.Fatalf("%v: %d rows on the tile kernels do not fold", act, rows)
				}
				inv := make([]float64, rows)
				for r := range inv {
					ss := 0.0
					for _, v := range xs[r*k : (r+1)*k] {
						ss += float64(v) * float64(v)
					}
					inv[r] = 1 / math.Sqrt(ss/float64(k)+eps)
				}
				normed, added := make([]float64, rows*n), make([]float64, rows*n)
				for i := range normed {
					normed[i] = prod[i] * inv[i/n]
					added[i] = prod[i] + float64(adds[i])
				}
				for _, splits := range g.TileSplits(rows, k, n) {
					g.SetTileSplits(rows, k, n, splits)
					what := fmt.Sprintf("%v gemv tile fold %s k=%d n=%d T=%d splits %d", act, sh.name, k, n, rows, splits)
					total := rows*n + n + 64
					out := outBuf(t, act, total)
					must(t, g.RunFolded(nil, out, px, pw, rows, k, n, false, Fold{Eps: eps}))
					got := bytesOf(t, act, out, total)
					worst = max(worst, compare(t, what+" eps", decode(act, got[:rows*n*act.Size()]), normed, tol(act)))
					checkPoisonTail(t, what+" eps", got, rows*n*act.Size(), act)
					scaled := got[:rows*n*act.Size()]

					out2 := outBuf(t, act, total)
					must(t, g.RunFolded(nil, out2, px, pw, rows, k, n, false, Fold{Add: padd}))
					got2 := bytesOf(t, act, out2, total)
					worst = max(worst, compare(t, what+" add", decode(act, got2[:rows*n*act.Size()]), added, tol(act)))
					checkPoisonTail(t, what+" add", got2, rows*n*act.Size(), act)

					f := n / 2
					g.SetTileSplits(rows, k, 2*f, splits)
					sw := outBuf(t, act, rows*f)
					must(t, g.RunSwiGLU(nil, sw, px, pw, rows, k, f, eps))
					prodBuf, sw2 := outBuf(t, act, rows*2*f), outBuf(t, act, rows*f)
					must(t, g.RunFolded(nil, prodBuf, px, pw, rows, k, 2*f, false, Fold{Eps: eps}))
					must(t, kk.SwiGLUPacked(nil, sw2, prodBuf, ProductScales{}, rows, f))
					if a, b := bytesOf(t, act, sw, rows*f), bytesOf(t, act, sw2, rows*f); !bytes.Equal(a, b) {
						t.Errorf("%s: swiglu with the norm differs from the folded product + swiglu_packed", what)
					}
					if sh.n == 6144 {
						checkFoldedRoPE(t, g, kk, act, px, pw, scaled, rows, k, eps)
					}
					g.ForgetTileSplits(rows, k, n)
					g.ForgetTileSplits(rows, k, 2*f)
				}
			}
			report(t, act, fmt.Sprintf("gemv tile fold %s k=%d n=%d T=9..64, every split", sh.name, k, n), worst)
		}
	}
}

// checkFoldedRoPE runs RunRoPEQKV with NormEps on Llama-3-8B's heads (32/8
// of 128, n = 6144 outputs) and RoPEQKVWrite on scaled (the bytes of
// RunFolded with that eps) and requires the same q, k cache and v cache.
func checkFoldedRoPE(t *testing.T, g *GEMV, kk *Kernels, act cu.DType, px, pw cu.Ptr, scaled []byte, rows, k int, eps float32) {
	t.Helper()
	const heads, kvHeads, hd, maxPos = 32, 8, 128, 4096
	rng := newRNG(t)
	qw, width := heads*hd, kvHeads*hd
	nslot := rows + 5
	perm := rng.Perm(nslot)
	slots, pos := make([]int32, rows), make([]int32, rows)
	for i := range slots {
		slots[i], pos[i] = int32(perm[i]), int32(rng.IntN(maxPos))
	}
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
