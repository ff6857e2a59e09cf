package chat

// gonja's lexer (v2.9.1) reads a number followed by '.' by peeking at the
// character after the dot and then stepping back by that character's width
// rather than the dot's: where it is a multi-byte (non-ASCII) character the
// lexer lands before the number and, after some characters, lexes the same
// text again without end, its tokens filling the memory (FuzzRender:
// "{{\x7f0.ᰰ" took gigabytes in seconds). Such code is an error in Jinja as
// well (or, as in x.0.日, an attribute no chat template uses), so Parse
// refuses it before gonja reads it.

import (
	"strings"
	"unicode/utf8"
)

// numberDotTrap returns the byte offset of the first number inside a tag
// ({{ … }}, {% … %}; outside its string literals) that gonja's lexer would
// step back from wrongly: digits, or a float, followed by '.' and a
// non-ASCII byte. It returns -1 when there is none.
func numberDotTrap(src string) int {
	n := len(src)
	digit := func(i int) bool { return i < n && src[i] >= '0' && src[i] <= '9' }
	digits := func(i int) int { // past a run of digits and underscores
		for i < n && (digit(i) || src[i] == '_') {
			i++
		}
		return i
	}
	identByte := func(c byte) bool {
		return c == '_' || c >= 0x80 || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	dotThenWide := func(i int) bool { return i+1 < n && src[i] == '.' && src[i+1] >= 0x80 }
	inTag := false
	var quote byte
	for i := 0; i < n; i++ {
		c := src[i]
		switch {
		case !inTag:
			if c == '{' && i+1 < n && (src[i+1] == '{' || src[i+1] == '%') {
				inTag = true
				i++
			}
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case (c == '}' || c == '%') && i+1 < n && src[i+1] == '}':
			inTag = false
			i++
		case digit(i) && (i == 0 || !identByte(src[i-1])):
			if c == '0' && i+1 < n && strings.IndexByte("xXbBoO", src[i+1]) >= 0 {
				j := i + 2
				for j < n && identByte(src[j]) {
					j++
				}
				i = j - 1
				continue
			}
			j := digits(i)
			if dotThenWide(j) {
				return i
			}
			if j < n && src[j] == '.' && digit(j+1) {
				j = digits(j + 1)
			}
			if j < n && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < n && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if digit(k) {
					j = digits(k)
				}
			}
			if dotThenWide(j) {
				return i
			}
			i = j - 1
		}
	}
	return -1
}

// snippet is up to 16 bytes of src from i, cut at a character's start.
func snippet(src string, i int) string {
	end := min(len(src), i+16)
	for end > i && end < len(src) && !utf8.RuneStart(src[end]) {
		end--
	}
	return src[i:end]
}
