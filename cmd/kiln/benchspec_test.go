package main

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestOracleDrafterRederives: the oracle drafts the plain run's tokens
// while a sequence follows them (all of them at p 1), and where it leaves
// them drafts the continuation derived from the sequence, once, counting
// its time as paused; a failed derivation is kept as the run's error.
func TestOracleDrafterRederives(t *testing.T) {
	var asked [][]int
	o := &oracleDrafter{
		plain: []int{1, 2, 3, 4, 5, 6, 7, 8},
		p:     1,
		vocab: 100,
		rng:   rand.New(rand.NewPCG(1, 0)),
		continuation: func(tokens []int) ([]int, error) {
			asked = append(asked, slices.Clone(tokens))
			time.Sleep(time.Millisecond)
			out := make([]int, 8-len(tokens))
			for i := range out {
				out[i] = 50 + i
			}
			return out, nil
		},
	}
	o.reset()
	if d := o.Draft([]int{1, 2, 3}, 2); !slices.Equal(d, []int{4, 5}) {
		t.Fatalf("on plain's tokens: drafted %v, want [4 5]", d)
	}
	if d := o.Draft([]int{1, 2, 3, 9}, 3); !slices.Equal(d, []int{50, 51, 52}) {
		t.Fatalf("off them: drafted %v, want the derived continuation [50 51 52]", d)
	}
	if d := o.Draft([]int{1, 2, 3, 9, 50}, 2); !slices.Equal(d, []int{51, 52}) {
		t.Fatalf("on the derived tokens: drafted %v, want [51 52]", d)
	}
	if len(asked) != 1 || o.rederived != 1 || o.paused < time.Millisecond {
		t.Errorf("derived %d times (asked %v), paused %v: want once, at least 1ms", o.rederived, asked, o.paused)
	}
	if d := o.Draft([]int{1, 2, 3, 9, 50, 51, 52, 53}, 2); d != nil {
		t.Errorf("at the run's length: drafted %v, want none", d)
	}
	o.reset()
	if d := o.Draft([]int{1, 2}, 1); !slices.Equal(d, []int{3}) || o.paused != 0 {
		t.Errorf("after reset: drafted %v (paused %v), want plain's [3]", d, o.paused)
	}
	o.continuation = func([]int) ([]int, error) { return nil, errors.New("no room") }
	if d := o.Draft([]int{7}, 1); d != nil || o.err == nil {
		t.Errorf("a failed derivation: drafted %v, error %v: want none and the error kept", d, o.err)
	}
}
