package chat

import (
	"strings"
	"testing"
)

// TestRenderRefusesCycles: a template that makes a value hold itself fails
// with an error (gonja's printing of such a value overflowed the stack and
// killed the process: FuzzRender), and the ordinary uses of namespaces,
// cyclers and kwargs render as before.
func TestRenderRefusesCycles(t *testing.T) {
	for _, src := range []string{
		"{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}",
		"{% set ns=namespace()%}{%for i in range(4)%}{%set ns.a=ns%}{%endfor%}{{ns.a}}e", // FuzzRender's
		"{% set ns = namespace() %}{% set ns.a = [1, ns] %}{{ ns.a }}",
		"{% set ns = namespace() %}{% set ns['a'] = ns %}{{ ns|dictsort }}",
		"{% set ns = namespace() %}{% set ns.a = {'x': [ns]} %}{{ ns.items()|list }}",
		"{% set ns = namespace() %}{% set m = namespace(o=ns) %}{% set ns.a = m %}{{ ns }}",
		"{% set c = cycler(1, 2) %}{% set c.a = c %}{{ c }}",
		"{% macro f(**kw) %}{% set kw.a = kw %}{{ kw }}{% endmacro %}{{ f(x=1) }}",
		"{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set ns.l = ns.l + [ns] %}{% endfor %}{{ ns }}",
	} {
		tpl, err := Parse(src)
		if err != nil {
			t.Errorf("%q: parse: %v", src, err)
			continue
		}
		out, err := tpl.Render(nil, Options{})
		// (gonja's macro calls keep the message, not the error chain)
		if err == nil || !strings.Contains(err.Error(), errHoldsItself.Error()) {
			t.Errorf("%q: %q, %v; want %v", src, out, err, errHoldsItself)
		}
	}
	for src, want := range map[string]string{
		"{% set ns = namespace(found=false) %}{% for i in range(3) %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}": "True",
		"{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l }}":                                    "[0, 1, 2]",
		"{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}{% set b.z = a %}{{ b.z.x }}{{ b.y.x }}":                                           "11",
		"{% set ns = namespace(d={'k': 'v'}) %}{% set ns.e = ns.d %}{{ ns.e.k }}":                                                                   "v",
		"{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}":                                                                  "aba",
	} {
		tpl, err := Parse(src)
		if err != nil {
			t.Errorf("%q: parse: %v", src, err)
			continue
		}
		out, err := tpl.Render(nil, Options{})
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("%q: %q, %v; want %q", src, out, err, want)
		}
	}
}

// TestCheckAcyclicDepth: a value nested past maxValueDepth is refused
// rather than walked.
func TestCheckAcyclicDepth(t *testing.T) {
	var v any = 1
	for range maxValueDepth + 2 {
		v = []any{v}
	}
	if err := checkAcyclic(v); err == nil {
		t.Error("a list nested past maxValueDepth passed")
	}
	if err := checkAcyclic([]any{map[string]any{"a": 1}, "x"}); err != nil {
		t.Error(err)
	}
}
