package loadgen

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// syntheticRun is 60 requests of a server whose speed this run is scale
// times nominal (times a lognormal factor of sd between runs: the noise
// one run's requests do not show), with request-to-request noise too.
func syntheticRun(rng *rand.Rand, scale, sd float64) []Result {
	run := scale * (1 + sd*rng.NormFloat64())
	start := time.Unix(0, 0)
	var rs []Result
	for range 60 {
		d := func(ms float64) time.Duration {
			return time.Duration(run * ms * (1 + 0.1*rng.NormFloat64()) * float64(time.Millisecond))
		}
		r := Result{Start: start, TTFT: d(40), InputTokens: 128, OutputTokens: 64}
		for range 63 {
			r.ITL = append(r.ITL, d(10))
		}
		r.E2E = r.TTFT
		for _, x := range r.ITL {
			r.E2E += x
		}
		rs = append(rs, r)
		start = start.Add(r.E2E / 4) // four streams: throughput follows speed
	}
	return rs
}

// TestCompareRunsNoise: repeated runs of one workload, each run off by 3%
// (one standard deviation) as a whole, never read as a regression (200
// comparisons of 5 runs against 5, every figure); a 20% slowdown reads as
// one in the medians and throughput, every time (the 99th percentiles of
// 60 requests move with a few of them). With k runs a side and a
// between-run deviation s, a change is caught beyond tolerance +
// t·s·√(2/k): at s = 5% and k = 4 that is about 13%, and 20% slowdowns
// were missed in some comparisons (at 3% and k = 4, in 4 of 800): hence
// five runs here, and s reported with every change. With one run a side
// nothing is called a regression.
func TestCompareRunsNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	runs := func(n int, scale float64) [][]Result {
		var rs [][]Result
		for range n {
			rs = append(rs, syntheticRun(rng, scale, 0.03))
		}
		return rs
	}
	false_, missed := 0, 0
	for range 200 {
		for _, c := range CompareRuns(runs(5, 1), runs(5, 1), 0.05) {
			if c.Regression {
				false_++
			}
			if !c.Gated || c.Runs != [2]int{5, 5} {
				t.Fatalf("%s: gated %v over %v runs", c.Name, c.Gated, c.Runs)
			}
		}
		for _, c := range CompareRuns(runs(5, 1), runs(5, 1.2), 0.05) {
			if c.Name == "p99_ttft_ms" || c.Name == "p99_itl_ms" || c.Name == "p99_e2e_ms" {
				continue // tails of 60 requests move with a few of them
			}
			if !c.Regression {
				missed++
			}
		}
	}
	if false_ > 0 || missed > 0 {
		t.Errorf("identical workloads: %d figures called regressions in 200 comparisons; a 20%% slowdown missed %d times", false_, missed)
	}
	for _, c := range CompareRuns(runs(1, 1), runs(1, 2), 0.05) {
		if c.Regression || c.Gated {
			t.Errorf("one run a side: %s called a regression (gated %v)", c.Name, c.Gated)
		}
	}
}

// TestCompareFromZero: a figure whose base mean is 0 (every base request
// failed, or one-token outputs with no inter-token gap) gives no NaN: a
// latency that grows from nothing is a regression, one that stays at
// nothing is not.
func TestCompareFromZero(t *testing.T) {
	for _, tc := range []struct {
		higher     bool
		next       []float64
		regression bool
	}{
		{false, []float64{3, 4}, true},
		{false, []float64{0, 0}, false},
		{true, []float64{5, 6}, false},
	} {
		c := CompareRunSamples("x", tc.higher, []float64{0, 0}, tc.next, 0.05)
		if math.IsNaN(c.Delta) || math.IsNaN(c.Low) || math.IsNaN(c.High) || c.Regression != tc.regression {
			t.Errorf("higher %v, 0 → %v: %+v; want regression %v and no NaN", tc.higher, tc.next, c, tc.regression)
		}
		s := CompareSamples("x", tc.higher, []float64{0, 0, 0}, tc.next, 0.05)
		if math.IsNaN(s.Low) || math.IsNaN(s.High) || s.Regression != tc.regression {
			t.Errorf("samples: higher %v, 0 → %v: %+v; want regression %v and no NaN", tc.higher, tc.next, s, tc.regression)
		}
	}
}

// TestPercentileInfinite: percentiles of values that include infinities
// (a change from a base of 0) are never NaN: the nearer end where one end
// of the interpolation is infinite, exact positions as they are.
func TestPercentileInfinite(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{[]float64{math.Inf(-1), 1, 2}, 0, math.Inf(-1)},
		{[]float64{math.Inf(-1), 1, 2}, 20, math.Inf(-1)},
		{[]float64{math.Inf(-1), 1, 2}, 40, 1},
		{[]float64{1, 2, math.Inf(1)}, 50, 2},
		{[]float64{1, 2, math.Inf(1)}, 80, math.Inf(1)},
		{[]float64{1, 2, 4}, 75, 3},
	} {
		if got := percentile(c.xs, c.p); got != c.want {
			t.Errorf("percentile(%v, %g) = %g, want %g", c.xs, c.p, got, c.want)
		}
	}
}
