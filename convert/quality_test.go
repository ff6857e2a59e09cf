package convert

import (
	"os"
	"path/filepath"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/eval"
	"kiln/internal/testshared"
	"kiln/model"
	"kiln/tensor"
	"kiln/tokenizer"
)

const demoDir = "../demo/files"

// demoAs writes the demo model (bf16) as a GGUF file with matrices in dt
// and returns an engine on it.
func demoAs(t *testing.T, dt tensor.DType) *engine.Engine {
	t.Helper()
	src, err := model.Load(demoDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), dt.String()+".gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GGUF(f, src, dt); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if w := m.Tensors["model.layers.0.mlp.down_proj.weight"]; w.DType != dt {
		t.Fatalf("down_proj stored as %v, want %v", w.DType, dt)
	}
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestQuantizedQuality measures the demo model's perplexity on the start of
// the public-domain corpus (War and Peace, the first 8,000 bytes, windows of
// 512 tokens) stored as bf16 (its own dtype), Q8_0 and Q4_0, and fails when
// a format's mean negative log-likelihood moves from bf16's by more than its
// bound: 0.005 nats for Q8_0, 0.03 for Q4_0 (about 7 and 10 times the moves
// measured, 0.0007 and -0.0026; docs/PERF.md has the figures).
// It also checks that Q8_0's greedy continuation of a prompt is bf16's,
// token for token, for 64 tokens.
func TestQuantizedQuality(t *testing.T) {
	text, err := os.ReadFile(testshared.Path(t, "corpora", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(demoDir)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(text[:8000]), true)
	prompt := tok.Encode("In the beginning God created", true)
	nll := map[tensor.DType]float64{}
	greedy := map[tensor.DType][]int{}
	for _, dt := range []tensor.DType{tensor.BF16, tensor.Q8_0, tensor.Q4_0} {
		e := demoAs(t, dt)
		p, err := eval.SlidingPerplexity(e, ids, 512, 256)
		if err != nil {
			t.Fatal(err)
		}
		nll[dt] = p.NLL / float64(p.Predicted)
		t.Logf("%v: perplexity %.4f over %d tokens (mean NLL %.5f nats)", dt, p.PPL, p.Tokens, nll[dt])
		greedy[dt] = generate(t, e, prompt, 64)
	}
	for dt, bound := range map[tensor.DType]float64{tensor.Q8_0: 0.005, tensor.Q4_0: 0.03} {
		if d := nll[dt] - nll[tensor.BF16]; d > bound || d < -bound {
			t.Errorf("%v: mean NLL %.5f against bf16's %.5f: moved %.5f nats, bound %g", dt, nll[dt], nll[tensor.BF16], d, bound)
		}
	}
	for i := range greedy[tensor.BF16] {
		if greedy[tensor.Q8_0][i] != greedy[tensor.BF16][i] {
			t.Fatalf("q8_0's greedy token %d is %d, bf16's %d", i, greedy[tensor.Q8_0][i], greedy[tensor.BF16][i])
		}
	}
}

// generate continues prompt greedily for n tokens.
func generate(t *testing.T, e *engine.Engine, prompt []int, n int) []int {
	t.Helper()
	s := e.NewSequence()
	defer e.Free(s)
	logits, err := e.Prefill(s, prompt, false)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for len(out) < n {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		out = append(out, best)
		if logits, err = e.Step([]engine.Item{{Seq: s, Tokens: []int{best}}}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
