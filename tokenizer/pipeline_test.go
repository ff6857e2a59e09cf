package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kiln/internal/testshared"
)

var splitTexts = []string{
	"Hello world", "  two leading", "trailing  ", "a   b\t\tc\n\n d", "don't WON'T I'm 'll ''s",
	"1234567 3.14", "café naïve", "你好，世界", "non\u00a0breaking\u00a0 space\u3000x", "windows\r\n\r\nline",
	"   \n  mixed \t whitespace \n", "$19.99 (20%)", "a+b=c;\n\n", "🙂👋🏽 hi", "\x00x", "end.", "",
}

func spans(sp splitter, s string) []string {
	var out []string
	for _, m := range sp.matches(s, nil) {
		out = append(out, s[m[0]:m[1]])
	}
	return out
}

// TestRegexFallbackAgrees checks the Go-regexp fallback (with the emulated
// look-ahead and Unicode \s) against the hand-written scanners.
func TestRegexFallbackAgrees(t *testing.T) {
	for _, pat := range []string{patGPT2, patLlama3, patQwen2} {
		hand, err := newRegexSplitter(pat)
		if err != nil {
			t.Fatal(err)
		}
		generic, err := compileSplitRegex(pat)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := generic.(*regexSplitter); !ok {
			t.Fatalf("fallback for %q is %T", pat, generic)
		}
		for _, s := range splitTexts {
			if a, b := spans(hand, s), spans(generic, s); !slices.Equal(a, b) {
				t.Errorf("pattern %.20q text %q:\nscanner %q\nregexp  %q", pat, s, a, b)
			}
		}
	}
}

func TestScanners(t *testing.T) {
	tests := []struct {
		sp   splitter
		text string
		want []string
	}{
		{gpt2Scanner{}, "Hello  world's 123!!", []string{"Hello", " ", " world", "'s", " 123", "!!"}},
		{gpt2Scanner{}, "a \n b", []string{"a", " \n", " b"}},
		{llama3Scanner{3}, "abc 12345 DON'T\r\n\n x", []string{"abc", " ", "123", "45", " DON", "'T", "\r\n\n", " x"}},
		{llama3Scanner{1}, "x 123", []string{"x", " ", "1", "2", "3"}},
		{llama3Scanner{3}, "\tand ...\n\nz", []string{"\tand", " ...\n\n", "z"}},
	}
	for _, tc := range tests {
		if got := spans(tc.sp, tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("%T %q: got %q, want %q", tc.sp, tc.text, got, tc.want)
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	sp := stringSplitter{"-"}
	tests := []struct {
		beh  splitBehavior
		want []string
	}{
		{behIsolated, []string{"a", "-", "b", "-", "-", "c"}},
		{behRemoved, []string{"a", "b", "c"}},
		{behMergedWithPrevious, []string{"a-", "b--", "c"}},
		{behMergedWithNext, []string{"a", "-b", "-", "-c"}},
		{behContiguous, []string{"a", "-", "b", "--", "c"}},
	}
	s := "a-b--c"
	for _, tc := range tests {
		got, _ := applySplit(sp, tc.beh, false, s, nil, nil)
		var strs []string
		for _, g := range got {
			strs = append(strs, s[g[0]:g[1]])
		}
		if !slices.Equal(strs, tc.want) {
			t.Errorf("behavior %d: got %q, want %q", tc.beh, strs, tc.want)
		}
	}
}

// A legacy SentencePiece-style file: Metaspace pre-tokenizer and decoder,
// RobertaProcessing, added tokens with lstrip/rstrip/single_word.
const metaspaceJSON = `{
 "added_tokens": [
  {"id": 0, "content": "<s>", "special": true},
  {"id": 1, "content": "</s>", "special": true},
  {"id": 2, "content": "<mask>", "lstrip": true, "special": true},
  {"id": 3, "content": "<r>", "rstrip": true, "special": true},
  {"id": 4, "content": "cat", "single_word": true}
 ],
 "normalizer": null,
 "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
 "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0]},
 "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
 "model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"<s>": 0, "</s>": 1, "<mask>": 2, "<r>": 3, "cat": 4,
   "<unk>": 5, "▁": 6, "a": 7, "b": 8, "▁a": 9, "▁ab": 10, "c": 11, "t": 12},
  "merges": ["▁ a", "▁a b"]}
}`

func TestMetaspaceRoberta(t *testing.T) {
	tk, err := ParseHFJSON([]byte(metaspaceJSON))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text    string
		special bool
		want    []int
	}{
		{"ab a", false, []int{10, 9}},
		{"ab a", true, []int{0, 10, 9, 1}},
		{"a <mask>b", false, []int{9, 2, 6, 8}}, // lstrip eats the space before <mask>
		{"<r>  a", false, []int{3, 9}},          // rstrip eats the spaces after <r>
		{"a cat", false, []int{9, 6, 4}},        // a whole word: matched
		{"acat", false, []int{9, 11, 7, 12}},    // inside a word: not matched
		{"a x", false, []int{9, 6, 5}},          // unknown character
	}
	for _, tc := range tests {
		if got := tk.Encode(tc.text, tc.special); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q, %v) = %v, want %v", tc.text, tc.special, got, tc.want)
		}
	}
	if tk.BOS() != 0 || !slices.Equal(tk.EOS(), []int{1}) {
		t.Errorf("bos %d eos %v", tk.BOS(), tk.EOS())
	}
	for _, tc := range []struct {
		ids  []int
		want string
	}{
		{[]int{10, 9}, "ab a"},
		{[]int{6, 6, 9}, "  a"}, // HF drops every "▁" of the first token only
		{[]int{0, 9}, "<s> a"},
	} {
		if got := tk.Decode(tc.ids); got != tc.want {
			t.Errorf("Decode(%v) = %q, want %q", tc.ids, got, tc.want)
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", string(tinyByteLevelJSON()))
	write("tokenizer_config.json", `{"bos_token": {"content": "<|endoftext|>"}, "eos_token": "<|endoftext|>",
		"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}`)
	write("generation_config.json", `{"eos_token_id": [261, 7]}`)
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tk.BOS() != 261 || !slices.Equal(tk.EOS(), []int{261, 7}) || tk.ChatTemplate() != "D" {
		t.Errorf("bos %d eos %v template %q", tk.BOS(), tk.EOS(), tk.ChatTemplate())
	}
	if got := tk.Encode("the", true); len(got) == 0 || got[0] != 261 {
		t.Errorf("Encode with BOS: %v", got)
	}
	if got := tk.Encode(" the<|endoftext|>", false); !slices.Equal(got, []int{258, 261}) {
		t.Errorf("Encode: %v", got)
	}
	write("tokenizer_config.json", `{`)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("broken config: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing path: no error")
	}
}

func TestParseHFJSONMalformed(t *testing.T) {
	bad := map[string]string{
		"not json":         `{"model":`,
		"array":            `[]`,
		"no model":         `{}`,
		"unigram":          `{"model":{"type":"Unigram","vocab":[]}}`,
		"negative id":      `{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`,
		"huge id":          `{"model":{"type":"BPE","vocab":{"a":999999999},"merges":[]}}`,
		"merge missing":    `{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}`,
		"merge no space":   `{"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}}`,
		"merge triple":     `{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a","a"]]}}`,
		"merge number":     `{"model":{"type":"BPE","vocab":{"a":0},"merges":[5]}}`,
		"unk missing":      `{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"<unk>"}}`,
		"added negative":   `{"added_tokens":[{"id":-3,"content":"x"}],"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad normalizer":   `{"normalizer":{"type":"NFKD"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad pre":          `{"pre_tokenizer":{"type":"BertPreTokenizer"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad regex":        `{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?<=x)"}},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad behavior":     `{"pre_tokenizer":{"type":"Split","pattern":{"String":"x"},"behavior":"Odd"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad decoder":      `{"decoder":{"type":"WordPiece"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"bad post":         `{"post_processor":{"type":"Mystery"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"template range":   `{"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}],"special_tokens":{"x":{"ids":[9]}}},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"template missing": `{"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}]},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"roberta bad":      `{"post_processor":{"type":"RobertaProcessing","sep":["</s>"],"cls":["<s>",0]},"model":{"type":"BPE","vocab":{"<s>":0},"merges":[]}}`,
		"replace no pat":   `{"normalizer":{"type":"Replace","content":"x"},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"strip content":    `{"decoder":{"type":"Strip","content":"ab","start":1},"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"subword prefix":   `{"model":{"type":"BPE","vocab":{},"merges":[],"continuing_subword_prefix":"##"}}`,
	}
	for name, data := range bad {
		if _, err := ParseHFJSON([]byte(data)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestLossy checks the from_utf8_lossy rule used by byte-level decoding.
func TestLossy(t *testing.T) {
	tests := []struct{ in, want string }{
		{"abc", "abc"},
		{"\xf0\x9f\x99", "\uFFFD"},             // truncated 4-byte: one replacement
		{"\xf0\x9f\x99x", "\uFFFDx"},           //
		{"\xff\xfe", "\uFFFD\uFFFD"},           // two invalid bytes
		{"\xe0\x80\x80", "\uFFFD\uFFFD\uFFFD"}, // overlong: each byte
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate
		{"a\xc3", "a\uFFFD"},
	}
	for _, tc := range tests {
		if got := lossy([]byte(tc.in)); got != tc.want {
			t.Errorf("lossy(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRealConfigs loads the real tokenizer_config.json files (and SmolLM3's
// chat_template.jinja) beside a tiny tokenizer.json that has their chat
// tokens, in a temporary directory.
func TestRealConfigs(t *testing.T) {
	tj := strings.Replace(string(tinyByteLevelJSON()), `"added_tokens":[`,
		`"added_tokens":[{"id":262,"content":"<|im_start|>","special":true},{"id":263,"content":"<|im_end|>","special":true},`, 1)
	cases := []struct {
		name     string
		bos      int
		template bool
	}{
		{"qwen2.5-instruct", -1, true},
		{"qwen3", -1, true},
		{"smollm2-135m-instruct", 262, false},
		{"smollm3", -1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := testshared.Path(t, "tokenizers", tc.name)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tj), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"tokenizer_config.json", "chat_template.jinja"} {
				if data, err := os.ReadFile(filepath.Join(src, f)); err == nil {
					if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			tk, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			// No bos_token in the config: the template's <|endoftext|> stays.
			wantBOS := tc.bos
			if wantBOS < 0 {
				wantBOS = 261
			}
			if tk.BOS() != wantBOS || !slices.Equal(tk.EOS(), []int{263}) {
				t.Errorf("bos %d eos %v", tk.BOS(), tk.EOS())
			}
			if got := tk.ChatTemplate() != ""; got != tc.template {
				t.Errorf("chat template present = %v", got)
			}
			if ids := tk.Encode("<|im_start|>user\nhi<|im_end|>", false); ids[0] != 262 || ids[len(ids)-1] != 263 {
				t.Errorf("chat tokens not split out: %v", ids)
			}
		})
	}
}
