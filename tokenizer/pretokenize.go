package tokenizer

// Pre-tokenization cuts a normalized text segment into pre-tokens that BPE
// then encodes independently. The regexes that byte-level vocabularies use
// (GPT-2, Llama 3, Qwen2) need look-ahead (`\s+(?!\S)`), which Go's regexp
// lacks, so those three are hand-written scanners: at each position they try
// the pattern's alternatives in order, exactly as a backtracking engine would,
// and return where the leftmost-first match ends. Every position of the text
// is covered by some alternative of these patterns, so a scan never leaves
// gaps. Unknown patterns fall back to Go's regexp, with the common
// `\s+(?!\S)|\s+` tail emulated by shortening the whitespace match.

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The split regexes kiln recognizes and scans by hand.
const (
	patGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter finds the pieces of s that a Split pre-tokenizer's pattern
// matches; the spans are in order and do not overlap.
type splitter interface {
	matches(s string, dst [][2]int) [][2]int
}

// scanner is a hand-written splitter: next returns the end of the match that
// starts at i (always > i for i < len(s)).
type scanner interface {
	splitter
	next(s string, i int) int
}

type gpt2Scanner struct{}

type llama3Scanner struct{ maxDigits int }

func decodeRune(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// Character classes of ASCII runes, looked up instead of computed.
const (
	clLetter = 1 << iota
	clNumber
	clSpace
	clOther
)

var asciiClass = func() (c [128]uint8) {
	for r := range c {
		switch {
		case (r|0x20) >= 'a' && (r|0x20) <= 'z':
			c[r] = clLetter
		case r >= '0' && r <= '9':
			c[r] = clNumber
		case r == ' ' || (r >= '\t' && r <= '\r'):
			c[r] = clSpace
		default:
			c[r] = clOther
		}
	}
	return c
}()

func isLetter(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == clLetter
	}
	return r >= 0 && unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == clNumber
	}
	return r >= 0 && unicode.IsNumber(r)
}

func isSpace(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == clSpace
	}
	return r >= 0 && unicode.IsSpace(r)
}

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == clOther
	}
	return r >= 0 && !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}

// contraction reports the length of 's|'t|'re|'ve|'m|'ll|'d at i (s[i]=='\”).
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return 0
	}
	c := s[i+1]
	if fold {
		c |= 0x20
	}
	switch c {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if i+2 >= len(s) {
			return 0
		}
		c2 := s[i+2]
		if fold {
			c2 |= 0x20
		}
		if (c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l') {
			return 3
		}
	}
	return 0
}

// spanWhile returns the end of the run of runes from i satisfying f.
// ASCII runes of class cl are skipped without decoding or calling f.
func spanWhile(s string, i int, f func(rune) bool) int {
	return spanClass(s, i, 0, f)
}

func spanClass(s string, i int, cl uint8, f func(rune) bool) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf && cl != 0 {
			if asciiClass[c] != cl {
				return i
			}
			i++
			continue
		}
		r, w := decodeRune(s, i)
		if !f(r) {
			break
		}
		i += w
	}
	return i
}

// whitespace implements `\s+(?!\S)|\s+` at i, where s[i] is whitespace: the
// run minus its last rune when a non-space follows and the run has two runes
// or more.
func whitespace(s string, i int) int {
	j := i
	last := i
	for j < len(s) {
		r, w := decodeRune(s, j)
		if !isSpace(r) {
			break
		}
		last = j
		j += w
	}
	if j < len(s) && last > i {
		return last
	}
	return j
}

func (gpt2Scanner) next(s string, i int) int {
	r, w := decodeRune(s, i)
	if r == '\'' {
		if n := contraction(s, i, false); n > 0 {
			return i + n
		}
	}
	start := i
	if r == ' ' {
		r2, w2 := decodeRune(s, i+1)
		if w2 > 0 && !isSpace(r2) {
			r, w = r2, w2
			i++
		}
	}
	switch {
	case isLetter(r):
		return spanClass(s, i+w, clLetter, isLetter)
	case isNumber(r):
		return spanClass(s, i+w, clNumber, isNumber)
	case isOther(r):
		return spanClass(s, i+w, clOther, isOther)
	}
	return whitespace(s, start)
}

func (sc gpt2Scanner) matches(s string, dst [][2]int) [][2]int { return scanAll(sc, s, dst) }

func (sc llama3Scanner) next(s string, i int) int {
	r, w := decodeRune(s, i)
	if r == '\'' {
		if n := contraction(s, i, true); n > 0 {
			return i + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return spanClass(s, i+w, clLetter, isLetter)
	}
	if r != '\r' && r != '\n' && !isNumber(r) {
		if r2, w2 := decodeRune(s, i+w); w2 > 0 && isLetter(r2) {
			return spanClass(s, i+w+w2, clLetter, isLetter)
		}
	}
	// \p{N}{1,3}
	if isNumber(r) {
		j := i + w
		for k := 1; k < sc.maxDigits && j < len(s); k++ {
			r2, w2 := decodeRune(s, j)
			if !isNumber(r2) {
				break
			}
			j += w2
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r == ' ' {
		if r2, w2 := decodeRune(s, i+1); w2 > 0 && isOther(r2) {
			j = i + 1
			r, w = r2, w2
		}
	}
	if isOther(r) {
		j = spanClass(s, j+w, clOther, isOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// \s*[\r\n]+ : the whitespace run up to and including its last newline.
	end := i
	nl := -1
	for end < len(s) {
		r2, w2 := decodeRune(s, end)
		if !isSpace(r2) {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			nl = end + 1
		}
		end += w2
	}
	if nl > 0 {
		return nl
	}
	return whitespace(s, i)
}

func (sc llama3Scanner) matches(s string, dst [][2]int) [][2]int { return scanAll(sc, s, dst) }

func scanAll(sc scanner, s string, dst [][2]int) [][2]int {
	for i := 0; i < len(s); {
		j := sc.next(s, i)
		if j <= i { // defensive: never loop forever
			_, w := decodeRune(s, i)
			j = i + w
		}
		dst = append(dst, [2]int{i, j})
		i = j
	}
	return dst
}

// regexSplitter runs a Go regexp; wsGroup, when > 0, is the capture group
// that replaced `\s+(?!\S)|\s+` and gets the look-ahead shortening.
type regexSplitter struct {
	re      *regexp.Regexp
	wsGroup int
}

func (rs *regexSplitter) matches(s string, dst [][2]int) [][2]int {
	for i := 0; i <= len(s); {
		m := rs.re.FindStringSubmatchIndex(s[i:])
		if m == nil {
			break
		}
		a, b := i+m[0], i+m[1]
		if rs.wsGroup > 0 && m[2*rs.wsGroup] >= 0 && b < len(s) {
			// \s+(?!\S): give the last space back when a non-space follows.
			if last := lastRuneStart(s, a, b); last > a {
				b = last
			}
		}
		if b == a { // empty match: step one rune
			if a >= len(s) {
				break
			}
			_, w := decodeRune(s, a)
			i = a + w
			continue
		}
		dst = append(dst, [2]int{a, b})
		i = b
	}
	return dst
}

func lastRuneStart(s string, a, b int) int {
	_, w := utf8.DecodeLastRuneInString(s[a:b])
	return b - w
}

const unicodeSpaces = `\t\n\v\f\r\x{85}\p{Z}`

// widenSpaces rewrites \s and \S (outside and inside bracket classes) to
// Unicode White_Space.
func widenSpaces(pat string) string {
	var sb strings.Builder
	inClass := false
	for i := 0; i < len(pat); i++ {
		c := pat[i]
		if c == '\\' && i+1 < len(pat) {
			switch d := pat[i+1]; {
			case d == 's' && inClass:
				sb.WriteString(unicodeSpaces)
			case d == 's':
				sb.WriteString("[" + unicodeSpaces + "]")
			case d == 'S' && !inClass:
				sb.WriteString("[^" + unicodeSpaces + "]")
			default:
				sb.WriteByte(c)
				sb.WriteByte(d)
			}
			i++
			continue
		}
		if c == '[' && !inClass {
			inClass = true
			sb.WriteByte(c)
			// A ']' right after '[' or '[^' is a literal.
			if i+1 < len(pat) && pat[i+1] == '^' {
				sb.WriteByte('^')
				i++
			}
			if i+1 < len(pat) && pat[i+1] == ']' {
				sb.WriteByte(']')
				i++
			}
			continue
		}
		if c == ']' && inClass {
			inClass = false
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// stringSplitter matches a literal string.
type stringSplitter struct{ lit string }

func (ss stringSplitter) matches(s string, dst [][2]int) [][2]int {
	if ss.lit == "" {
		return dst
	}
	for i := 0; ; {
		k := strings.Index(s[i:], ss.lit)
		if k < 0 {
			return dst
		}
		dst = append(dst, [2]int{i + k, i + k + len(ss.lit)})
		i += k + len(ss.lit)
	}
}

// newRegexSplitter picks a hand-written scanner for the known patterns and
// compiles anything else with Go's regexp.
func newRegexSplitter(pat string) (splitter, error) {
	switch pat {
	case patGPT2:
		return gpt2Scanner{}, nil
	case patLlama3:
		return llama3Scanner{maxDigits: 3}, nil
	case patQwen2:
		return llama3Scanner{maxDigits: 1}, nil
	}
	return compileSplitRegex(pat)
}

// compileSplitRegex compiles a split pattern with Go's regexp. `\s` and
// `\S` are widened to Unicode White_Space (Go's are ASCII-only, Oniguruma's
// are not), and a trailing `\s+(?!\S)|\s+` becomes a capture group whose
// match gives back its last rune when a non-space follows.
func compileSplitRegex(pat string) (splitter, error) {
	wsGroup := 0
	const tail = `\s+(?!\S)|\s+`
	emulated := strings.HasSuffix(pat, tail)
	if emulated {
		pat = strings.TrimSuffix(pat, tail) + `(\s+)`
	}
	re, err := regexp.Compile(widenSpaces(pat))
	if err != nil {
		return nil, fmt.Errorf("split pattern %q: %w", pat, err)
	}
	if emulated {
		wsGroup = re.NumSubexp()
	}
	return &regexSplitter{re: re, wsGroup: wsGroup}, nil
}

// Split behaviors of Hugging Face pre-tokenizers.
type splitBehavior uint8

const (
	behIsolated splitBehavior = iota
	behRemoved
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

// applySplit cuts s by the matches of sp under the given behavior and
// appends the resulting pieces (as spans) to dst.
func applySplit(sp splitter, beh splitBehavior, invert bool, s string, dst [][2]int, tmp [][2]int) ([][2]int, [][2]int) {
	tmp = sp.matches(s, tmp[:0])
	// Turn matches into alternating (span, isMatch) pieces covering s.
	type piece struct {
		a, b  int
		match bool
	}
	var pieces []piece
	prev := 0
	for _, m := range tmp {
		if m[0] > prev {
			pieces = append(pieces, piece{prev, m[0], invert})
		}
		pieces = append(pieces, piece{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev < len(s) {
		pieces = append(pieces, piece{prev, len(s), invert})
	}
	switch beh {
	case behIsolated:
		for _, p := range pieces {
			dst = append(dst, [2]int{p.a, p.b})
		}
	case behRemoved:
		for _, p := range pieces {
			if !p.match {
				dst = append(dst, [2]int{p.a, p.b})
			}
		}
	case behMergedWithPrevious:
		for _, p := range pieces {
			if p.match && len(dst) > 0 && dst[len(dst)-1][1] == p.a && len(pieces) > 0 {
				dst[len(dst)-1][1] = p.b
			} else {
				dst = append(dst, [2]int{p.a, p.b})
			}
		}
	case behMergedWithNext:
		pending := -1
		for _, p := range pieces {
			if p.match {
				if pending >= 0 {
					dst = append(dst, [2]int{pending, p.a})
				}
				pending = p.a
				continue
			}
			if pending >= 0 {
				dst = append(dst, [2]int{pending, p.b})
				pending = -1
			} else {
				dst = append(dst, [2]int{p.a, p.b})
			}
		}
		if pending >= 0 {
			dst = append(dst, [2]int{pending, len(s)})
		}
	case behContiguous:
		for i, p := range pieces {
			if i > 0 && p.match && pieces[i-1].match && dst[len(dst)-1][1] == p.a {
				dst[len(dst)-1][1] = p.b
			} else {
				dst = append(dst, [2]int{p.a, p.b})
			}
		}
	}
	return dst, tmp
}

// bytesToUnicode is GPT-2's reversible map from bytes to printable runes:
// printable Latin-1 bytes map to themselves, the rest to U+0100 onwards.
func bytesToUnicode() (b2u [256]rune, u2b map[rune]byte) {
	u2b = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2u[b] = rune(b)
		} else {
			b2u[b] = rune(256 + n)
			n++
		}
		u2b[b2u[b]] = byte(b)
	}
	return b2u, u2b
}

// byteLevelString maps raw bytes to their byte-level token spelling.
func byteLevelString(b2u *[256]rune, raw string) string {
	var sb strings.Builder
	for i := 0; i < len(raw); i++ {
		sb.WriteRune(b2u[raw[i]])
	}
	return sb.String()
}

// byteLevelDecode maps a byte-level token back to raw bytes; ok is false when
// some rune is outside the byte alphabet (HF then keeps the token's own bytes).
func byteLevelDecode(u2b map[rune]byte, tok string) ([]byte, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := u2b[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
