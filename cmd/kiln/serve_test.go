package main

import "testing"

// TestChoiceNames: a slow step's log names the shapes timed at first use,
// without their candidates' times, and says how many it left out.
func TestChoiceNames(t *testing.T) {
	choices := []string{
		"T=134 (rows ≤ 256) K=4096 N=6144: cuBLASLt algorithms 0 18.4 µs, 1 18.5 µs: 0 kept",
		"decode attention T=4 ctx≤256 32/8 heads ×128: 32 keys a split 8.6 µs: tensor cores kept",
		"norms T=2 (≤ 2) dim 4096: prefetch 3.7 µs, plain 3.8 µs: prefetch kept",
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{6, "T=134 (rows ≤ 256) K=4096 N=6144; decode attention T=4 ctx≤256 32/8 heads ×128; norms T=2 (≤ 2) dim 4096"},
		{1, "T=134 (rows ≤ 256) K=4096 N=6144; and 2 more"},
		{3, "T=134 (rows ≤ 256) K=4096 N=6144; decode attention T=4 ctx≤256 32/8 heads ×128; norms T=2 (≤ 2) dim 4096"},
	} {
		if got := choiceNames(choices, tc.n); got != tc.want {
			t.Errorf("choiceNames(.., %d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
