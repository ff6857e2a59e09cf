package tokenizer

// llama2.c tokenizer.bin: int32 max_token_length, then for every token a
// float32 score, an int32 byte length and the bytes (little-endian). The
// file does not store the vocabulary size; tokens run to the end of file.
//
// Encoding follows run.c's encode: a dummy-prefix token " " when the text is
// not empty, one symbol per UTF-8 code point group (a lead byte plus up to
// three continuation bytes) looked up in the vocabulary or else one symbol
// per byte with id byte+3, then repeated merging of the adjacent pair whose
// concatenation is the highest-scoring vocabulary entry (leftmost on ties).
// The merge step is the shared BPE engine: every vocabulary entry that is the
// concatenation of two entries becomes a merge, ranked by score.
//
// Decoding follows run.c's decode: BOS (1) itself prints nothing, a piece
// right after BOS loses its leading space, and "<0xNN>" pieces are raw bytes.
// Unlike run.c's safe_printf, non-printable single bytes are kept, so that
// byte-fallback characters survive a round trip.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

const llama2cBOS, llama2cEOS = 1, 2

// ParseLlama2C builds a Tokenizer from the bytes of a llama2.c tokenizer.bin.
func ParseLlama2C(data []byte) (*Tokenizer, error) {
	t, err := parseLlama2C(data)
	if err != nil {
		return nil, fmt.Errorf("parse llama2.c tokenizer: %w", err)
	}
	return t, nil
}

func parseLlama2C(data []byte) (*Tokenizer, error) {
	if len(data) < 4 {
		return nil, errors.New("tokenizer.bin too short for its header")
	}
	maxLen := int32(binary.LittleEndian.Uint32(data))
	if maxLen <= 0 || maxLen > 1<<16 {
		return nil, fmt.Errorf("implausible max_token_length %d", maxLen)
	}
	var pieces []string
	var scores []float32
	for off := 4; off < len(data); {
		if len(data)-off < 8 {
			return nil, fmt.Errorf("token %d: truncated header at offset %d", len(pieces), off)
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(data[off:]))
		n := int32(binary.LittleEndian.Uint32(data[off+4:]))
		off += 8
		if n < 0 || int64(n) > int64(len(data)-off) {
			return nil, fmt.Errorf("token %d: length %d out of range at offset %d", len(pieces), n, off)
		}
		if n > maxLen {
			return nil, fmt.Errorf("token %d: length %d exceeds max_token_length %d", len(pieces), n, maxLen)
		}
		if math.IsNaN(float64(score)) {
			return nil, fmt.Errorf("token %d: NaN score", len(pieces))
		}
		pieces = append(pieces, string(data[off:off+int(n)]))
		scores = append(scores, score)
		off += int(n)
	}
	if len(pieces) < 3 {
		return nil, fmt.Errorf("only %d tokens; need at least <unk>, BOS and EOS", len(pieces))
	}
	t := newTokenizer()
	t.input = inputLlama2C
	t.pieces = pieces
	t.vocab = make(map[string]int, len(pieces))
	// run.c looks strings up by binary search over the sorted vocabulary;
	// with duplicates the first id wins here.
	for id := len(pieces) - 1; id >= 0; id-- {
		t.vocab[pieces[id]] = id
	}
	t.merges = scoreMerges(pieces, scores, t.vocab)
	if id, ok := t.vocab[" "]; ok {
		t.llamaSpace = id
	}
	t.setChunkSep(" ")
	t.bos, t.eos = llama2cBOS, []int{llama2cEOS}
	t.prefix = []int{llama2cBOS}
	t.dec = decoderConfig{mode: decBytes, llama2c: true, raw: make([][]byte, len(pieces))}
	for id, p := range pieces {
		if b, ok := parseByteToken(p); ok {
			t.dec.raw[id] = []byte{b}
		} else {
			t.dec.raw[id] = []byte(p)
		}
	}
	return t, nil
}

// scoreMerges turns a scored vocabulary into ranked merges: every entry that
// splits into two entries is reachable by merging them, and a higher score
// merges first (equal scores share a rank, so position breaks the tie).
func scoreMerges(pieces []string, scores []float32, vocab map[string]int) map[uint64]mergeInfo {
	type cand struct {
		a, b, m int32
		score   float32
	}
	var cands []cand
	for id, p := range pieces {
		if len(p) < 2 || vocab[p] != id {
			continue
		}
		for k := 1; k < len(p); k++ {
			ia, ok1 := vocab[p[:k]]
			ib, ok2 := vocab[p[k:]]
			if ok1 && ok2 {
				cands = append(cands, cand{int32(ia), int32(ib), int32(id), scores[id]})
			}
		}
	}
	distinct := make([]float32, 0, len(cands))
	for _, c := range cands {
		distinct = append(distinct, c.score)
	}
	sort.Slice(distinct, func(i, j int) bool { return distinct[i] > distinct[j] })
	rankOf := make(map[float32]int32, len(distinct))
	r := int32(0)
	for i, s := range distinct {
		if i > 0 && s == distinct[i-1] {
			continue
		}
		rankOf[s] = r
		r++
	}
	merges := make(map[uint64]mergeInfo, len(cands))
	for _, c := range cands {
		merges[pairKey(c.a, c.b)] = mergeInfo{rank: rankOf[c.score], id: c.m}
	}
	return merges
}

// encodeLlama2C follows run.c encode (see the file comment). The dummy
// prefix is a symbol of its own, exactly like the " " it spells.
func (t *Tokenizer) encodeLlama2C(text string, w *workspace, out []int) []int {
	if text == "" {
		return out
	}
	if t.llamaSpace >= 0 {
		text = " " + text
	}
	return t.encodeWord(text, w, out)
}

// llama2cSymbols groups a lead byte with up to three continuation bytes and
// looks the group up; unknown groups become one symbol per byte, id byte+3.
func (t *Tokenizer) llama2cSymbols(text string, w *workspace) {
	for i := 0; i < len(text); {
		j := i + 1
		for j < len(text) && text[j]&0xC0 == 0x80 && j-i < 4 {
			j++
		}
		if id, ok := t.vocab[text[i:j]]; ok {
			w.syms = append(w.syms, symbol{id: int32(id)})
		} else {
			for k := i; k < j; k++ {
				if id := int(text[k]) + 3; id < len(t.pieces) {
					w.syms = append(w.syms, symbol{id: int32(id)})
				}
			}
		}
		i = j
	}
}
