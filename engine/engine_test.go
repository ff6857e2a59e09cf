package engine_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"kiln/backend/cpu"
	"kiln/bench"
	"kiln/engine"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// tinyModel writes and loads a random-weight tiny Llama.
func tinyModel(t *testing.T, d tensor.DType) *model.Model {
	t.Helper()
	dir := t.TempDir()
	if err := bench.WriteRandomModel(dir, bench.Shapes["tiny"], d, 3); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestDecodeAllocatesNothing checks the hot path: a decode step on the fast
// kernels allocates no memory once its bucket's plan exists, with a float32
// or an FP8 KV cache.
func TestDecodeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for i, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.BF16} {
		fp8 := i == 2 // the FP8 KV cache
		m := tinyModel(t, d)
		e, err := engine.New(m, &cpu.Backend{}, engine.Options{MaxSeqs: 2, KVCacheFP8: fp8})
		if err != nil {
			t.Fatal(err)
		}
		seq := e.NewSequence()
		if _, err := e.Prefill(seq, []int{1, 2, 3}, false); err != nil {
			t.Fatal(err)
		}
		tok := []int{5}
		items := []engine.Item{{Seq: seq, Tokens: tok}}
		sampler := engine.NewSampler(engine.SamplingParams{Temperature: 0.7, TopK: 20, TopP: 0.9, MinP: 0.01, RepetitionPenalty: 1.1}, e.Vocab(), nil)
		allocs := testing.AllocsPerRun(50, func() {
			logits, err := e.Step(items)
			if err != nil {
				t.Fatal(err)
			}
			tok[0] = sampler.Sample(logits)
			sampler.Accept(tok[0])
		})
		if allocs != 0 {
			t.Errorf("%v (FP8 KV cache %v): %.1f allocations per decode step, want 0", d, fp8, allocs)
		}
		e.Close()
	}
}

// TestBatchedEqualsSequential checks that sequences decoded together in one
// step get the logits they get alone (up to float32 summation order, which
// differs between the batched and single-row matrix kernels) and identical
// greedy tokens.
func TestBatchedEqualsSequential(t *testing.T) {
	m := tinyModel(t, tensor.F32)
	prompts := [][]int{{1, 7, 9, 11}, {1, 200}, {1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 9}}
	const steps = 12
	greedy := func(logits []float32) int {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	// One at a time.
	alone := make([][]int, len(prompts))
	aloneLogits := make([][]float32, len(prompts))
	for i, p := range prompts {
		e, err := engine.New(m, &cpu.Backend{}, engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		seq := e.NewSequence()
		logits, err := e.Prefill(seq, p, false)
		if err != nil {
			t.Fatal(err)
		}
		for s := 0; s < steps; s++ {
			id := greedy(logits)
			alone[i] = append(alone[i], id)
			aloneLogits[i] = append(aloneLogits[i], logits...)
			if logits, err = e.Step([]engine.Item{{Seq: seq, Tokens: []int{id}}}); err != nil {
				t.Fatal(err)
			}
		}
		e.Close()
	}
	// Together: the prompts prefilled in one step, then decoded together.
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{MaxSeqs: len(prompts)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	items := make([]engine.Item, len(prompts))
	for i, p := range prompts {
		items[i] = engine.Item{Seq: e.NewSequence(), Tokens: p}
	}
	together := make([][]int, len(prompts))
	var maxErr float64
	for s := 0; s < steps; s++ {
		logits, err := e.Step(items)
		if err != nil {
			t.Fatal(err)
		}
		v := e.Vocab()
		for i := range items {
			row := logits[i*v : (i+1)*v]
			want := aloneLogits[i][s*v : (s+1)*v]
			for j := range row {
				maxErr = math.Max(maxErr, math.Abs(float64(row[j]-want[j])))
			}
			id := greedy(row)
			together[i] = append(together[i], id)
			items[i].Tokens = []int{id}
		}
	}
	for i := range prompts {
		for s := range alone[i] {
			if alone[i][s] != together[i][s] {
				t.Fatalf("sequence %d: batched greedy %v, alone %v", i, together[i], alone[i])
			}
		}
	}
	if maxErr > 1e-4 {
		t.Errorf("batched logits differ from sequential by %g > 1e-4", maxErr)
	}
	if _, err := e.Step([]engine.Item{items[1], {Seq: items[1].Seq, Tokens: []int{2}}}); err == nil || !strings.Contains(err.Error(), "repeats a sequence") {
		t.Errorf("a step naming one sequence twice: %v", err)
	}
	e.Free(items[0].Seq)
	if _, err := e.Step(items[:1]); err == nil {
		t.Error("a step on a freed sequence was accepted")
	}
}

// TestKVCacheExhaustion checks that running out of blocks or context is an
// error, and that freeing returns every block.
func TestKVCacheExhaustion(t *testing.T) {
	m := tinyModel(t, tensor.F32)
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 32, BlockSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// The backend was told the cache's block size when the graph was
	// compiled (the CUDA backend builds its attention kernels for it).
	if e.Compiled.KVBlockSize != 8 {
		t.Errorf("compiled for KV-cache blocks of %d tokens, the cache's hold 8", e.Compiled.KVBlockSize)
	}
	free := e.FreeBlocks()
	seq := e.NewSequence()
	if _, err := e.Prefill(seq, make([]int, 32), false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Step([]engine.Item{{Seq: seq, Tokens: []int{1}}}); err == nil {
		t.Error("a step past the context length was accepted")
	}
	other := e.NewSequence()
	if _, err := e.Step([]engine.Item{{Seq: other, Tokens: []int{1}}}); err == nil {
		t.Error("a step with no free blocks was accepted")
	}
	e.Free(seq)
	e.Free(other)
	if e.FreeBlocks() != free {
		t.Errorf("%d blocks free after freeing everything, want %d", e.FreeBlocks(), free)
	}
	if _, err := e.Step([]engine.Item{{Seq: e.NewSequence(), Tokens: []int{int(1e6)}}}); err == nil {
		t.Error("an out-of-vocabulary token was accepted")
	}
}

// TestKVCacheFraction: sized from the memory left, the cache holds at most
// MaxSeqs full contexts; a fraction too small for one context is an error.
func TestKVCacheFraction(t *testing.T) {
	m := tinyModel(t, tensor.F32)
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 64, MaxSeqs: 3, KVCacheFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.KVSpec().Blocks; got != 3*4 {
		t.Errorf("%d blocks, want 12 (3 contexts of 64 tokens in blocks of 16)", got)
	}
	if e.KVBytes() != e.KVSpec().Bytes() {
		t.Errorf("KVBytes %d, spec %d", e.KVBytes(), e.KVSpec().Bytes())
	}
	e.Close()
	if _, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 64, KVCacheFraction: 1e-15}); err == nil || !strings.Contains(err.Error(), "less than one context") {
		t.Errorf("a fraction too small: %v", err)
	}
}

// TestDefaultContext: without a context length an engine serves the
// model's own when the memory holds it, and when it does not, what the
// KV cache's share of the memory holds for one sequence (a model of 2M
// positions against a thousandth of the free memory), at most ContextCap;
// an explicit context that does not fit stays an error.
func TestDefaultContext(t *testing.T) {
	c := model.Config{Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 2, NumHeads: 2, NumKVHeads: 2, HeadDim: 8,
		VocabSize: 32, MaxPositions: 512, RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32}
	e, err := engine.New(testmodel.Random(c, 1), &cpu.Backend{}, engine.Options{KVCacheFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if e.ContextLen() != 512 {
		t.Errorf("context %d, want the model's 512", e.ContextLen())
	}
	e.Close()
	// A cap bounds the default (a draft model's, by its target's).
	e, err = engine.New(testmodel.Random(c, 1), &cpu.Backend{}, engine.Options{KVCacheFraction: 0.5, ContextCap: 300})
	if err != nil {
		t.Fatal(err)
	}
	if e.ContextLen() != 300 {
		t.Errorf("context %d, want the cap's 300", e.ContextLen())
	}
	e.Close()
	c.MaxPositions = 1 << 21
	m := testmodel.Random(c, 1)
	e, err = engine.New(m, &cpu.Backend{}, engine.Options{KVCacheFraction: 1e-3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, spec := e.ContextLen(), e.KVSpec()
	t.Logf("context %d of %d, %d blocks", ctx, c.MaxPositions, spec.Blocks)
	if ctx >= c.MaxPositions || ctx < engine.MinAutoContextLen || ctx != spec.Blocks*spec.BlockSize {
		t.Errorf("context %d (model %d) in a cache of %d blocks of %d", ctx, c.MaxPositions, spec.Blocks, spec.BlockSize)
	}
	s := e.NewSequence()
	if _, err := e.Prefill(s, []int{1, 2, 3}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: c.MaxPositions, KVCacheFraction: 1e-3}); err == nil || !strings.Contains(err.Error(), "less than one context") {
		t.Errorf("an explicit context that does not fit: %v", err)
	}
}

// TestPrefixCaching: a sequence whose prompt starts like an earlier one
// starts with that one's full blocks (never the last token), its logits
// match a cache-less engine's, and cached blocks are given up when blocks
// run short.
func TestPrefixCaching(t *testing.T) {
	m := tinyModel(t, tensor.F32)
	prompt := make([]int, 60)
	for i := range prompt {
		prompt[i] = (i*37 + 5) % 256
	}
	longer := append(append([]int(nil), prompt...), 7, 8, 9)
	run := func(e *engine.Engine, s *engine.Sequence, toks []int) []float32 {
		l, err := e.Prefill(s, toks[s.Len():], false)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...)
	}
	plain, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 128, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	want := run(plain, plain.NewSequenceFor(longer), longer)

	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 128, MaxSeqs: 2, KVBlocks: 6, PrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	first := e.NewSequenceFor(prompt)
	if first.Len() != 0 {
		t.Fatalf("an empty cache gave %d tokens", first.Len())
	}
	run(e, first, prompt)
	e.Free(first) // its 3 full blocks stay cached, unreferenced
	if e.FreeBlocks() != 6 {
		t.Errorf("%d blocks available after free, want 6 (cached ones count)", e.FreeBlocks())
	}
	second := e.NewSequenceFor(longer)
	if second.Len() != 48 {
		t.Fatalf("second sequence starts with %d cached tokens, want 48 (3 full blocks)", second.Len())
	}
	got := run(e, second, longer)
	var diff, norm float64
	for i := range want {
		diff = math.Max(diff, math.Abs(float64(got[i]-want[i])))
		norm = math.Max(norm, math.Abs(float64(want[i])))
	}
	if diff/norm > 1e-5 {
		t.Errorf("logits after a prefix hit differ: ‖Δ‖∞/‖ref‖∞ = %.3g", diff/norm)
	}
	if st := e.PrefixStats(); st.Queries != 60+63 || st.Hits != 48 {
		t.Errorf("prefix stats %+v, want 123 queries, 48 hits", st)
	}
	e.Free(second)
	// Another prompt needs all 6 blocks: the cached ones are evicted.
	other := make([]int, 90)
	for i := range other {
		other[i] = (i*11 + 3) % 256
	}
	third := e.NewSequenceFor(other)
	run(e, third, other)
	e.Free(third)
	if again := e.NewSequenceFor(longer); again.Len() != 0 {
		t.Errorf("evicted prefix still found: %d tokens", again.Len())
	}
}

// TestForkCopyOnWrite: a forked sequence shares its parent's blocks; the
// first write into the shared partial block copies it, and both continue
// exactly as sequences computed from scratch would; with a float32 and an
// FP8 KV cache.
func TestForkCopyOnWrite(t *testing.T) {
	m := tinyModel(t, tensor.F32)
	for _, fp8 := range []bool{false, true} {
		t.Run(fmt.Sprintf("fp8=%v", fp8), func(t *testing.T) { forkCopyOnWrite(t, m, fp8) })
	}
}

func forkCopyOnWrite(t *testing.T, m *model.Model, fp8 bool) {
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 64, MaxSeqs: 4, KVCacheFP8: fp8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompt := make([]int, 20) // one full block of 16 and a partial one
	for i := range prompt {
		prompt[i] = (i*29 + 3) % 256
	}
	step := func(s *engine.Sequence, tok int) []float32 {
		l, err := e.Step([]engine.Item{{Seq: s, Tokens: []int{tok}}})
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...)
	}
	fresh := func(tok int) []float32 {
		s := e.NewSequence()
		defer e.Free(s)
		l, err := e.Prefill(s, append(append([]int(nil), prompt...), tok), false)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), l...)
	}
	wantA, wantB := fresh(7), fresh(9)
	total := e.FreeBlocks()
	a := e.NewSequence()
	if _, err := e.Prefill(a, prompt, false); err != nil {
		t.Fatal(err)
	}
	b := e.Fork(a)
	if e.FreeBlocks() != total-2 {
		t.Errorf("after the fork %d blocks free, want %d (shared, not copied)", e.FreeBlocks(), total-2)
	}
	if need := e.BlocksToGrow(b, 1); need != 1 {
		t.Errorf("the fork needs %d blocks to write, want 1 (the copy of the partial block)", need)
	}
	gotB := step(b, 9)
	gotA := step(a, 7)
	if e.Copies() != 1 {
		t.Errorf("%d copies on write, want 1 (the second writer owns the block alone by then)", e.Copies())
	}
	for name, pair := range map[string][2][]float32{"parent": {gotA, wantA}, "fork": {gotB, wantB}} {
		var diff, norm float64
		for i := range pair[1] {
			diff = math.Max(diff, math.Abs(float64(pair[0][i]-pair[1][i])))
			norm = math.Max(norm, math.Abs(float64(pair[1][i])))
		}
		if diff/norm > 1e-5 {
			t.Errorf("%s: ‖Δ‖∞/‖ref‖∞ = %.3g", name, diff/norm)
		}
	}
	e.Free(a)
	e.Free(b)
	if e.FreeBlocks() != total {
		t.Errorf("%d blocks free at the end, want %d", e.FreeBlocks(), total)
	}
}

// TestLongContextPrefill: a model of 32,768 positions (llama3 rope scaling)
// takes its own context by default and prefills 32,000 tokens, the same
// last logits (within 1e-4) whether in the default chunks or in chunks of
// 100 tokens (the cache read back across 320 steps). The GPU's 32k prefill
// is benchmarked on the GPU machine.
func TestLongContextPrefill(t *testing.T) {
	if testing.Short() {
		t.Skip("a 32k prefill twice: about 20 s")
	}
	c := model.Config{Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 1, NumHeads: 2, NumKVHeads: 1, HeadDim: 8,
		VocabSize: 64, MaxPositions: 32768, RMSNormEps: 1e-5, RopeTheta: 500000, DType: tensor.F32,
		RopeScaling: model.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	m := testmodel.Random(c, 1)
	toks := make([]int, 32000)
	for i := range toks {
		toks[i] = (i*7 + i/13) % 64
	}
	last := func(buckets []int) []float32 {
		e, err := engine.New(m, &cpu.Backend{}, engine.Options{KVCacheFraction: 0.5, Buckets: buckets})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.ContextLen() != 32768 {
			t.Fatalf("context %d, want the model's 32768", e.ContextLen())
		}
		l, err := e.Prefill(e.NewSequence(), toks, false)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}
	if d := relErrInf(last([]int{1, 100}), last(nil)); d > 1e-4 {
		t.Errorf("chunks of 100 against the default's: ‖Δ‖∞/‖ref‖∞ = %.3g", d)
	}
}
