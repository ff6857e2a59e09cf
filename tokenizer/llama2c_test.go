package tokenizer

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"kiln/internal/testshared"
)

var llama2cFiles = []struct {
	name string
	path []string
	size int
}{
	{"tok512", []string{"models", "stories260K", "tok512.bin"}, 512},
	{"llama2-32k", []string{"models", "llama2c-tokenizer-32k", "tokenizer.bin"}, 32000},
}

// Hand-checked against a line-by-line Python port of run.c encode (with
// bos=0, eos=0).
var llama2cKnown = map[string][]struct {
	text string
	ids  []int
}{
	"tok512": {
		{"Once upon a time, there was a little girl named Lily.", []int{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}},
		{"Hello world", []int{346, 306, 414, 263, 304, 341}},
		{"café 你好 🙂", []int{280, 412, 431, 485, 410, 231, 192, 163, 232, 168, 192, 410, 243, 162, 156, 133}},
		{"  two  spaces\n", []int{410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419, 13}},
		{"", nil},
	},
	"llama2-32k": {
		{"Once upon a time, there was a little girl named Lily.", []int{9038, 2501, 263, 931, 29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889}},
		{"Hello world", []int{15043, 3186}},
		{"café 你好 🙂", []int{274, 28059, 29871, 30919, 31076, 29871, 243, 162, 156, 133}},
		{"  two  spaces\n", []int{259, 1023, 29871, 8162, 13}},
		{"", nil},
	},
}

// naiveRunC is a direct port of run.c encode (O(n²) merge scan), the
// reference the heap-based encoder must agree with.
func naiveRunC(tk *Tokenizer, scores []float32, text string) []int {
	var out []int
	if text == "" {
		return out
	}
	out = append(out, tk.vocab[" "])
	for i := 0; i < len(text); {
		j := i + 1
		for j < len(text) && text[j]&0xC0 == 0x80 && j-i < 4 {
			j++
		}
		if id, ok := tk.vocab[text[i:j]]; ok {
			out = append(out, id)
		} else {
			for k := i; k < j; k++ {
				out = append(out, int(text[k])+3)
			}
		}
		i = j
	}
	for {
		best, bi, bid := float32(-1e10), -1, -1
		for k := 0; k+1 < len(out); k++ {
			if id, ok := tk.vocab[tk.pieces[out[k]]+tk.pieces[out[k+1]]]; ok && scores[id] > best {
				best, bi, bid = scores[id], k, id
			}
		}
		if bi < 0 {
			return out
		}
		out[bi] = bid
		out = append(out[:bi+1], out[bi+2:]...)
	}
}

func readScores(t *testing.T, data []byte) []float32 {
	var s []float32
	for off := 4; off < len(data); {
		s = append(s, math.Float32frombits(binary.LittleEndian.Uint32(data[off:])))
		n := int(binary.LittleEndian.Uint32(data[off+4:]))
		off += 8 + n
	}
	return s
}

func TestLlama2C(t *testing.T) {
	lines := warAndPeaceLines(t, 0)
	for _, f := range llama2cFiles {
		t.Run(f.name, func(t *testing.T) {
			p := testshared.Path(t, f.path...)
			tk := loadShared(t, f.path...)
			if tk.VocabSize() != f.size || tk.BOS() != 1 || !slices.Equal(tk.EOS(), []int{2}) {
				t.Fatalf("vocab %d bos %d eos %v", tk.VocabSize(), tk.BOS(), tk.EOS())
			}
			for _, k := range llama2cKnown[f.name] {
				if got := tk.Encode(k.text, false); !slices.Equal(got, k.ids) && (len(got) != 0 || len(k.ids) != 0) {
					t.Errorf("Encode(%q) = %v, want %v", k.text, got, k.ids)
				}
				if got := tk.Encode(k.text, true); len(got) == 0 || got[0] != 1 {
					t.Errorf("Encode(%q, true) does not start with BOS: %v", k.text, got)
				}
			}
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			scores := readScores(t, data)
			// Round trip every 7th corpus line (and compare with the naive
			// port on some of them).
			for i := 0; i < len(lines); i += 7 {
				l := lines[i]
				ids := tk.Encode(l, true)
				if got := tk.Decode(ids); got != l {
					t.Fatalf("line %d: round trip %q -> %q", i, l, got)
				}
				if i%70 == 0 {
					if want := naiveRunC(tk, scores, l); !slices.Equal(ids[1:], want) {
						t.Fatalf("line %d %q: ids %v, run.c %v", i, l, ids[1:], want)
					}
				}
				checkStream(t, tk, ids)
			}
		})
	}
}

// TestLlama2CDecode checks run.c's decode rules: BOS prints nothing, the
// piece after BOS loses its leading space, <0xNN> is a raw byte.
func TestLlama2CDecode(t *testing.T) {
	tk := loadShared(t, "models", "stories260K", "tok512.bin")
	hello := tk.Encode("Hello", false)
	tests := []struct {
		ids  []int
		want string
	}{
		{append([]int{1}, hello...), "Hello"},
		{hello, " Hello"},
		{[]int{1, 3 + 'A', 3 + 'B'}, "AB"},
		{[]int{3 + 0xF0, 3 + 0x9F, 3 + 0x99, 3 + 0x82}, "🙂"},
		{[]int{3 + 0xF0, 3 + 0x9F}, "\uFFFD"},
		{[]int{-1, 99999}, ""},
	}
	for _, tc := range tests {
		if got := tk.Decode(tc.ids); got != tc.want {
			t.Errorf("Decode(%v) = %q, want %q", tc.ids, got, tc.want)
		}
	}
}

func makeLlama2C(maxLen int32, toks []string, scores []float32) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, maxLen)
	for i, s := range toks {
		binary.Write(&b, binary.LittleEndian, scores[i])
		binary.Write(&b, binary.LittleEndian, int32(len(s)))
		b.WriteString(s)
	}
	return b.Bytes()
}

func TestLlama2CMalformed(t *testing.T) {
	good := makeLlama2C(5, []string{"<unk>", "<s>", "</s>", " ", "a", " a"}, []float32{0, 0, 0, 0, -1, -2})
	if _, err := ParseLlama2C(good); err != nil {
		t.Fatalf("good file: %v", err)
	}
	bad := map[string][]byte{
		"empty":          nil,
		"short header":   {1, 0},
		"truncated":      good[:len(good)-1],
		"cut score":      good[:6],
		"zero max":       makeLlama2C(0, []string{"<unk>", "<s>", "</s>"}, []float32{0, 0, 0}),
		"too few":        makeLlama2C(8, []string{"a"}, []float32{0}),
		"over max len":   makeLlama2C(2, []string{"<unk>", "<s>", "</s>"}, []float32{0, 0, 0}),
		"negative len":   append(append([]byte{}, good[:4]...), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff),
		"huge len":       append(append([]byte{}, good[:4]...), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f),
		"nan score":      makeLlama2C(8, []string{"<unk>", "<s>", "</s>"}, []float32{float32(math.NaN()), 0, 0}),
		"garbage header": []byte(strings.Repeat("\xff", 64)),
	}
	for name, data := range bad {
		if _, err := ParseLlama2C(data); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestLlama2CMatchesHFSentencePiece: Llama 2's vocabulary reached two ways,
// run.c's score-driven merging (llama2.c tokenizer.bin) and Hugging Face's
// merge-rank BPE (Phi-3 shares the vocabulary), must give the same ids.
func TestLlama2CMatchesHFSentencePiece(t *testing.T) {
	hf := loadShared(t, "tokenizers", "phi-3-mini")
	l2c := loadShared(t, "models", "llama2c-tokenizer-32k", "tokenizer.bin")
	texts := warAndPeaceLines(t, 0)
	for _, e := range readExpected(t, "phi-3-mini") {
		if !strings.Contains(e.Text, "<") { // run.c does not parse special tokens
			texts = append(texts, e.Text)
		}
	}
	diff := 0
	for _, s := range texts {
		if a, b := hf.Encode(s, false), l2c.Encode(s, false); !slices.Equal(a, b) {
			if diff++; diff <= 3 {
				t.Errorf("%q: HF %v, llama2.c %v", s, a, b)
			}
		}
	}
	if diff > 0 {
		t.Errorf("%d of %d texts differ", diff, len(texts))
	}
}
