package cuda

import (
	"slices"
	"testing"

	"kiln/backend/cuda/kernels"
)

// TestTuneChoiceNames: the cache's names of GEMV-or-cuBLASLt choices read
// back to the same choice, malformed ones are refused; decode plans that
// differ get different names.
func TestTuneChoiceNames(t *testing.T) {
	for _, c := range []gemvChoice{{}, {use: true}, {use: true, split: 1}, {use: true, split: 8},
		{use: true, way: kernels.WayCUDACores}, {use: true, way: kernels.WayTensorCores}} {
		name := c.name()
		got, ok := parseGEMVChoice(name)
		if !ok || got != c {
			t.Errorf("%q read back as %+v, %v (want %+v)", name, got, ok, c)
		}
	}
	for _, bad := range []string{"", "GEMV", "gemv, K split 0", "gemv, K split -2", "gemv, K split x", "cublaslt ", "gemv, on "} {
		if _, ok := parseGEMVChoice(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
	plans := []kernels.DecodePlan{{Chunk: 64, MaxSplits: 4}, {Chunk: 64, MaxSplits: 8}, {Chunk: 64, MaxSplits: 4, MMA: true},
		{Chunk: 64, MaxSplits: 4, MMA: true, Stages: 2}, {MaxSplits: 4, Cluster: true}}
	for i, p := range plans {
		got, ok := cachedPlan(plans, planName(p))
		if !ok || got != p {
			t.Errorf("plan %d (%v): %q found %v, %v", i, p, planName(p), got, ok)
		}
	}
	if _, ok := cachedPlan(plans, "chunk 32, splits 4, cluster false, mma false, stages 0"); ok {
		t.Error("a plan not among the candidates was taken")
	}
}

// TestRacedWays: a product of one row races the CUDA cores' way alone;
// of more rows, every way the GEMV offers, in its order.
func TestRacedWays(t *testing.T) {
	both := []string{kernels.WayTensorCores, kernels.WayCUDACores}
	for _, c := range []struct {
		ways []string
		t    int
		want []string
	}{
		{both, 1, []string{kernels.WayCUDACores}},
		{[]string{kernels.WayCUDACores, kernels.WayTensorCores}, 1, []string{kernels.WayCUDACores}},
		{both, 2, both},
		{both, 8, both},
		{[]string{kernels.WayCUDACores}, 1, []string{kernels.WayCUDACores}},
		{[]string{kernels.WayTensorCores}, 1, []string{kernels.WayTensorCores}},
		{nil, 1, nil},
	} {
		if got := racedWays(c.ways, c.t); !slices.Equal(got, c.want) {
			t.Errorf("racedWays(%q, %d) = %q, want %q", c.ways, c.t, got, c.want)
		}
	}
}
