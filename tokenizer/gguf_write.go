package tokenizer

import (
	"fmt"
	"slices"
	"sort"
)

// GGUF token types (llama.cpp's llama_token_type).
const (
	ggufNormalType      = 1
	ggufControlType     = 3
	ggufUserDefinedType = 4
)

// ggufPreNames are the GGUF pre-tokenizer names FromGGUF knows for
// byte-level BPE vocabularies, in the order GGUFMetadata tries them.
var ggufPreNames = []string{"gpt-2", "llama-bpe", "qwen2", "smollm"}

// probeTexts exercise what tells pre-tokenizers apart (digit runs,
// contractions, whitespace runs, letters of several scripts, symbols,
// emoji) and are encoded, with and without special tokens, by both
// tokenizers GGUFMetadata compares; the added tokens' contents are probed
// too.
var probeTexts = []string{
	"Hello, world! It's 2026: 1234567 apples cost $3.50 (or 12,000 yen).",
	"  leading spaces\tand tabs\n\nnew lines   trailing  ",
	"don't I'm you'll we've they're she'd HE'LL",
	"naïve café Ünïcödé 日本語のテキスト Привет мир 🙂🚀",
	"func main() { x := a+b*c; if x>=10 { return } }",
	"ABC123def456 9 99 999 9999 3.14159 1e-5 0x1F",
	"In the beginning God created the heaven and the earth.",
}

// GGUFMetadata returns the tokenizer.* metadata of a GGUF file that holds
// this tokenizer, as llama.cpp's converter writes it, for byte-level BPE
// vocabularies (GPT-2, Llama 3, Qwen2 and SmolLM pre-tokenizers): the
// tokens and their types, the merges, the pre-tokenizer's name, BOS/EOS and
// whether they are added, the chat template. The pre-tokenizer is chosen
// by trying each name FromGGUF knows: the one whose rebuilt tokenizer
// encodes probe texts exactly as t does; other tokenizers get an error.
func (t *Tokenizer) GGUFMetadata() (map[string]any, error) {
	if t.input != inputBytes || len(t.norm) > 0 {
		return nil, fmt.Errorf("tokenizer: only byte-level BPE vocabularies can be written to GGUF")
	}
	n := len(t.pieces)
	types := make([]int32, n)
	for i := range types {
		types[i] = ggufNormalType
	}
	for _, a := range t.added {
		if a.id < n {
			types[a.id] = ggufUserDefinedType
			if a.special {
				types[a.id] = ggufControlType
			}
		}
	}
	type rankedMerge struct {
		rank int32
		text string
	}
	ranked := make([]rankedMerge, 0, len(t.merges))
	for k, m := range t.merges {
		a, b := int(int32(k>>32)), int(int32(uint32(k)))
		if a < 0 || a >= n || b < 0 || b >= n {
			return nil, fmt.Errorf("tokenizer: merge of ids %d and %d outside the vocabulary", a, b)
		}
		ranked = append(ranked, rankedMerge{m.rank, t.pieces[a] + " " + t.pieces[b]})
	}
	sort.Slice(ranked, func(i, j int) bool { return ranked[i].rank < ranked[j].rank })
	merges := make([]string, len(ranked))
	for i, m := range ranked {
		merges[i] = m.text
	}
	md := map[string]any{
		"tokenizer.ggml.model":      "gpt2",
		"tokenizer.ggml.tokens":     slices.Clone(t.pieces),
		"tokenizer.ggml.token_type": types,
		"tokenizer.ggml.merges":     merges,
	}
	if t.bos >= 0 {
		md["tokenizer.ggml.bos_token_id"] = uint32(t.bos)
	}
	if len(t.eos) > 0 {
		md["tokenizer.ggml.eos_token_id"] = uint32(t.eos[0])
	}
	md["tokenizer.ggml.add_bos_token"] = slices.Equal(t.prefix, []int{t.bos}) && t.bos >= 0
	md["tokenizer.ggml.add_eos_token"] = len(t.eos) > 0 && slices.Equal(t.suffix, []int{t.eos[0]})
	if t.chatTemplate != "" {
		md["tokenizer.chat_template"] = t.chatTemplate
	}
	for _, pre := range ggufPreNames {
		md["tokenizer.ggml.pre"] = pre
		back, err := FromGGUF(md)
		if err == nil && t.sameEncodings(back) {
			return md, nil
		}
	}
	return nil, fmt.Errorf("tokenizer: none of the GGUF pre-tokenizers %v encodes as this tokenizer does", ggufPreNames)
}

// sameEncodings reports whether u encodes the probe texts (and t's added
// tokens) as t does, with and without special tokens.
func (t *Tokenizer) sameEncodings(u *Tokenizer) bool {
	texts := slices.Clone(probeTexts)
	for _, a := range t.added {
		texts = append(texts, "x"+a.content+" y")
	}
	for _, s := range texts {
		for _, special := range []bool{true, false} {
			if !slices.Equal(t.Encode(s, special), u.Encode(s, special)) {
				return false
			}
		}
	}
	return true
}
