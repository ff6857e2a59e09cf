package kernels

import (
	"math"
	"testing"

	"kiln/tensor"
)

// TestDequantize widens fresh random blocks of every format of
// DequantFormats (tensor.Quantize of normal values with rows of magnitudes
// 1/8 to 8, 64 blocks of 256 values and a tail of a whole block) and checks
// every value bit for bit against tensor's reference decoder rounded to the
// activation dtype, for each activation dtype; then the inputs it refuses.
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
			must(t, err)
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
			{"q4_1", k.Dequantize(nil, p, p, tensor.Q4_1, 32)},
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
