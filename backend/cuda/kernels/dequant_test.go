package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// TestDequantize widens fresh random blocks of every format of
// DequantFormats (64 blocks of 256 values and a tail of a whole block:
// tensor.Quantize of normal values with rows of magnitudes 1/8 to 8 where
// tensor quantizes the format, else random bytes with finite random f16
// scales) and checks every value bit for bit against tensor's reference
// decoder rounded to the activation dtype, for each activation dtype;
// then the inputs it refuses.
func TestDequantize(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, f := range DequantFormats {
			n := 64*256 + f.BlockSize()
			x := randn(rng, n, 1)
			for i := range x {
				x[i] *= float32(math.Ldexp(1, (i/256)%7-3))
			}
			blocks, err := tensor.Quantize(f, x)
			if err != nil {
				blocks = randomBlocks(t, rng, f, n)
			}
			want := make([]float32, n)
			must(t, tensor.ToF32(f, blocks, want))
			roundTo(act, want)
			pw := alloc(t, len(blocks))
			must(t, gpu(t).Upload(pw, blocks))
			out := outBuf(t, act, n+64)
			must(t, k.Dequantize(nil, out, pw, f, n))
			got := down(t, act, out, n+64)
			bad := 0
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && bad < 5 {
					t.Errorf("%v %v: value %d = %v, want %v", act, f, i, got[i], want[i])
					bad++
				}
			}
			for i := n; i < n+64; i++ {
				if !math.IsNaN(float64(got[i])) {
					t.Fatalf("%v %v: value %d past the end written", act, f, i)
				}
			}
			t.Logf("%v %v: %d values bit for bit", act, f, n)
		}
		p := alloc(t, 1<<12)
		for _, c := range []struct {
			what string
			err  error
		}{
			{"f16", k.Dequantize(nil, p, p, tensor.F16, 32)},
			{"half a block", k.Dequantize(nil, p, p, tensor.Q4_K, 128)},
			{"out misaligned", k.Dequantize(nil, p+8, p, tensor.Q8_0, 32)},
			{"no values", k.Dequantize(nil, p, p, tensor.Q8_0, 0)},
		} {
			if c.err == nil {
				t.Errorf("%v %s: err %v, want a refusal", act, c.what, c.err)
			}
		}
	}
}

// blockScales are the byte offsets of the f16 scales in a block of the
// formats tensor.Quantize does not make (ggml's block layouts).
var blockScales = map[tensor.DType][]int{
	tensor.Q4_1: {0, 2}, tensor.Q5_0: {0}, tensor.Q5_1: {0, 2}, tensor.IQ4_NL: {0}, tensor.Q2_K: {80, 82}, tensor.Q3_K: {108},
}

// randomBlocks is n values' worth of random blocks of f whose f16 scales
// are finite: normal values of magnitudes 1/64 to 1 (NaN and infinity
// propagate differently on the device and the host).
func randomBlocks(t *testing.T, rng *rand.Rand, f tensor.DType, n int) []byte {
	t.Helper()
	offs, ok := blockScales[f]
	if !ok {
		t.Fatalf("no random blocks of %v", f)
	}
	nb, err := f.Bytes(int64(n))
	must(t, err)
	b := make([]byte, nb)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	bb := f.BlockBytes()
	for at := 0; at < len(b); at += bb {
		for _, o := range offs {
			h := tensor.F32ToF16(float32(rng.NormFloat64() * math.Ldexp(1, -rng.IntN(7))))
			b[at+o], b[at+o+1] = byte(h), byte(h>>8)
		}
	}
	return b
}

// TestDequantizeExperts widens a table of experts' matrices in one launch
// (DequantizeExperts, as a mixture's step does), for every format of
// DequantFormats: the matrices of the experts a step routed rows to bit for
// bit as Dequantize widens each, those of the experts with no entry (and
// every matrix's tail past its values) left as they were; then without
// counts (a shared expert), every matrix widened.
func TestDequantizeExperts(t *testing.T) {
	d := gpu(t)
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, f := range DequantFormats {
			const experts, kinds = 5, 2 // two kinds of matrix in one table, as gate and up could be
			n := 64 * 256               // two blocks of threads a matrix
			count := []int32{2, 0, 1, 0, 7}
			var srcs, dsts []uint64
			var want [][]float32
			for range kinds * experts {
				x := randn(rng, n, 1)
				blocks, err := tensor.Quantize(f, x)
				if err != nil {
					blocks = randomBlocks(t, rng, f, n)
				}
				w := make([]float32, n)
				must(t, tensor.ToF32(f, blocks, w))
				want = append(want, roundTo(act, w))
				pw := alloc(t, len(blocks))
				must(t, d.Upload(pw, blocks))
				srcs = append(srcs, uint64(pw))
				dsts = append(dsts, uint64(outBuf(t, act, n+64)))
			}
			table := func(v []uint64) cu.Ptr {
				p := alloc(t, 8*len(v))
				must(t, d.Upload(p, cu.AsBytes(v)))
				return p
			}
			tab := ExpertTable{Format: f, Src: table(srcs), Dst: table(dsts), Matrices: kinds * experts, Experts: experts, N: n, Count: upI32(t, count)}
			must(t, k.DequantizeExperts(nil, tab))
			check := func(routed bool) {
				for j, p := range dsts {
					got := down(t, act, cu.Ptr(p), n+64)
					widened := !routed || count[j%experts] > 0
					for i, g := range got {
						switch {
						case i >= n || !widened:
							if !math.IsNaN(float64(g)) {
								t.Fatalf("%v %v routed=%v: matrix %d (expert %d, %d entries) value %d written", act, f, routed, j, j%experts, count[j%experts], i)
							}
						case math.Float32bits(g) != math.Float32bits(want[j][i]):
							t.Fatalf("%v %v routed=%v: matrix %d value %d = %v, want %v", act, f, routed, j, i, g, want[j][i])
						}
					}
				}
			}
			check(true)
			for _, p := range dsts {
				poison(t, act, cu.Ptr(p), n+64)
			}
			tab.Count = 0
			must(t, k.DequantizeExperts(nil, tab))
			check(false)
		}
		p := alloc(t, 1<<12)
		for _, c := range []struct {
			what string
			tab  ExpertTable
		}{
			{"f16", ExpertTable{Format: tensor.F16, Src: p, Dst: p, Matrices: 1, Experts: 1, N: 32}},
			{"half a block", ExpertTable{Format: tensor.Q4_K, Src: p, Dst: p, Matrices: 1, Experts: 1, N: 128}},
			{"no matrices", ExpertTable{Format: tensor.Q8_0, Src: p, Dst: p, Experts: 1, N: 32}},
			{"no experts", ExpertTable{Format: tensor.Q8_0, Src: p, Dst: p, Matrices: 1, N: 32}},
			{"no tables", ExpertTable{Format: tensor.Q8_0, Matrices: 1, Experts: 1, N: 32}},
		} {
			if err := k.DequantizeExperts(nil, c.tab); err == nil {
				t.Errorf("%v %s: no refusal", act, c.what)
			}
		}
	}
}
