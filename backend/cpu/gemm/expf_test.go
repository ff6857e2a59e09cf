package gemm

import (
	"math"
	"testing"
)

// TestExpf compares Expf with math.Exp over the softmax range, densely near
// zero and at the ends; relative error at most 2e-7 (a couple of ulps).
func TestExpf(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 2_000_000; i++ {
		x := -87.0 * float64(i) / 2_000_000
		got := float64(Expf(float32(x)))
		want := math.Exp(float64(float32(x)))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 2e-7 {
		t.Errorf("worst relative error %g > 2e-7", worst)
	}
	if Expf(-100) != 0 || Expf(0) != 1 || !math.IsInf(float64(Expf(100)), 1) {
		t.Errorf("Expf(-100)=%g Expf(0)=%g Expf(100)=%g", Expf(-100), Expf(0), Expf(100))
	}
	if got := Expf(5); math.Abs(float64(got)-math.Exp(5))/math.Exp(5) > 2e-7 {
		t.Errorf("Expf(5) = %g", got)
	}
}
