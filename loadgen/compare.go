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
}

// CompareRequests compares two load tests' requests figure by figure. Each
// figure's 95% confidence interval of the relative change comes from a
// bootstrap (1,000 resamples of each run's requests); a change is a
// regression when the whole interval lies on the bad side of tolerance
// (e.g. 0.05 for 5%).
func CompareRequests(base, next []Result, tolerance float64) []Change {
	base, next = measured(base), measured(next)
	ttft := func(r Result) []time.Duration { return []time.Duration{r.TTFT} }
	itl := func(r Result) []time.Duration { return r.ITL }
	e2e := func(r Result) []time.Duration { return []time.Duration{r.E2E} }
	p50 := func(s Stats) float64 { return s.P50 }
	p99 := func(s Stats) float64 { return s.P99 }
	figures := []struct {
		name   string
		higher bool
		f      func([]Result) float64
	}{
		{"p50_ttft_ms", false, latency(ttft, p50)},
		{"p99_ttft_ms", false, latency(ttft, p99)},
		{"p50_itl_ms", false, latency(itl, p50)},
		{"p99_itl_ms", false, latency(itl, p99)},
		{"p50_e2e_ms", false, latency(e2e, p50)},
		{"p99_e2e_ms", false, latency(e2e, p99)},
		{"output_tokens_per_s", true, func(rs []Result) float64 { return Summarize(rs, SLO{}, Cost{}).OutputTokensPerS }},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var out []Change
	for _, fg := range figures {
		out = append(out, compareStat(fg.name, fg.higher, base, next, fg.f, rng, tolerance))
	}
	return out
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
	c.Delta = (c.New - c.Base) / c.Base
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
		deltas = append(deltas, (n-b)/b)
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
	mean := func(xs []float64) float64 {
		var s float64
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	return compareStat(name, higher, base, next, mean, rand.New(rand.NewPCG(7, 7)), tolerance)
}
