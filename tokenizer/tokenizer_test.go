package tokenizer

import (
	"encoding/json"
	"math/rand"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"kiln/internal/testshared"
)

type expectedEntry struct {
	Text    string `json:"text"`
	IDs     []int  `json:"ids"`
	Decoded string `json:"decoded"`
}

// The shared tokenizers are large (Llama 3's JSON is 17 MB): load each once.
var (
	loadMu    sync.Mutex
	loadCache = map[string]*Tokenizer{}
)

func loadShared(t testing.TB, elem ...string) *Tokenizer {
	t.Helper()
	p := testshared.Path(t, elem...)
	loadMu.Lock()
	defer loadMu.Unlock()
	if tk, ok := loadCache[p]; ok {
		return tk
	}
	tk, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	loadCache[p] = tk
	return tk
}

func readExpected(t testing.TB, name string) []expectedEntry {
	t.Helper()
	data, err := os.ReadFile(testshared.Path(t, "tokenizers", "expected", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var es []expectedEntry
	if err := json.Unmarshal(data, &es); err != nil {
		t.Fatal(err)
	}
	return es
}

var hfCases = []struct {
	name     string // expected/NAME.json
	tokPath  []string
	bos      int
	template bool
}{
	{"gpt2", []string{"tokenizers", "gpt2", "tokenizer.json"}, -1, false},
	{"llama3.2", []string{"tokenizers", "llama3.2-bpe", "tokenizer.json"}, -1, false},
	{"phi-3-mini", []string{"tokenizers", "phi-3-mini"}, 1, true},
}

// TestHFExpected checks every reference encoding from Hugging Face tokenizers.
func TestHFExpected(t *testing.T) {
	for _, tc := range hfCases {
		t.Run(tc.name, func(t *testing.T) {
			tk := loadShared(t, tc.tokPath...)
			es := readExpected(t, tc.name)
			matched := 0
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
			t.Logf("%s: %d/%d entries match", tc.name, matched, len(es))
			if tk.BOS() != tc.bos {
				t.Errorf("BOS = %d, want %d", tk.BOS(), tc.bos)
			}
			if (tk.ChatTemplate() != "") != tc.template {
				t.Errorf("chat template present = %v, want %v", tk.ChatTemplate() != "", tc.template)
			}
		})
	}
}

func short(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// TestPhi3Directory checks the config-derived special tokens.
func TestPhi3Directory(t *testing.T) {
	tk := loadShared(t, "tokenizers", "phi-3-mini")
	if got := tk.EOS(); !slices.Equal(got, []int{32000}) {
		t.Errorf("EOS = %v, want [32000]", got)
	}
	// The template adds no BOS (add_bos_token is false for Phi-3).
	if got := tk.Encode("Hi", true); !slices.Equal(got, tk.Encode("Hi", false)) {
		t.Errorf("addSpecial changed Phi-3 ids: %v", got)
	}
	// rstrip on the chat tokens eats the newlines after them, and the
	// remaining segment gets the "▁" prefix.
	if got := tk.Encode("<|user|>\nHi<|end|>\n<|assistant|>", false); !slices.Equal(got, []int{32010, 6324, 32007, 32001}) {
		t.Errorf("chat ids %v", got)
	}
}

// TestStreamDecoder checks that streaming equals batch decoding on real
// encodings and on random id sequences (which split UTF-8 everywhere).
func TestStreamDecoder(t *testing.T) {
	for _, tc := range hfCases {
		t.Run(tc.name, func(t *testing.T) {
			tk := loadShared(t, tc.tokPath...)
			rng := rand.New(rand.NewSource(1))
			var seqs [][]int
			for _, e := range readExpected(t, tc.name) {
				seqs = append(seqs, e.IDs)
			}
			for range 200 {
				seq := make([]int, rng.Intn(20))
				for i := range seq {
					if rng.Intn(2) == 0 {
						seq[i] = rng.Intn(tk.VocabSize())
					} else {
						seq[i] = rng.Intn(600) // bytes and byte tokens
					}
				}
				seqs = append(seqs, seq)
			}
			for _, seq := range seqs {
				checkStream(t, tk, seq)
			}
		})
	}
}

func checkStream(t *testing.T, tk *Tokenizer, seq []int) {
	t.Helper()
	d := tk.NewDecoder()
	var sb strings.Builder
	for _, id := range seq {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("Add returned invalid UTF-8 %q for %v", s, seq)
		}
		sb.WriteString(s)
	}
	sb.WriteString(d.Flush())
	if want := tk.Decode(seq); sb.String() != want {
		t.Fatalf("stream %q != Decode %q for %v", sb.String(), want, seq)
	}
}

func warAndPeaceLines(t testing.TB, n int) []string {
	data, err := os.ReadFile(testshared.Path(t, "corpora", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	if n > 0 && len(lines) > n {
		lines = lines[:n]
	}
	return lines
}

// TestRoundTripCorpus: decode(encode(line)) == line for every tokenizer.
func TestRoundTripCorpus(t *testing.T) {
	lines := warAndPeaceLines(t, 3000)
	for _, tc := range hfCases {
		t.Run(tc.name, func(t *testing.T) {
			tk := loadShared(t, tc.tokPath...)
			for _, l := range lines {
				if got := tk.Decode(tk.Encode(l, false)); got != l {
					t.Fatalf("round trip %q -> %q", l, got)
				}
			}
		})
	}
}

// TestConcurrentEncode: one Tokenizer shared by goroutines (run with -race
// to check the cache) gives the same ids as serial use.
func TestConcurrentEncode(t *testing.T) {
	tk := loadShared(t, "tokenizers", "gpt2", "tokenizer.json")
	lines := warAndPeaceLines(t, 400)
	want := make([][]int, len(lines))
	for i, l := range lines {
		want[i] = tk.Encode(l, false)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				k := (i + g*97) % len(lines)
				if got := tk.Encode(lines[k], false); !slices.Equal(got, want[k]) {
					errs <- lines[k]
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for l := range errs {
		t.Errorf("concurrent Encode(%q) differs", l)
	}
}

func TestEncodeOrdinary(t *testing.T) {
	tk := loadShared(t, "tokenizers", "llama3.2-bpe", "tokenizer.json")
	text := "hi<|eot_id|>"
	if got := tk.Encode(text, false); got[len(got)-1] != 128009 {
		t.Errorf("Encode did not find <|eot_id|>: %v", got)
	}
	got := tk.EncodeOrdinary(text)
	if slices.Contains(got, 128009) || tk.Decode(got) != text {
		t.Errorf("EncodeOrdinary = %v (%q)", got, tk.Decode(got))
	}
	// gpt2's only added token is special: ordinary text matches the
	// expected encoding of the literal string.
	g := loadShared(t, "tokenizers", "gpt2", "tokenizer.json")
	if got := g.EncodeOrdinary("<|endoftext|>"); len(got) < 2 || g.Decode(got) != "<|endoftext|>" {
		t.Errorf("gpt2 EncodeOrdinary = %v", got)
	}
}
