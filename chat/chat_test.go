package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/internal/testshared"
)

// fixtureNow is the instant make_fixtures.py freezes strftime_now at.
var fixtureNow = time.Date(2025, 3, 9, 14, 5, 7, 0, time.Local)

// expected is testdata/chat/expected.json (see tools/chat-fixtures).
type expected struct {
	Jinja2    string `json:"jinja2"`
	Now       string `json:"now"`
	Templates map[string]struct {
		Path  string        `json:"path"`
		BOS   *string       `json:"bos_token"`
		EOS   *string       `json:"eos_token"`
		Cases []fixtureCase `json:"cases"`
	} `json:"templates"`
	SnippetVars map[string]json.RawMessage `json:"snippet_vars"`
	Snippets    []snippetCase              `json:"snippets"`
}

type fixtureCase struct {
	Name                string                     `json:"name"`
	Messages            []fixtureMessage           `json:"messages"`
	AddGenerationPrompt bool                       `json:"add_generation_prompt"`
	Tools               []json.RawMessage          `json:"tools"`
	Extra               map[string]json.RawMessage `json:"extra"`
	Output              *string                    `json:"output"`
	Error               string                     `json:"error"`
	Raised              bool                       `json:"raised"`
}

type fixtureMessage struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	Name       string `json:"name"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type snippetCase struct {
	Template string  `json:"template"`
	Output   *string `json:"output"`
	Error    string  `json:"error"`
	Raised   bool    `json:"raised"`
}

func (m fixtureMessage) message() Message {
	out := Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out
}

func loadExpected(t testing.TB) *expected {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "chat", "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e expected
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if e.Now != "2025-03-09T14:05:07" {
		t.Fatalf("fixtures freeze strftime_now at %s, the test at %s", e.Now, fixtureNow)
	}
	return &e
}

// loadTemplate reads a fixture template from ../shared the way a model
// folder is read.
func loadTemplate(t *testing.T, rel string) *Template {
	t.Helper()
	if file, entry, ok := strings.Cut(rel, "#"); ok {
		// Entry N of a JSON list of {"template", "name"} (ollama's index).
		b, err := os.ReadFile(testshared.Path(t, file))
		if err != nil {
			t.Fatal(err)
		}
		var list []struct{ Template string }
		n, err := strconv.Atoi(entry)
		if err == nil {
			err = json.Unmarshal(b, &list)
		}
		if err != nil || n < 0 || n >= len(list) {
			t.Fatalf("%s: entry %s of %d: %v", rel, entry, len(list), err)
		}
		tpl, err := Parse(list[n].Template)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return tpl
	}
	p := testshared.Path(t, rel)
	if strings.HasSuffix(rel, ".jinja") && filepath.Base(rel) != "chat_template.jinja" {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := Parse(string(b))
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return tpl
	}
	tpl, err := FromTokenizerConfig(filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// TestFixtures renders every fixture conversation with every real template
// and compares with jinja2's output byte for byte.
func TestFixtures(t *testing.T) {
	e := loadExpected(t)
	for name, tc := range e.Templates {
		t.Run(name, func(t *testing.T) {
			tpl := loadTemplate(t, tc.Path)
			if strings.HasSuffix(tc.Path, "tokenizer_config.json") || strings.HasSuffix(tc.Path, "/chat_template.jinja") {
				// The tokens come from the model folder's config: check them.
				if tpl.BOS != deref(tc.BOS) || tpl.EOS != deref(tc.EOS) {
					t.Errorf("config tokens BOS %q EOS %q, fixtures used %v %v", tpl.BOS, tpl.EOS, tc.BOS, tc.EOS)
				}
			} else {
				// A bare template: the fixtures chose its family's tokens.
				tpl.BOS, tpl.EOS = deref(tc.BOS), deref(tc.EOS)
			}
			matched := 0
			for _, c := range tc.Cases {
				label := fmt.Sprintf("%s/agp=%v", c.Name, c.AddGenerationPrompt)
				got, err := tpl.Render(fixtureMessages(c.Messages), fixtureOptions(c))
				switch {
				case c.Output != nil && err != nil:
					t.Errorf("%s: %v", label, err)
				case c.Output != nil && got != *c.Output:
					t.Errorf("%s: output differs from jinja2\n got: %q\nwant: %q", label, got, *c.Output)
				case c.Output == nil && err == nil:
					t.Errorf("%s: rendered %q, jinja2 failed with %s", label, got, c.Error)
				case c.Output == nil && c.Raised:
					var re *RaisedError
					if !errors.As(err, &re) || re.Message != c.Error {
						t.Errorf("%s: error %v, want raise_exception(%q)", label, err, c.Error)
					} else {
						matched++
					}
				default:
					matched++
				}
			}
			t.Logf("%d/%d cases identical to jinja2", matched, len(tc.Cases))
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func fixtureMessages(in []fixtureMessage) []Message {
	out := make([]Message, len(in))
	for i, m := range in {
		out[i] = m.message()
	}
	return out
}

func fixtureOptions(c fixtureCase) Options {
	o := Options{AddGenerationPrompt: c.AddGenerationPrompt, Tools: c.Tools, Now: fixtureNow}
	if len(c.Extra) > 0 {
		o.Extra = map[string]any{}
		for k, v := range c.Extra {
			o.Extra[k] = v
		}
	}
	return o
}

// knownDifferences are snippets where gonja's evaluator parts from jinja2
// and this package does not step in (the package comment lists them), with
// what this package renders; no real template tested here meets them. The
// test pins the rendering, so that a gonja release that changes one shows.
var knownDifferences = map[string]struct{ got, why string }{
	"{{ 2 ** 10 }}":                   {"1024.0", "gonja's ** always gives a float"},
	"{{ not n }}":                     {"0", "gonja's not of a number is a number"},
	"{{ 'ab' ~ none }}":               {"ab", "gonja has no None apart from undefined, which prints as ''"},
	"{{ none }}|{{ none_value }}":     {"|", "gonja has no None apart from undefined, which prints as ''"},
	"{{ none_value is defined }}":     {"False", "gonja has no None apart from undefined"},
	"{{ none_value | default('d') }}": {"d", "gonja has no None apart from undefined"},
	"{{ nope is none }}":              {"True", "gonja has no None apart from undefined"},
	"{{ 'héllo'[1] }}":                {"Ã", "gonja indexes a string by bytes"},
}

// TestSnippets renders small templates, one Jinja feature each, and
// compares with jinja2.
func TestSnippets(t *testing.T) {
	e := loadExpected(t)
	vars := map[string]any{}
	for k, raw := range e.SnippetVars {
		v, err := decodeJSON(raw)
		if err != nil {
			t.Fatalf("snippet_vars[%s]: %v", k, err)
		}
		vars[k] = v
	}
	for _, s := range e.Snippets {
		tpl, err := Parse(s.Template)
		if err != nil {
			if s.Output != nil {
				t.Errorf("%q: %v", s.Template, err)
			}
			continue
		}
		got, err := tpl.execute(vars, fixtureNow)
		if known, ok := knownDifferences[s.Template]; ok {
			if err != nil || got != known.got {
				t.Errorf("%q: known difference (%s) rendered %q, %v; pinned %q, jinja2 %q", s.Template, known.why, got, err, known.got, *s.Output)
			}
			continue
		}
		switch {
		case s.Output != nil && err != nil:
			t.Errorf("%q: %v\nwant: %q", s.Template, err, *s.Output)
		case s.Output != nil && got != *s.Output:
			t.Errorf("%q: output differs from jinja2\n got: %q\nwant: %q", s.Template, got, *s.Output)
		case s.Output == nil && err == nil:
			t.Errorf("%q: rendered %q, jinja2 failed with %s", s.Template, got, s.Error)
		case s.Output == nil && s.Raised:
			var re *RaisedError
			if !errors.As(err, &re) || re.Message != s.Error {
				t.Errorf("%q: error %v, want raise_exception(%q)", s.Template, err, s.Error)
			}
		}
	}
}

func TestKnownDifferencesAreSnippets(t *testing.T) {
	e := loadExpected(t)
	for text := range knownDifferences {
		found := false
		for _, s := range e.Snippets {
			found = found || s.Template == text
		}
		if !found {
			t.Errorf("known difference %q is not among the snippets", text)
		}
	}
}

// TestRaiseException checks that raise_exception surfaces as a
// *RaisedError naming the template's message, for a real template (Mistral
// refuses a system message) and for an inline one.
func TestRaiseException(t *testing.T) {
	inline, err := Parse(`{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role: ' ~ m.content) }}{% endif %}{{ m.content }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "be terse"}, {Role: "user", Content: "hi"}}
	_, err = inline.Render(msgs, Options{})
	var re *RaisedError
	if !errors.As(err, &re) || re.Message != "no system role: be terse" {
		t.Fatalf("error %v, want RaisedError(no system role: be terse)", err)
	}
	if out, err := inline.Render(msgs[1:], Options{}); err != nil || out != "hi" {
		t.Fatalf("without the system message: %q, %v", out, err)
	}

	mistral := loadTemplate(t, "tokenizers/chat-templates/mistral-instruct-a.jinja")
	_, err = mistral.Render(msgs, Options{BOS: "<s>", EOS: "</s>"})
	if !errors.As(err, &re) || re.Message != "Conversation roles must alternate user/assistant/user/assistant/..." {
		t.Fatalf("mistral: error %v, want the role-order RaisedError", err)
	}
}

// TestMalformed checks that bad templates are errors, at parse time or at
// render time, and never panics.
func TestMalformed(t *testing.T) {
	parseErrors := []string{
		"{% if x %}", "{{ x", "{% for %}", "{% endfor %}", "{% unknowntag %}", "{% set x = %}",
		"{{ }}", "{%", "{{", "{#", "{% raw %}", "{% macro %}", "{% generation %}", "{% generation x %}{% endgeneration %}",
		"{% extends 'base' %}",
	}
	for _, src := range parseErrors {
		if _, err := Parse(src); err == nil {
			t.Errorf("Parse(%q) gave no error", src)
		}
	}
	renderErrors := []string{
		"{{ x | nofilter }}", "{{ x is nosuchtest }}", "{{ nofunc() }}", "{{ 'a' * -1 }}", "{{ 7 % 0 }}",
		"{% include 'other' %}", "{{ x.y.z }}", "{{ 'a'[::0] }}", "{{ range(1, 2, 0) }}", "{{ range(10000000) }}",
		"{{ strftime_now() }}", "{{ messages | tojson(indent=[1]) }}", "{{ (messages | items) }}",
		"{{ 'abc'.split('') }}", "{{ {1: 2} | dictsort }}" + "{{ {'a': 1, 'b': 'x'} | dictsort(by='value') }}",
	}
	for _, src := range renderErrors {
		tpl, err := Parse(src)
		if err != nil {
			t.Errorf("Parse(%q): %v", src, err)
			continue
		}
		if out, err := tpl.Render([]Message{{Role: "user", Content: "hi"}}, Options{}); err == nil {
			t.Errorf("Render(%q) = %q, want an error", src, out)
		}
	}
}

func TestOptions(t *testing.T) {
	tpl, err := Parse(`{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ flag }}|{{ obj | tojson }}|{{ m | tojson }}|{{ strftime_now('%Y') }}`)
	if err != nil {
		t.Fatal(err)
	}
	tpl.BOS, tpl.EOS = "<s>", "</s>"
	o := Options{
		EOS:   "<eos>",
		Tools: []json.RawMessage{json.RawMessage(`{"z": 1, "a": [true, null, 1.50]}`)},
		Extra: map[string]any{"flag": false, "obj": json.RawMessage(`{"y": 1, "x": 2}`), "m": map[string]any{"y": 1, "x": []string{"a"}}},
		Now:   time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	got, err := tpl.Render(nil, o)
	want := `<s>|<eos>|[{"z": 1, "a": [true, null, 1.5]}]|False|{"y": 1, "x": 2}|{"x": ["a"], "y": 1}|1999`
	if err != nil || got != want {
		t.Errorf("got %q, %v\nwant %q", got, err, want)
	}

	for _, bad := range []Options{
		{Extra: map[string]any{"messages": 1}},
		{Extra: map[string]any{"x": json.RawMessage(`{`)}},
		{Extra: map[string]any{"x": func() {}}},
		{Tools: []json.RawMessage{json.RawMessage(`{"a": }`)}},
	} {
		if _, err := tpl.Render(nil, bad); err == nil {
			t.Errorf("Render with %+v gave no error", bad)
		}
	}
}

// TestMessageValue checks what a template sees of a message: keys in a
// fixed order, optional ones only when set, arguments decoded in order (or
// kept as text when they are not JSON).
func TestMessageValue(t *testing.T) {
	tpl, err := Parse(`{% for m in messages %}{{ m | tojson }}{{ 'tool_calls' in m }}{{ m.name is defined }}
{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render([]Message{
		{Role: "user", Content: "hi"},
		{Role: "assistant", ToolCalls: []ToolCall{
			{ID: "c1", Name: "f", Arguments: json.RawMessage(`{"b": 1, "a": "x"}`)},
			{Name: "g", Arguments: json.RawMessage(`not json`)},
			{Name: "h"},
		}},
		{Role: "tool", Content: "42", Name: "f", ToolCallID: "c1"},
	}, Options{})
	want := `{"role": "user", "content": "hi"}FalseFalse
{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}, {"type": "function", "function": {"name": "g", "arguments": "not json"}}, {"type": "function", "function": {"name": "h", "arguments": {}}}]}TrueFalse
{"role": "tool", "content": "42", "name": "f", "tool_call_id": "c1"}FalseTrue
`
	if err != nil || got != want {
		t.Errorf("got %s, %v\nwant %s", got, err, want)
	}
}

func TestFromTokenizerConfig(t *testing.T) {
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		name     string
		files    map[string]string
		want     string // rendered with no messages; "" for an error
		bos, eos string
	}{
		{"string", map[string]string{"tokenizer_config.json": `{"chat_template": "S{{ bos_token }}", "bos_token": "<s>", "eos_token": "</s>"}`}, "S<s>", "<s>", "</s>"},
		{"named list", map[string]string{"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}`}, "D", "", ""},
		{"added-token objects", map[string]string{"tokenizer_config.json": `{"chat_template": "x", "bos_token": {"content": "<|b|>", "lstrip": false}, "eos_token": null}`}, "x", "<|b|>", ""},
		{"jinja file wins", map[string]string{"tokenizer_config.json": `{"chat_template": "X", "eos_token": "E"}`, "chat_template.jinja": "J{{ eos_token }}"}, "JE", "", "E"},
		{"jinja file alone", map[string]string{"chat_template.jinja": "J"}, "J", "", ""},
		{"list without default", map[string]string{"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "T"}]}`}, "", "", ""},
		{"no template", map[string]string{"tokenizer_config.json": `{"bos_token": "<s>"}`}, "", "", ""},
		{"bad json", map[string]string{"tokenizer_config.json": `{`}, "", "", ""},
		{"bad template", map[string]string{"tokenizer_config.json": `{"chat_template": "{% if %}"}`}, "", "", ""},
		{"empty folder", map[string]string{}, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := FromTokenizerConfig(write(t, tc.files))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tpl.BOS != tc.bos || tpl.EOS != tc.eos {
				t.Errorf("BOS %q EOS %q, want %q %q", tpl.BOS, tpl.EOS, tc.bos, tc.eos)
			}
			if got, err := tpl.Render(nil, Options{}); err != nil || got != tc.want {
				t.Errorf("rendered %q, %v; want %q", got, err, tc.want)
			}
		})
	}

	// Real folders: SmolLM2's tokenizer_config.json has no chat template.
	if _, err := FromTokenizerConfig(testshared.Path(t, "tokenizers", "smollm2-135m-instruct")); err == nil {
		t.Error("smollm2-135m-instruct: no error for a config without a chat template")
	}
	qwen, err := FromTokenizerConfig(testshared.Path(t, "tokenizers", "qwen2.5-instruct"))
	if err != nil {
		t.Fatal(err)
	}
	if qwen.BOS != "" || qwen.EOS != "<|im_end|>" || !strings.Contains(qwen.Source(), "<|im_start|>") {
		t.Errorf("qwen2.5: BOS %q EOS %q", qwen.BOS, qwen.EOS)
	}
}

func TestFromGGUF(t *testing.T) {
	md := map[string]any{
		"tokenizer.chat_template":      "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
		"tokenizer.ggml.tokens":        []string{"<unk>", "<s>", "</s>"},
		"tokenizer.ggml.bos_token_id":  uint32(1),
		"tokenizer.ggml.eos_token_id":  uint32(2),
		"general.architecture":         "llama",
		"tokenizer.ggml.padding_token": int32(0),
	}
	tpl, err := FromGGUF(md)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tpl.Render([]Message{{Role: "user", Content: "hi"}}, Options{}); err != nil || got != "<s>hi</s>" {
		t.Errorf("got %q, %v", got, err)
	}
	md["tokenizer.ggml.tokens"] = []any{"a"} // ids out of range: no tokens
	if tpl, err := FromGGUF(md); err != nil || tpl.BOS != "" || tpl.EOS != "" {
		t.Errorf("out-of-range ids: %v, BOS %q EOS %q", err, tpl.BOS, tpl.EOS)
	}
	for _, bad := range []map[string]any{{}, {"tokenizer.chat_template": 3}, {"tokenizer.chat_template": "{% for %}"}} {
		if _, err := FromGGUF(bad); err == nil {
			t.Errorf("FromGGUF(%v): no error", bad)
		}
	}
}

// TestConcurrentRender renders one template from several goroutines (run
// with -race).
func TestConcurrentRender(t *testing.T) {
	e := loadExpected(t)
	tc := e.Templates["qwen3"]
	tpl := loadTemplate(t, tc.Path)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := tc.Cases[i%len(tc.Cases)]
			for range 5 {
				got, err := tpl.Render(fixtureMessages(c.Messages), fixtureOptions(c))
				if c.Output != nil && (err != nil || got != *c.Output) {
					t.Errorf("%s: concurrent render differs: %v", c.Name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		1: "1.0", 0.1: "0.1", 1e-5: "1e-05", 1e-4: "0.0001", 1.5e-7: "1.5e-07", 1e16: "1e+16", 1e15: "1000000000000000.0",
		123456789.125: "123456789.125", 3e20: "3e+20", -2.5: "-2.5", 9007199254740993.0: "9007199254740992.0", 1e22: "1e+22",
		5e-324: "5e-324", 1.7976931348623157e308: "1.7976931348623157e+308",
	} {
		if got := pyFloat(f); got != want {
			t.Errorf("pyFloat(%v) = %s, want %s", f, got, want)
		}
	}
}

// FuzzRender parses and renders arbitrary template text: whatever the text,
// Parse and Render return (an error or not) and never panic.
func FuzzRender(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "chat", "expected.json"))
	if err != nil {
		f.Fatal(err)
	}
	var e expected
	if err := json.Unmarshal(b, &e); err != nil {
		f.Fatal(err)
	}
	for _, s := range e.Snippets {
		f.Add(s.Template)
	}
	for _, src := range []string{"{{ messages[0].content }}", "{% for m in messages %}{{ m | tojson(indent=2) }}{% endfor %}", "{% if %}", "{{ 'a' * -1 }}"} {
		f.Add(src)
	}
	msgs := []Message{
		{Role: "system", Content: "sys"},
		{Role: "user", Content: "hi 'there' \"x\""},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "1", Name: "f", Arguments: json.RawMessage(`{"a": [1, 2.5, null]}`)}}},
		{Role: "tool", Content: "r", ToolCallID: "1"},
	}
	opts := Options{
		AddGenerationPrompt: true, BOS: "<s>", EOS: "</s>", Now: fixtureNow,
		Tools: []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "f"}}`)},
		Extra: map[string]any{"enable_thinking": false},
	}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src)
		if err != nil {
			return
		}
		_, _ = tpl.Render(msgs, opts)
	})
}
