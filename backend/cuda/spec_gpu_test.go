package cuda_test

import (
	"fmt"
	"slices"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/bench"
	"kiln/demo"
	"kiln/engine"
	"kiln/tensor"
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

// TestVerifyRowsMatchDecode: a verifying step's rows (k+1 tokens of one
// sequence in one decode step) give the logits that decoding the same
// tokens one step at a time gives, on a random model of Llama-3-8B's
// attention shape (32 query heads over 8 KV heads of 128): within 1e-4 in
// f32 and 2e-2 in bf16 (the single-GPU limits of the fixtures), for 3, 5
// and 9 tokens (one and two 16-row tiles of a KV head's queries) at a
// short and a longer context; the CPU's logits are the reference.
func TestVerifyRowsMatchDecode(t *testing.T) {
	s := bench.Shape{Name: "verify", Hidden: 4096, Layers: 2, Heads: 32, KVHeads: 8, FFN: 512, Vocab: 1000, Context: 1024}
	dir := ""
	for _, dtype := range []string{"f32", "bf16"} {
		gpu := backendOf(t, dtype)
		if dir == "" {
			dir = randomModel(t, s, tensor.BF16, 11)
		}
		limit := 1e-4
		if dtype == "bf16" {
			limit = 2e-2
		}
		for _, ctx := range []int{20, 300} {
			for _, n := range []int{3, 5, 9} {
				t.Run(fmt.Sprintf("%s/ctx%d/tokens%d", dtype, ctx, n), func(t *testing.T) {
					prompt := make([]int, ctx)
					for i := range prompt {
						prompt[i] = (i*37 + 11) % s.Vocab
					}
					run := make([]int, n)
					for i := range run {
						run[i] = (i*101 + 7) % s.Vocab
					}
					rows := func(b backend.Backend, oneByOne bool) [][]float32 {
						e := openEngine(t, dir, b, engine.Options{MaxSeqs: 2})
						seq := e.NewSequence()
						defer e.Free(seq)
						if _, err := e.Step([]engine.Item{{Seq: seq, Tokens: prompt}}); err != nil {
							t.Fatal(err)
						}
						var out [][]float32
						if oneByOne {
							for _, id := range run {
								l, err := e.Step([]engine.Item{{Seq: seq, Tokens: []int{id}}})
								if err != nil {
									t.Fatal(err)
								}
								out = append(out, slices.Clone(l))
							}
							return out
						}
						l, err := e.Step([]engine.Item{{Seq: seq, Tokens: run, AllRows: true}})
						if err != nil {
							t.Fatal(err)
						}
						for i := range n {
							out = append(out, slices.Clone(l[i*s.Vocab:(i+1)*s.Vocab]))
						}
						return out
					}
					ref := rows(&cpu.Backend{}, true)
					single, verify := rows(gpu, true), rows(gpu, false)
					for i := range n {
						es, ev := relL2(single[i], ref[i]), relL2(verify[i], ref[i])
						t.Logf("row %d: one token a step %.3g, the verifying step %.3g, between them %.3g", i, es, ev, relL2(verify[i], single[i]))
						if !(es <= limit) || !(ev <= limit) {
							t.Errorf("row %d: ‖Δ‖₂/‖ref‖₂ one token a step %.3g, verifying %.3g > %g", i, es, ev, limit)
						}
					}
				})
			}
		}
	}
}
