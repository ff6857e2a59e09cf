package demo

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"slices"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/eval"
)

type reference struct {
	Prompts []struct {
		Text       string `json:"text"`
		InputIDs   []int  `json:"input_ids"`
		GreedyIDs  []int  `json:"greedy_ids"`
		GreedyText string `json:"greedy_text"`
	} `json:"prompts"`
	LogitsPrompt int    `json:"logits_prompt"`
	LogitsShape  [2]int `json:"logits_shape"`
}

func readJSON(t *testing.T, path string, v any) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func newEngine(t *testing.T) (*engine.Engine, func([]int) string, func(string) []int) {
	m, tok, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, tok.Decode, func(s string) []int { return tok.Encode(s, true) }
}

// TestGreedyMatchesTransformers checks that the embedded model, tokenized and
// run by kiln, gives transformers' greedy continuations (recorded by
// tools/demo-model/train.py) and its logits.
func TestGreedyMatchesTransformers(t *testing.T) {
	var ref reference
	readJSON(t, "testdata/reference.json", &ref)
	e, decode, encode := newEngine(t)
	for _, p := range ref.Prompts {
		if ids := encode(p.Text); !slices.Equal(ids, p.InputIDs) {
			t.Errorf("%q encodes to %v, transformers %v", p.Text, ids, p.InputIDs)
		}
		var got []int
		_, err := e.Generate(p.InputIDs, engine.SamplingParams{MaxTokens: len(p.GreedyIDs), IgnoreStop: true}, func(id int) bool {
			got = append(got, id)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, p.GreedyIDs) {
			t.Errorf("%q: greedy ids\n got %v\nwant %v", p.Text, got, p.GreedyIDs)
		}
		if text := decode(got); text != p.GreedyText {
			t.Errorf("%q: greedy text %q, want %q", p.Text, text, p.GreedyText)
		}
	}
	raw, err := os.ReadFile("testdata/reference_logits.bin")
	if err != nil {
		t.Fatal(err)
	}
	ids := ref.Prompts[ref.LogitsPrompt].InputIDs
	logits, err := e.Prefill(e.NewSequence(), ids, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 4*len(logits) || ref.LogitsShape[0] != len(ids) {
		t.Fatalf("reference logits of %d bytes for %d values", len(raw), len(logits))
	}
	var diff, norm float64
	for i, x := range logits {
		want := float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		diff = math.Max(diff, math.Abs(float64(x)-want))
		norm = math.Max(norm, math.Abs(want))
	}
	if diff/norm > 1e-4 {
		t.Errorf("logits: ‖out−ref‖∞/‖ref‖∞ = %.3g > 1e-4", diff/norm)
	}
}

// TestHeldOutPerplexity checks kiln's perplexity on the held-out books
// against the training script's (transformers, float32) within 1%.
func TestHeldOutPerplexity(t *testing.T) {
	var ref struct {
		Window, Stride int
		Books          map[string]struct {
			File       string  `json:"file"`
			NTokens    int     `json:"n_tokens"`
			NPredicted int     `json:"n_predicted"`
			PPL        float64 `json:"ppl"`
		} `json:"books"`
	}
	readJSON(t, "testdata/perplexity.json", &ref)
	e, _, _ := newEngine(t)
	m, tok, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	books := []string{"Ruth", "Jude", "Ecclesiastes", "Mark"}
	if testing.Short() {
		books = books[:2]
	}
	for _, name := range books {
		b, ok := ref.Books[name]
		if !ok {
			t.Fatalf("no reference for %s", name)
		}
		text, err := os.ReadFile("testdata/" + b.File)
		if err != nil {
			t.Fatal(err)
		}
		ids := tok.Encode(string(text), false)
		if len(ids) != b.NTokens {
			t.Errorf("%s: %d tokens, transformers' tokenizer gave %d", name, len(ids), b.NTokens)
		}
		got, err := eval.SlidingPerplexity(e, ids, ref.Window, ref.Stride)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: perplexity %.4f, transformers %.4f", name, got.PPL, b.PPL)
		if got.Predicted != b.NPredicted || math.Abs(got.PPL-b.PPL) > 0.01*b.PPL {
			t.Errorf("%s: perplexity %.4f over %d tokens, transformers %.4f over %d", name, got.PPL, got.Predicted, b.PPL, b.NPredicted)
		}
	}
}
