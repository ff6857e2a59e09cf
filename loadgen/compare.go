package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Change is one figure of two runs compared.
type Change struct {
	Name  string  `json:"name"`
	Base  float64 `json:"base"`
	New   float64 `json:"new"`
	Delta float64 `json:"relative_change"` // (new-base)/base
	// Low and High bound the bootstrap 95% interval of the relative change.
	Low        float64 `json:"ci95_low"`
	High       float64 `json:"ci95_high"`
	HigherIsOK bool    `json:"higher_is_better"`
	Regression bool    `json:"regression"`
	// Runs counts the runs of each side compared (CompareRuns); Gated says
	// a regression could be called (two or more runs a side: the interval
	// is then that of the runs' means, BetweenRunSD their pooled standard
	// deviation relative to the base).
	Runs         [2]int  `json:"runs,omitempty"`
	Gated        bool    `json:"gated"`
	BetweenRunSD float64 `json:"between_run_sd,omitempty"`
}

// CompareRequests compares two load tests' requests figure by figure. Each
// figure's 95% confidence interval of the relative change comes from a
// bootstrap (1,000 resamples of each run's requests); a change is a
// regression when the whole interval lies on the bad side of tolerance
// (e.g. 0.05 for 5%).
func CompareRequests(base, next []Result, tolerance float64) []Change {
	base, next = measured(base), measured(next)
	rng := rand.New(rand.NewPCG(7, 7))
	var out []Change
	for _, fg := range requestFigures() {
		out = append(out, compareStat(fg.name, fg.higher, base, next, fg.f, rng, tolerance))
	}
	return out
}

// requestFigure is a figure of a run's requests, and whether higher is
// better.
type requestFigure struct {
	name   string
	higher bool
	f      func([]Result) float64
}

// requestFigures are the figures compared: TTFT, ITL and end-to-end
// latency's median and 99th percentile, and output throughput.
func requestFigures() []requestFigure {
	ttft := func(r Result) []time.Duration { return []time.Duration{r.TTFT} }
	itl := func(r Result) []time.Duration { return r.ITL }
	e2e := func(r Result) []time.Duration { return []time.Duration{r.E2E} }
	p50 := func(s Stats) float64 { return s.P50 }
	p99 := func(s Stats) float64 { return s.P99 }
	return []requestFigure{
		{"p50_ttft_ms", false, latency(ttft, p50)},
		{"p99_ttft_ms", false, latency(ttft, p99)},
		{"p50_itl_ms", false, latency(itl, p50)},
		{"p99_itl_ms", false, latency(itl, p99)},
		{"p50_e2e_ms", false, latency(e2e, p50)},
		{"p99_e2e_ms", false, latency(e2e, p99)},
		{"output_tokens_per_s", true, func(rs []Result) float64 { return Summarize(rs, SLO{}, Cost{}).OutputTokensPerS }},
	}
}

// measured drops warm-up and failed requests.
func measured(rs []Result) []Result {
	return slices.DeleteFunc(slices.Clone(rs), func(r Result) bool { return r.Warmup || r.Error != "" })
}

// latency is a statistic (pick, of statsOf) of the durations get takes from
// each request.
func latency(get func(Result) []time.Duration, pick func(Stats) float64) func([]Result) float64 {
	return func(rs []Result) float64 {
		var ds []time.Duration
		for _, r := range rs {
			ds = append(ds, get(r)...)
		}
		return pick(statsOf(ds))
	}
}

func compareStat[T any](name string, higher bool, base, next []T, f func([]T) float64, rng *rand.Rand, tol float64) Change {
	c := Change{Name: name, Base: f(base), New: f(next), HigherIsOK: higher}
	c.Delta = relChange(c.Base, c.New)
	if len(base) < 2 || len(next) < 2 {
		c.Low, c.High = math.NaN(), math.NaN()
		return c
	}
	resample := func(xs []T) []T {
		out := make([]T, len(xs))
		for i := range out {
			out[i] = xs[rng.IntN(len(xs))]
		}
		return out
	}
	var deltas []float64
	for range 1000 {
		b, n := f(resample(base)), f(resample(next))
		deltas = append(deltas, relChange(b, n))
	}
	slices.Sort(deltas)
	c.Low, c.High = percentile(deltas, 2.5), percentile(deltas, 97.5)
	if higher {
		c.Regression = c.High < -tol
	} else {
		c.Regression = c.Low > tol
	}
	return c
}

// CompareSamples compares two sets of repeated measurements of one figure
// (e.g. tokens/s of each repetition of `kiln bench model`) the same way.
func CompareSamples(name string, higher bool, base, next []float64, tolerance float64) Change {
	return compareStat(name, higher, base, next, mean, rand.New(rand.NewPCG(7, 7)), tolerance)
}

// relChange is next's change relative to base; from a base of 0, ±Inf
// (or 0 when next is 0 too), never NaN, so that a gate sees it.
func relChange(base, next float64) float64 {
	if base == 0 {
		if next == 0 {
			return 0
		}
		return math.Copysign(math.Inf(1), next)
	}
	return (next - base) / base
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// CompareRuns compares repeated runs of one workload (base and next hold
// each run's requests) figure by figure, so that run-to-run noise — which
// the requests of one run do not show — does not read as a regression.
// Each run gives one value of each figure; the change is that of the means
// over the runs, and a regression needs it beyond tolerance plus t·s·√(1/kb +
// 1/kn) in the bad direction, s the pooled standard deviation of the runs'
// values (relative to the base mean) and t Student's 97.5% quantile for the
// pooled degrees of freedom. With one run a side the between-run noise is
// unknown: the changes are reported (the bootstrap intervals within the
// runs), and none is a regression (Gated false).
func CompareRuns(base, next [][]Result, tolerance float64) []Change {
	if len(base) < 2 || len(next) < 2 {
		var b, n []Result
		for _, r := range base {
			b = append(b, r...)
		}
		for _, r := range next {
			n = append(n, r...)
		}
		out := CompareRequests(b, n, tolerance)
		for i := range out {
			out[i].Regression = false
		}
		return out
	}
	var out []Change
	for _, fg := range requestFigures() {
		var bv, nv []float64
		for _, r := range base {
			bv = append(bv, fg.f(measured(r)))
		}
		for _, r := range next {
			nv = append(nv, fg.f(measured(r)))
		}
		out = append(out, compareRunValues(fg.name, fg.higher, bv, nv, tolerance))
	}
	return out
}

// CompareRunSamples is CompareRuns for one figure given as each run's
// value (e.g. the mean tokens/s of each kiln bench model run).
func CompareRunSamples(name string, higher bool, base, next []float64, tolerance float64) Change {
	return compareRunValues(name, higher, base, next, tolerance)
}

func compareRunValues(name string, higher bool, b, n []float64, tol float64) Change {
	ss := func(xs []float64, m float64) float64 {
		var s float64
		for _, x := range xs {
			s += (x - m) * (x - m)
		}
		return s
	}
	mb, mn := mean(b), mean(n)
	c := Change{Name: name, Base: mb, New: mn, HigherIsOK: higher, Runs: [2]int{len(b), len(n)}, Gated: true}
	c.Delta = relChange(mb, mn)
	if mb == 0 { // no relative spread: a change from nothing is all there is
		c.Low, c.High = c.Delta, c.Delta
		c.Regression = higher && c.Delta < 0 || !higher && c.Delta > 0
		return c
	}
	dof := len(b) + len(n) - 2
	s := math.Sqrt((ss(b, mb)+ss(n, mn))/float64(dof)) / math.Abs(mb)
	c.BetweenRunSD = s
	half := studentT975(dof) * s * math.Sqrt(1/float64(len(b))+1/float64(len(n)))
	c.Low, c.High = c.Delta-half, c.Delta+half
	if higher {
		c.Regression = c.High < -tol
	} else {
		c.Regression = c.Low > tol
	}
	return c
}

// studentT975 is Student's t distribution's 97.5% quantile for dof degrees
// of freedom (a table to 30, then the normal's 1.96).
func studentT975(dof int) float64 {
	t := [...]float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if dof < 1 {
		return math.Inf(1)
	}
	if dof < len(t) {
		return t[dof]
	}
	return 1.96
}
