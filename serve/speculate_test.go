package serve

import (
	"slices"
	"testing"
	"time"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/stephook"
	"kiln/internal/testshared"
	"kiln/model"
)

// TestPlanDrafts: the plan drafts while the steps' measured costs make
// drafting yield more tokens a second, as many requests as do, and
// measures costs it does not know or that are old.
func TestPlanDrafts(t *testing.T) {
	buckets := []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
	bucket := func(n int) int {
		for _, b := range buckets {
			if b >= n {
				return b
			}
		}
		return 0
	}
	ms := func(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
	cands := func(n int, kept float64) []draftCandidate {
		var c []draftCandidate
		for range n {
			c = append(c, draftCandidate{drafts: 4, kept: kept})
		}
		return c
	}
	// A compute-bound batch of 64: each bucket costs more.
	compute := newStepCosts(bucket)
	for b, d := range map[int]float64{64: 5, 128: 7, 256: 12, 512: 22} {
		compute.record(b, ms(d))
	}
	// Fixed costs: every bucket the same.
	fixed := newStepCosts(bucket)
	for _, b := range buckets {
		fixed.record(b, ms(5))
	}
	for _, c := range []struct {
		name      string
		costs     *stepCosts
		n, prompt int
		cands     []draftCandidate
		want      int
	}{
		// 64+4m tokens: m=16 costs 7 ms for 64+19 tokens, less than
		// plain's 12.8 a ms; none drafts.
		{"compute-bound, few kept", compute, 64, 0, cands(64, 1.2), 0},
		// 3.5 kept of 4: 48 fill the 256 bucket (232 tokens in 12 ms),
		// all 64 would take the 512 bucket's 22 ms for 288.
		{"compute-bound, most kept", compute, 64, 0, cands(64, 3.5), 48},
		{"fixed costs", fixed, 64, 0, cands(64, 0.5), 64},
		// Prompt tokens fill the step to its budget: drafts add no cost
		// (they take prompt tokens' places).
		{"at the budget", compute, 64, 448, cands(64, 0.5), 64},
		{"nothing kept", fixed, 8, 0, cands(8, 0), 0},
		{"no candidates", fixed, 8, 0, nil, 0},
	} {
		got := planDrafts(c.n, c.prompt, 512, c.cands, c.costs)
		if got != c.want {
			t.Errorf("%s: %d draft, want %d", c.name, got, c.want)
		}
	}
	// Candidates are taken best first.
	mixed := []draftCandidate{{drafts: 4, kept: 0}, {drafts: 4, kept: 3.9}, {drafts: 4, kept: 0}}
	if m := planDrafts(1, 0, 512, mixed, fixed); m != 1 || mixed[0].kept != 3.9 {
		t.Errorf("mixed: %d draft, the first keeping %g", m, mixed[0].kept)
	}
	// Unknown costs: the plain step's measured first, then the drafts'
	// (priced as the nearest smaller bucket's).
	fresh := newStepCosts(bucket)
	if m := planDrafts(8, 0, 512, cands(8, 0.5), fresh); m != 0 {
		t.Errorf("no costs known: %d draft, want 0 (measure plain)", m)
	}
	fresh.record(8, ms(5))
	if m := planDrafts(8, 0, 512, cands(8, 0.5), fresh); m != 8 {
		t.Errorf("plain's cost known: %d draft, want 8 (measure drafting)", m)
	}
	fresh.record(40, ms(50))
	if m := planDrafts(8, 0, 512, cands(8, 0.5), fresh); m != 6 {
		t.Errorf("the 32 bucket not measured: %d draft, want 6 (32 tokens, priced as 8)", m)
	}
	fresh.record(16, ms(20))
	fresh.record(32, ms(40))
	if m := planDrafts(8, 0, 512, cands(8, 0.5), fresh); m != 0 {
		t.Errorf("drafting measured slow: %d draft, want 0", m)
	}
	// Stale: after costStale steps, drafting is measured again.
	for range costStale {
		fresh.record(8, ms(5))
		planDrafts(8, 0, 512, nil, fresh)
	}
	if m := planDrafts(8, 0, 512, cands(8, 0.5), fresh); m != 8 {
		t.Errorf("drafting's cost stale: %d draft, want 8 (measure again)", m)
	}
}

// batchDrafter drafts, for any of its prompts, the first right tokens of
// its plain continuation and then tokens the model never chooses here.
type batchDrafter struct {
	plains [][]int
	right  int
	vocab  int
}

func (d batchDrafter) Draft(tokens []int, k int) []int {
	for _, p := range d.plains {
		n := len(tokens)
		if n >= len(p) || !slices.Equal(tokens, p[:n]) {
			continue
		}
		out := slices.Clone(p[n:min(n+k, len(p))])
		for i := d.right; i < len(out); i++ {
			out[i] = d.vocab - 1
		}
		return out
	}
	return nil
}

// TestSpeculationPlanInBatch: 8 requests at once, each keeping half of
// its drafts. Where a step's cost is mostly fixed they draft at most
// steps; where it grows with its tokens (compute-bound) drafting does not
// pay and they draft in a few steps that measure it, with the same
// output either way.
func TestSpeculationPlanInBatch(t *testing.T) {
	ps := prompts(8)
	want := alone(t, stories(t, 8, 0), ps, 40)
	var plains [][]int
	for i, p := range ps {
		plains = append(plains, append(slices.Clone(p), want[i]...))
	}
	for _, tc := range []struct {
		name       string
		fixed, a   time.Duration // a step's time: fixed + a×(its tokens' power-of-two bucket)
		minV, maxV int           // verifying request-steps
	}{
		// Plain steps of 8 tokens take 10 ms. One request drafting takes
		// the step to 18 ms and yields it 3 tokens, more than its 1 in a
		// plain step's 10 ms, so its governor sees drafting pay; but the
		// batch's 8 take 10 ms, and so at every number drafting.
		{"compute-bound", 2 * time.Millisecond, time.Millisecond, 0, 24},
		// 40.8 ms plain, 46.4 ms drafting.
		{"fixed costs", 40 * time.Millisecond, 100 * time.Microsecond, 80, 320},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			timed := &stephook.Backend{Backend: &cpu.Backend{}, Before: func(b *backend.Batch) error {
				padded := 1 // the step's bucket, as a GPU runs it
				for padded < len(b.Tokens) {
					padded *= 2
				}
				time.Sleep(tc.fixed + time.Duration(padded)*tc.a)
				return nil
			}}
			e, err := engine.New(m, timed, engine.Options{MaxSeqs: 8, BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			d := batchDrafter{plains: plains, right: 2, vocab: e.Vocab()}
			s := runScheduler(t, e, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 512, SpeculateMaxSeqs: 8,
				Speculation: &engine.Speculation{Drafter: d, K: 4}})
			var rs []*Request
			for _, p := range ps {
				r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 40, IgnoreStop: true}}
				if err := s.Submit(r); err != nil {
					t.Fatal(err)
				}
				rs = append(rs, r)
				// Arrivals a few steps apart, as a server's: each
				// request's governor starts at its own time.
				time.Sleep(3 * (tc.fixed + 8*tc.a))
			}
			for i, r := range rs {
				got, end := collect(t, r)
				if end.Err != nil || !slices.Equal(got, want[i]) {
					t.Errorf("request %d ended %+v with\n got %v\nwant %v", i, end, got, want[i])
				}
			}
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%d verifying request-steps, %d drafted, %d kept, %d steps", st.SpecDrafts, st.SpecDraftTokens, st.SpecAcceptedTokens, st.Steps)
			if int(st.SpecDrafts) < tc.minV || int(st.SpecDrafts) > tc.maxV {
				t.Errorf("%d verifying request-steps, want %d to %d", st.SpecDrafts, tc.minV, tc.maxV)
			}
		})
	}
}
