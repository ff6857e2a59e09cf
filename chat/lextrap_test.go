package chat

import (
	"strings"
	"testing"
)

// TestNumberDotTrap: the numbers gonja's lexer steps back from by the wrong
// width (digits or a float, then '.' and a non-ASCII character, in a tag's
// code) are found; the same text in string literals, outside tags, after
// an identifier or in hex is not.
func TestNumberDotTrap(t *testing.T) {
	for src, want := range map[string]int{
		"{{\x7f0.ᰰ":                  3,
		"{{ x.0.日 }}":                5,
		"{{ 1.5.é }}":                3,
		"{{ 1e5.日 }}":                3,
		"{% if 12_3.日 %}{% endif %}": 6,
		"a 0.日 {{ 1 }}":              -1, // text, not a tag
		"{{ '0.日' ~ \"1.é\" }}":      -1, // string literals
		"{{ 'it\\'s 0.日' }}":         -1,
		"{{ x1.日 }}":                 -1, // an identifier's digit
		"{{ 0x1f.日 }}":               -1, // hex is read apart
		"{{ 1.5 }} 2.日":              -1,
		"{{ 1. }}{{ 3.x }}":          -1,
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
