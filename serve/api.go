package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"kiln/engine"
)

// apiError is an OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	e := &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: "invalid_request_error"}
	if param != "" {
		e.Param = &param
	}
	return e
}

func withCode(e *apiError, code string) *apiError {
	e.Code = &code
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// samplingFields are the generation parameters both endpoints take.
type samplingFields struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	N                   *int            `json:"n"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	Logprobs            json.RawMessage `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	User                string          `json:"user"`
	Priority            *int            `json:"priority"`
	Timeout             *float64        `json:"timeout"`    // seconds the request may wait before it starts
	IgnoreEOS           bool            `json:"ignore_eos"` // vLLM's: generate through end-of-sequence tokens
	MinTokens           *int            `json:"min_tokens"` // vLLM's: no stop token or stop string ends generation before this many
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// completionRequest is POST /v1/completions.
type completionRequest struct {
	samplingFields
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
}

// chatMessage is one message of POST /v1/chat/completions.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// chatRequest is POST /v1/chat/completions.
type chatRequest struct {
	samplingFields
	Messages []chatMessage `json:"messages"`
}

// knownFields lists the JSON fields kiln reads (the tags of the request
// types); others are ignored (and logged once).
var knownFields = func() map[string]bool {
	m := map[string]bool{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for f := range t.Fields() {
			if f.Anonymous {
				add(f.Type)
			} else if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
				m[name] = true
			}
		}
	}
	add(reflect.TypeFor[completionRequest]())
	add(reflect.TypeFor[chatRequest]())
	return m
}()

// logprobSpec is what log-probabilities a request wants.
type logprobSpec struct {
	on  bool
	top int // alternatives per token
}

// logprobs reads "logprobs" (true/false for chat, a count of alternatives
// for completions) and "top_logprobs" (chat).
func (f *samplingFields) logprobs() (logprobSpec, *apiError) {
	var l logprobSpec
	raw := string(f.Logprobs)
	var n int
	switch {
	case raw == "" || raw == "null" || raw == "false":
	case raw == "true":
		l.on = true
	case json.Unmarshal(f.Logprobs, &n) == nil:
		if n < 0 || n > 20 {
			return l, badRequest("logprobs", "logprobs must be between 0 and 20, got %d", n)
		}
		l.on, l.top = true, n
	default:
		return l, badRequest("logprobs", "logprobs must be a boolean (chat) or an integer (completions)")
	}
	if f.TopLogprobs != nil {
		if *f.TopLogprobs < 0 || *f.TopLogprobs > 20 {
			return l, badRequest("top_logprobs", "top_logprobs must be between 0 and 20, got %d", *f.TopLogprobs)
		}
		if *f.TopLogprobs > 0 && !l.on {
			return l, badRequest("top_logprobs", "top_logprobs needs logprobs: true")
		}
		l.top = *f.TopLogprobs
	}
	return l, nil
}

// params checks the sampling fields and turns them into engine parameters
// for n choices; defaultMax applies when no maximum is given (0: up to the
// context).
func (f *samplingFields) params(defaultMax int) (engine.SamplingParams, []string, int, *apiError) {
	var p engine.SamplingParams
	checkRange := func(name string, v *float64, lo, hi float64) *apiError {
		if v != nil && (math.IsNaN(*v) || *v < lo || *v > hi) {
			return badRequest(name, "%s must be between %g and %g, got %g", name, lo, hi, *v)
		}
		return nil
	}
	for _, c := range []struct {
		name   string
		v      *float64
		lo, hi float64
	}{
		{"temperature", f.Temperature, 0, 2}, {"top_p", f.TopP, 0, 1}, {"min_p", f.MinP, 0, 1},
		{"presence_penalty", f.PresencePenalty, -2, 2}, {"frequency_penalty", f.FrequencyPenalty, -2, 2},
		{"repetition_penalty", f.RepetitionPenalty, 0.01, 10},
	} {
		if err := checkRange(c.name, c.v, c.lo, c.hi); err != nil {
			return p, nil, 0, err
		}
	}
	p.Temperature = 1 // OpenAI's default
	if f.Temperature != nil {
		p.Temperature = *f.Temperature
	}
	if f.TopP != nil {
		p.TopP = *f.TopP
	}
	if f.MinP != nil {
		p.MinP = *f.MinP
	}
	if f.PresencePenalty != nil {
		p.PresencePenalty = *f.PresencePenalty
	}
	if f.FrequencyPenalty != nil {
		p.FrequencyPenalty = *f.FrequencyPenalty
	}
	if f.RepetitionPenalty != nil {
		p.RepetitionPenalty = *f.RepetitionPenalty
	}
	if f.TopK != nil {
		switch {
		case *f.TopK == -1 || *f.TopK == 0: // off (vLLM uses -1)
		case *f.TopK > 0:
			p.TopK = *f.TopK
		default:
			return p, nil, 0, badRequest("top_k", "top_k must be -1 (off) or positive, got %d", *f.TopK)
		}
	}
	max := defaultMax
	for _, m := range []struct {
		name string
		v    *int
	}{{"max_tokens", f.MaxTokens}, {"max_completion_tokens", f.MaxCompletionTokens}} {
		if m.v != nil {
			if *m.v < 1 {
				return p, nil, 0, badRequest(m.name, "%s must be at least 1, got %d", m.name, *m.v)
			}
			max = *m.v
		}
	}
	p.MaxTokens = max
	n := 1
	if f.N != nil {
		if *f.N < 1 || *f.N > 16 {
			return p, nil, 0, badRequest("n", "n must be between 1 and 16, got %d", *f.N)
		}
		n = *f.N
	}
	if f.Seed != nil {
		p.Seed = uint64(*f.Seed)
	}
	p.IgnoreStop = f.IgnoreEOS
	if f.MinTokens != nil {
		if *f.MinTokens < 0 || *f.MinTokens > max {
			return p, nil, 0, badRequest("min_tokens", "min_tokens must be between 0 and max_tokens (%d), got %d", max, *f.MinTokens)
		}
		p.MinTokens = *f.MinTokens
	}
	stops, err := stopStrings(f.Stop)
	if err != nil {
		return p, nil, 0, err
	}
	return p, stops, n, nil
}

// stopStrings reads "stop": a string or a list of up to 16 strings.
func stopStrings(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) > 16 {
		return nil, badRequest("stop", "stop must be a string or a list of at most 16 strings")
	}
	return slices.DeleteFunc(many, func(s string) bool { return s == "" }), nil
}

// promptOf reads "prompt": a string, a list of one string, or a list of token
// ids.
func promptOf(raw json.RawMessage) (text string, ids []int, err *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, badRequest("prompt", "prompt is required")
	}
	if json.Unmarshal(raw, &text) == nil {
		return text, nil, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return "", nil, badRequest("prompt", "a list of %d prompts: kiln takes one prompt per request", len(texts))
		}
		return texts[0], nil, nil
	}
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("prompt", "prompt is an empty list of token ids")
		}
		return "", ids, nil
	}
	return "", nil, badRequest("prompt", "prompt must be a string or a list of token ids")
}

// contentText reads a chat message's content: a string, or a list of parts
// of which only {"type": "text"} ones are taken.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q: kiln takes text only", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
