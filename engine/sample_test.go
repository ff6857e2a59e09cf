package engine

import (
	"math"
	"strings"
	"testing"
)

func logitsOf(probs ...float64) []float32 {
	l := make([]float32, len(probs))
	for i, p := range probs {
		l[i] = float32(math.Log(p))
	}
	return l
}

func TestGreedyIsFirstArgmax(t *testing.T) {
	s := NewSampler(SamplingParams{}, 5, nil)
	if got := s.Sample([]float32{1, 3, 3, float32(math.NaN()), 2}); got != 1 {
		t.Errorf("greedy chose %d, want 1", got)
	}
	if got := s.Sample([]float32{float32(math.NaN()), -1, 0}); got != 2 {
		t.Errorf("greedy chose %d with a NaN first, want 2", got)
	}
}

func TestSamplingDistribution(t *testing.T) {
	cases := []struct {
		name string
		p    SamplingParams
		want []float64 // expected frequencies
	}{
		{"temperature 1", SamplingParams{Temperature: 1}, []float64{0.5, 0.3, 0.15, 0.05}},
		{"top-k 2", SamplingParams{Temperature: 1, TopK: 2}, []float64{0.625, 0.375, 0, 0}},
		{"top-p 0.7", SamplingParams{Temperature: 1, TopP: 0.7}, []float64{0.625, 0.375, 0, 0}},
		{"top-p 0.81", SamplingParams{Temperature: 1, TopP: 0.81}, []float64{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
		{"min-p 0.5", SamplingParams{Temperature: 1, MinP: 0.5}, []float64{0.625, 0.375, 0, 0}},
		{"min-p 0.25", SamplingParams{Temperature: 1, MinP: 0.25}, []float64{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
		// Temperature 0.5 squares the probabilities before normalising.
		{"temperature 0.5", SamplingParams{Temperature: 0.5}, []float64{0.25 / 0.3650, 0.09 / 0.3650, 0.0225 / 0.3650, 0.0025 / 0.3650}},
		{"top-k 1 is greedy", SamplingParams{Temperature: 2, TopK: 1}, []float64{1, 0, 0, 0}},
	}
	row := logitsOf(0.5, 0.3, 0.15, 0.05)
	const n = 40000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.p.Seed = 42
			s := NewSampler(c.p, len(row), nil)
			counts := make([]int, len(row))
			for i := 0; i < n; i++ {
				counts[s.Sample(row)]++
			}
			for id, want := range c.want {
				got := float64(counts[id]) / n
				// 5 standard deviations of a binomial proportion, plus a hair.
				tol := 5*math.Sqrt(want*(1-want)/n) + 1e-9
				if math.Abs(got-want) > tol {
					t.Errorf("id %d drawn %.4f of the time, want %.4f ± %.4f", id, got, want, tol)
				}
			}
		})
	}
}

func TestSeedReproducible(t *testing.T) {
	row := logitsOf(0.2, 0.2, 0.2, 0.2, 0.2)
	draw := func(seed uint64) []int {
		s := NewSampler(SamplingParams{Temperature: 1, Seed: seed}, len(row), nil)
		var ids []int
		for i := 0; i < 50; i++ {
			ids = append(ids, s.Sample(row))
		}
		return ids
	}
	a, b, c := draw(7), draw(7), draw(8)
	same := func(x, y []int) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("the same seed gave different draws")
	}
	if same(a, c) {
		t.Error("different seeds gave the same 50 draws")
	}
}

func TestPenalties(t *testing.T) {
	// Repetition penalty (prompt and output): positive logits divided,
	// negative ones multiplied.
	s := NewSampler(SamplingParams{RepetitionPenalty: 2}, 3, []int{0, 1})
	if got := s.Sample([]float32{3, -1, 1.6}); got != 2 {
		t.Errorf("repetition penalty: chose %d, want 2 (3/2 < 1.6)", got)
	}
	// Frequency and presence penalties apply to generated tokens only.
	s = NewSampler(SamplingParams{FrequencyPenalty: 0.5, PresencePenalty: 0.25}, 3, []int{2})
	s.Accept(0)
	s.Accept(0)
	// logit 0: 2 - (2·0.5 + 0.25) = 0.75 < 1 (id 1); id 2 only in the prompt.
	if got := s.Sample([]float32{2, 1, 0.9}); got != 1 {
		t.Errorf("frequency/presence penalty: chose %d, want 1", got)
	}
}

// TestMinTokens checks that stop tokens are banned until MinTokens tokens
// were accepted, on the host (Sample) and in the device sampler's history
// (Banned entries, merged with the penalties' entries), and free after.
func TestMinTokens(t *testing.T) {
	for _, rep := range []float64{1, 1.3} {
		p := SamplingParams{MinTokens: 2, StopTokens: []int{0, 3}, RepetitionPenalty: rep}
		s := NewSampler(p, 4, []int{3, 1})
		row := []float32{5, 1, 2, 4} // the stop tokens 0 and 3 lead
		for step := 0; step < 3; step++ {
			got := s.Sample(row)
			banned := map[int32]bool{}
			for _, e := range s.deviceParams().History {
				if e.Banned {
					banned[e.ID] = true
				}
			}
			if step < 2 {
				if got != 2 || !s.Banning() || !banned[0] || !banned[3] || len(banned) != 2 {
					t.Errorf("rep %g step %d: chose %d, banned %v, want 2 with 0 and 3 banned", rep, step, got, banned)
				}
			} else if got != 0 || s.Banning() || len(banned) != 0 {
				t.Errorf("rep %g step %d: chose %d, banned %v, want 0 and nothing banned", rep, step, got, banned)
			}
			s.Accept(got)
		}
	}
	// With ignore_eos nothing is banned.
	s := NewSampler(SamplingParams{MinTokens: 5, StopTokens: []int{0}, IgnoreStop: true}, 2, nil)
	if s.Banning() || s.Sample([]float32{1, 0}) != 0 {
		t.Error("min tokens banned a stop token under IgnoreStop")
	}
}

func TestSamplingParamsValidate(t *testing.T) {
	bad := []SamplingParams{
		{Temperature: -1}, {Temperature: math.NaN()}, {TopK: -1}, {TopP: 1.5}, {MinP: -0.1},
		{RepetitionPenalty: -1}, {FrequencyPenalty: 3}, {PresencePenalty: -2.5}, {MaxTokens: -1},
		{MinTokens: -1}, {MaxTokens: 3, MinTokens: 4},
	}
	for _, p := range bad {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if err := (&SamplingParams{Temperature: 0.7, TopK: 40, TopP: 0.95, MinP: 0.05, RepetitionPenalty: 1.1}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestStopStrings(t *testing.T) {
	cases := []struct {
		stops  []string
		pieces []string
		want   string
		stop   bool
	}{
		{[]string{"world"}, []string{"Hello ", "wo", "rld", "!"}, "Hello ", true},
		{[]string{"world"}, []string{"Hello ", "wo", "w", "x"}, "Hello wowx", false},
		{[]string{"\n\n", "END"}, []string{"a\n", "b", "\n", "\nc"}, "a\nb", true},
		{[]string{"ab"}, []string{"xa", "a", "b"}, "xa", true},
		{nil, []string{"x", "y"}, "xy", false},
		{[]string{""}, []string{"x"}, "x", false},
	}
	for _, c := range cases {
		s := NewStopStrings(c.stops)
		var got strings.Builder
		stopped := false
		for _, p := range c.pieces {
			out, st := s.Add(p)
			got.WriteString(out)
			if st {
				stopped = true
				break
			}
		}
		if !stopped {
			got.WriteString(s.Flush())
		}
		if got.String() != c.want || stopped != c.stop {
			t.Errorf("stops %q pieces %q: got %q stopped=%v, want %q stopped=%v", c.stops, c.pieces, got.String(), stopped, c.want, c.stop)
		}
	}
}
