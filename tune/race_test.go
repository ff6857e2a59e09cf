package tune

import (
	"errors"
	"testing"
)

// timings times candidate i by ts[i], one value a call in turn; a
// candidate without values fails.
func timings(ts map[int][]float64) func(int) (float64, error) {
	calls := map[int]int{}
	return func(i int) (float64, error) {
		if ts[i] == nil {
			return 0, errors.New("launch refused")
		}
		v := ts[i][calls[i]%len(ts[i])]
		calls[i]++
		return v, nil
	}
}

// TestRace: the default is kept unless every timing of a candidate but its
// slowest beats every timing of the default, and then the fastest such by
// median (not the fastest candidate when its timings overlap the
// default's); one slow round of a candidate does not keep the default, two
// do; failing candidates drop out, and
// a failing default leaves the fastest other; a candidate whose every
// timing beats the default's by less than MinGain is not kept.
func TestRace(t *testing.T) {
	// Five timings a candidate, one a round (Rounds).
	for _, c := range []struct {
		name  string
		times map[int][]float64
		best  int
		noise float64
	}{
		{"clear win", map[int][]float64{0: {10, 10.2, 10.1, 10, 10}, 1: {8, 8.1, 8, 8, 8}}, 1, 0.2},
		{"within the noise", map[int][]float64{0: {10, 11, 10.5, 10.5, 10.5}, 1: {9.8, 10.2, 10.1, 9.7, 9.7}}, 0, 1},
		{"one slow round", map[int][]float64{0: {10, 10.1, 10, 10, 10}, 1: {8, 30, 8, 8, 8}}, 1, 0.1},
		{"two slow rounds", map[int][]float64{0: {10, 10.1, 10, 10, 10}, 1: {8, 30, 8, 10.05, 8}}, 0, 0.1},
		{"overlapping ranges", map[int][]float64{0: {10, 12, 11, 11, 11}, 1: {9, 10.5, 9, 10.2, 9}}, 0, 2},
		{"two clear wins", map[int][]float64{0: {10, 10, 10, 10, 10}, 1: {9, 9.5, 9, 9, 9}, 2: {8, 9.9, 8.5, 8.5, 8.5}}, 2, 0},
		{"the fastest overlaps, a slower one clears", map[int][]float64{0: {10, 10, 10, 10, 10}, 1: {7, 10.5, 7, 10, 7}, 2: {9, 9, 9, 9, 9}}, 2, 0},
		{"default fastest", map[int][]float64{0: {5, 5, 5, 5, 5}, 1: {6, 6, 6, 6, 6}, 2: {7, 7, 7, 7, 7}}, 0, 0},
		{"a candidate fails", map[int][]float64{0: {10, 10, 10, 10, 10}, 2: {7, 7, 7, 7, 7}}, 2, 0},
		{"the default fails", map[int][]float64{1: {9, 9, 9, 9, 9}, 2: {7, 7.5, 7, 7, 7}}, 2, 0},
		{"all fail", map[int][]float64{}, -1, 0},
		{"separate but under MinGain", map[int][]float64{0: {10, 10, 10, 10, 10}, 1: {9.9, 9.9, 9.9, 9.9, 9.9}}, 0, 0},
		{"just past MinGain", map[int][]float64{0: {10, 10, 10, 10, 10}, 1: {9.79, 9.79, 9.79, 9.79, 9.79}}, 1, 0},
	} {
		n := 3
		for i := range c.times {
			n = max(n, i+1)
		}
		r := Race(n, timings(c.times))
		if r.Best != c.best || r.Noise < c.noise-1e-9 || r.Noise > c.noise+1e-9 {
			t.Errorf("%s: best %d noise %g (want %d, %g); medians %v, errors %v", c.name, r.Best, r.Noise, c.best, c.noise, r.Median, r.Errs)
		}
	}
}

// TestBeats: beats holds between any two candidates as Race's test holds
// against the default (every timing but the slowest below, the median by
// MinGain), and
// never for a candidate that failed or is out of range.
func TestBeats(t *testing.T) {
	ts := map[int][]float64{0: {10, 10, 10, 10, 10}, 1: {8, 8.5, 8, 8, 8}, 2: {7, 8.2, 7, 8.1, 7}, 3: {7.9, 7.9, 7.9, 7.9, 7.9}}
	r := Race(5, timings(ts))
	for _, c := range []struct {
		i, j int
		want bool
	}{
		{1, 0, true}, {2, 0, true}, {3, 0, true}, {0, 1, false},
		{2, 1, false}, // two timings of 2 over 1's fastest
		{3, 1, false}, // below every timing but by less than MinGain
		{4, 0, false}, {0, 4, false}, {1, 5, false}, {-1, 0, false},
	} {
		if got := r.beats(c.i, c.j); got != c.want {
			t.Errorf("beats(%d, %d) = %v, want %v (medians %v)", c.i, c.j, got, c.want, r.Median)
		}
	}
}

// TestParseMode: the --tune values, "" the default.
func TestParseMode(t *testing.T) {
	for in, want := range map[string]string{"": Cached, "cached": Cached, "off": Off, "full": Full, "defaults": Defaults} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("Full"); err == nil {
		t.Error(`ParseMode("Full") accepted`)
	}
}
