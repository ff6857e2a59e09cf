package tokenizer

// Vocabularies stored in GGUF metadata (tokenizer.ggml.*). Two models exist:
//
//   - "llama": SentencePiece BPE by scores, as llama.cpp's llm_tokenizer_spm:
//     each segment between special tokens gets a "▁" prefix and its spaces
//     become "▁", characters not in the vocabulary fall back to <0xNN> byte
//     tokens, and pairs merge by the score of the merged token. Decoding is
//     SentencePiece's (▁ to space, byte tokens joined, one leading space
//     stripped), the same as Hugging Face's decoder for these models.
//   - "gpt2": byte-level BPE from tokenizer.ggml.merges, with the split regex
//     chosen by tokenizer.ggml.pre.
//
// Control, user-defined and unknown tokens are cut out of the text first, as
// llama.cpp does when parsing special tokens. Metadata values are accepted in
// whatever Go type a GGUF reader produced ([]string or []any, any integer
// width), and every length and id is checked.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"kiln/model"
)

// GGUF token types.
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// FromGGUF builds a Tokenizer from GGUF metadata (keys tokenizer.ggml.* and
// tokenizer.chat_template).
func FromGGUF(md map[string]any) (*Tokenizer, error) {
	t, err := fromGGUF(md)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from GGUF metadata: %w", err)
	}
	return t, nil
}

func fromGGUF(md map[string]any) (*Tokenizer, error) {
	kind, _ := md["tokenizer.ggml.model"].(string)
	tokens, err := stringList(md["tokenizer.ggml.tokens"])
	if err != nil {
		return nil, fmt.Errorf("tokenizer.ggml.tokens: %w", err)
	}
	if len(tokens) == 0 {
		return nil, errors.New("tokenizer.ggml.tokens is missing or empty")
	}
	var types []int64
	if v, ok := md["tokenizer.ggml.token_type"]; ok {
		if types, err = intList(v); err != nil {
			return nil, fmt.Errorf("tokenizer.ggml.token_type: %w", err)
		}
		if len(types) != len(tokens) {
			return nil, fmt.Errorf("%d token types for %d tokens", len(types), len(tokens))
		}
	}
	typeOf := func(id int) int64 {
		if types == nil {
			return ggufNormal
		}
		return types[id]
	}
	t := newTokenizer()
	t.pieces = tokens
	t.vocab = make(map[string]int, len(tokens))
	for id := len(tokens) - 1; id >= 0; id-- {
		t.vocab[tokens[id]] = id
	}
	for id, s := range tokens {
		switch typeOf(id) {
		case ggufControl, ggufUserDefined, ggufUnknown:
			if s != "" {
				t.added = append(t.added, addedToken{content: s, id: id, special: typeOf(id) != ggufUserDefined})
			}
		}
	}
	t.finishAdded()

	addBOS := false
	switch kind {
	case "llama", "":
		if kind == "" {
			return nil, errors.New("tokenizer.ggml.model is missing")
		}
		var scores []float64
		if v, ok := md["tokenizer.ggml.scores"]; ok {
			if scores, err = floatList(v); err != nil {
				return nil, fmt.Errorf("tokenizer.ggml.scores: %w", err)
			}
		}
		if len(scores) != len(tokens) {
			return nil, fmt.Errorf("%d scores for %d tokens", len(scores), len(tokens))
		}
		sc := make([]float32, len(scores))
		for i, s := range scores {
			if math.IsNaN(s) {
				return nil, fmt.Errorf("score %d is NaN", i)
			}
			sc[i] = float32(s)
		}
		// Only normal (and user-defined) tokens take part in merges.
		mergeable := make(map[string]int, len(tokens))
		for id := len(tokens) - 1; id >= 0; id-- {
			switch typeOf(id) {
			case ggufNormal, ggufUserDefined:
				mergeable[tokens[id]] = id
			}
		}
		t.merges = scoreMerges(tokens, sc, mergeable)
		t.input = inputRunes
		t.byteFallback = true
		addSpace := true
		if v, ok := md["tokenizer.ggml.add_space_prefix"]; ok {
			b, ok := v.(bool)
			if !ok {
				return nil, errors.New("tokenizer.ggml.add_space_prefix is not a bool")
			}
			addSpace = b
		}
		if addSpace {
			t.norm = append(t.norm, normStep{kind: normPrepend, a: "▁"})
		}
		t.norm = append(t.norm, normStep{kind: normReplace, a: " ", b: "▁"})
		t.unk = 0
		t.initByteTables()
		t.setChunkSep("▁")
		t.finishPipeline()
		c := decoderConfig{mode: decPieces, text: make([]string, len(tokens)), byteOf: make([]int16, len(tokens))}
		for id, p := range tokens {
			c.byteOf[id] = -1
			if b, ok := parseByteToken(p); ok && (types == nil || typeOf(id) == ggufByte) {
				c.byteOf[id] = int16(b)
			}
			c.text[id] = strings.ReplaceAll(p, "▁", " ")
		}
		if addSpace {
			c.stripN, c.stripChar = 1, ' '
		}
		t.dec = c
		addBOS = true
	case "gpt2":
		merges, err := stringList(md["tokenizer.ggml.merges"])
		if err != nil {
			return nil, fmt.Errorf("tokenizer.ggml.merges: %w", err)
		}
		t.merges = make(map[uint64]mergeInfo, len(merges))
		for rank, m := range merges {
			a, b, ok := cutSpace(m)
			if !ok {
				return nil, fmt.Errorf("merge %d %q: no space", rank, m)
			}
			ia, ok1 := t.vocab[a]
			ib, ok2 := t.vocab[b]
			im, ok3 := t.vocab[a+b]
			if !ok1 || !ok2 || !ok3 {
				return nil, fmt.Errorf("merge %d %q uses tokens missing from the vocabulary", rank, m)
			}
			t.merges[pairKey(int32(ia), int32(ib))] = mergeInfo{rank: int32(rank), id: int32(im)}
		}
		t.input = inputBytes
		pre, _ := md["tokenizer.ggml.pre"].(string)
		switch pre {
		case "llama-bpe", "llama3", "llama-v3", "smaug-bpe":
			t.pre = []preStep{{kind: preSplit, split: llama3Scanner{maxDigits: 3}}}
			t.ignoreMerges = true
		case "qwen2", "deepseek-r1-qwen":
			t.pre = []preStep{{kind: preSplit, split: llama3Scanner{maxDigits: 1}}}
		case "smollm":
			t.pre = []preStep{{kind: preDigits, individual: true}, {kind: preSplit, split: gpt2Scanner{}}}
		case "gpt-2", "gpt2", "default", "":
			t.pre = []preStep{{kind: preSplit, split: gpt2Scanner{}}}
		default:
			return nil, fmt.Errorf("tokenizer.ggml.pre %q is not supported", pre)
		}
		t.setFastSplit()
		t.initByteTables()
		_, u2b := bytesToUnicode()
		t.dec = decoderConfig{mode: decBytes, raw: make([][]byte, len(tokens))}
		for id, p := range tokens {
			if b, ok := byteLevelDecode(u2b, p); ok {
				t.dec.raw[id] = b
			} else {
				t.dec.raw[id] = []byte(p)
			}
		}
	default:
		return nil, fmt.Errorf("tokenizer.ggml.model %q is not supported", kind)
	}

	idKey := func(key string) (int, bool, error) {
		v, ok := md[key]
		if !ok {
			return -1, false, nil
		}
		n, ok := model.MetadataInt(v)
		if !ok || n < 0 || n >= int64(len(tokens)) {
			return -1, false, fmt.Errorf("%s: bad token id %v", key, v)
		}
		return int(n), true, nil
	}
	if id, ok, err := idKey("tokenizer.ggml.bos_token_id"); err != nil {
		return nil, err
	} else if ok {
		t.bos = id
	}
	if id, ok, err := idKey("tokenizer.ggml.unknown_token_id"); err != nil {
		return nil, err
	} else if ok && t.input == inputRunes {
		t.unk = id
	}
	if _, _, err := idKey("tokenizer.ggml.padding_token_id"); err != nil {
		return nil, err
	}
	for _, key := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		id, ok, err := idKey(key)
		if err != nil {
			return nil, err
		}
		if ok && !slices.Contains(t.eos, id) {
			t.eos = append(t.eos, id)
		}
	}
	if t.unk >= len(tokens) {
		t.unk = -1
	}
	if v, ok := md["tokenizer.ggml.add_bos_token"]; ok {
		b, ok := v.(bool)
		if !ok {
			return nil, errors.New("tokenizer.ggml.add_bos_token is not a bool")
		}
		addBOS = b
	}
	if addBOS && t.bos >= 0 {
		t.prefix = []int{t.bos}
	}
	if v, ok := md["tokenizer.ggml.add_eos_token"]; ok {
		if b, _ := v.(bool); b && len(t.eos) > 0 {
			t.suffix = []int{t.eos[0]}
		}
	}
	if v, ok := md["tokenizer.chat_template"]; ok {
		s, ok := v.(string)
		if !ok {
			return nil, errors.New("tokenizer.chat_template is not a string")
		}
		t.chatTemplate = s
	}
	return t, nil
}

func cutSpace(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

func stringList(v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return nil, errors.New("missing")
	case []string:
		return x, nil
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("element %d is %T, not a string", i, e)
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected type %T", v)
}

func intList(v any) ([]int64, error) {
	switch x := v.(type) {
	case []int32:
		out := make([]int64, len(x))
		for i, e := range x {
			out[i] = int64(e)
		}
		return out, nil
	case []any:
		out := make([]int64, len(x))
		for i, e := range x {
			n, ok := model.MetadataInt(e)
			if !ok {
				return nil, fmt.Errorf("element %d is %T, not an integer", i, e)
			}
			out[i] = n
		}
		return out, nil
	case []int:
		out := make([]int64, len(x))
		for i, e := range x {
			out[i] = int64(e)
		}
		return out, nil
	case []int64:
		return x, nil
	case []uint32:
		out := make([]int64, len(x))
		for i, e := range x {
			out[i] = int64(e)
		}
		return out, nil
	case []int8:
		out := make([]int64, len(x))
		for i, e := range x {
			out[i] = int64(e)
		}
		return out, nil
	case []uint8:
		out := make([]int64, len(x))
		for i, e := range x {
			out[i] = int64(e)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected type %T", v)
}

func floatList(v any) ([]float64, error) {
	switch x := v.(type) {
	case []float32:
		out := make([]float64, len(x))
		for i, e := range x {
			out[i] = float64(e)
		}
		return out, nil
	case []float64:
		return x, nil
	case []any:
		out := make([]float64, len(x))
		for i, e := range x {
			switch f := e.(type) {
			case float32:
				out[i] = float64(f)
			case float64:
				out[i] = f
			default:
				n, ok := model.MetadataInt(e)
				if !ok {
					return nil, fmt.Errorf("element %d is %T, not a number", i, e)
				}
				out[i] = float64(n)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected type %T", v)
}
