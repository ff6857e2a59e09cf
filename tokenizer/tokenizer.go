// Package tokenizer turns text into token ids and back for the vocabularies
// kiln loads: Hugging Face tokenizer.json (byte-level BPE and
// SentencePiece-style BPE), llama2.c tokenizer.bin, and vocabularies stored
// in GGUF metadata.
//
// Every format is loaded into one Tokenizer that runs the same pipeline as
// Hugging Face tokenizers: added (special) tokens are cut out of the text
// first; each remaining segment is normalized, pre-tokenized into words, and
// every word is BPE-merged (bpe.go); with addSpecial the post-processor's
// BOS/EOS ids are put around the result. Decoding goes through a
// StreamDecoder (decode.go), so that Decode and streaming agree by
// construction.
//
// Known differences from Hugging Face tokenizers, none of which the tested
// models hit: added tokens are always matched in the raw text (their
// "normalized" flag is ignored); the NFC normalizer (Qwen2) is the identity,
// which is right for text already in NFC, as kiln has no Unicode
// normalization tables; only BPE models load (no WordPiece or Unigram), and
// other unsupported pipeline parts are load errors.
package tokenizer

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// inputKind says how a word is cut into initial BPE symbols.
type inputKind uint8

const (
	inputBytes   inputKind = iota // byte-level: one symbol per byte (GPT-2 alphabet)
	inputRunes                    // one symbol per character, with byte fallback / unk
	inputLlama2C                  // llama2.c run.c: code point groups, unknown bytes as id byte+3
)

// addedToken is a token that is matched in the raw text before the model
// runs (Hugging Face added_tokens, GGUF control and user-defined tokens).
type addedToken struct {
	content                    string
	id                         int
	lstrip, rstrip, singleWord bool
	special                    bool
}

// normStep is one normalizer operation on a text segment.
type normStep struct {
	kind        uint8 // normPrepend, normReplace, normLower, normStrip
	a, b        string
	left, right bool
}

const (
	normPrepend uint8 = iota
	normReplace
	normLower
	normStrip
)

// preStep is one pre-tokenizer operation on the list of words.
type preStep struct {
	kind        uint8 // preSplit, prePrefixSpace, preMetaspace, preDigits
	split       splitter
	behavior    splitBehavior
	invert      bool
	replacement string
	prepend     uint8 // 0 never, 1 always, 2 first segment only
	splitWords  bool
	individual  bool
}

const (
	preSplit uint8 = iota
	prePrefixSpace
	preMetaspace
	preDigits
)

// Tokenizer encodes text to ids and decodes ids to text. It is safe for
// concurrent use.
type Tokenizer struct {
	pieces []string       // id -> token spelling as the vocabulary stores it
	vocab  map[string]int // spelling -> id (model vocabulary)

	merges       map[uint64]mergeInfo
	input        inputKind
	byteToID     [256]int32 // inputBytes: initial symbol of each byte, -1 if absent
	byteFallback bool
	byteIDs      [256]int32 // "<0xNN>" ids, -1 if absent
	unk          int
	fuseUnk      bool
	ignoreMerges bool
	rawVocab     map[string]int // inputBytes+ignoreMerges: raw bytes -> id
	llamaSpace   int            // inputLlama2C: id of " " (dummy prefix), -1 if absent
	chunkSep     string         // see setChunkSep
	spFast       bool           // see finishPipeline

	added      []addedToken
	addedFirst [256][]int // first byte -> indexes into added, longest first
	addedLead  int        // the first byte shared by all added tokens, or -1

	norm []normStep
	pre  []preStep
	// fastSplit is set when the whole pre-tokenizer is one Isolated split
	// without rewriting, so words are substrings of the segment.
	fastSplit scanner

	prefix, suffix []int // post-processor ids added with addSpecial

	bos          int
	eos          []int
	chatTemplate string

	dec decoderConfig

	cacheMu sync.RWMutex
	cache   map[string][]int
}

const maxCacheWord = 48
const maxCacheEntries = 1 << 17

func newTokenizer() *Tokenizer {
	t := &Tokenizer{unk: -1, bos: -1, llamaSpace: -1, addedLead: -1}
	for i := range t.byteToID {
		t.byteToID[i] = -1
		t.byteIDs[i] = -1
	}
	t.cache = make(map[string][]int)
	return t
}

// VocabSize is the number of ids, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// BOS is the beginning-of-sequence id, -1 if the vocabulary has none.
func (t *Tokenizer) BOS() int { return t.bos }

// EOS lists the ids that end a generated sequence.
func (t *Tokenizer) EOS() []int { return append([]int(nil), t.eos...) }

// ChatTemplate is the Jinja chat template shipped with the vocabulary, "" if none.
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// Token returns the spelling of id as stored in the vocabulary ("" when out
// of range); useful for debugging and logit masks.
func (t *Tokenizer) Token(id int) string {
	if id < 0 || id >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// TokenID looks up the id of a vocabulary spelling or added token content.
func (t *Tokenizer) TokenID(tok string) (int, bool) {
	for _, a := range t.added {
		if a.content == tok {
			return a.id, true
		}
	}
	id, ok := t.vocab[tok]
	return id, ok
}

// Encode turns text into ids. With addSpecial the post-processor's tokens
// (BOS, and EOS where the template has it) are added, like Hugging Face's
// add_special_tokens=True.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	return t.encode(text, addSpecial, false)
}

// EncodeOrdinary encodes text with special tokens treated as plain text
// (Hugging Face's split_special_tokens=True): untrusted content such as a
// user message cannot smuggle in control tokens like <|eot_id|>. Non-special
// added tokens are still recognized; nothing is added around the result.
func (t *Tokenizer) EncodeOrdinary(text string) []int {
	return t.encode(text, false, true)
}

func (t *Tokenizer) encode(text string, addSpecial, ordinary bool) []int {
	out := make([]int, 0, len(text)/3+4)
	if addSpecial {
		out = append(out, t.prefix...)
	}
	w := wsPool.Get().(*workspace)
	if t.input == inputLlama2C {
		out = t.encodeLlama2C(text, w, out)
	} else {
		first := true
		t.splitAdded(text, ordinary, func(seg string, id int) {
			if id >= 0 {
				out = append(out, id)
			} else {
				out = t.encodeSegment(seg, first, w, out)
			}
			first = false
		})
	}
	wsPool.Put(w)
	if addSpecial {
		out = append(out, t.suffix...)
	}
	return out
}

// splitAdded cuts text at added tokens (leftmost, then longest match, as
// Hugging Face's Aho-Corasick does) and calls f for each plain segment (id
// -1) and each added token, honoring lstrip/rstrip/single_word. With
// ordinary, special tokens are not matched (their text stays plain).
func (t *Tokenizer) splitAdded(text string, ordinary bool, f func(seg string, id int)) {
	if len(t.added) == 0 {
		if text != "" {
			f(text, -1)
		}
		return
	}
	start := 0
	for i := 0; i < len(text); {
		if t.addedLead >= 0 {
			// All added tokens start with the same byte: jump to it.
			k := strings.IndexByte(text[i:], byte(t.addedLead))
			if k < 0 {
				break
			}
			i += k
		}
		cands := t.addedFirst[text[i]]
		matched := -1
		for _, k := range cands {
			if strings.HasPrefix(text[i:], t.added[k].content) {
				matched = k
				break
			}
		}
		if matched < 0 {
			i++
			continue
		}
		a := &t.added[matched]
		ms, me := i, i+len(a.content)
		if ordinary && a.special {
			i = me
			continue
		}
		if a.singleWord {
			okStart := ms == 0 || !endsWithWord(text[:ms])
			okEnd := me == len(text) || !startsWithWord(text[me:])
			if !okStart || !okEnd {
				i = me
				continue
			}
		}
		if a.lstrip {
			ns := ms
			for ns > start {
				r, w := utf8.DecodeLastRuneInString(text[:ns])
				if !unicode.IsSpace(r) {
					break
				}
				ns -= w
			}
			ms = ns
		}
		if a.rstrip {
			for me < len(text) {
				r, w := utf8.DecodeRuneInString(text[me:])
				if !unicode.IsSpace(r) {
					break
				}
				me += w
			}
		}
		if ms > start {
			f(text[start:ms], -1)
		}
		f(a.content, a.id)
		start = me
		i = me
	}
	if start < len(text) {
		f(text[start:], -1)
	}
}

func isWordRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

// normalize applies the normalizer steps to one segment.
func (t *Tokenizer) normalize(s string) string {
	for _, st := range t.norm {
		switch st.kind {
		case normPrepend:
			if s != "" {
				s = st.a + s
			}
		case normReplace:
			s = strings.ReplaceAll(s, st.a, st.b)
		case normLower:
			s = strings.ToLower(s)
		case normStrip:
			if st.left {
				s = strings.TrimLeftFunc(s, unicode.IsSpace)
			}
			if st.right {
				s = strings.TrimRightFunc(s, unicode.IsSpace)
			}
		}
	}
	return s
}

// encodeSegment normalizes, pre-tokenizes and BPE-encodes one segment that
// holds no added token.
func (t *Tokenizer) encodeSegment(seg string, first bool, w *workspace, out []int) []int {
	if t.spFast {
		return t.encodeSegmentSP(seg, w, out)
	}
	s := t.normalize(seg)
	if s == "" {
		return out
	}
	if t.fastSplit != nil {
		for i := 0; i < len(s); {
			j := t.fastSplit.next(s, i)
			if j <= i {
				_, n := decodeRune(s, i)
				j = i + n
			}
			out = t.encodeWord(s[i:j], w, out)
			i = j
		}
		return out
	}
	words := []string{s}
	for _, st := range t.pre {
		words = t.applyPre(st, words, first, w)
	}
	for _, word := range words {
		out = t.encodeWord(word, w, out)
	}
	return out
}

// encodeSegmentSP is encodeSegment for the SentencePiece pipeline
// (Prepend sep, Replace " " with sep, no pre-tokenizer, chunking on sep)
// fused into one pass: each chunk is normalized into a scratch buffer and
// encoded from there, instead of building the normalized segment and then
// searching it for cuts.
func (t *Tokenizer) encodeSegmentSP(seg string, w *workspace, out []int) []int {
	if seg == "" {
		return out
	}
	sep := t.chunkSep
	buf := append(w.buf[:0], sep...)
	prevSep := true
	for i := 0; i < len(seg); {
		c := seg[i]
		n, isSep := 1, c == ' '
		if !isSep && c == sep[0] && strings.HasPrefix(seg[i:], sep) {
			n, isSep = len(sep), true
		}
		if isSep && !prevSep {
			out = t.encodeChunk(bufString(buf), w, out)
			buf = buf[:0]
		}
		if isSep {
			buf = append(buf, sep...)
		} else {
			buf = append(buf, c)
		}
		prevSep = isSep
		i += n
	}
	out = t.encodeChunk(bufString(buf), w, out)
	w.buf = buf
	return out
}

// bufString views a scratch buffer as a string without copying; the view
// must not outlive the call it is passed to (encodeChunk clones what it
// keeps).
func bufString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// finishPipeline enables the fused SentencePiece path when the pipeline is
// exactly the one it implements.
func (t *Tokenizer) finishPipeline() {
	t.spFast = false
	sep := t.chunkSep
	if sep == "" || len(t.pre) != 0 || len(t.norm) != 2 || t.input != inputRunes {
		return
	}
	p, r := t.norm[0], t.norm[1]
	t.spFast = p.kind == normPrepend && p.a == sep && r.kind == normReplace && r.a == " " && r.b == sep
}

// applyPre runs one general pre-tokenizer step over all words.
func (t *Tokenizer) applyPre(st preStep, words []string, first bool, w *workspace) []string {
	var next []string
	for _, s := range words {
		switch st.kind {
		case preSplit:
			w.spans, w.tmp = applySplit(st.split, st.behavior, st.invert, s, w.spans[:0], w.tmp)
			for _, sp := range w.spans {
				if sp[1] > sp[0] {
					next = append(next, s[sp[0]:sp[1]])
				}
			}
		case prePrefixSpace:
			if !strings.HasPrefix(s, " ") {
				s = " " + s
			}
			next = append(next, s)
		case preMetaspace:
			s = strings.ReplaceAll(s, " ", st.replacement)
			if (st.prepend == 1 || (st.prepend == 2 && first)) && !strings.HasPrefix(s, st.replacement) {
				s = st.replacement + s
			}
			if !st.splitWords {
				next = append(next, s)
				continue
			}
			w.spans, w.tmp = applySplit(stringSplitter{st.replacement}, behMergedWithNext, false, s, w.spans[:0], w.tmp)
			for _, sp := range w.spans {
				if sp[1] > sp[0] {
					next = append(next, s[sp[0]:sp[1]])
				}
			}
		case preDigits:
			i := 0
			for i < len(s) {
				r, n := decodeRune(s, i)
				j := i + n
				if unicode.IsDigit(r) {
					if !st.individual {
						for j < len(s) {
							r2, n2 := decodeRune(s, j)
							if !unicode.IsDigit(r2) {
								break
							}
							j += n2
						}
					}
				} else {
					for j < len(s) {
						r2, n2 := decodeRune(s, j)
						if unicode.IsDigit(r2) {
							break
						}
						j += n2
					}
				}
				next = append(next, s[i:j])
				i = j
			}
		}
	}
	return next
}

// encodeWord BPE-encodes one pre-token, through the cache for short words.
// Long words of SentencePiece-style vocabularies are first cut into chunks
// that no merge can cross (see setChunkSep).
func (t *Tokenizer) encodeWord(word string, w *workspace, out []int) []int {
	if word == "" {
		return out
	}
	if t.chunkSep != "" && len(word) > maxCacheWord {
		sep := t.chunkSep
		start := 0
		for i := 1; i < len(word); {
			k := strings.Index(word[i:], sep)
			if k < 0 {
				break
			}
			i += k
			if !strings.HasSuffix(word[start:i], sep) {
				out = t.encodeChunk(word[start:i], w, out)
				start = i
			}
			i += len(sep)
		}
		return t.encodeChunk(word[start:], w, out)
	}
	return t.encodeChunk(word, w, out)
}

// encodeChunk BPE-encodes a piece that merges cannot reach beyond.
func (t *Tokenizer) encodeChunk(word string, w *workspace, out []int) []int {
	if word == "" {
		return out
	}
	cacheable := len(word) <= maxCacheWord
	if cacheable {
		t.cacheMu.RLock()
		ids, ok := t.cache[word]
		t.cacheMu.RUnlock()
		if ok {
			return append(out, ids...)
		}
	}
	start := len(out)
	w.syms = w.syms[:0]
	if t.ignoreMerges {
		// Llama 3: a word that is itself a token is emitted whole.
		vocab := t.vocab
		if t.input == inputBytes {
			vocab = t.rawVocab
		}
		if id, ok := vocab[word]; ok {
			out = append(out, id)
			goto done
		}
	}
	switch t.input {
	case inputBytes:
		for i := 0; i < len(word); i++ {
			if id := t.byteToID[word[i]]; id >= 0 {
				w.syms = append(w.syms, symbol{id: id})
			}
		}
	case inputRunes:
		t.runeSymbols(word, w)
	case inputLlama2C:
		t.llama2cSymbols(word, w)
	}
	out = mergeSymbols(t.merges, w, out)
done:
	if cacheable {
		ids := append([]int(nil), out[start:]...)
		t.cacheMu.Lock()
		if len(t.cache) >= maxCacheEntries {
			clear(t.cache)
		}
		// Clone: word may be a view of the caller's text or of a scratch
		// buffer, and the cache must pin neither.
		t.cache[strings.Clone(word)] = ids
		t.cacheMu.Unlock()
	}
	return out
}

// runeSymbols makes one symbol per character, falling back to <0xNN> byte
// tokens, then to the unknown token (fused when fuse_unk), as HF BPE does.
func (t *Tokenizer) runeSymbols(word string, w *workspace) {
	pendingUnk := false
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+n]
		i += n
		if id, ok := t.vocab[ch]; ok {
			if pendingUnk {
				w.syms = append(w.syms, symbol{id: int32(t.unk)})
				pendingUnk = false
			}
			w.syms = append(w.syms, symbol{id: int32(id)})
			continue
		}
		if t.byteFallback {
			ok := true
			for k := 0; k < len(ch); k++ {
				if t.byteIDs[ch[k]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				if pendingUnk {
					w.syms = append(w.syms, symbol{id: int32(t.unk)})
					pendingUnk = false
				}
				for k := 0; k < len(ch); k++ {
					w.syms = append(w.syms, symbol{id: t.byteIDs[ch[k]]})
				}
				continue
			}
		}
		if t.unk >= 0 {
			if pendingUnk && !t.fuseUnk {
				w.syms = append(w.syms, symbol{id: int32(t.unk)})
			}
			pendingUnk = true
		}
	}
	if pendingUnk {
		w.syms = append(w.syms, symbol{id: int32(t.unk)})
	}
}

// setChunkSep enables cutting long words before sep (where the previous
// text does not end in sep) when that is provably lossless: no merge result
// contains sep right after some other character, so no pair spanning such a
// cut can ever merge, and BPE on the chunks equals BPE on the whole word.
// SentencePiece vocabularies have this property for "▁" (llama2.c: " "),
// which turns their whole-line BPE into cacheable word-sized pieces.
func (t *Tokenizer) setChunkSep(sep string) {
	t.chunkSep = ""
	if t.ignoreMerges {
		return // the whole-word vocabulary check needs whole words
	}
	if _, ok := t.vocab[sep]; !ok {
		return // sep would be byte-fallback symbols the check cannot see
	}
	for _, m := range t.merges {
		p := t.pieces[m.id]
		for i := 1; i < len(p); {
			k := strings.Index(p[i:], sep)
			if k < 0 {
				break
			}
			i += k
			if !strings.HasSuffix(p[:i], sep) {
				return
			}
			i += len(sep)
		}
	}
	t.chunkSep = sep
}

// finishAdded sorts added tokens for matching: per first byte, longest first.
func (t *Tokenizer) finishAdded() {
	for i := range t.addedFirst {
		t.addedFirst[i] = nil
	}
	for k, a := range t.added {
		if a.content == "" {
			continue
		}
		b := a.content[0]
		t.addedFirst[b] = append(t.addedFirst[b], k)
	}
	t.addedLead = -1
	leads := 0
	for b, l := range t.addedFirst {
		if len(l) > 0 {
			leads++
			t.addedLead = b
		}
	}
	if leads != 1 {
		t.addedLead = -1
	}
	for b := range t.addedFirst {
		l := t.addedFirst[b]
		for i := 1; i < len(l); i++ { // insertion sort by length desc
			for j := i; j > 0 && len(t.added[l[j]].content) > len(t.added[l[j-1]].content); j-- {
				l[j], l[j-1] = l[j-1], l[j]
			}
		}
	}
}

// setPiece records id's spelling, growing the table as needed.
func (t *Tokenizer) setPiece(id int, s string) {
	for len(t.pieces) <= id {
		t.pieces = append(t.pieces, "")
	}
	t.pieces[id] = s
}

// initByteTables fills byteIDs (<0xNN> tokens) and, for byte-level
// vocabularies, byteToID and rawVocab.
func (t *Tokenizer) initByteTables() {
	for b := 0; b < 256; b++ {
		if id, ok := t.vocab[byteTokenName(byte(b))]; ok {
			t.byteIDs[b] = int32(id)
		}
	}
	if t.input == inputBytes {
		b2u, u2b := bytesToUnicode()
		for b := 0; b < 256; b++ {
			if id, ok := t.vocab[string(b2u[b])]; ok {
				t.byteToID[b] = int32(id)
			}
		}
		if t.ignoreMerges {
			t.rawVocab = make(map[string]int, len(t.vocab))
			for s, id := range t.vocab {
				if raw, ok := byteLevelDecode(u2b, s); ok {
					t.rawVocab[string(raw)] = id
				}
			}
		}
	}
}

const hexDigits = "0123456789ABCDEF"

func byteTokenName(b byte) string {
	return string([]byte{'<', '0', 'x', hexDigits[b>>4], hexDigits[b&15], '>'})
}

// parseByteToken recognizes "<0xNN>" and returns the byte.
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexVal(s[3])
	lo, ok2 := hexVal(s[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
