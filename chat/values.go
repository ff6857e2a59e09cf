package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// The template sees Python-like values: string, bool, nil, int, float64,
// []any for lists and *exec.Dict for mappings. exec.Dict keeps its pairs in
// insertion order, as a Python dict does; the order shows in tojson, in
// `| items` and in loops over a mapping, so every mapping handed to a
// template is built in a known order: messages in the order messageValue
// writes, JSON objects (tools, tool-call arguments, json.RawMessage extras) in
// document order, Go maps sorted by key.

// newDict returns an empty ordered mapping.
func newDict() *exec.Dict { return exec.NewDict() }

// dictSet appends key: value (or replaces the value of an existing key,
// keeping its place, as a Python dict does).
func dictSet(d *exec.Dict, key string, value any) {
	for _, p := range d.Pairs {
		if p.Key.IsString() && p.Key.String() == key {
			p.Value = exec.AsValue(value)
			return
		}
	}
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: exec.AsValue(value)})
}

// messageValue is the mapping a template sees for m: role and content, then
// name, tool_calls and tool_call_id only when set (so `'tool_calls' in
// message` and `message.tool_calls is defined` mean what templates expect).
func messageValue(m Message) (*exec.Dict, error) {
	d := newDict()
	dictSet(d, "role", m.Role)
	dictSet(d, "content", m.Content)
	if m.Name != "" {
		dictSet(d, "name", m.Name)
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]any, 0, len(m.ToolCalls))
		for _, tc := range m.ToolCalls {
			args, err := argumentsValue(tc.Arguments)
			if err != nil {
				return nil, fmt.Errorf("tool call %s: %w", tc.Name, err)
			}
			fn := newDict()
			dictSet(fn, "name", tc.Name)
			dictSet(fn, "arguments", args)
			call := newDict()
			if tc.ID != "" {
				dictSet(call, "id", tc.ID)
			}
			dictSet(call, "type", "function")
			dictSet(call, "function", fn)
			calls = append(calls, call)
		}
		dictSet(d, "tool_calls", calls)
	}
	if m.ToolCallID != "" {
		dictSet(d, "tool_call_id", m.ToolCallID)
	}
	return d, nil
}

// argumentsValue decodes a tool call's JSON arguments; empty arguments are
// an empty mapping, and text that is not JSON stays a string (templates such
// as Qwen3's print a string as it is).
func argumentsValue(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return newDict(), nil
	}
	if !json.Valid(raw) {
		return string(raw), nil
	}
	return decodeJSON(raw)
}

// decodeJSON decodes one JSON document into template values, keeping the
// key order of objects. Integers stay integers (Python's json.loads makes
// int for 1 and float for 1.0, and json.dumps writes them back so).
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeNext(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("json: trailing data after the value")
	}
	return v, nil
}

func decodeNext(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := newDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeNext(dec)
				if err != nil {
					return nil, err
				}
				dictSet(d, k.(string), v)
			}
			_, err := dec.Token() // '}'
			return d, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeNext(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token() // ']'
			return list, err
		}
		return nil, fmt.Errorf("json: unexpected %v", t)
	case json.Number:
		return numberValue(t)
	default: // string, bool, nil
		return t, nil
	}
}

func numberValue(n json.Number) (any, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.Atoi(s); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, fmt.Errorf("json: number %s: %w", s, err)
	}
	return f, nil
}

// goList converts each element with goValue into a template list.
func goList[E any](x []E) ([]any, error) {
	out := make([]any, len(x))
	for i, e := range x {
		c, err := goValue(e)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// goValue converts a Go value given in Options.Extra into a template value:
// json.RawMessage is decoded in document order, maps are sorted by key,
// slices become lists, numbers become int or float64.
func goValue(v any) (any, error) {
	switch x := v.(type) {
	case nil, string, bool, int, float64, *exec.Dict:
		return x, nil
	case int64:
		return int(x), nil
	case int32:
		return int(x), nil
	case float32:
		return float64(x), nil
	case json.RawMessage:
		return decodeJSON(x)
	case []any:
		return goList(x)
	case []string:
		return goList(x)
	case []map[string]any:
		return goList(x)
	case map[string]any:
		d := newDict()
		for _, k := range slices.Sorted(maps.Keys(x)) {
			c, err := goValue(x[k])
			if err != nil {
				return nil, err
			}
			dictSet(d, k, c)
		}
		return d, nil
	}
	// Anything else (a struct, another slice type) goes through JSON, as an
	// HTTP request's fields would have.
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("value of type %T: %w", v, err)
	}
	return decodeJSON(b)
}
