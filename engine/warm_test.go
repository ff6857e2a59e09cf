package engine_test

import (
	"slices"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/demo"
	"kiln/engine"
	"kiln/internal/devsample"
)

// TestWarm: Warm steps a prompt chunk of each bucket up to its bound and
// decode batches of powers of two up to the sequences' bound (and that
// bound) at each context up to its bound, frees every block, and leaves the
// engine's greedy output as a fresh engine's; on a backend that samples on
// the device too.
func TestWarm(t *testing.T) {
	m, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prompt := tok.Encode("In the beginning God created", true)
	p := engine.SamplingParams{MaxTokens: 24}
	for _, tc := range []struct {
		name   string
		device bool
	}{{"cpu", false}, {"device sampling", true}} {
		t.Run(tc.name, func(t *testing.T) {
			open := func() *engine.Engine {
				var b backend.Backend = &cpu.Backend{}
				if tc.device {
					b = &devsample.Backend{Backend: b}
				}
				e, err := engine.New(m, b, engine.Options{MaxSeqs: 12, Buckets: []int{1, 2, 4, 8, 16, 64}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
			want := generate(t, open(), prompt, p, nil)
			e := open()
			free := e.FreeBlocks()
			st, err := e.Warm(12, 64, 600)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", st)
			// Batches: every size to 8, then 12 (16 is past it). Contexts:
			// one token and 257 (the demo model's context of 512 bounds
			// the 600 asked for: 513 is past it), 257 prefilled in chunks
			// of 64 (4 steps). At each context, 3 steps for each batch and
			// for 12 sequences of 2 and of 4 tokens (of 8, 96 tokens would
			// pass the 64 asked for).
			const steps = 6 + 4 + 2*(9+2)*3
			if !slices.Equal(st.Chunks, []int{1, 2, 4, 8, 16, 64}) || !slices.Equal(st.Batches, []int{1, 2, 3, 4, 5, 6, 7, 8, 12}) ||
				!slices.Equal(st.Runs, []int{2, 4}) || !slices.Equal(st.Contexts, []int{1, 257}) || st.Steps != steps {
				t.Errorf("warmed chunks %v, batches %v, runs %v, contexts %v in %d steps; want chunks 1…64, batches 1…8 12, runs 2 4, contexts 1 257, %d steps",
					st.Chunks, st.Batches, st.Runs, st.Contexts, st.Steps, steps)
			}
			if got := e.FreeBlocks(); got != free {
				t.Errorf("%d blocks free after the warm-up, %d before", got, free)
			}
			if got := generate(t, e, prompt, p, nil); !slices.Equal(got, want) {
				t.Errorf("after the warm-up:\n got %v\nwant %v", got, want)
			}
		})
	}
}
