package tokenizer

// Decoding is a small state machine fed one id at a time; Decode runs it over
// the whole sequence, so streaming and batch decoding agree by construction.
// Three modes mirror the decoders found in the wild:
//
//   - bytes: every token becomes raw bytes (GPT-2 byte-level alphabet, or
//     llama2.c pieces with <0xNN> as raw bytes); bytes are released as soon
//     as they form complete UTF-8, and invalid sequences become U+FFFD the
//     way Rust's String::from_utf8_lossy does (one per maximal invalid part),
//     which is what Hugging Face's ByteLevel decoder returns.
//   - pieces: SentencePiece-style (Replace "▁"→" ", ByteFallback, Fuse,
//     Strip): text tokens are emitted at once, consecutive <0xNN> tokens are
//     collected and released when a text token or the end arrives, as valid
//     UTF-8 or else one U+FFFD per byte (HF's ByteFallback rule).
//   - join: no decoder; tokens joined by spaces, as HF does without one.

import (
	"strings"
	"unicode/utf8"
)

type decodeMode uint8

const (
	decBytes decodeMode = iota
	decPieces
	decJoin
)

type decoderConfig struct {
	mode decodeMode
	// decBytes: raw bytes of each token.
	raw [][]byte
	// llama2c: skip the leading space of a piece that follows BOS, and
	// print nothing for BOS itself (run.c never prints it).
	llama2c bool
	// decPieces: the text of each token after Replace; byteOf[id] >= 0 for
	// <0xNN> tokens when byte fallback is on.
	text   []string
	byteOf []int16
	// strip removes up to stripN leading stripChar runes from the start of
	// the whole output (Strip after Fuse), or of each token when perToken.
	stripN    int
	stripChar rune
	perToken  bool
	// metaFirst: Metaspace decoder; the first token loses every
	// occurrence of this replacement rune instead of turning it into spaces.
	metaFirst string
}

// StreamDecoder turns ids into text incrementally for streaming generation.
// The concatenation of all Add results and Flush equals Decode of all ids.
type StreamDecoder struct {
	t        *Tokenizer
	pending  []byte // decBytes: bytes not yet released
	run      []byte // decPieces: collected byte-fallback bytes
	stripped int    // leading strip chars removed so far
	started  bool   // some non-empty text was emitted (strip is over)
	n        int    // tokens seen
	prev     int
}

// NewDecoder starts a streaming detokenizer.
func (t *Tokenizer) NewDecoder() *StreamDecoder { return &StreamDecoder{t: t, prev: -1} }

// Decode turns ids into text like Hugging Face's decode(ids,
// skip_special_tokens=False). Out-of-range ids are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	d := t.NewDecoder()
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Add(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// Add feeds one id and returns the text it completes; incomplete UTF-8 is
// held back until later ids (or Flush) complete it.
func (d *StreamDecoder) Add(id int) string {
	t := d.t
	if id < 0 || id >= len(t.pieces) {
		return ""
	}
	prev := d.prev
	d.prev = id
	d.n++
	c := &t.dec
	switch c.mode {
	case decBytes:
		b := c.raw[id]
		if c.llama2c {
			if id == t.bos {
				return ""
			}
			if prev == t.bos && len(b) > 0 && b[0] == ' ' {
				b = b[1:]
			}
		}
		d.pending = append(d.pending, b...)
		cut := completePrefix(d.pending)
		if cut == 0 {
			return ""
		}
		s := lossy(d.pending[:cut])
		d.pending = append(d.pending[:0], d.pending[cut:]...)
		return s
	case decPieces:
		if c.byteOf != nil && c.byteOf[id] >= 0 {
			d.run = append(d.run, byte(c.byteOf[id]))
			return ""
		}
		s := d.flushRun()
		tok := c.text[id]
		if d.n == 1 && c.metaFirst != "" {
			tok = strings.ReplaceAll(t.pieces[id], c.metaFirst, "")
		}
		if c.perToken {
			tok = stripLeading(tok, c.stripChar, c.stripN)
		}
		return s + d.emit(tok)
	default:
		s := c.textOrPiece(t, id)
		if d.n > 1 {
			s = " " + s
		}
		return s
	}
}

func (c *decoderConfig) textOrPiece(t *Tokenizer, id int) string {
	if c.text != nil {
		return c.text[id]
	}
	return t.pieces[id]
}

// Flush returns whatever is still held back (an incomplete UTF-8 tail comes
// out as U+FFFD, as in Decode); call it when the sequence ends. A
// StreamDecoder is for one goroutine at a time.
func (d *StreamDecoder) Flush() string {
	switch d.t.dec.mode {
	case decBytes:
		s := lossy(d.pending)
		d.pending = d.pending[:0]
		return s
	case decPieces:
		return d.flushRun()
	}
	return ""
}

// flushRun releases the collected byte-fallback bytes.
func (d *StreamDecoder) flushRun() string {
	if len(d.run) == 0 {
		return ""
	}
	var s string
	if utf8.Valid(d.run) {
		s = string(d.run)
	} else {
		s = strings.Repeat("\uFFFD", len(d.run))
	}
	d.run = d.run[:0]
	if d.t.dec.perToken {
		return s
	}
	return d.emit(s)
}

// emit applies the whole-output leading strip (Strip after Fuse).
func (d *StreamDecoder) emit(s string) string {
	c := &d.t.dec
	if d.started || c.perToken || c.stripN == 0 {
		if s != "" {
			d.started = true
		}
		return s
	}
	for s != "" && d.stripped < c.stripN {
		r, w := utf8.DecodeRuneInString(s)
		if r != c.stripChar {
			d.started = true
			return s
		}
		s = s[w:]
		d.stripped++
	}
	if s != "" || d.stripped >= c.stripN {
		d.started = true
	}
	return s
}

func stripLeading(s string, ch rune, n int) string {
	for i := 0; i < n && s != ""; i++ {
		r, w := utf8.DecodeRuneInString(s)
		if r != ch {
			break
		}
		s = s[w:]
	}
	return s
}

// completePrefix returns how many leading bytes of b can be released: all
// but a trailing sequence that is a valid but incomplete UTF-8 prefix.
func completePrefix(b []byte) int {
	n := len(b)
	// An incomplete sequence is at most 3 bytes long.
	for k := 1; k <= 3 && k <= n; k++ {
		i := n - k
		c := b[i]
		if c < 0x80 {
			return n
		}
		if c >= 0xC0 {
			need := seqLen(c)
			if need > k && validPrefix(b[i:]) {
				return i
			}
			return n
		}
	}
	return n
}

func seqLen(c byte) int {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 2
	case c >= 0xE0 && c <= 0xEF:
		return 3
	case c >= 0xF0 && c <= 0xF4:
		return 4
	}
	return 1
}

// validPrefix reports whether p (starting with a lead byte) is a prefix of
// some valid UTF-8 sequence (Unicode Table 3-7).
func validPrefix(p []byte) bool {
	lo, hi := byte(0x80), byte(0xBF)
	switch p[0] {
	case 0xE0:
		lo = 0xA0
	case 0xED:
		hi = 0x9F
	case 0xF0:
		lo = 0x90
	case 0xF4:
		hi = 0x8F
	}
	if seqLen(p[0]) == 1 {
		return false
	}
	for i := 1; i < len(p); i++ {
		c := p[i]
		if i == 1 {
			if c < lo || c > hi {
				return false
			}
		} else if c < 0x80 || c > 0xBF {
			return false
		}
	}
	return true
}

// lossy converts bytes to a string like Rust's String::from_utf8_lossy: each
// maximal invalid subpart becomes one U+FFFD.
func lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || w > 1 {
			sb.Write(b[i : i+w])
			i += w
			continue
		}
		// Invalid: skip the longest valid prefix of a sequence at i.
		j := i + 1
		if need := seqLen(b[i]); need > 1 {
			for j < len(b) && j-i < need && validPrefix(b[i:j+1]) {
				j++
			}
		}
		sb.WriteString("\uFFFD")
		i = j
	}
	return sb.String()
}
