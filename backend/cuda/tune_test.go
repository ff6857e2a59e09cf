package cuda_test

import (
	"slices"
	"strings"
	"testing"

	"kiln/backend/cuda"
	"kiln/bench"
	"kiln/engine"
	"kiln/tensor"
	"kiln/tune"
)

// TestTuneCache: a first start with an empty cache times its choices
// (products of 16 rows: GEMV or cuBLASLt and the tile kernels' split,
// cuBLASLt's algorithms; decode attention's plan) and files them under the
// device; a second start with the same cache takes every one of them from
// it (Stats.Choices says "(tune cache)", nothing is timed) and gives the
// same logits bit for bit; tune.Full times them again; tune.Off leaves the
// directory untouched.
func TestTuneCache(t *testing.T) {
	s := bench.Shape{Name: "tc", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 256}
	model := randomModel(t, s, tensor.F32, 9)
	dir := t.TempDir()
	const seqs, steps = 16, 3
	run := func(mode, tuneDir string) ([][]float32, []string) {
		b := backendOf(t, "bf16")
		b.Tune, b.TuneDir = mode, tuneDir
		return decodeSteps(t, model, b, seqs, steps), b.Stats().Choices
	}
	cached := func(choices []string) (n int) {
		for _, c := range choices {
			if strings.HasSuffix(c, "(tune cache)") {
				n++
			}
		}
		return n
	}
	first, c1 := run(tune.Cached, dir)
	if cached(c1) != 0 || len(c1) == 0 {
		t.Fatalf("first start: %d choices, %d from the cache (want some, none):\n%s", len(c1), cached(c1), strings.Join(c1, "\n"))
	}
	second, c2 := run(tune.Cached, dir)
	if cached(c2) == 0 || cached(c2) != len(c2) {
		t.Fatalf("second start: %d of %d choices from the cache (want all):\n%s", cached(c2), len(c2), strings.Join(c2, "\n"))
	}
	for i := range first {
		if !slices.Equal(first[i], second[i]) {
			t.Fatalf("step %d: logits with the cached choices differ from the first start's", i)
		}
	}
	_, c3 := run(tune.Full, dir)
	if cached(c3) != 0 || len(c3) == 0 {
		t.Fatalf("tune.Full: %d of %d choices from the cache (want none)", cached(c3), len(c3))
	}
	off := t.TempDir()
	run(tune.Off, off)
	c, err := tune.Open(off, cuda.TuneDevice(backendOf(t, "bf16").Device))
	if err != nil || c.Len() != 0 {
		t.Fatalf("tune.Off left %v entries (%v)", c, err)
	}
	c, err = tune.Open(dir, cuda.TuneDevice(backendOf(t, "bf16").Device))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d entries filed; second start's choices:\n%s", c.Len(), strings.Join(c2, "\n"))
}

// decodeSteps prefills seqs sequences of 3 tokens of the model at path on
// b (an engine of 16 sequences at most) and returns the logits of steps
// decode steps of them all.
func decodeSteps(t *testing.T, path string, b *cuda.Backend, seqs, steps int) [][]float32 {
	t.Helper()
	e := openEngine(t, path, b, engine.Options{MaxSeqs: 16})
	var sq []*engine.Sequence
	for i := range seqs {
		q := e.NewSequence()
		if _, err := e.Prefill(q, []int{1, 2 + i, 3}, false); err != nil {
			t.Fatal(err)
		}
		sq = append(sq, q)
	}
	var out [][]float32
	for step := range steps {
		items := make([]engine.Item, seqs)
		for i := range items {
			items[i] = engine.Item{Seq: sq[i], Tokens: []int{7 + step + i}}
		}
		l, err := e.Step(items)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, slices.Clone(l))
	}
	return out
}
