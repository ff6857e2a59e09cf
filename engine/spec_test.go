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
	"kiln/internal/stephook"
	"kiln/internal/testmodel"
	"kiln/model"
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
	return demoEngineWith(t, b, engine.Options{PrefixCaching: prefix, MaxSeqs: 2, Buckets: []int{1, 2, 4, 8, 16, 64}})
}

// demoEngineWith is the demo model on backend b with options o (its draft
// model, if o names one, loaded with it).
func demoEngineWith(t *testing.T, b backend.Backend, o engine.Options) (*engine.Engine, func(string) []int) {
	t.Helper()
	m, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(m, b, o)
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

// demoWithDraft is the demo model on the CPU with draft as its draft model
// (Options.DraftModel: the draft's entries in the same cache's blocks; nil:
// the demo model itself).
func demoWithDraft(t *testing.T, draft *model.Model, o engine.Options) (*engine.Engine, func(string) []int) {
	t.Helper()
	if draft == nil {
		m, _, err := demo.Load()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		draft = m
	}
	o.DraftModel = draft
	return demoEngineWith(t, &cpu.Backend{}, o)
}

// TestDraftModelSharedCache: a draft model loaded with its target
// (Options.DraftModel) keeps its entries in the blocks of the target's
// sequences. The model drafting for itself keeps every greedy draft (so
// the draft's entries read back through the borrowed block tables are its
// own), a random draft keeps few; output is plain greedy output; no block
// is left taken; and the draft engine's cache has the target's blocks.
func TestDraftModelSharedCache(t *testing.T) {
	for _, prefix := range []bool{false, true} {
		e, enc := demoWithDraft(t, nil, engine.Options{MaxSeqs: 2, PrefixCaching: prefix, Buckets: []int{1, 2, 4, 8, 16, 64}})
		d := e.Draft()
		if d == nil || d.KVSpec().Blocks != e.KVSpec().Blocks {
			t.Fatalf("draft engine %v, its cache of %d blocks for the target's %d", d != nil, d.KVSpec().Blocks, e.KVSpec().Blocks)
		}
		prompt := enc(repetitive)
		p := engine.SamplingParams{MaxTokens: 50}
		want := generate(t, e, prompt, p, nil)
		for rep := range 2 { // the second time, with prefix caching, on cached blocks
			before := e.SpecStats()
			got := generate(t, e, prompt, p, &engine.Speculation{Drafter: engine.ModelDrafter{E: d}, K: 4, Always: true})
			if !slices.Equal(got, want) {
				t.Fatalf("prefix caching %v, run %d: greedy\n got %v\nwant %v", prefix, rep, got, want)
			}
			s := e.SpecStats()
			if drafted, kept := s.DraftTokens-before.DraftTokens, s.AcceptedTokens-before.AcceptedTokens; kept != drafted || drafted == 0 {
				t.Errorf("prefix caching %v, run %d: the model drafting for itself kept %d of %d drafts", prefix, rep, kept, drafted)
			}
			if free := e.FreeBlocks(); free != e.KVSpec().Blocks {
				t.Errorf("prefix caching %v, run %d: %d of %d blocks free after", prefix, rep, free, e.KVSpec().Blocks)
			}
		}
	}
	c := demoConfig(t)
	c.NumLayers, c.HiddenSize, c.IntermediateSize, c.NumHeads, c.NumKVHeads, c.HeadDim = 1, 32, 64, 2, 2, 16
	e, enc := demoWithDraft(t, testmodel.Random(c, 5), engine.Options{MaxSeqs: 2})
	prompt := enc(repetitive)
	p := engine.SamplingParams{MaxTokens: 50}
	want := generate(t, e, prompt, p, nil)
	got := generate(t, e, prompt, p, &engine.Speculation{Drafter: engine.ModelDrafter{E: e.Draft()}, K: 4, Always: true})
	if !slices.Equal(got, want) {
		t.Fatalf("a random draft: greedy\n got %v\nwant %v", got, want)
	}
	if s := e.SpecStats(); s.AcceptedTokens*2 > s.DraftTokens {
		t.Errorf("a random draft model kept %d of %d drafts", s.AcceptedTokens, s.DraftTokens)
	}
}

// demoConfig is the demo model's config.
func demoConfig(t *testing.T) model.Config {
	m, _, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.Config
}

// TestDraftSessionCopyOnWrite: when the target copies a block on write
// that the draft model wrote its entries into (a fork shared it), those
// entries are not in the copy: the draft session writes them again, and
// its drafts stay the model's greedy continuation. Drafts of a fork, in
// the same blocks, do not disturb the original's.
func TestDraftSessionCopyOnWrite(t *testing.T) {
	e, enc := demoWithDraft(t, nil, engine.Options{MaxSeqs: 3, BlockSize: 16, Buckets: []int{1, 2, 4, 8, 16, 64}})
	d := engine.ModelDrafter{E: e.Draft()}
	// The free blocks first hold the draft's entries of other text (a
	// block taken for a copy holds them, not nothing).
	generate(t, e, enc("Then Jesus answered and said unto them, Verily, verily, I say unto you, The Son can do nothing of himself"),
		engine.SamplingParams{MaxTokens: 40}, &engine.Speculation{Drafter: d, K: 4, Always: true})
	prompt := enc("And the LORD spake unto Moses in the wilderness of Sinai, in the tabernacle of the congregation, on the first day")
	prompt = prompt[:len(prompt)-len(prompt)%16+14] // the last block partial (shared by the fork), nearly full
	want := generate(t, e, prompt, engine.SamplingParams{MaxTokens: 9}, nil)
	a := e.NewSequence()
	if _, err := e.Prefill(a, prompt[:len(prompt)-1], false); err != nil {
		t.Fatal(err)
	}
	sa := d.Session(a)
	defer sa.Release()
	check := func(name string, s engine.DraftSession, tokens []int, want []int) {
		t.Helper()
		if got := s.Draft(tokens, 4); !slices.Equal(got, want) {
			t.Errorf("%s: drafts %v, want the greedy %v", name, got, want)
		}
	}
	check("first", sa, prompt, want[:4])
	b := e.Fork(a) // shares a's blocks, the partial last one with the draft's entries
	// a's next token is written into a copy of the shared block, which
	// does not hold the draft's entries.
	if _, err := e.StepGreedy([]engine.Item{{Seq: a, Tokens: prompt[len(prompt)-1:]}}); err != nil {
		t.Fatal(err)
	}
	if e.Copies() != 1 {
		t.Fatalf("%d blocks copied on write, want 1", e.Copies())
	}
	check("after the copy", sa, append(slices.Clone(prompt), want[0]), want[1:5])
	// The fork drafts in the block a left (copied on write by its Reserve
	// first if a still shared it).
	sb := d.Session(b)
	defer sb.Release()
	check("the fork", sb, prompt, want[:4])
	check("after the fork's drafts", sa, append(slices.Clone(prompt), want[:2]...), want[2:6])
	e.Free(a)
	e.Free(b)
	if free := e.FreeBlocks(); free != e.KVSpec().Blocks {
		t.Errorf("%d of %d blocks free after", free, e.KVSpec().Blocks)
	}
}

// TestDraftCacheSizing: with a draft model, a cache sized from the memory
// left holds both models' entries in each block: fewer blocks, in the
// ratio of the target's block to both.
func TestDraftCacheSizing(t *testing.T) {
	o := engine.Options{MaxSeqs: 1 << 20, KVCacheFraction: 0.01, ContextLen: 256}
	alone, _ := demoEngineWith(t, &cpu.Backend{}, o)
	both, _ := demoWithDraft(t, nil, o)
	n1, n2 := alone.KVSpec().Blocks, both.KVSpec().Blocks
	// The draft is the model itself: half the blocks, as memory moves
	// (the host's free memory is read twice) within 10%.
	if r := float64(n2) / float64(n1); r < 0.45 || r > 0.55 {
		t.Errorf("%d blocks with the draft's entries, %d without: ratio %.3f, want 0.5", n2, n1, r)
	}
}

// TestDraftBatch: sessions drafting together (ModelDrafter.DraftBatch)
// draft what each would alone, in steps over all of them: the model
// drafting for itself proposes each sequence's greedy continuation, after
// a first draft and after a catch-up of kept drafts.
func TestDraftBatch(t *testing.T) {
	batched := 0 // draft steps of one token for each of three sequences
	b := &stephook.Backend{Backend: &cpu.Backend{}, Before: func(b *backend.Batch) error {
		if len(b.Seqs) == 3 && len(b.Tokens) == 3 {
			batched++
		}
		return nil
	}}
	m, _, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, enc := demoEngineWith(t, b, engine.Options{MaxSeqs: 4, DraftModel: m, Buckets: []int{1, 2, 4, 8, 16, 64}})
	d := engine.ModelDrafter{E: e.Draft()}
	texts := []string{repetitive, "And God said, Let there be light: and there was light.", "The LORD is my shepherd; I shall not want."}
	var prompts, wants [][]int
	var sessions []engine.DraftSession
	for _, text := range texts {
		p := enc(text)
		prompts = append(prompts, p)
		wants = append(wants, generate(t, e, p, engine.SamplingParams{MaxTokens: 8}, nil))
		seq := e.NewSequence()
		if _, err := e.Prefill(seq, p[:len(p)-1], false); err != nil {
			t.Fatal(err)
		}
		s := d.Session(seq)
		t.Cleanup(s.Release)
		sessions = append(sessions, s)
	}
	got := d.DraftBatch(sessions, prompts, []int{4, 4, 2})
	for i, n := range []int{4, 4, 2} {
		if !slices.Equal(got[i], wants[i][:n]) {
			t.Errorf("sequence %d: drafts %v, want %v", i, got[i], wants[i][:n])
		}
	}
	// Two drafts kept and the next token: the sessions catch up on them.
	var later [][]int
	for i, p := range prompts {
		later = append(later, append(slices.Clone(p), wants[i][:3]...))
	}
	got = d.DraftBatch(sessions, later, []int{4, 4, 4})
	for i := range got {
		if !slices.Equal(got[i], wants[i][3:7]) {
			t.Errorf("sequence %d, after a catch-up: drafts %v, want %v", i, got[i], wants[i][3:7])
		}
	}
	if batched < 4 {
		t.Errorf("%d draft steps of the three sequences together, want at least 4", batched)
	}
}

// TestReserve: Reserve takes all the blocks it is asked for or none; a
// fork shares only the blocks that hold tokens, not those reserved past
// them, so that the two write their own tokens into blocks of their own;
// and a draft engine's own sequences (a one-off draft, a warm-up) put no
// blocks in the prefix cache, whose target entries they never wrote.
func TestReserve(t *testing.T) {
	e, enc := demoWithDraft(t, nil, engine.Options{MaxSeqs: 3, KVBlocks: 12, BlockSize: 16, PrefixCaching: true, Buckets: []int{1, 2, 4, 8, 16, 64}})
	prompt := enc(repetitive)[:32] // two full blocks
	a := e.NewSequence()
	if _, err := e.Prefill(a, prompt, false); err != nil {
		t.Fatal(err)
	}
	free := e.FreeBlocks()
	if err := e.Reserve(a, 16*(free+1)); err == nil || e.FreeBlocks() != free {
		t.Fatalf("reserving more than the cache holds: %v, %d of %d blocks left free", err, e.FreeBlocks(), free)
	}
	if err := e.Reserve(a, 20); err != nil || e.FreeBlocks() != free-2 {
		t.Fatalf("reserve 20 tokens: %v, %d free of %d", err, e.FreeBlocks(), free)
	}
	b := e.Fork(a)
	// Different tokens after the fork: each must land in its own block.
	la, err := e.Step([]engine.Item{{Seq: a, Tokens: []int{10}}, {Seq: b, Tokens: []int{20}}})
	if err != nil {
		t.Fatal(err)
	}
	rowA := slices.Clone(la[:e.Vocab()])
	if _, err := e.Step([]engine.Item{{Seq: b, Tokens: []int{30}}}); err != nil { // b writes again
		t.Fatal(err)
	}
	la2, err := e.Step([]engine.Item{{Seq: a, Tokens: []int{11}}})
	if err != nil {
		t.Fatal(err)
	}
	c := e.NewSequence() // the reference: a's tokens, no reservation, no fork
	if _, err := e.Prefill(c, prompt, false); err != nil {
		t.Fatal(err)
	}
	lc, err := e.Step([]engine.Item{{Seq: c, Tokens: []int{10}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(rowA, lc[:e.Vocab()]); d > 1e-4 {
		t.Errorf("a's row after the fork differs from the reference by %g", d)
	}
	lc2, err := e.Step([]engine.Item{{Seq: c, Tokens: []int{11}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(la2[:e.Vocab()], lc2[:e.Vocab()]); d > 1e-4 {
		t.Errorf("a's row after its fork wrote again differs from the reference by %g", d)
	}
	for _, s := range []*engine.Sequence{a, b, c} {
		e.Free(s)
	}
	if e.FreeBlocks() != e.KVSpec().Blocks {
		t.Errorf("%d of %d blocks free after", e.FreeBlocks(), e.KVSpec().Blocks)
	}
	// The draft engine's own sequences (a warm-up's, a one-off draft's):
	// nothing for the target to share.
	if _, err := e.Draft().Warm(2, 16, 200); err != nil {
		t.Fatal(err)
	}
	other := enc("And God said, Let there be light: and there was light. And God saw the light, that it was good")
	engine.ModelDrafter{E: e.Draft()}.Draft(other, 4)
	before := e.PrefixStats()
	s := e.NewSequenceFor(other)
	defer e.Free(s)
	if hits := e.PrefixStats().Hits - before.Hits; hits != 0 || s.Len() != 0 {
		t.Errorf("the target found %d tokens of the draft's one-off sequence in the prefix cache", hits)
	}
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
