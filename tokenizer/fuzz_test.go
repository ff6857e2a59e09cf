package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// tinyByteLevelJSON is a small GPT-2-style tokenizer.json: the full byte
// alphabet (so every input is encodable) plus a few merges.
func tinyByteLevelJSON() []byte {
	b2u, _ := bytesToUnicode()
	vocab := "{"
	for b := 0; b < 256; b++ {
		if b > 0 {
			vocab += ","
		}
		vocab += quoteJSON(string(b2u[b])) + ":" + itoa(b)
	}
	extra := []string{"Ġt", "he", "Ġthe", "in", "Ġa"}
	for i, e := range extra {
		vocab += "," + quoteJSON(e) + ":" + itoa(256+i)
	}
	vocab += "}"
	return []byte(`{"added_tokens":[{"id":261,"content":"<|endoftext|>","special":true}],
"normalizer":null,
"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|endoftext|>"}},{"Sequence":{"id":"A"}}],
 "special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[261],"tokens":["<|endoftext|>"]}}},
"decoder":{"type":"ByteLevel"},
"model":{"type":"BPE","vocab":` + vocab + `,"merges":["Ġ t","h e","Ġt he","i n",["Ġ","a"]]}}`)
}

func quoteJSON(s string) string {
	out := `"`
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			out += `\` + string(r)
		case r < 0x20:
			out += `\u00` + string("0123456789abcdef"[r>>4]) + string("0123456789abcdef"[r&15])
		default:
			out += string(r)
		}
	}
	return out + `"`
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

func FuzzLoadLlama2C(f *testing.F) {
	f.Add(makeLlama2C(5, []string{"<unk>", "<s>", "</s>", " ", "a", " a"}, []float32{0, 0, 0, 0, -1, -2}))
	f.Add([]byte{7, 0, 0, 0})
	f.Add([]byte{7, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := ParseLlama2C(data)
		if err != nil {
			return
		}
		ids := tk.Encode("a b\xff☃", true)
		_ = tk.Decode(ids)
	})
}

func FuzzLoadHFJSON(f *testing.F) {
	f.Add(tinyByteLevelJSON())
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"<unk>":0,"▁":1,"a":2},"merges":[],"unk_token":"<unk>","byte_fallback":true},
"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":-5},"merges":[]}}`))
	f.Add([]byte(`{"added_tokens":[{"id":99999999,"content":"x"}],"model":{"type":"BPE","vocab":{},"merges":[]}}`))
	f.Add([]byte(`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?!x)"}},"model":{"type":"BPE","vocab":{},"merges":[]}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := ParseHFJSON(data)
		if err != nil {
			return
		}
		ids := tk.Encode("Hello wörld <|endoftext|> 123\n\xff", true)
		_ = tk.Decode(ids)
		_ = tk.Decode([]int{0, 1, 2, -1, 1 << 30})
	})
}

// fuzzTokenizer is the real GPT-2 vocabulary when the shared data is there,
// else the tiny inline one.
func fuzzTokenizer(f *testing.F) *Tokenizer {
	dir := os.Getenv("KILN_SHARED_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared")
	}
	if p := filepath.Join(dir, "tokenizers", "gpt2", "tokenizer.json"); fileExists(p) {
		tk, err := Load(p)
		if err == nil {
			return tk
		}
	}
	tk, err := ParseHFJSON(tinyByteLevelJSON())
	if err != nil {
		f.Fatal(err)
	}
	return tk
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// FuzzEncode: byte-level BPE is lossless, so decode(encode(s)) == s for any
// valid UTF-8, and streaming must agree with batch decoding.
func FuzzEncode(f *testing.F) {
	tk := fuzzTokenizer(f)
	for _, s := range []string{"", " ", "Hello world", "  two\n\n spaces  ", "don't I'M", "1234567", "你好🙂\u200d", "<|endoftext|>x", "a\tb\r\nc", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		ids := tk.Encode(s, false)
		if got := tk.Decode(ids); got != s {
			t.Fatalf("round trip %q -> %v -> %q", s, ids, got)
		}
		d := tk.NewDecoder()
		out := ""
		for _, id := range ids {
			out += d.Add(id)
		}
		if out += d.Flush(); out != s {
			t.Fatalf("stream %q != %q", out, s)
		}
	})
}

// tinySentencePieceJSON is a Llama-2-style tokenizer.json: Prepend/Replace
// normalizer, byte fallback over all 256 <0xNN> tokens, and the
// Replace/ByteFallback/Fuse/Strip decoder.
func tinySentencePieceJSON() []byte {
	vocab := `"<unk>":0,"<s>":1,"</s>":2`
	for b := 0; b < 256; b++ {
		vocab += `,"` + byteTokenName(byte(b)) + `":` + itoa(3+b)
	}
	vocab += `,"▁":259,"a":260,"b":261,"▁a":262,"▁ab":263,"é":264`
	return []byte(`{"added_tokens":[{"id":0,"content":"<unk>","special":true},{"id":1,"content":"<s>","special":true},{"id":2,"content":"</s>","special":true}],
"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
"pre_tokenizer":null,
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"vocab":{` + vocab + `},"merges":["▁ a","▁a b"]}}`)
}

// FuzzStreamDecode: for every decoder mode, streaming output is valid UTF-8
// piece by piece and adds up to Decode.
func FuzzStreamDecode(f *testing.F) {
	var tks []*Tokenizer
	for _, data := range [][]byte{tinyByteLevelJSON(), tinySentencePieceJSON(), []byte(metaspaceJSON)} {
		tk, err := ParseHFJSON(data)
		if err != nil {
			f.Fatal(err)
		}
		tks = append(tks, tk)
	}
	l2c, err := ParseLlama2C(makeLlama2C(6, append([]string{"<unk>", "<s>", "</s>"}, func() []string {
		var l []string
		for b := 0; b < 256; b++ {
			l = append(l, byteTokenName(byte(b)))
		}
		return append(l, " ", "a", " a")
	}()...), make([]float32, 262)))
	if err != nil {
		f.Fatal(err)
	}
	tks = append(tks, l2c)
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{1, 0xf0 + 3, 0x9f + 3, 0x99 + 3, 0x82 + 3, 10})
	f.Add([]byte{200, 201, 202, 7, 7, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tk := range tks {
			ids := make([]int, len(data))
			for i, b := range data {
				ids[i] = int(b) * tk.VocabSize() / 256
				if b%2 == 1 {
					ids[i] = int(b) + 1 // byte-token region
				}
			}
			d := tk.NewDecoder()
			out := ""
			for _, id := range ids {
				s := d.Add(id)
				if !utf8.ValidString(s) {
					t.Fatalf("invalid UTF-8 %q from Add", s)
				}
				out += s
			}
			out += d.Flush()
			if want := tk.Decode(ids); out != want {
				t.Fatalf("stream %q != Decode %q (ids %v)", out, want, ids)
			}
		}
	})
}

// TestSentencePieceRoundTrip checks byte fallback both ways on the tiny file.
func TestSentencePieceRoundTrip(t *testing.T) {
	tk, err := ParseHFJSON(tinySentencePieceJSON())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"ab a", " ab", "é 🙂x", "  ", "a\x00b"} {
		ids := tk.Encode(s, true)
		if ids[0] != 1 {
			t.Errorf("no BOS: %v", ids)
		}
		if got := tk.Decode(ids[1:]); got != s {
			t.Errorf("round trip %q -> %v -> %q", s, ids, got)
		}
	}
	if got := tk.Encode("ab a", false); len(got) != 2 || got[0] != 263 || got[1] != 262 {
		t.Errorf("Encode(ab a) = %v", got)
	}
	// An invalid byte run decodes to one U+FFFD per byte, as HF does.
	if got := tk.Decode([]int{3 + 0xf0, 3 + 0x9f, 260}); got != "\uFFFD\uFFFDa" {
		t.Errorf("invalid run: %q", got)
	}
}

// FuzzSplitters: the hand-written scanners agree with Go's regexp running
// the same patterns (look-ahead emulated) on any valid UTF-8.
func FuzzSplitters(f *testing.F) {
	for _, s := range splitTexts {
		f.Add(s)
	}
	type pair struct{ hand, generic splitter }
	var pairs []pair
	for _, pat := range []string{patGPT2, patLlama3, patQwen2} {
		h, err1 := newRegexSplitter(pat)
		g, err2 := compileSplitRegex(pat)
		if err1 != nil || err2 != nil {
			f.Fatal(err1, err2)
		}
		pairs = append(pairs, pair{h, g})
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for _, p := range pairs {
			a, b := spans(p.hand, s), spans(p.generic, s)
			if len(a) != len(b) {
				t.Fatalf("%q: scanner %q regexp %q", s, a, b)
			}
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%q: scanner %q regexp %q", s, a, b)
				}
			}
		}
	})
}
