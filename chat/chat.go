// Package chat renders a model's chat template (the Jinja text in
// tokenizer_config.json, chat_template.jinja or GGUF's
// tokenizer.chat_template) into the prompt the model was trained on,
// exactly as Hugging Face transformers' tokenizer.apply_chat_template does.
//
// transformers renders with Python's jinja2 in an ImmutableSandboxedEnvironment
// with trim_blocks and lstrip_blocks, adds raise_exception, strftime_now and a
// tojson that is json.dumps(ensure_ascii=False), and passes messages, tools,
// documents, add_generation_prompt, the tokenizer's special tokens and any
// extra keyword arguments. This package rebuilds that environment on gonja
// (a Go Jinja engine) and fixes, in environment.go, the places where gonja's
// builtins differ from jinja2's and real templates notice. The tests render
// real templates over a set of conversations and compare byte for byte with
// what jinja2 produced (testdata/chat/expected.json, made by
// tools/chat-fixtures/make_fixtures.py).
//
// Invariants: a template or input, however malformed, gives an error and
// never a panic; mappings keep their insertion order (a message is role,
// content, then name, tool_calls and tool_call_id when set; JSON objects keep
// their document order), because tojson shows it.
//
// Known differences from jinja2, none of which the templates tested here
// meet (the tests pin each one): gonja does not tell an undefined variable
// from one set to none (both are "not defined" and print as ""); ** gives a
// float and `not` of a number a number; indexing a string counts bytes, not
// characters; printing a list or mapping directly with {{ x }} does not use
// Python's repr (x | string and x | tojson do); the % formatting operator
// on strings is an error (the format filter works); operations jinja2 refuses
// (adding a string to a number, looping over a number) may give a result
// instead of an error.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"

	"kiln/model"
)

// Message is one turn of a conversation, as OpenAI's chat API and
// transformers' templates know it.
type Message struct {
	Role    string // "system", "user", "assistant", "tool", ...
	Content string
	// Name, ToolCalls and ToolCallID are optional: the template sees a key
	// only when it is set.
	Name       string
	ToolCalls  []ToolCall
	ToolCallID string
}

// ToolCall is a function call an assistant message made. The template sees
// {"id": ID, "type": "function", "function": {"name": Name, "arguments":
// <Arguments decoded>}}, the form transformers documents.
type ToolCall struct {
	ID        string // omitted when empty
	Name      string
	Arguments json.RawMessage // a JSON object (OpenAI sends it as a string: pass that string's text); not JSON: passed as a string
}

// Options are the variables a rendering passes besides the messages.
type Options struct {
	// AddGenerationPrompt ends the prompt with the header of an assistant
	// turn, so the model answers.
	AddGenerationPrompt bool
	// BOS and EOS are bos_token and eos_token; empty means the Template's own
	// (from the tokenizer config), and when that is empty too the variable is
	// left undefined, as transformers leaves a token the config lacks.
	BOS, EOS string
	// Tools are the tool definitions, each one JSON object as OpenAI's API
	// sends it ({"type": "function", "function": {...}}); their key order is
	// kept. Nil: tools is none.
	Tools []json.RawMessage
	// Extra are further template variables (enable_thinking, date_string,
	// ...): json.RawMessage values are decoded keeping key order, Go maps are
	// sorted by key. They may not be messages, tools, documents,
	// add_generation_prompt, raise_exception or strftime_now.
	Extra map[string]any
	// Now is the time strftime_now reports (the zero time: time.Now()).
	Now time.Time
}

// Template is a parsed chat template. It is safe for concurrent use.
type Template struct {
	// BOS and EOS are the special tokens the model's tokenizer declares
	// (empty when unknown); Render uses them unless Options has its own.
	BOS, EOS string

	source string
	tpl    *exec.Template
}

// RaisedError is the error of a template that called raise_exception, as
// templates do for conversations they cannot render (a system message the
// model has no role for, roles that do not alternate). It is the caller's
// input that is wrong: a server answers it with 400.
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return "chat template: " + e.Message }

// Parse parses a chat template's source.
func Parse(source string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("parse chat template: %v", r)
		}
	}()
	rewritten := rewriteConditionals(source)
	if i := numberDotTrap(rewritten); i >= 0 {
		return nil, fmt.Errorf("parse chat template: line %d: a number followed by '.' and a non-ASCII character (%q), which the template engine cannot read",
			1+strings.Count(rewritten[:i], "\n"), snippet(rewritten, i))
	}
	tpl, err := exec.NewTemplate(templateName, jinjaConfig(), sourceLoader{rewritten}, environment)
	if err != nil {
		// gonja quotes the whole source in its message; keep the cause only.
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	return &Template{source: source, tpl: tpl}, nil
}

// Source returns the template's text.
func (t *Template) Source() string { return t.source }

// reserved are the variables transformers passes itself; Extra may not
// name them (Python would reject the duplicate keyword argument).
var reserved = []string{"messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now", ifElseName}

// Render renders messages into the prompt text.
func (t *Template) Render(messages []Message, o Options) (string, error) {
	vars := map[string]any{}
	if bos := firstNonEmpty(o.BOS, t.BOS); bos != "" {
		vars["bos_token"] = bos
	}
	if eos := firstNonEmpty(o.EOS, t.EOS); eos != "" {
		vars["eos_token"] = eos
	}
	for k, v := range o.Extra {
		if slices.Contains(reserved, k) {
			return "", fmt.Errorf("render chat template: Extra may not set %q", k)
		}
		c, err := goValue(v)
		if err != nil {
			return "", fmt.Errorf("render chat template: Extra[%q]: %w", k, err)
		}
		vars[k] = c
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		d, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("render chat template: message %d: %w", i, err)
		}
		msgs[i] = d
	}
	vars["messages"] = msgs
	vars["tools"] = nil
	if o.Tools != nil {
		tools := make([]any, len(o.Tools))
		for i, raw := range o.Tools {
			v, err := decodeJSON(raw)
			if err != nil {
				return "", fmt.Errorf("render chat template: tool %d: %w", i, err)
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	vars["documents"] = nil
	vars["add_generation_prompt"] = o.AddGenerationPrompt

	return t.execute(vars, o.Now)
}

// execute renders with the variables vars plus transformers' globals
// raise_exception and strftime_now (reporting now, or time.Now() when zero).
func (t *Template) execute(vars map[string]any, now time.Time) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render chat template: %v", r)
		}
	}()
	if now.IsZero() {
		now = time.Now()
	}
	ctx := exec.NewContext(make(map[string]any, len(vars)+2))
	for k, v := range vars {
		ctx.Set(k, v)
	}
	var raised *string
	ctx.Set("raise_exception", func(va *exec.VarArgs) (any, error) {
		msg := ""
		if len(va.Args) > 0 {
			msg = va.Args[0].String()
		}
		if raised == nil {
			raised = &msg
		}
		return nil, errors.New(msg)
	})
	ctx.Set("strftime_now", func(va *exec.VarArgs) (any, error) {
		if len(va.Args) != 1 || !va.Args[0].IsString() {
			return nil, errors.New("strftime_now takes one format string")
		}
		return strftime(now, va.Args[0].String()), nil
	})

	out, err = t.tpl.ExecuteToString(ctx)
	// In jinja2 raise_exception always ends the rendering; in gonja a filter
	// such as default can swallow the error, so a raise counts even then.
	if raised != nil {
		return "", &RaisedError{Message: *raised}
	}
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// FromTokenizerConfig reads the chat template of a Hugging Face model
// folder: chat_template.jinja when present (transformers saves it there
// since v4.50, and it wins), else tokenizer_config.json's "chat_template", a
// string or a list of {"name", "template"} of which "default" is taken. BOS
// and EOS come from tokenizer_config.json's bos_token and eos_token.
func FromTokenizerConfig(dir string) (*Template, error) {
	t, err := FromTokenizerConfigFS(os.DirFS(dir), ".")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, nil
}

// FromTokenizerConfigFS is FromTokenizerConfig for the folder dir of fsys
// (a model embedded in the binary, say).
func FromTokenizerConfigFS(fsys fs.FS, dir string) (*Template, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	cfgPath := path.Join(dir, "tokenizer_config.json")
	b, err := fs.ReadFile(fsys, cfgPath)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("read tokenizer_config.json: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}

	var source string
	if b, err := fs.ReadFile(fsys, path.Join(dir, "chat_template.jinja")); err == nil {
		source = string(b)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	} else {
		source, err = configTemplate(cfg.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("read tokenizer_config.json: %w", err)
		}
		if source == "" {
			return nil, fmt.Errorf("no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template)")
		}
	}
	t, err := Parse(source)
	if err != nil {
		return nil, err
	}
	t.BOS, t.EOS = tokenText(cfg.BOS), tokenText(cfg.EOS)
	return t, nil
}

// configTemplate reads tokenizer_config.json's chat_template value.
func configTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of {name, template}")
	}
	var names []string
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names = append(names, n.Name)
	}
	return "", fmt.Errorf("chat_template has no template named \"default\" (it has %s)", strings.Join(names, ", "))
}

// tokenText reads a special token of tokenizer_config.json: a string, or
// an AddedToken object {"content": ...}.
func tokenText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var added struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &added) == nil {
		return added.Content
	}
	return ""
}

// FromGGUF reads the chat template of a GGUF file's metadata
// (model.Model.Metadata): tokenizer.chat_template, with BOS and EOS the
// tokens tokenizer.ggml.bos_token_id and eos_token_id name in
// tokenizer.ggml.tokens.
func FromGGUF(md map[string]any) (*Template, error) {
	v, ok := md["tokenizer.chat_template"]
	if !ok {
		return nil, errors.New("gguf: no tokenizer.chat_template")
	}
	source, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("gguf: tokenizer.chat_template is %T, not a string", v)
	}
	t, err := Parse(source)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	t.BOS = ggufToken(md, "tokenizer.ggml.bos_token_id")
	t.EOS = ggufToken(md, "tokenizer.ggml.eos_token_id")
	return t, nil
}

// ggufToken is the text of the token whose id md[key] holds ("" when
// either is missing or out of range).
func ggufToken(md map[string]any, key string) string {
	id, ok := model.MetadataInt(md[key])
	if !ok || id < 0 {
		return ""
	}
	switch tokens := md["tokenizer.ggml.tokens"].(type) {
	case []string:
		if id < int64(len(tokens)) {
			return tokens[id]
		}
	case []any:
		if id < int64(len(tokens)) {
			s, _ := tokens[id].(string)
			return s
		}
	}
	return ""
}
