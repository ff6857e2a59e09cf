package chat

import (
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// gonja parses Jinja's conditional expression (A if B else C) only as a
// whole {{ ... }} output, not inside parentheses or call arguments, where
// real templates use it (Gemma 3's: '<start_of_turn>' + role + '\n' +
// (first_user_prefix if loop.first else "")). rewriteConditionals turns
// each such parenthesized or argument conditional into a call of ifElse,
// which gonja parses; ifElse evaluates both branches (jinja2 evaluates only
// the one taken: the same output unless the other branch fails, e.g. an
// index out of range).

// ifElseName is the function the rewritten conditionals call.
const ifElseName = "__kiln_if_else"

// ifElse is (a if cond else b).
func ifElse(va *exec.VarArgs) (any, error) {
	if len(va.Args) != 3 {
		return nil, nil
	}
	if va.Args[0].IsTrue() {
		return va.Args[1].Interface(), nil
	}
	return va.Args[2].Interface(), nil
}

// rewriteConditionals rewrites the conditional expressions inside the
// parentheses of src's tags ({{ }} and {% %}).
func rewriteConditionals(src string) string {
	var b strings.Builder
	for {
		i := indexTag(src)
		if i < 0 {
			b.WriteString(src)
			return b.String()
		}
		closer := "}}"
		if src[i+1] == '%' {
			closer = "%}"
		}
		end := tagEnd(src, i+2, closer)
		if end < 0 {
			b.WriteString(src)
			return b.String()
		}
		b.WriteString(src[:i+2])
		b.WriteString(rewriteParens(src[i+2 : end]))
		src = src[end:]
	}
}

// indexTag is where the next {{ or {% opens (-1: none).
func indexTag(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%') {
			return i
		}
	}
	return -1
}

// tagEnd is where closer ends the tag whose body starts at from (string
// literals skipped), or -1.
func tagEnd(s string, from int, closer string) int {
	for i := from; i+1 < len(s); i++ {
		switch s[i] {
		case '\'', '"':
			i = stringEnd(s, i)
		default:
			if strings.HasPrefix(s[i:], closer) {
				return i
			}
		}
	}
	return -1
}

// stringEnd is the index of the quote closing the literal opening at i
// (len(s)-1 when it does not close).
func stringEnd(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case q:
			return j
		}
	}
	return len(s) - 1
}

// rewriteParens rewrites expr's parenthesized parts, innermost first: the
// arguments (or the one expression) between each pair of parentheses that
// are conditionals become ifElse calls.
func rewriteParens(expr string) string {
	var b strings.Builder
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; c {
		case '\'', '"':
			j := stringEnd(expr, i)
			b.WriteString(expr[i : j+1])
			i = j
		case '(':
			j := matchParen(expr, i)
			if j < 0 {
				b.WriteString(expr[i:])
				return b.String()
			}
			var args []string
			for _, a := range splitTop(expr[i+1:j], ',') {
				args = append(args, rewriteConditional(rewriteParens(a)))
			}
			b.WriteString("(" + strings.Join(args, ",") + ")")
			i = j
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// rewriteConditional is e as an ifElse call when it is a conditional "A if
// B else C" at its top level, else e.
func rewriteConditional(e string) string {
	parts := splitKeyword(e, "if")
	if len(parts) != 2 || strings.TrimSpace(parts[0]) == "" {
		return e
	}
	rest := splitKeyword(parts[1], "else")
	if len(rest) < 2 {
		return e
	}
	cond, alt := rest[0], strings.Join(rest[1:], " else ")
	return ifElseName + "(" + cond + "," + parts[0] + "," + rewriteConditional(alt) + ")"
}

// topLevel calls at(i) for each index i of s outside parentheses,
// brackets, braces and string literals, in order, until at returns true.
func topLevel(s string, at func(i int) bool) {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			i = stringEnd(s, i)
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth == 0 && at(i):
			return
		}
	}
}

// splitTop splits s at sep where it stands outside parentheses, brackets,
// braces and string literals.
func splitTop(s string, sep byte) []string {
	var out []string
	start := 0
	topLevel(s, func(i int) bool {
		if s[i] == sep {
			out = append(out, s[start:i])
			start = i + 1
		}
		return false
	})
	return append(out, s[start:])
}

// splitKeyword splits s at the top-level word kw (whitespace around it), at
// its first occurrence.
func splitKeyword(s, kw string) []string {
	out := []string{s}
	topLevel(s, func(i int) bool {
		if isSpace(s[i]) && strings.HasPrefix(s[i+1:], kw) && i+1+len(kw) < len(s) && isSpace(s[i+1+len(kw)]) {
			out = []string{s[:i], s[i+1+len(kw):]}
			return true
		}
		return false
	})
	return out
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// matchParen is the index of the parenthesis closing the one at i, or -1.
func matchParen(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '\'', '"':
			j = stringEnd(s, j)
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}
