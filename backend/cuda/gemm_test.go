package cuda_test

import (
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
)

// TestGEMMReference checks the prefill benchmark's reference product: it
// picks one of cuBLASLt's candidate algorithms, says which, and measures a
// rate between 1 TFLOP/s and 5 PFLOP/s (no GPU's dense bf16 peak is above
// it; a measurement that missed the device's completion would be).
func TestGEMMReference(t *testing.T) {
	b := backendOf(t, "bf16")
	g, err := b.NewGEMM(cu.BF16, 2048)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if !strings.HasPrefix(g.Choice, "cuBLASLt algorithm ") {
		t.Errorf("choice %q", g.Choice)
	}
	rate, err := g.Rate()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("2048³ bf16: %.1f TFLOP/s; %s", rate/1e12, g.Choice)
	if !(rate > 1e12 && rate < 5e15) {
		t.Fatalf("rate %g FLOP/s", rate)
	}
}
