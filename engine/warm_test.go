package engine_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/demo"
	"kiln/engine"
	"kiln/internal/devsample"
	"kiln/internal/stephook"
	"kiln/model"
)

// TestWarm: Warm steps a prompt chunk of each bucket up to its bound and
// decode batches of powers of two up to the sequences' bound (and that
// bound) at each context up to its bound, frees every block, and leaves the
// engine's greedy output as a fresh engine's; on a backend that samples on
// the device too.
func TestWarm(t *testing.T) {
	m, prompt := warmDemo(t)
	p := engine.SamplingParams{MaxTokens: 24}
	for _, tc := range []struct {
		name   string
		device bool
	}{{"cpu", false}, {"device sampling", true}} {
		t.Run(tc.name, func(t *testing.T) {
			open := func(before func(*backend.Batch) error) *engine.Engine {
				e, _ := warmEngine(t, m, tc.device, before)
				return e
			}
			want := generate(t, open(nil), prompt, p, nil)
			seen := map[int]int{}
			e := open(func(b *backend.Batch) error { noteContext(seen, b); return nil })
			free := e.FreeBlocks()
			st, err := e.Warm(12, 64, 600)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", st)
			// Batches: every size to 8, then 12 (16 is past it). Contexts
			// (the longest sequence's tokens before its steps): none, 64,
			// 128 and 256 (the demo model's context of 512 bounds the 600
			// asked for: 512 leaves no room), prefilled in chunks of 64
			// (1+2+4 steps). At each context, 3 steps for each batch and
			// for 12 sequences of 2 and of 4 tokens (of 8, 96 tokens would
			// pass the 64 asked for).
			const steps = 6 + 7 + 4*(9+2)*3
			if !slices.Equal(st.Chunks, []int{1, 2, 4, 8, 16, 64}) || !slices.Equal(st.Batches, []int{1, 2, 3, 4, 5, 6, 7, 8, 12}) ||
				!slices.Equal(st.Runs, []int{2, 4}) || !slices.Equal(st.Contexts, []int{0, 64, 128, 256}) || st.Steps != steps {
				t.Errorf("warmed chunks %v, batches %v, runs %v, contexts %v in %d steps; want chunks 1…64, batches 1…8 12, runs 2 4, contexts 0 64 128 256, %d steps",
					st.Chunks, st.Batches, st.Runs, st.Contexts, st.Steps, steps)
			}
			// Every context bucket (a power of two from 64, as the CUDA
			// backend's decode attention chooses) was met by the steps of
			// one-token sequences and by those of runs.
			if want := map[int]int{64: 2, 128: 2, 256: 2, 512: 2}; !maps.Equal(seen, want) {
				t.Errorf("contexts met (bucket: 1 one-token steps, 2 runs too): %v, want %v", seen, want)
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

// warmDemo is the demo model and the warm-up tests' prompt.
func warmDemo(t *testing.T) (*model.Model, []int) {
	m, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, tok.Encode("In the beginning God created", true)
}

// warmEngine is the warm-up tests' engine of m: on the CPU behind a step
// hook (before), and with device sampling emulated when device is set
// (ds, else nil).
func warmEngine(t *testing.T, m *model.Model, device bool, before func(*backend.Batch) error) (e *engine.Engine, ds *devsample.Backend) {
	var b backend.Backend = &stephook.Backend{Backend: &cpu.Backend{}, Before: before}
	if device {
		ds = &devsample.Backend{Backend: b}
		b = ds
	}
	e, err := engine.New(m, b, engine.Options{MaxSeqs: 12, Buckets: []int{1, 2, 4, 8, 16, 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, ds
}

// noteContext records in seen, for a decode step (more than one sequence:
// prompt chunks have one), its context bucket (the smallest power of two
// from 64 past its last position) and whether its sequences brought one
// token each (1) or several (2, which wins).
func noteContext(seen map[int]int, b *backend.Batch) {
	if len(b.Seqs) < 2 {
		return
	}
	bucket := 64
	for bucket < int(slices.Max(b.Positions))+1 {
		bucket *= 2
	}
	kind := 1
	if len(b.Tokens) > len(b.Seqs) {
		kind = 2
	}
	seen[bucket] = max(seen[bucket], kind)
}

// TestWarmFails: a step of the warm-up that fails ends it with an error
// that says which step, and every block it took is free again.
func TestWarmFails(t *testing.T) {
	m, _, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, at := range []int{3, 12, 40} { // a prompt chunk, a decode step, the 64-token sequence's prefill
		countdown := at
		e, err := engine.New(m, &stephook.Backend{Backend: &cpu.Backend{}, Before: func(*backend.Batch) error {
			if countdown--; countdown == 0 {
				return errors.New("the step failed")
			}
			return nil
		}}, engine.Options{MaxSeqs: 12, Buckets: []int{1, 2, 4, 8, 16, 64}})
		if err != nil {
			t.Fatal(err)
		}
		free := e.FreeBlocks()
		st, err := e.Warm(12, 64, 600)
		if err == nil || !strings.Contains(err.Error(), "warm-up: a ") || st.Steps != at {
			t.Errorf("failing at step %d: %v after %d steps, want the warm-up's error at that step", at, err, st.Steps)
		}
		if got := e.FreeBlocks(); got != free {
			t.Errorf("failing at step %d: %d blocks free, %d before", at, got, free)
		}
		e.Close()
	}
}

// TestWarmVerify: WarmVerify steps 1 to seqs sequences of k+1 tokens with
// every row wanted (its greedy choice, or its logits), three times at each
// context up to its bound (the long sequence prefilled by plain steps, one
// row wanted), frees every block, and leaves greedy output as a fresh
// engine's; on a backend that samples on the device too.
func TestWarmVerify(t *testing.T) {
	m, prompt := warmDemo(t)
	p := engine.SamplingParams{MaxTokens: 24}
	for _, tc := range []struct {
		name           string
		device, greedy bool
	}{{"cpu", false, true}, {"device sampling", true, true}, {"sampled verification", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			plainEngine, _ := warmEngine(t, m, tc.device, nil)
			want := generate(t, plainEngine, prompt, p, nil)
			var verifying, prefill int
			contexts := map[int]bool{}
			e, ds := warmEngine(t, m, tc.device, func(b *backend.Batch) error {
				switch {
				case len(b.Rows) == len(b.Tokens) && len(b.Tokens) == 3*len(b.Seqs):
					verifying++
					contexts[int(slices.Max(b.Positions))+1-3] = true
				case len(b.Rows) == 1 && len(b.Seqs) == 1:
					prefill++
				default:
					t.Errorf("a step of %d tokens of %d sequences, %d rows wanted", len(b.Tokens), len(b.Seqs), len(b.Rows))
				}
				return nil
			})
			free := e.FreeBlocks()
			st, err := e.WarmVerify(2, 3, 300, tc.greedy)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", st)
			// Contexts 0, 64 and 128 (256 leaves no room in 300), the
			// longest prefilled in chunks of 64 (1+2 steps); at each, 1, 2
			// and 3 sequences of 3 tokens stepped 3 times.
			if !slices.Equal(st.Batches, []int{1, 2, 3}) || !slices.Equal(st.Runs, []int{3}) || !slices.Equal(st.Contexts, []int{0, 64, 128}) ||
				st.Steps != 30 || verifying != 27 || prefill != 3 {
				t.Errorf("batches %v, runs %v, contexts %v, %d steps (%d verifying, %d prefill); want 1 2 3, 3, 0 64 128, 30 (27, 3)",
					st.Batches, st.Runs, st.Contexts, st.Steps, verifying, prefill)
			}
			// The longest sequence's tokens before each verifying step:
			// each context, then 3 and 6 more (a shape's three steps).
			if got := slices.Sorted(maps.Keys(contexts)); !slices.Equal(got, []int{0, 3, 6, 64, 67, 70, 128, 131, 134}) {
				t.Errorf("longest sequence's tokens before the verifying steps: %v, want 0 3 6 64 67 70 128 131 134", got)
			}
			// Greedy verification chooses every row's token on the
			// device; sampled verification brings the rows back.
			if ds != nil {
				if chose := ds.MultiRowChoices(); (chose > 0) != tc.greedy {
					t.Errorf("%d rows chosen on the device by verifying steps, greedy %v", chose, tc.greedy)
				}
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

// TestWarmDecode: WarmDecode steps one sequence's one-token decode steps
// three times at each context up to its bound, the long sequence filled in
// steps of the largest bucket, and frees every block.
func TestWarmDecode(t *testing.T) {
	m, _ := warmDemo(t)
	var decode, fill int
	e, _ := warmEngine(t, m, false, func(b *backend.Batch) error {
		if len(b.Seqs) != 1 || len(b.Rows) != 1 {
			t.Errorf("a step of %d sequences, %d rows wanted", len(b.Seqs), len(b.Rows))
		}
		if len(b.Tokens) == 1 {
			decode++
		} else {
			fill++
		}
		return nil
	})
	free := e.FreeBlocks()
	st, err := e.WarmDecode(300)
	if err != nil {
		t.Fatal(err)
	}
	// Contexts 0, 64 and 128: fills of 64, then 64+64; 3 decode steps at
	// each.
	if !slices.Equal(st.Contexts, []int{0, 64, 128}) || st.Steps != 12 || decode != 9 || fill != 3 {
		t.Errorf("contexts %v, %d steps (%d decode, %d filling); want 0 64 128, 12 (9, 3)", st.Contexts, st.Steps, decode, fill)
	}
	if got := e.FreeBlocks(); got != free {
		t.Errorf("%d blocks free after the warm-up, %d before", got, free)
	}
}
