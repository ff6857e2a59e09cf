package cuda

import (
	"testing"

	"kiln/backend/cuda/kernels"
	"kiln/tune"
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

// TestKeepDefaultWay: a race of cuBLASLt, the two vector ways (the default
// first) and a tile split keeps the other way only when it beats the
// default way as the race requires against cuBLASLt, or when the default
// way did not beat cuBLASLt; other winners are kept as the race chose.
func TestKeepDefaultWay(t *testing.T) {
	for _, c := range []struct {
		name  string
		times [][]float64
		ways  int
		want  int
	}{
		{"other way within the default way's noise", [][]float64{{20, 20, 20, 20, 20}, {10, 11, 10, 10, 10}, {9.5, 10.5, 9.5, 9.5, 9.5}}, 2, 1},
		{"other way clearly faster", [][]float64{{20, 20, 20, 20, 20}, {10, 10.2, 10, 10, 10}, {8, 8.1, 8, 8, 8}}, 2, 2},
		{"default way did not beat cuBLASLt", [][]float64{{10, 10, 10, 10, 10}, {9.9, 10.5, 9.9, 9.9, 9.9}, {8, 8, 8, 8, 8}}, 2, 2},
		{"cuBLASLt kept", [][]float64{{5, 5, 5, 5, 5}, {6, 6, 6, 6, 6}, {7, 7, 7, 7, 7}}, 2, 0},
		{"default way kept", [][]float64{{20, 20, 20, 20, 20}, {8, 8, 8, 8, 8}, {9, 9, 9, 9, 9}}, 2, 1},
		{"one way only", [][]float64{{20, 20, 20, 20, 20}, {8, 9, 8, 8, 8}, {7.9, 7.9, 7.9, 7.9, 7.9}}, 1, 2},
	} {
		calls := make([]int, len(c.times))
		r := tune.Race(len(c.times), func(i int) (float64, error) {
			v := c.times[i][calls[i]%len(c.times[i])]
			calls[i]++
			return v, nil
		})
		if got := keepDefaultWay(r, c.ways); got != c.want {
			t.Errorf("%s: kept %d, want %d (race's best %d, medians %v)", c.name, got, c.want, r.Best, r.Median)
		}
	}
}
