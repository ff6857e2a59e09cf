package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"kiln/internal/testshared"
)

// ggufFromHF converts a tokenizer.json into the GGUF metadata a converter
// would write: "gpt2" kind with merges for byte-level files, "llama" kind
// with scores for SentencePiece-style ones (score = minus the rank of the
// first merge producing the token, so merge order becomes score order).
func ggufFromHF(t *testing.T, path, kind, pre string, generic bool) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		AddedTokens []hfAddedToken `json:"added_tokens"`
		Model       struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	n := len(f.Model.Vocab)
	for _, a := range f.AddedTokens {
		n = max(n, a.ID+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for s, id := range f.Model.Vocab {
		tokens[id] = s
		types[id] = ggufNormal
		if _, ok := parseByteToken(s); ok && kind == "llama" {
			types[id] = ggufByte
		}
	}
	for _, a := range f.AddedTokens {
		tokens[a.ID] = a.Content
		types[a.ID] = ggufControl
		if a.Content == "<unk>" {
			types[a.ID] = ggufUnknown
		}
	}
	var merges []string
	for _, raw := range f.Model.Merges {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			var p []string
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			s = p[0] + " " + p[1]
		}
		merges = append(merges, s)
	}
	md := map[string]any{
		"tokenizer.ggml.model":         kind,
		"tokenizer.ggml.tokens":        tokens,
		"tokenizer.ggml.token_type":    types,
		"tokenizer.ggml.bos_token_id":  uint32(1),
		"tokenizer.ggml.eos_token_id":  uint32(2),
		"tokenizer.chat_template":      "{{ messages }}",
		"tokenizer.ggml.add_bos_token": true,
	}
	if kind == "gpt2" {
		md["tokenizer.ggml.merges"] = merges
		md["tokenizer.ggml.pre"] = pre
	} else {
		scores := make([]float32, n)
		for i := range scores {
			scores[i] = -1e9
		}
		for rank := len(merges) - 1; rank >= 0; rank-- {
			a, b, _ := strings.Cut(merges[rank], " ")
			scores[f.Model.Vocab[a+b]] = -float32(rank)
		}
		md["tokenizer.ggml.scores"] = scores
	}
	if generic { // the same values as a generic GGUF reader returns them
		anyList := func(l []any) []any { return l }
		var ts, ty []any
		for i := range tokens {
			ts = append(ts, tokens[i])
			ty = append(ty, types[i])
		}
		md["tokenizer.ggml.tokens"] = anyList(ts)
		md["tokenizer.ggml.token_type"] = anyList(ty)
		md["tokenizer.ggml.bos_token_id"] = int32(1)
		if kind == "gpt2" {
			var ms []any
			for _, m := range merges {
				ms = append(ms, m)
			}
			md["tokenizer.ggml.merges"] = ms
		}
	}
	return md
}

func TestFromGGUF(t *testing.T) {
	cases := []struct {
		name, kind, pre string
		path            []string
		generic         bool
	}{
		{"gpt2", "gpt2", "gpt-2", []string{"tokenizers", "gpt2", "tokenizer.json"}, false},
		{"llama3.2", "gpt2", "llama-bpe", []string{"tokenizers", "llama3.2-bpe", "tokenizer.json"}, true},
		{"phi-3-mini", "llama", "", []string{"tokenizers", "phi-3-mini", "tokenizer.json"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			md := ggufFromHF(t, testshared.Path(t, tc.path...), tc.kind, tc.pre, tc.generic)
			tk, err := FromGGUF(md)
			if err != nil {
				t.Fatal(err)
			}
			matched := 0
			es := readExpected(t, tc.name)
			for i, e := range es {
				got := tk.Encode(e.Text, false)
				if !slices.Equal(got, e.IDs) {
					t.Errorf("entry %d %q: ids\n got %v\nwant %v", i, short(e.Text), got, e.IDs)
					continue
				}
				if dec := tk.Decode(e.IDs); dec != e.Decoded {
					t.Errorf("entry %d %q: decoded %q, want %q", i, short(e.Text), dec, e.Decoded)
					continue
				}
				matched++
			}
			t.Logf("%s via GGUF: %d/%d entries match", tc.name, matched, len(es))
			for _, e := range es {
				checkStream(t, tk, e.IDs)
			}
			if got := tk.Encode("a", true); got[0] != 1 {
				t.Errorf("add_bos_token: %v", got)
			}
			if tk.BOS() != 1 || !slices.Equal(tk.EOS(), []int{2}) || tk.ChatTemplate() != "{{ messages }}" {
				t.Errorf("bos %d eos %v template %q", tk.BOS(), tk.EOS(), tk.ChatTemplate())
			}
		})
	}
}

func TestFromGGUFMalformed(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"tokenizer.ggml.model":      "llama",
			"tokenizer.ggml.tokens":     []string{"<unk>", "<s>", "</s>", "▁", "a", "▁a"},
			"tokenizer.ggml.scores":     []float32{0, 0, 0, -1, -2, -3},
			"tokenizer.ggml.token_type": []int32{2, 3, 3, 1, 1, 1},
		}
	}
	if tk, err := FromGGUF(base()); err != nil {
		t.Fatal(err)
	} else if got := tk.Encode("a a", false); !slices.Equal(got, []int{5, 5}) {
		t.Errorf("tiny llama vocab: %v", got)
	}
	mods := map[string]func(map[string]any){
		"no model":       func(m map[string]any) { delete(m, "tokenizer.ggml.model") },
		"unknown model":  func(m map[string]any) { m["tokenizer.ggml.model"] = "bert" },
		"no tokens":      func(m map[string]any) { delete(m, "tokenizer.ggml.tokens") },
		"tokens type":    func(m map[string]any) { m["tokenizer.ggml.tokens"] = 42 },
		"token elem":     func(m map[string]any) { m["tokenizer.ggml.tokens"] = []any{"a", 3} },
		"short scores":   func(m map[string]any) { m["tokenizer.ggml.scores"] = []float32{0} },
		"scores type":    func(m map[string]any) { m["tokenizer.ggml.scores"] = "x" },
		"short types":    func(m map[string]any) { m["tokenizer.ggml.token_type"] = []int32{1} },
		"bos range":      func(m map[string]any) { m["tokenizer.ggml.bos_token_id"] = uint32(99) },
		"bos type":       func(m map[string]any) { m["tokenizer.ggml.bos_token_id"] = "1" },
		"eos negative":   func(m map[string]any) { m["tokenizer.ggml.eos_token_id"] = int32(-1) },
		"add_bos type":   func(m map[string]any) { m["tokenizer.ggml.add_bos_token"] = 1 },
		"template type":  func(m map[string]any) { m["tokenizer.chat_template"] = 1 },
		"gpt2 no merges": func(m map[string]any) { m["tokenizer.ggml.model"] = "gpt2" },
		"gpt2 bad merge": func(m map[string]any) {
			m["tokenizer.ggml.model"] = "gpt2"
			m["tokenizer.ggml.merges"] = []string{"nospace"}
		},
		"gpt2 miss merge": func(m map[string]any) {
			m["tokenizer.ggml.model"] = "gpt2"
			m["tokenizer.ggml.merges"] = []string{"x y"}
		},
		"gpt2 bad pre": func(m map[string]any) {
			m["tokenizer.ggml.model"] = "gpt2"
			m["tokenizer.ggml.merges"] = []string{}
			m["tokenizer.ggml.pre"] = "mystery"
		},
	}
	for name, mod := range mods {
		m := base()
		mod(m)
		if _, err := FromGGUF(m); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := FromGGUF(nil); err == nil {
		t.Error("nil metadata: no error")
	}
}

// TestGGUFMetadataRoundTrip writes byte-level BPE tokenizers as GGUF
// metadata and reads them back: the rebuilt tokenizer gives every reference
// encoding of Hugging Face tokenizers, and encodes the start of the corpus
// as the original does; the pre-tokenizer is the one llama.cpp names for
// the model. A SentencePiece tokenizer is refused.
func TestGGUFMetadataRoundTrip(t *testing.T) {
	corpus, err := os.ReadFile(testshared.Path(t, "corpora", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(corpus[:20000])
	for _, tc := range []struct {
		name string
		path []string
		pre  string
	}{
		{"gpt2", []string{"tokenizers", "gpt2", "tokenizer.json"}, "gpt-2"},
		{"llama3.2", []string{"tokenizers", "llama3.2-bpe", "tokenizer.json"}, "llama-bpe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := loadShared(t, tc.path...)
			md, err := tk.GGUFMetadata()
			if err != nil {
				t.Fatal(err)
			}
			if md["tokenizer.ggml.pre"] != tc.pre {
				t.Errorf("pre-tokenizer %v, want %s", md["tokenizer.ggml.pre"], tc.pre)
			}
			back, err := FromGGUF(md)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range readExpected(t, tc.name) {
				if got := back.Encode(e.Text, false); !slices.Equal(got, e.IDs) {
					t.Fatalf("entry %d %q: ids\n got %v\nwant %v", i, short(e.Text), got, e.IDs)
				}
			}
			for _, special := range []bool{false, true} {
				if !slices.Equal(back.Encode(text, special), tk.Encode(text, special)) {
					t.Errorf("the corpus encodes differently (special tokens %v)", special)
				}
			}
			if back.BOS() != tk.BOS() || !slices.Equal(back.EOS()[:min(1, len(back.EOS()))], tk.EOS()[:min(1, len(tk.EOS()))]) {
				t.Errorf("bos/eos %d %v, want %d %v", back.BOS(), back.EOS(), tk.BOS(), tk.EOS())
			}
		})
	}
	if _, err := loadShared(t, "tokenizers", "phi-3-mini").GGUFMetadata(); err == nil {
		t.Error("a SentencePiece tokenizer was written as GGUF metadata")
	}
}
