package tune

import (
	"math"
	"slices"
)

// Rounds is how many times Race times each candidate.
const Rounds = 5

// MinGain is the least a candidate's median must gain on the default's
// for Race to keep it, beyond the separation of the timings: a race times
// a product alone, on operands it runs over again, and on the H100
// choices of 0.5–1.1% faster so (the cuBLASLt algorithms of 2048-token
// prefill products) made the prefill 2–4% slower end to end (docs/PERF.md,
// Tuning, session 19).
const MinGain = 0.02

// Result is what Race measured: each candidate's median time (+Inf for
// one that failed), the default's spread over the rounds, the failures,
// and the candidate kept (-1: none ran).
type Result struct {
	Median []float64
	Noise  float64
	Errs   []error
	Best   int
	times  [][]float64
}

// beats reports whether candidate i beat candidate j as Race requires of a
// candidate to replace the default: both ran, every timing of i but its
// slowest is below every timing of j, and i's median is below j's by
// MinGain.
func (r Result) beats(i, j int) bool {
	if i < 0 || j < 0 || i >= len(r.times) || j >= len(r.times) || len(r.times[i]) == 0 || len(r.times[j]) == 0 ||
		r.Errs[i] != nil || r.Errs[j] != nil {
		return false
	}
	ti := slices.Sorted(slices.Values(r.times[i]))
	if len(ti) > 2 {
		ti = ti[:len(ti)-1]
	}
	return ti[len(ti)-1] < slices.Min(r.times[j]) && r.Median[i] < (1-MinGain)*r.Median[j]
}

// Race times n candidates, candidate 0 being the default: Rounds rounds,
// each timing every candidate once in turn (time(i) returns one timing of
// candidate i), so that a drift of the machine's speed falls on all of them
// alike. A candidate's time is its median over the rounds; the noise is
// the spread of the default's times (largest less smallest). A candidate
// may replace the default only if every one of its timings but its slowest
// beats every one of the default's (by chance alone, with equal speeds, 1
// time in 42 for 5 rounds) and its median beats the default's by MinGain
// (which equal speeds seldom give as well), and of those the fastest by
// median is kept, so a tuned choice is never slower than the default
// beyond what the timings can tell. Its slowest timing is let go because a
// round can be slowed by what the race does not measure (the host late to
// launch a run, another GPU's thread): with every timing required, one such
// round kept cuBLASLt at 20.3 µs against the GEMV's 15.8 (noise 0.1 µs) for
// a TP=2 rank's down projection, and the step lost 2.4% (docs/PERF.md,
// Tuning, session 37). A candidate whose timing fails drops
// out (its error in Errs), and when the default fails the fastest of the
// others is kept.
func Race(n int, time func(i int) (float64, error)) Result {
	times := make([][]float64, n)
	r := Result{Median: make([]float64, n), Errs: make([]error, n), Best: -1, times: times}
	for range Rounds {
		for i := range n {
			if r.Errs[i] != nil {
				continue
			}
			t, err := time(i)
			if err != nil {
				r.Errs[i] = err
				continue
			}
			times[i] = append(times[i], t)
		}
	}
	ran := func(i int) bool { return r.Errs[i] == nil && len(times[i]) > 0 }
	for i := range n {
		r.Median[i] = math.Inf(1)
		if ran(i) {
			ts := slices.Clone(times[i])
			slices.Sort(ts)
			r.Median[i] = ts[len(ts)/2]
		}
	}
	if n > 0 && ran(0) {
		r.Noise = slices.Max(times[0]) - slices.Min(times[0])
		r.Best = 0
		for i := 1; i < n; i++ {
			if r.beats(i, 0) && r.Median[i] < r.Median[r.Best] {
				r.Best = i
			}
		}
		return r
	}
	for i := range n {
		if ran(i) && (r.Best < 0 || r.Median[i] < r.Median[r.Best]) {
			r.Best = i
		}
	}
	return r
}
