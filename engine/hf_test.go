package engine_test

import (
	"math"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/hffixture"
	"kiln/model"
)

// relErrInf is ‖got−want‖∞ / ‖want‖∞.
func relErrInf(got, want []float32) float64 {
	var diff, norm float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		diff = math.Max(diff, d)
		norm = math.Max(norm, math.Abs(float64(want[i])))
	}
	return diff / norm
}

// TestHFTransformersFixtures compares kiln's logits at every prompt position
// (‖out−ref‖∞/‖ref‖∞ ≤ 1e-4) and greedy continuation (identical ids) with
// transformers', for every architecture variant, on the fast and reference
// kernels, and with the prompt processed whole and in small chunks (which
// exercises attention over a partly cached sequence). The reference runs
// stack the Q/K/V and gate/up projections; the fast runs keep them apart.
func TestHFTransformersFixtures(t *testing.T) {
	for dir, f := range hffixture.Load(t, "../testdata/hf") {
		for _, ref := range []bool{false, true} {
			for _, buckets := range [][]int{nil, {1, 2, 4, 8}} {
				name := f.Variant
				if ref {
					name += "/reference"
				}
				if buckets != nil {
					name += "/chunked"
				}
				t.Run(name, func(t *testing.T) {
					m, err := model.Load(dir)
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					e, err := engine.New(m, &cpu.Backend{Reference: ref, StackProjections: ref}, engine.Options{Buckets: buckets, Compile: compileVerify})
					if err != nil {
						t.Fatal(err)
					}
					defer e.Close()
					logits := f.Prefill(t, e)
					if got := relErrInf(logits, f.Logits); got > 1e-4 {
						t.Errorf("logits: ‖out−ref‖∞/‖ref‖∞ = %.3g > 1e-4", got)
					}
					f.CheckGreedy(t, e)
				})
			}
		}
	}
}
