package kernels

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
)

// productScales draws an FP8 product's scales for rows×cols (ProductScales:
// a float32 a row and one a column, magnitudes 1/8 to 8) onto the device;
// which says which of the two are drawn (1 rows, 2 columns, 3 both).
func productScales(t *testing.T, rng *rand.Rand, rows, cols, which int) ProductScales {
	var sc ProductScales
	draw := func(n int) cu.Ptr {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(math.Ldexp(1+rng.Float64(), rng.IntN(7)-4))
		}
		return up(t, cu.F32, s)
	}
	if which&1 != 0 {
		sc.Rows = draw(rows)
	}
	if which&2 != 0 {
		sc.Cols = draw(cols)
	}
	return sc
}

// checkScaledReader: a reader of a product given the product's scales
// (run with sc) writes bit for bit what it writes on the product scaled
// first by ScaleRowsCols (run with no scales on the scaled copy); outs are
// the outputs both write (allocated by fresh before each run, n bytes
// each).
func checkScaledReader(t *testing.T, k *Kernels, what string, x cu.Ptr, sc ProductScales, rows, cols int, fresh func() []cu.Ptr, n []int,
	run func(x cu.Ptr, sc ProductScales, outs []cu.Ptr) error) {
	t.Helper()
	fused := fresh()
	must(t, run(x, sc, fused))
	scaled := alloc(t, rows*cols*k.Act.Size())
	must(t, k.ScaleRowsCols(nil, scaled, x, sc, rows, cols))
	twice := fresh()
	must(t, run(scaled, ProductScales{}, twice))
	for i := range fused {
		a, b := make([]byte, n[i]), make([]byte, n[i])
		must(t, gpu(t).Download(a, fused[i]))
		must(t, gpu(t).Download(b, twice[i]))
		if !bytes.Equal(a, b) {
			t.Errorf("%s: output %d with the scales differs from scale_rows_cols then the kernel", what, i)
		}
	}
}

// TestSwiGLUPacked: gu[rows, 2n] → SiLU(gate)·up, on the 16-byte vector
// path (n a multiple of the vector) and the element path; then with an FP8
// product's scales (rows, columns, both) against ScaleRowsCols first.
func TestSwiGLUPacked(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, shape := range [][2]int{{1, 96}, {3, 4096}, {17, 14336}, {300, 1024}, {7, 13}, {5, 12}} {
			rows, n := shape[0], shape[1]
			gu := roundTo(act, randn(rng, rows*2*n, 3))
			out := outBuf(t, act, rows*n)
			pgu := up(t, act, gu)
			must(t, k.SwiGLUPacked(nil, out, pgu, ProductScales{}, rows, n))
			ref := make([]float64, rows*n)
			for r := 0; r < rows; r++ {
				for c := 0; c < n; c++ {
					ref[r*n+c] = silu64(float64(gu[r*2*n+c])) * float64(gu[r*2*n+n+c])
				}
			}
			e := compare(t, "swiglu_packed", down(t, act, out, rows*n), ref, tol(act))
			report(t, act, fmt.Sprintf("swiglu_packed %dx%d", rows, n), e)
			for which := 1; which <= 3; which++ {
				checkScaledReader(t, k, fmt.Sprintf("%v swiglu_packed %dx%d scales %d", act, rows, n, which), pgu, productScales(t, rng, rows, 2*n, which), rows, 2*n,
					func() []cu.Ptr { return []cu.Ptr{outBuf(t, act, rows*n)} }, []int{rows * n * act.Size()},
					func(x cu.Ptr, sc ProductScales, outs []cu.Ptr) error {
						return k.SwiGLUPacked(nil, outs[0], x, sc, rows, n)
					})
			}
		}
	}
}

// TestRoPEQKVWrite: the stacked q, k and v of each token taken apart: q
// rotated into its buffer, k rotated and v into random cache slots; the
// other slots keep what they held. Then with an FP8 product's scales
// against ScaleRowsCols first.
func TestRoPEQKVWrite(t *testing.T) {
	const bs, maxPos = 16, 4096
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, hs := range [][3]int{{32, 8, 128}, {4, 4, 64}, {5, 1, 80}, {3, 1, 72}} {
			heads, kvHeads, hd := hs[0], hs[1], hs[2]
			qw, width := heads*hd, kvHeads*hd
			cols := qw + 2*width
			tab := ropeTable(maxPos, hd, 500000)
			ptab := up(t, cu.F32, tab)
			for _, rows := range testRows {
				nslot, slots, pos := randSlots(rng, rows, bs, maxPos)
				for _, il := range []bool{false, true} {
					qkv := roundTo(act, randn(rng, rows*cols, 1))
					kc0 := roundTo(act, randn(rng, nslot*width, 1))
					vc0 := roundTo(act, randn(rng, nslot*width, 1))
					pq, pkc, pvc := outBuf(t, act, rows*qw), up(t, act, kc0), up(t, act, vc0)
					pqkv, ppos, pslots := up(t, act, qkv), upI32(t, pos), upI32(t, slots)
					must(t, k.RoPEQKVWrite(nil, pq, pkc, pvc, pqkv, ProductScales{}, ppos, pslots, ptab,
						rows, heads, kvHeads, hd, il))
					qref, kref, vref := refRoPEQKV(f64(qkv), pos, slots, tab, kc0, vc0, heads, kvHeads, hd, il)
					op := fmt.Sprintf("rope_qkv_write interleaved=%v", il)
					e1 := compare(t, op+" q", down(t, act, pq, rows*qw), qref, tol(act))
					e2 := compare(t, op+" k", down(t, act, pkc, nslot*width), kref, tol(act))
					e3 := compare(t, op+" v", down(t, act, pvc, nslot*width), vref, tol(act))
					report(t, act, fmt.Sprintf("%s rows=%d heads=%d/%d hd=%d", op, rows, heads, kvHeads, hd), max(e1, e2, e3))
					es := act.Size()
					checkScaledReader(t, k, fmt.Sprintf("%v %s rows=%d hd=%d", act, op, rows, hd), pqkv, productScales(t, rng, rows, cols, 3), rows, cols,
						func() []cu.Ptr { return []cu.Ptr{outBuf(t, act, rows*qw), up(t, act, kc0), up(t, act, vc0)} },
						[]int{rows * qw * es, nslot * width * es, nslot * width * es},
						func(x cu.Ptr, sc ProductScales, o []cu.Ptr) error {
							return k.RoPEQKVWrite(nil, o[0], o[1], o[2], x, sc, ppos, pslots, ptab, rows, heads, kvHeads, hd, il)
						})
				}
			}
		}
	}
}

// randSlots draws a cache of rows tokens and some room (nslot slots in
// blocks of bs), distinct random slots for the rows and random positions
// below maxPos.
func randSlots(rng *rand.Rand, rows, bs, maxPos int) (nslot int, slots, pos []int32) {
	nslot = ((rows+bs-1)/bs + 3) * bs
	perm := rng.Perm(nslot)
	slots, pos = make([]int32, rows), make([]int32, rows)
	for i := range slots {
		slots[i], pos[i] = int32(perm[i]), int32(rng.IntN(maxPos))
	}
	return nslot, slots, pos
}

// refRoPEQKV is RoPEQKVWrite in float64 on the stacked rows x (one per
// token of pos and slots) and the caches kc0, vc0: the rotated queries and
// the caches after the writes.
func refRoPEQKV(x []float64, pos, slots []int32, tab, kc0, vc0 []float32, heads, kvHeads, hd int, il bool) (q, kc, vc []float64) {
	qw, width := heads*hd, kvHeads*hd
	cols := qw + 2*width
	rows := len(pos)
	q, kr := make([]float64, rows*qw), make([]float64, rows*width)
	kc, vc = f64(kc0), f64(vc0)
	for r := 0; r < rows; r++ {
		copy(q[r*qw:], x[r*cols:r*cols+qw])
		copy(kr[r*width:], x[r*cols+qw:r*cols+qw+width])
	}
	refRoPE(q, pos, tab, heads, hd, il)
	refRoPE(kr, pos, tab, kvHeads, hd, il)
	for r, s := range slots {
		copy(kc[int(s)*width:(int(s)+1)*width], kr[r*width:])
		copy(vc[int(s)*width:(int(s)+1)*width], x[r*cols+qw+width:(r+1)*cols])
	}
	return q, kc, vc
}

// TestRowRMSReaders: SwiGLUPackedRMS and RoPEQKVWriteRMS read a product
// whose rows are still to be divided by the rms of another matrix's rows
// (a norm folded into the product, backend/cuda/normfold.go): against the
// float64 reference of SwiGLU and of RoPE with the cache writes of the
// product so divided (each element rounded to the activation dtype, as the
// kernels read it), at the plain readers' tolerance. Each row is drawn at
// a scale of its own (0.1 to 30, so that another row's rms is far off) and
// the product's row at that row's scale, as an unnormalized residual gives
// (a product of one scale for all rows overflowed f16 in SwiGLU after the
// division on the H200, 2026-11-27).
func TestRowRMSReaders(t *testing.T) {
	const eps = 1e-5
	rowsAt := func(rng *rand.Rand, rows, dim int) []float32 {
		x := randn(rng, rows*dim, 1)
		for r := range rows {
			s := float32(0.1 * math.Pow(300, rng.Float64()))
			for i := range dim {
				x[r*dim+i] *= s
			}
		}
		return x
	}
	// A product of unnormalized rows: row r of the normalized product (at
	// scale 3) times the rms of row r of the residual it was taken of.
	productRows := func(rng *rand.Rand, inv []float64, cols int) []float32 {
		p := randn(rng, len(inv)*cols, 3)
		for i := range p {
			p[i] /= float32(inv[i/cols])
		}
		return p
	}
	// The kernels read each element x of the product as x·inv rounded to
	// the activation dtype (scaled_of's rounding, as a norm's output is).
	divided := func(act cu.DType, p []float32, inv []float64, cols int) []float64 {
		d := make([]float32, len(p))
		for i, x := range p {
			d[i] = float32(float64(x) * inv[i/cols])
		}
		return f64(roundTo(act, d))
	}
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, shape := range [][3]int{{1, 256, 96}, {17, 4096, 14336}, {300, 512, 1024}} {
			rows, dim, n := shape[0], shape[1], shape[2]
			nx := roundTo(act, rowsAt(rng, rows, dim))
			inv := rowInvRMS(nx, rows, dim, eps)
			gu := roundTo(act, productRows(rng, inv, 2*n))
			out := outBuf(t, act, rows*n)
			must(t, k.SwiGLUPackedRMS(nil, out, up(t, act, gu), RowRMS{X: up(t, act, nx), Dim: dim, Eps: eps}, rows, n))
			ref, x := make([]float64, rows*n), divided(act, gu, inv, 2*n)
			for r := range rows {
				for c := range n {
					ref[r*n+c] = silu64(x[r*2*n+c]) * x[r*2*n+n+c]
				}
			}
			e := compare(t, "swiglu_packed_n", down(t, act, out, rows*n), ref, tol(act))
			report(t, act, fmt.Sprintf("swiglu_packed_n %dx%d over rows of %d", rows, n, dim), e)
		}
		const bs, maxPos, dim = 16, 4096, 256
		// Heads of 128, 64 and 72 (a half not a multiple of 16 bytes).
		for _, hs := range [][3]int{{32, 8, 128}, {4, 4, 64}, {3, 1, 72}} {
			heads, kvHeads, hd := hs[0], hs[1], hs[2]
			qw, width := heads*hd, kvHeads*hd
			cols := qw + 2*width
			tab := ropeTable(maxPos, hd, 500000)
			for _, rows := range testRows {
				nslot, slots, pos := randSlots(rng, rows, bs, maxPos)
				nx := roundTo(act, rowsAt(rng, rows, dim))
				inv := rowInvRMS(nx, rows, dim, eps)
				qkv := roundTo(act, productRows(rng, inv, cols))
				scaled := divided(act, qkv, inv, cols)
				kc0 := roundTo(act, randn(rng, nslot*width, 1))
				vc0 := roundTo(act, randn(rng, nslot*width, 1))
				pq, pkc, pvc := outBuf(t, act, rows*qw), up(t, act, kc0), up(t, act, vc0)
				must(t, k.RoPEQKVWriteRMS(nil, pq, pkc, pvc, up(t, act, qkv), RowRMS{X: up(t, act, nx), Dim: dim, Eps: eps},
					upI32(t, pos), upI32(t, slots), up(t, cu.F32, tab), rows, heads, kvHeads, hd, false))
				qref, kref, vref := refRoPEQKV(scaled, pos, slots, tab, kc0, vc0, heads, kvHeads, hd, false)
				e1 := compare(t, "RoPEQKVWriteRMS q", down(t, act, pq, rows*qw), qref, tol(act))
				e2 := compare(t, "RoPEQKVWriteRMS k", down(t, act, pkc, nslot*width), kref, tol(act))
				e3 := compare(t, "RoPEQKVWriteRMS v", down(t, act, pvc, nslot*width), vref, tol(act))
				report(t, act, fmt.Sprintf("RoPEQKVWriteRMS rows=%d heads=%d/%d hd=%d", rows, heads, kvHeads, hd), max(e1, e2, e3))
			}
		}
	}
}

// TestFoldGain: FoldGain multiplies a product's weights by a norm's gain
// column by column, each product rounded to the activation dtype: bit for
// bit the host's float32 product rounded the same way, for gains of each
// weight dtype.
func TestFoldGain(t *testing.T) {
	const rows, cols = 37, 4096
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, gt := range allDTypes {
			w := roundTo(act, randn(rng, rows*cols, 1))
			g := roundTo(gt, randn(rng, cols, 1))
			pw := up(t, act, w)
			must(t, k.FoldGain(nil, pw, up(t, gt, g), gt, rows, cols))
			want := make([]float32, rows*cols)
			for i := range want {
				want[i] = w[i] * g[i%cols]
			}
			want = roundTo(act, want)
			got := down(t, act, pw, rows*cols)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v weights, %v gain: [%d] = %v, want %v", act, gt, i, got[i], want[i])
				}
			}
		}
	}
}
