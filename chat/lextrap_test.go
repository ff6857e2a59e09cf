package chat

import (
	"strings"
	"testing"
)

// TestNumberDotTrap: a digit followed by '.' and a multi-byte character in
// a tag's code, which gonja's lexer steps back from by the wrong width, is
// found (the offset of that digit); the same text in string literals,
// comments, text outside tags or past a bracket mismatch (where the lexer
// stops) is not, and an invalid byte after the dot (read one byte wide)
// is not either.
func TestNumberDotTrap(t *testing.T) {
	for src, want := range map[string]int{
		"{{\x7f0.ᰰ":                      3,
		"{{ x.0.日 }}":                    5,
		"{{ 1.5.é }}":                    5,
		"{{ 1e5.日 }}":                    5,
		"{% if 12_3.日 %}{% endif %}":     9,
		"a 0.日 {{ 1 }}":                  -1, // text, not a tag
		"{{ '0.日' ~ \"1.é\" }}":          -1, // string literals
		"{{ 'it\\'s 0.日' }}":             -1,
		"{{ x1.日 }}":                     4, // an identifier's digit: refused too
		"{{ 0x1f.日 }}":                   -1,
		"{{ {'a': 1}.x }} 0.日":           -1, // a dict's braces do not end the tag
		"{{ {'a': {'b': 1}} }}{{ 2.日 }}": 24,
		"{{ ٣.日 }}":                      3,  // a digit beyond ASCII
		"{{ 0.\xff }}":                   -1, // an invalid byte is read one byte wide
		"{# 0.日 #}{{ 1 }}":               -1, // a comment
		"{{ (1, 0) ] 0.日 }}":             -1, // the lexer stops at the mismatch
		"{{{\xff\x7f\xea\xea0.ᰰ":         7,  // FuzzRender's second
		"{{ 1.5 }} 2.日":                  -1,
		"{{ 1. }}{{ 3.x }}":              -1,
	} {
		if got := numberDotTrap(src); got != want {
			t.Errorf("numberDotTrap(%q) = %d, want %d", src, got, want)
		}
	}
}

// TestParseRefusesNumberDot: Parse returns an error for FuzzRender's input
// (which made gonja's lexer fill the memory) instead of handing it over.
func TestParseRefusesNumberDot(t *testing.T) {
	for _, src := range []string{"{{{\xff\x7f0.ᰰ\xb0\xb0\xb0\xb00.0.\xf7", "{{\n0.日", "{{ x.0.日 }}"} {
		_, err := Parse(src)
		if err == nil || !strings.Contains(err.Error(), "a number followed by '.'") {
			t.Errorf("Parse(%q): %v", src, err)
		}
	}
}
