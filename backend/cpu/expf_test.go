package cpu

import (
	"math"
	"testing"
)

// TestExpf compares expf with math.Exp over the softmax range, densely near
// zero and at the ends; relative error at most 2e-7 (a couple of ulps).
func TestExpf(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 2_000_000; i++ {
		x := -87.0 * float64(i) / 2_000_000
		got := float64(expf(float32(x)))
		want := math.Exp(float64(float32(x)))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 2e-7 {
		t.Errorf("worst relative error %g > 2e-7", worst)
	}
	if expf(-100) != 0 || expf(0) != 1 || !math.IsInf(float64(expf(100)), 1) {
		t.Errorf("expf(-100)=%g expf(0)=%g expf(100)=%g", expf(-100), expf(0), expf(100))
	}
	if got := expf(5); math.Abs(float64(got)-math.Exp(5))/math.Exp(5) > 2e-7 {
		t.Errorf("expf(5) = %g", got)
	}
}
