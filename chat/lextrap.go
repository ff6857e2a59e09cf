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
	"unicode"
	"unicode/utf8"
)

// numberDotTrap returns the byte offset of the first digit in a tag's code
// ({{ … }}, {% … %}, outside its string literals, found as gonja's lexer
// finds them) followed by '.' and a multi-byte character, or -1 when there
// is none. It looks at every digit, an identifier's last one too (x1.日),
// which rejects a little more than the lexer stumbles on.
func numberDotTrap(src string) int {
	n := len(src)
	i := 0
	for i < n {
		// Text: up to the next tag or comment.
		j := strings.IndexByte(src[i:], '{')
		if j < 0 {
			return -1
		}
		i += j
		if i+1 >= n {
			return -1
		}
		var end string
		switch src[i+1] {
		case '{':
			end = "}}"
		case '%':
			end = "%}"
		case '#':
			k := strings.Index(src[i+2:], "#}")
			if k < 0 {
				return -1
			}
			i += 2 + k + 2
			continue
		default:
			i++
			continue
		}
		// Code: brackets opened, strings, until the end not inside a bracket.
		i += 2
		var closers []byte
		var quote byte
		for i < n {
			c := src[i]
			if quote != 0 {
				switch c {
				case '\\':
					i += 2
				case quote:
					quote = 0
					i++
				default:
					i++
				}
				continue
			}
			if len(closers) == 0 && strings.HasPrefix(src[i:], end) {
				i += len(end)
				break
			}
			switch c {
			case '\'', '"':
				quote = c
			case '(':
				closers = append(closers, ')')
			case '[':
				closers = append(closers, ']')
			case '{':
				closers = append(closers, '}')
			case ')', ']', '}':
				if len(closers) == 0 || closers[len(closers)-1] != c {
					return -1 // gonja's lexer stops at the mismatch
				}
				closers = closers[:len(closers)-1]
			}
			r, w := utf8.DecodeRuneInString(src[i:])
			if unicode.IsDigit(r) && i+w+1 < n && src[i+w] == '.' {
				if _, after := utf8.DecodeRuneInString(src[i+w+1:]); after > 1 {
					return i
				}
			}
			i += w
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
