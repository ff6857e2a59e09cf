package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// CorruptCandidates makes verify perturb the results of the candidates f
// names (corruptCandidate), until the returned function undoes it; for
// the GPU tests of package cuda_test.
func CorruptCandidates(f func(name string) bool) (undo func()) {
	corruptCandidate = f
	return func() { corruptCandidate = nil }
}

// TestRelErr: verify's measure of a candidate's error, against values
// worked out by hand.
func TestRelErr(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		ref, got []float32
		want     float64
	}{
		{[]float32{3, 4}, []float32{3, 4}, 0},
		{[]float32{3, 4}, []float32{3, 5}, 0.2}, // ‖(0,1)‖/‖(3,4)‖
		{[]float32{3, 4}, []float32{0, 0}, 1},   // nothing computed
		{[]float32{0, 0}, []float32{0, 0}, 0},   // zero against zero
		{[]float32{0, 0}, []float32{3, 4}, 5},   // ‖got‖ against zeros
		{[]float32{1, 2}, []float32{1, float32(math.NaN())}, inf},
		{[]float32{1, 2}, []float32{float32(math.Inf(-1)), 2}, inf},
		{[]float32{0, 0}, []float32{float32(math.NaN()), 0}, inf},
		{[]float32{1, 2}, []float32{1}, inf}, // a short result
	} {
		if got := relErr(c.ref, c.got); math.Abs(got-c.want) > 1e-12 && got != c.want {
			t.Errorf("relErr(%v, %v) = %v, want %v", c.ref, c.got, got, c.want)
		}
	}
	if finite([]float32{1, float32(math.NaN())}) || finite([]float32{float32(math.Inf(1))}) || !finite([]float32{0, -1e30}) {
		t.Error("finite is wrong")
	}
}

// TestFloats: device bytes of each dtype widen to the values they hold,
// randomBytes' values read back within [-1, 1), and bytes that are not
// whole elements, or of no dtype, are refused.
func TestFloats(t *testing.T) {
	vals := []float32{1.5, -2, 0, 0.25}
	for _, dt := range []cu.DType{cu.F32, cu.F16, cu.BF16, cu.F8E4M3} {
		td, _ := tensorDType(dt)
		b, err := tensor.EncodeF32(td, vals)
		if err != nil {
			t.Fatal(err)
		}
		got, err := floats(dt, b)
		if err != nil || relErr(vals, got) != 0 {
			t.Errorf("%v: %v (%v), want %v", dt, got, err, vals)
		}
		r, err := randomBytes(dt, 1000, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		rv, err := floats(dt, r)
		if err != nil || len(rv) != 1000 {
			t.Fatalf("%v: %d random values (%v)", dt, len(rv), err)
		}
		var sum float64
		for _, v := range rv {
			// Rounding may carry a value just under 1 to 1.
			if !(v >= -1 && v <= 1) {
				t.Fatalf("%v: random value %v", dt, v)
			}
			sum += float64(v * v)
		}
		if sum < 1000.0/4 { // uniform in [-1, 1): a mean square of 1/3
			t.Errorf("%v: random values' mean square %.3g", dt, sum/1000)
		}
	}
	// NaN in a bf16 result reads as NaN, and fails the comparison.
	nan, err := floats(cu.BF16, []byte{0xc0, 0x7f, 0x80, 0x3f})
	if err != nil || relErr([]float32{1, 1}, nan) != math.Inf(1) {
		t.Errorf("bf16 NaN, 1: %v (%v)", nan, err)
	}
	if _, err := floats(cu.BF16, make([]byte, 3)); err == nil {
		t.Error("3 bytes of bf16 accepted")
	}
	if _, err := floats(cu.DType(7), make([]byte, 4)); err == nil {
		t.Error("a dtype that is none accepted")
	}
}
