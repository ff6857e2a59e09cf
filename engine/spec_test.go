package engine_test

import (
	"math"
	"slices"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/demo"
	"kiln/engine"
	"kiln/internal/devsample"
	"kiln/internal/testmodel"
)

func TestNGramDraft(t *testing.T) {
	g := engine.NGram{MinN: 1, MaxN: 3}
	for _, c := range []struct {
		tokens []int
		k      int
		want   []int
	}{
		{[]int{1, 2, 3, 4, 1, 2, 3}, 3, []int{4, 1, 2}},       // the 3 tokens 1 2 3 seen before
		{[]int{1, 2, 3, 9, 2, 3, 7, 5, 2, 3}, 2, []int{7, 5}}, // the most recent occurrence of 2 3
		{[]int{5, 6, 7, 8, 6}, 4, []int{7, 8, 6}},             // n=1, cut at the end
		{[]int{1, 2, 3, 4}, 3, nil},                           // nothing repeats
		{[]int{1, 2, 1, 2}, 0, nil},                           // no room
		{[]int{7}, 2, nil},                                    // too short
		{[]int{4, 4, 4, 4}, 2, []int{4}},                      // overlapping: the run continues
	} {
		if got := g.Draft(c.tokens, c.k); !slices.Equal(got, c.want) {
			t.Errorf("Draft(%v, %d) = %v, want %v", c.tokens, c.k, got, c.want)
		}
	}
}

// demoEngine is the built-in demo model on the CPU, and its tokenizer's
// encoding of text.
func demoEngine(t *testing.T, prefix bool) (*engine.Engine, func(string) []int) {
	return demoEngineOn(t, prefix, &cpu.Backend{})
}

// demoEngineOn is demoEngine on backend b.
func demoEngineOn(t *testing.T, prefix bool, b backend.Backend) (*engine.Engine, func(string) []int) {
	t.Helper()
	m, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(m, b, engine.Options{PrefixCaching: prefix, MaxSeqs: 2, Buckets: []int{1, 2, 4, 8, 16, 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); m.Close() })
	return e, func(s string) []int { return tok.Encode(s, true) }
}

// repetitive is a prompt after which the demo model (trained on the King
// James Bible) soon repeats itself ("and the world, and the world, ..."):
// prompt lookup's drafts are then often kept.
const repetitive = "In the beginning God created the heaven and the earth. In the beginning God created the heaven and the earth. In the beginning God"

func generate(t *testing.T, e *engine.Engine, prompt []int, p engine.SamplingParams, sp *engine.Speculation) []int {
	t.Helper()
	var ids []int
	emit := func(id int) bool { ids = append(ids, id); return true }
	var err error
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

// TestSpeculativeGreedy: greedy speculative decoding by prompt lookup on
// the demo model gives plain greedy decoding's tokens, with and without
// prefix caching (rejected drafts' blocks unindexed), for 1 to 8 drafts a
// step; drafts are kept; and a later sequence over the same prompt,
// reusing the cached blocks, still gives the same tokens. The same on a
// backend that chooses tokens where the logits are (devsample): the
// drafts are then verified by the ids of every row of a verifying step.
func TestSpeculativeGreedy(t *testing.T) {
	for _, prefix := range []bool{false, true} {
		testSpeculativeGreedy(t, prefix, &cpu.Backend{})
	}
	ds := &devsample.Backend{Backend: &cpu.Backend{}}
	testSpeculativeGreedy(t, false, ds)
	if ds.MultiRowChoices() == 0 {
		t.Error("no verifying step chose its rows' tokens on the (emulated) device")
	}
}

func testSpeculativeGreedy(t *testing.T, prefix bool, b backend.Backend) {
	e, enc := demoEngineOn(t, prefix, b)
	prompt := enc(repetitive)
	p := engine.SamplingParams{MaxTokens: 60}
	want := generate(t, e, prompt, p, nil)
	for _, k := range []int{1, 4, 8} {
		before := e.SpecStats()
		got := generate(t, e, prompt, p, &engine.Speculation{Drafter: engine.NGram{MinN: 1, MaxN: 3}, K: k, Always: true})
		if !slices.Equal(got, want) {
			t.Fatalf("prefix %v, k %d: speculative greedy\n got %v\nwant %v", prefix, k, got, want)
		}
		s := e.SpecStats()
		drafted, kept := s.DraftTokens-before.DraftTokens, s.AcceptedTokens-before.AcceptedTokens
		t.Logf("prefix %v, k %d: %d steps verified drafts, %d drafted, %d kept", prefix, k, s.Drafts-before.Drafts, drafted, kept)
		if kept == 0 || kept > drafted {
			t.Errorf("prefix %v, k %d: %d of %d drafts kept", prefix, k, kept, drafted)
		}
	}
	if again := generate(t, e, prompt, p, nil); !slices.Equal(again, want) {
		t.Fatalf("prefix %v: greedy after speculation\n got %v\nwant %v", prefix, again, want)
	}
}

// TestVerifyDistribution: the token Verify returns for a draft follows
// Sample's distribution (the rule keeps the target distribution whatever
// the draft): 200,000 draws each for a likely draft, an unlikely one and one
// the filters drop, every token's frequency within 5 standard deviations of
// its probability.
func TestVerifyDistribution(t *testing.T) {
	row := []float32{2.0, 1.5, 1.2, 0.3, -0.5, -1.0, 0.9, 1.9}
	p := engine.SamplingParams{Temperature: 0.9, TopK: 6, TopP: 0.97, MinP: 0.02, Seed: 7}
	// The exact distribution: Sample's frequencies over many draws are
	// checked too, against this computation's.
	probs := exactProbs(row, p)
	const n = 200000
	for _, draft := range []int{0, 3, 5} {
		s := engine.NewSampler(p, len(row), nil)
		counts := make([]int, len(row))
		kept := 0
		for range n {
			id, ok := s.Verify(row, draft)
			counts[id]++
			if ok {
				kept++
			}
		}
		for id, c := range counts {
			want := probs[id] * n
			sd := math.Sqrt(n*probs[id]*(1-probs[id])) + 1
			if math.Abs(float64(c)-want) > 5*sd {
				t.Errorf("draft %d: token %d drawn %d times, want %.0f ± %.0f", draft, id, c, want, sd)
			}
		}
		if want := probs[draft] * n; math.Abs(float64(kept)-want) > 5*(math.Sqrt(want)+1) {
			t.Errorf("draft %d kept %d times, want %.0f", draft, kept, want)
		}
	}
	s := engine.NewSampler(p, len(row), nil)
	counts := make([]int, len(row))
	for range n {
		counts[s.Sample(row)]++
	}
	for id, c := range counts {
		if want, sd := probs[id]*n, math.Sqrt(n*probs[id]*(1-probs[id]))+1; math.Abs(float64(c)-want) > 5*sd {
			t.Errorf("Sample: token %d drawn %d times, want %.0f ± %.0f", id, c, want, sd)
		}
	}
}

// exactProbs is the sampling distribution of row under p, computed in
// float64: temperature, top-k, softmax, top-p, min-p, renormalized.
func exactProbs(row []float32, p engine.SamplingParams) []float64 {
	idx := make([]int, len(row))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case row[a] > row[b]:
			return -1
		case row[a] < row[b]:
			return 1
		}
		return 0
	})
	idx = idx[:p.TopK]
	w := map[int]float64{}
	var sum float64
	for _, i := range idx {
		w[i] = math.Exp(float64(row[i]) / p.Temperature)
		sum += w[i]
	}
	var cum float64
	keep := map[int]bool{}
	for _, i := range idx {
		keep[i] = true
		cum += w[i] / sum
		if cum >= p.TopP {
			break
		}
	}
	top := w[idx[0]] / sum
	out := make([]float64, len(row))
	var total float64
	for i := range keep {
		if w[i]/sum >= p.MinP*top {
			out[i] = w[i] / sum
			total += out[i]
		}
	}
	for i := range out {
		out[i] /= total
	}
	return out
}

// TestSpeculativeSampling: sampled speculative decoding keeps the
// distribution of the plain sampler on the demo model: 400 generations of
// 32 tokens each way at temperature 0.5 (fixed seeds; about a fifth of the
// drafts kept), the 16th and the 32nd tokens (one observation a
// generation: the tokens of one generation are not independent) pass a
// chi-squared test of homogeneity at the 0.005 level (fixed seeds, so the
// outcome is fixed; a sampler that kept drafts twice as often as it should
// failed it, which the 0.001 level let pass: TestVerifyDistribution is the
// sharp check of the rule).
func TestSpeculativeSampling(t *testing.T) {
	e, enc := demoEngine(t, false)
	prompt := enc(repetitive)
	at := []int{15, 31}
	plain, spec := make([]map[int]int, len(at)), make([]map[int]int, len(at))
	for i := range at {
		plain[i], spec[i] = map[int]int{}, map[int]int{}
	}
	note := func(counts []map[int]int, ids []int) {
		for i, j := range at {
			if j < len(ids) {
				counts[i][ids[j]]++
			}
		}
	}
	before := e.SpecStats()
	const runs = 400
	for i := range runs {
		p := engine.SamplingParams{Temperature: 0.5, MaxTokens: 32, Seed: uint64(i + 1)}
		note(plain, generate(t, e, prompt, p, nil))
		p.Seed += 1 << 20
		note(spec, generate(t, e, prompt, p, &engine.Speculation{Drafter: engine.NGram{MinN: 1, MaxN: 3}, K: 4, Always: true}))
	}
	s := e.SpecStats()
	kept, drafted := s.AcceptedTokens-before.AcceptedTokens, s.DraftTokens-before.DraftTokens
	t.Logf("%d drafted, %d kept", drafted, kept)
	if kept*10 < drafted {
		t.Fatalf("%d of %d drafts kept: too few for the test to see a bias", kept, drafted)
	}
	for i, j := range at {
		chi2, dof := homogeneity(plain[i], spec[i])
		// The 0.995 quantile of chi² with dof degrees of freedom, by
		// Wilson–Hilferty.
		crit := float64(dof) * math.Pow(1-2/(9*float64(dof))+2.576*math.Sqrt(2/(9*float64(dof))), 3)
		t.Logf("token %d: chi² %.1f over %d degrees of freedom (0.995 quantile %.1f)", j+1, chi2, dof, crit)
		if chi2 > crit {
			t.Errorf("token %d: chi² %.1f > %.1f: speculative sampling's tokens are not distributed as plain sampling's", j+1, chi2, crit)
		}
	}
}

// homogeneity is the chi-squared statistic of two samples' counts over the
// tokens seen (those seen fewer than 10 times in all pooled into one cell).
func homogeneity(a, b map[int]int) (float64, int) {
	var na, nb int
	for _, c := range a {
		na += c
	}
	for _, c := range b {
		nb += c
	}
	type cell struct{ a, b int }
	var cells []cell
	var rare cell
	keys := map[int]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		c := cell{a[k], b[k]}
		if c.a+c.b < 10 {
			rare.a += c.a
			rare.b += c.b
			continue
		}
		cells = append(cells, c)
	}
	if rare.a+rare.b > 0 {
		cells = append(cells, rare)
	}
	n := float64(na + nb)
	var chi2 float64
	for _, c := range cells {
		tot := float64(c.a + c.b)
		ea, eb := tot*float64(na)/n, tot*float64(nb)/n
		chi2 += (float64(c.a)-ea)*(float64(c.a)-ea)/ea + (float64(c.b)-eb)*(float64(c.b)-eb)/eb
	}
	return chi2, len(cells) - 1
}

// TestDraftModel: drafting with a model (its own engine and cache): the
// model itself as its draft keeps every greedy draft, a random model of the
// same vocabulary keeps few; either way greedy output is plain greedy
// output, over a long generation (the draft session cut back and fed again
// at every step).
func TestDraftModel(t *testing.T) {
	target, enc := demoEngine(t, false)
	prompt := enc(repetitive)
	p := engine.SamplingParams{MaxTokens: 50}
	want := generate(t, target, prompt, p, nil)
	self, _ := demoEngine(t, true)
	c := target.Config
	c.NumLayers, c.HiddenSize, c.IntermediateSize, c.NumHeads, c.NumKVHeads, c.HeadDim = 1, 32, 64, 2, 2, 16
	rnd, err := engine.New(testmodel.Random(c, 5), &cpu.Backend{}, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rnd.Close()
	for name, d := range map[string]*engine.Engine{"itself": self, "random": rnd} {
		before := target.SpecStats()
		got := generate(t, target, prompt, p, &engine.Speculation{Drafter: engine.ModelDrafter{E: d}, K: 4, Always: true})
		if !slices.Equal(got, want) {
			t.Fatalf("%s as the draft: greedy\n got %v\nwant %v", name, got, want)
		}
		s := target.SpecStats()
		drafted, kept := s.DraftTokens-before.DraftTokens, s.AcceptedTokens-before.AcceptedTokens
		t.Logf("%s: %d drafted, %d kept", name, drafted, kept)
		if name == "itself" && kept != drafted {
			t.Errorf("the model drafting for itself: %d of %d drafts kept", kept, drafted)
		}
		if d.FreeBlocks() != d.KVSpec().Blocks {
			t.Errorf("%s: %d of %d draft blocks free after", name, d.FreeBlocks(), d.KVSpec().Blocks)
		}
	}
}
