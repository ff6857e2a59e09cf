package cuda_test

import (
	"slices"
	"testing"

	"kiln/demo"
	"kiln/engine"
)

// TestSpeculativeGreedy: greedy speculative decoding by prompt lookup on
// the GPU (the demo model in f32, a prompt after which it repeats itself)
// gives plain greedy decoding's 60 tokens for 2, 4 and 8 drafts a step,
// keeps drafts, and replays its verifying steps (k+1 tokens of one
// sequence) from captured graphs as decode steps, within the decode
// workspace ReserveSteps reserved.
func TestSpeculativeGreedy(t *testing.T) {
	b := backendOf(t, "f32")
	m, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// A share of the memory for the KV cache, as kiln run and kiln serve
	// take: the engine then reserves the step memory first (ReserveSteps).
	e, err := engine.New(m, b, engine.Options{MaxSeqs: 2, KVCacheFraction: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompt := tok.Encode("In the beginning God created the heaven and the earth. In the beginning God created the heaven and the earth. In the beginning God", true)
	run := func(sp *engine.Speculation) []int {
		var ids []int
		emit := func(id int) bool { ids = append(ids, id); return true }
		p := engine.SamplingParams{MaxTokens: 60}
		if sp != nil {
			_, err = e.GenerateSpeculative(prompt, p, *sp, emit)
		} else {
			_, err = e.Generate(prompt, p, emit)
		}
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	want := run(nil)
	for _, k := range []int{2, 4, 8} {
		before, stats := e.SpecStats(), b.Stats()
		got := run(&engine.Speculation{Drafter: engine.NGram{MinN: 1, MaxN: 3}, K: k, Always: true})
		if !slices.Equal(got, want) {
			t.Fatalf("k %d: speculative greedy\n got %v\nwant %v", k, got, want)
		}
		s, after := e.SpecStats(), b.Stats()
		drafted, kept := s.DraftTokens-before.DraftTokens, s.AcceptedTokens-before.AcceptedTokens
		replays := after.GraphReplays - stats.GraphReplays
		t.Logf("k %d: %d verifying steps, %d drafted, %d kept; %d steps, %d replayed from graphs", k, s.Drafts-before.Drafts, drafted, kept,
			after.Steps-stats.Steps, replays)
		if kept == 0 || kept > drafted {
			t.Errorf("k %d: %d of %d drafts kept", k, kept, drafted)
		}
		if replays < (after.Steps-stats.Steps)/2 {
			t.Errorf("k %d: %d of %d steps replayed from graphs", k, replays, after.Steps-stats.Steps)
		}
		if g := after.WorkspaceGrowths - stats.WorkspaceGrowths; g != 0 {
			t.Errorf("k %d: the decode workspace grew %d times: the reservation missed the verifying steps", k, g)
		}
	}
}
