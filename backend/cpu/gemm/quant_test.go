package gemm

import (
	"math"
	"slices"
	"testing"

	"kiln/tensor"
)

// quantBound bounds how far rounding x to bits (8 or 16) in blocks of bs
// (quantize) can move x·w: each x value moves by at most stepFraction of
// its block's step amax/top (top 127 or 32767), so the product by at most
// Σ_k |w_k|·amax(k's block)·stepFraction/top.
func quantBound(x, w []float32, bs, bits int) float64 {
	top := float64(int(1)<<(bits-1) - 1)
	var b float64
	for k0 := 0; k0 < len(x); k0 += bs {
		var amax, wsum float64
		for k := k0; k < k0+bs; k++ {
			amax = math.Max(amax, math.Abs(float64(x[k])))
			wsum += math.Abs(float64(w[k]))
		}
		b += wsum * amax * stepFraction(bits) / top
	}
	return b
}

// stepFraction is how far, in steps, quantize may move a value: half a
// step, plus the float32 rounding of the step, of its inverse and of the
// scaled value (each 2⁻²⁴ relative), which for values of up to top steps
// is up to 3·2⁻²⁴·top more steps (0.006 at 16 bits).
func stepFraction(bits int) float64 {
	return 0.5 + 3*math.Exp2(-24)*float64(int(1)<<(bits-1))
}

// TestQuantize: every value of a block is within half a step of q·d, the
// sums are q's, zero, NaN and Inf blocks give zero, NaN and NaN scales, and
// the assembly gives the Go code's values exactly.
func TestQuantize(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ bs, bits int }{{32, 16}, {256, 8}, {32, 8}} {
		bs, bits := c.bs, c.bits
		T, K := 3, 2*bs
		x := randVec(r, T*K)
		for i := range x {
			x[i] *= float32(math.Pow(10, float64(r.IntN(7)-3)))
		}
		clear(x[K : K+bs]) // a zero block
		var a, g qx
		a.quantize(x, T, K, bs, bits)
		SetPure(true)
		g.quantize(x, T, K, bs, bits)
		SetPure(false)
		if !slices.Equal(a.q, g.q) || !slices.Equal(a.q16, g.q16) || !slices.Equal(a.d, g.d) || !slices.Equal(a.sums, g.sums) || !slices.Equal(a.sums16, g.sums16) {
			t.Fatalf("bs %d, %d bits: the assembly's quantization differs from Go's", bs, bits)
		}
		for i, v := range x {
			d, q := a.d[i/bs], 0
			if bits == 16 {
				q = int(a.q16[i])
			} else {
				q = int(a.q[i])
			}
			if got := float64(q) * float64(d); math.Abs(got-float64(v)) > stepFraction(bits)*float64(d) {
				t.Fatalf("bs %d, %d bits: x[%d] = %v quantized to %d·%v", bs, bits, i, v, q, d)
			}
		}
		if a.d[K/bs] != 0 {
			t.Errorf("bs %d: a zero block's scale is %v", bs, a.d[K/bs])
		}
		for i := range a.sums16 { // 8 bits only
			var s int16
			for _, q := range a.q[16*i : 16*i+16] {
				s += int16(q)
			}
			if a.sums16[i] != s {
				t.Fatalf("bs %d: sums16[%d] = %d, want %d", bs, i, a.sums16[i], s)
			}
		}
		for i := range a.sums {
			var s int16
			for _, q := range a.q[32*i : 32*i+32] {
				s += int16(q)
			}
			if a.sums[i] != s {
				t.Fatalf("bs %d: sums[%d] = %d, want %d", bs, i, a.sums[i], s)
			}
		}
		x[0], x[bs] = float32(math.NaN()), float32(math.Inf(-1))
		for _, pure := range []bool{false, true} {
			SetPure(pure)
			a.quantize(x, T, K, bs, bits)
			SetPure(false)
			if !math.IsNaN(float64(a.d[0])) || !math.IsNaN(float64(a.d[1])) {
				t.Errorf("bs %d: NaN and Inf blocks have scales %v, %v", bs, a.d[0], a.d[1])
			}
		}
	}
}

// TestQuantRows checks the assembly row kernels against the Go ones (the
// same integer products: they differ only in the order of the float32
// sums) on fresh random blocks, odd and even block counts, 1 to 9 rows.
func TestQuantRows(t *testing.T) {
	if !haveSIMD {
		t.Skip("no assembly kernels on this CPU")
	}
	r := newRand(t)
	for _, d := range []tensor.DType{tensor.Q8_0, tensor.Q4_0, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K} {
		bs := xBlock(d)
		for _, nb := range []int{1, 2, 3, 8, 11} {
			for _, N := range []int{1, 4, 9} {
				K := nb * bs
				w := randBlocks(r, d, N, K)
				x := randVec(r, K)
				var a qx
				a.quantize(x, 1, K, bs, xBits(d))
				rb := w.rowBytes()
				got, want := make([]float32, N+1), make([]float32, N)
				got[N] = 42
				rowsSIMD(d, w.Data, rb, &a, got[:N])
				rowsGo(d, w.Data, rb, &a, want)
				if got[N] != 42 {
					t.Fatalf("%v: wrote past the rows", d)
				}
				row := make([]float32, K)
				for n := range want {
					if err := tensor.ToF32(d, w.Data[n*rb:(n+1)*rb], row); err != nil {
						t.Fatal(err)
					}
					var mag float64
					for k := range row {
						mag += math.Abs(float64(row[k]) * float64(x[k]))
					}
					if diff := math.Abs(float64(got[n] - want[n])); math.IsNaN(float64(got[n])) || diff > relTol*mag+absTol {
						t.Fatalf("%v K=%d N=%d: row %d = %v, Go kernel %v", d, K, N, n, got[n], want[n])
					}
				}
			}
		}
	}
}
