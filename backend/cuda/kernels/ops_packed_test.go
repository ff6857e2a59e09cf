package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
)

// TestSwiGLUPacked: gu[rows, 2n] → SiLU(gate)·up, on the 16-byte vector
// path (n a multiple of the vector) and the element path.
func TestSwiGLUPacked(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, shape := range [][2]int{{1, 96}, {3, 4096}, {17, 14336}, {300, 1024}, {7, 13}, {5, 12}} {
			rows, n := shape[0], shape[1]
			gu := roundTo(act, randn(rng, rows*2*n, 3))
			out := outBuf(t, act, rows*n)
			must(t, k.SwiGLUPacked(nil, out, up(t, act, gu), rows, n))
			ref := make([]float64, rows*n)
			for r := 0; r < rows; r++ {
				for c := 0; c < n; c++ {
					ref[r*n+c] = silu64(float64(gu[r*2*n+c])) * float64(gu[r*2*n+n+c])
				}
			}
			e := compare(t, "swiglu_packed", down(t, act, out, rows*n), ref, tol(act))
			report(t, act, fmt.Sprintf("swiglu_packed %dx%d", rows, n), e)
		}
	}
}

// TestRoPEQKVWrite: the stacked q, k and v of each token taken apart: q
// rotated into its buffer, k rotated and v into random cache slots; the
// other slots keep what they held.
func TestRoPEQKVWrite(t *testing.T) {
	const bs, maxPos = 16, 4096
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, hs := range [][3]int{{32, 8, 128}, {4, 4, 64}, {5, 1, 80}} {
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
					must(t, k.RoPEQKVWrite(nil, pq, pkc, pvc, up(t, act, qkv), upI32(t, pos), upI32(t, slots), ptab,
						rows, heads, kvHeads, hd, il))
					qref, kref, vref := refRoPEQKV(f64(qkv), pos, slots, tab, kc0, vc0, heads, kvHeads, hd, il)
					op := fmt.Sprintf("rope_qkv_write interleaved=%v", il)
					e1 := compare(t, op+" q", down(t, act, pq, rows*qw), qref, tol(act))
					e2 := compare(t, op+" k", down(t, act, pkc, nslot*width), kref, tol(act))
					e3 := compare(t, op+" v", down(t, act, pvc, nslot*width), vref, tol(act))
					report(t, act, fmt.Sprintf("%s rows=%d heads=%d/%d hd=%d", op, rows, heads, kvHeads, hd), max(e1, e2, e3))
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
