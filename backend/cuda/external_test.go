package cuda_test

import (
	"math"
	"strings"
	"testing"

	"kiln/backend/cpu"
	"kiln/bench"
	"kiln/tensor"
)

// TestExternalKernels (GPU): the external kernels of
// testdata/external/verify join the decode products' races. Measured
// (Products ""), the wrong one fails its check against cuBLASLt's result
// in every race it enters and is never timed or kept, and the logits stay
// within 1e-4 of the CPU's. Forced wherever one takes a product (Products
// "external"), the good f32 kernel computes the batched steps' products
// and the logits match the CPU's within 1e-4 (f32), as
// TestBatchedMatchesCPU's; in bf16 the bf16 kernels (into bf16 and into
// f32 for the logits) stay within 2e-2 of cuBLASLt's run.
func TestExternalKernels(t *testing.T) {
	shape := bench.Shape{Name: "hd64", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 300, Context: 512}
	for _, c := range []struct {
		dtype, products string
		wdt             tensor.DType
		want            []string // names that must run (Stats.Choices' kept)
	}{
		{"f32", "", tensor.F32, nil},
		{"f32", "external", tensor.F32, []string{"external gemv_f32 sha256:"}},
		{"bf16", "external", tensor.BF16, []string{"external gemv_bf16 sha256:", "external gemv_bf16_f32 sha256:"}},
	} {
		t.Run(c.dtype+"/"+c.products, func(t *testing.T) {
			dir := randomModel(t, shape, c.wdt, 11)
			b := backendOf(t, c.dtype)
			b.ExternalDir = "testdata/external/verify"
			b.Products = c.products
			got := batchedSteps(t, dir, b, shape.Vocab)
			wrong, kept := 0, map[string]bool{}
			for _, line := range b.Stats().Choices {
				if strings.Contains(line, "external wrong_f32") {
					if !strings.Contains(line, "external wrong_f32 sha256:") || !strings.Contains(line, "wrong result") {
						t.Errorf("the wrong kernel was not rejected by its check: %s", line)
					}
					wrong++
				}
				for _, w := range c.want {
					if strings.Contains(line, ": "+w) && strings.HasSuffix(line, " kept") {
						kept[w] = true
					}
				}
			}
			if c.dtype == "f32" && wrong == 0 {
				t.Errorf("the wrong kernel entered no race: %q", b.Stats().Choices)
			}
			for _, w := range c.want {
				if !kept[w] {
					t.Errorf("%s kept in no race: %q", w, b.Stats().Choices)
				}
			}
			tol := 1e-4
			ref := batchedSteps(t, dir, &cpu.Backend{}, shape.Vocab)
			if c.dtype == "bf16" {
				lt := backendOf(t, c.dtype)
				lt.Products = "cublaslt"
				ref, tol = batchedSteps(t, dir, lt, shape.Vocab), 2e-2
			}
			for i := range ref {
				if e := relL2(got[i], ref[i]); e > tol || math.IsNaN(e) {
					t.Errorf("step %d: ‖Δ‖₂/‖ref‖₂ = %.3g > %g", i, e, tol)
				}
			}
		})
	}
}
