package serve

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kiln/backend"
	"kiln/engine"
	"kiln/tokenizer"
)

// ChatMessage is one message of a conversation, as the chat template sees it.
type ChatMessage struct{ Role, Content string }

// ChatTemplate renders a conversation into prompt text.
type ChatTemplate interface {
	Render(messages []ChatMessage, addGenerationPrompt bool) (string, error)
}

// Options configure a Server.
type Options struct {
	ModelName  string
	Tokenizer  *tokenizer.Tokenizer
	Chat       ChatTemplate // nil: /v1/chat/completions answers 400
	StopTokens []int        // end generation (the model's end-of-sequence ids)
	APIKey     string       // "": no authentication
	MaxBody    int64        // request body limit in bytes (0: 1 MiB)
	Log        *slog.Logger // nil: slog.Default()
	// JITWork counts the kernel modules compiled and the first-use choices
	// timed at run time (kiln:jit_fallback_total: what an ahead-of-time
	// artifact did not hold); nil: none (the CPU).
	JITWork func() int64
	// Counters are the backend's own counters, exported as they are (the
	// GPU's CUDA graphs captured and replayed, say).
	Counters []Counter
}

// Counter is a cumulative count a backend keeps, read when /metrics is
// asked (Value must be safe to call from any goroutine).
type Counter struct {
	Name, Help string
	Value      func() float64
}

// Server is the HTTP API over a Scheduler.
type Server struct {
	s       *Scheduler
	o       Options
	m       *metrics
	ready   atomic.Bool
	created int64
	ignored sync.Map // unknown request fields already logged
}

// NewServer makes the API for s; it answers /health with 503 until
// SetReady.
func NewServer(s *Scheduler, o Options) *Server {
	if o.MaxBody <= 0 {
		o.MaxBody = 1 << 20
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Server{s: s, o: o, m: newMetrics(s, o.JITWork, o.Counters), created: time.Now().Unix()}
}

// SetReady marks the model loaded (or not) for /health.
func (v *Server) SetReady(ok bool) { v.ready.Store(ok) }

// Handler routes the API.
func (v *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if !v.ready.Load() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		if err := v.s.Broken(); err != nil {
			http.Error(w, "broken: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", v.m.handler())
	mux.HandleFunc("GET /v1/models", v.auth(v.models))
	mux.HandleFunc("POST /v1/completions", v.auth(v.completions))
	mux.HandleFunc("POST /v1/chat/completions", v.auth(v.chatCompletions))
	return mux
}

func (v *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if v.o.APIKey == "" {
		return h
	}
	want := []byte("Bearer " + v.o.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			e := &apiError{status: http.StatusUnauthorized, Message: "missing or wrong API key (Authorization: Bearer KEY)", Type: "invalid_request_error"}
			writeError(w, withCode(e, "invalid_api_key"))
			return
		}
		h(w, r)
	}
}

func (v *Server) models(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(w, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{v.o.ModelName, "model", v.created, "kiln"}}})
}

func writeJSON(w http.ResponseWriter, x any) {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(x)
}

// decode reads a JSON body of at most MaxBody bytes into x, logging (once
// each) the fields kiln does not know.
func (v *Server) decode(w http.ResponseWriter, r *http.Request, x any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, v.o.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body over %d bytes", v.o.MaxBody), Type: "invalid_request_error"}
		}
		return badRequest("", "reading the request body: %v", err)
	}
	if err := json.Unmarshal(body, x); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			field := strings.TrimPrefix(typeErr.Field, "samplingFields.") // the embedded struct's name is no field of the API
			return badRequest(field, "%s must be of type %s, got %s", field, typeErr.Type, typeErr.Value)
		}
		return badRequest("", "the body is not valid JSON: %v", err)
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil {
		for k := range fields {
			if _, seen := v.ignored.LoadOrStore(k, true); !knownFields[k] && !seen {
				v.o.Log.Info("ignoring a request field kiln does not know", "field", k)
			}
		}
	}
	return nil
}

func (v *Server) checkModel(name string) *apiError {
	if name != "" && name != v.o.ModelName {
		e := badRequest("model", "model %q is not served here (this server serves %q)", name, v.o.ModelName)
		return withCode(e, "model_not_found")
	}
	return nil
}

// read decodes the body into req and checks its model, answering the error
// itself; it reports whether to go on.
func (v *Server) read(w http.ResponseWriter, r *http.Request, req any, model *string) bool {
	err := v.decode(w, r, req)
	if err == nil {
		err = v.checkModel(*model)
	}
	if err != nil {
		writeError(w, err)
		return false
	}
	return true
}

func (v *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !v.read(w, r, &req, &req.Model) {
		return
	}
	text, ids, aerr := promptOf(req.Prompt)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if ids == nil {
		ids = v.o.Tokenizer.Encode(text, true)
	} else {
		for _, id := range ids {
			if id < 0 || id >= v.s.e.Vocab() {
				writeError(w, badRequest("prompt", "token id %d out of range [0,%d)", id, v.s.e.Vocab()))
				return
			}
		}
		text = v.o.Tokenizer.Decode(ids)
	}
	echo := ""
	if req.Echo {
		echo = text
	}
	v.generate(w, r, &req.samplingFields, ids, 16, "text_completion", echo)
}

func (v *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !v.read(w, r, &req, &req.Model) {
		return
	}
	if v.o.Chat == nil {
		writeError(w, badRequest("messages", "model %q has no chat template: use /v1/completions", v.o.ModelName))
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, badRequest("messages", "messages is empty"))
		return
	}
	var msgs []ChatMessage
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "user", "assistant", "developer", "tool":
		default:
			writeError(w, badRequest(fmt.Sprintf("messages[%d].role", i), "unknown role %q", m.Role))
			return
		}
		content, err := contentText(m.Content)
		if err != nil {
			writeError(w, badRequest(fmt.Sprintf("messages[%d].content", i), "%v", err))
			return
		}
		msgs = append(msgs, ChatMessage{Role: m.Role, Content: content})
	}
	text, err := v.o.Chat.Render(msgs, true)
	if err != nil {
		writeError(w, badRequest("messages", "the chat template refused the conversation: %v", err))
		return
	}
	// The template writes any BOS itself.
	v.generate(w, r, &req.samplingFields, v.o.Tokenizer.Encode(text, false), 0, "chat.completion", "")
}

// choice is one of a request's n generations.
type choice struct {
	index   int
	req     *Request
	cancel  context.CancelFunc
	dec     *tokenizer.StreamDecoder
	stop    *engine.StopStrings
	text    strings.Builder
	finish  string
	stopped bool // a stop string ended it (its cancellation is not an error)
	done    bool
	err     error
	gen     int
	cached  int // prompt tokens from the prefix cache
	// Log-probabilities: all of them, and those not yet streamed.
	prev         int // the previous token, for the text of the next
	lps, pending []tokenLP
}

// tokenLP is a generated token's log-probability entry.
type tokenLP struct {
	text    string
	logprob float32
	top     []topLP
}

type topLP struct {
	text    string
	logprob float32
}

type choiceEvent struct {
	c  *choice
	ev Event
}

// generate runs n choices of prompt ids and answers, streaming or not.
// object is "text_completion" or "chat.completion".
func (v *Server) generate(w http.ResponseWriter, r *http.Request, f *samplingFields, ids []int, defaultMax int, object, echo string) {
	start := time.Now()
	p, stops, n, aerr := f.params(defaultMax)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	lps, aerr := f.logprobs()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ctxLen := v.s.e.ContextLen()
	if len(ids) == 0 {
		writeError(w, badRequest("prompt", "the prompt is empty"))
		return
	}
	if len(ids)+max(p.MaxTokens, 1) > ctxLen {
		writeError(w, withCode(badRequest("max_tokens", "the prompt (%d tokens) plus max_tokens (%d) exceed the context length %d", len(ids), p.MaxTokens, ctxLen), "context_length_exceeded"))
		return
	}
	p.StopTokens = v.o.StopTokens
	priority := 0
	if f.Priority != nil {
		priority = *f.Priority
	}
	startBy, aerr := deadline(r, f.Timeout, start)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var choices []*choice
	merged := make(chan choiceEvent)
	stopAll := func() {
		for _, c := range choices {
			c.cancel()
		}
	}
	var group []*Request
	for i := 0; i < n; i++ {
		cp := p
		cp.Seed = p.Seed + uint64(i)
		ctx, cancel := context.WithCancel(r.Context())
		req := &Request{Prompt: ids, Params: cp, Priority: priority, Ctx: ctx, StartBy: startBy, Logprobs: lps.on, TopLogprobs: lps.top}
		dec := v.o.Tokenizer.NewDecoder()
		for _, id := range ids {
			dec.Add(id) // prime, so that spacing continues from the prompt
		}
		choices = append(choices, &choice{index: i, req: req, cancel: cancel, dec: dec, stop: engine.NewStopStrings(stops), prev: ids[len(ids)-1]})
		group = append(group, req)
	}
	// The n choices go as one group: the prompt is computed once.
	if err := v.s.SubmitGroup(group); err != nil {
		stopAll()
		if errors.Is(err, backend.ErrGroupAborted) {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"})
			return
		}
		if errors.Is(err, ErrOverloaded) || errors.Is(err, ErrStopped) || errors.Is(err, ErrDeadline) {
			reason := "overloaded"
			if errors.Is(err, ErrDeadline) {
				reason = "deadline"
			}
			v.m.rejected.WithLabelValues(reason).Inc()
			w.Header().Set("Retry-After", "1")
			e := &apiError{status: http.StatusTooManyRequests, Message: err.Error(), Type: "server_overloaded"}
			if errors.Is(err, ErrStopped) {
				e.status = http.StatusServiceUnavailable
			}
			writeError(w, withCode(e, "server_overloaded"))
		} else {
			writeError(w, badRequest("", "%v", err))
		}
		return
	}
	for _, c := range choices {
		go func() {
			for ev := range c.req.Events {
				select {
				case merged <- choiceEvent{c, ev}:
				case <-r.Context().Done(): // the handler has returned
					return
				}
				if ev.Done {
					return
				}
			}
		}()
	}
	defer stopAll()
	id := newID(object)
	var sse *sseWriter
	if f.Stream {
		sse = newSSE(w)
		if object == "chat.completion" {
			for _, c := range choices {
				sse.send(chatChunk(id, v.created, v.o.ModelName, c.index, &delta{Role: "assistant"}, nil))
			}
		}
	}
	var firstToken time.Duration
	lastToken := make([]time.Time, n)
	left := n
	for left > 0 {
		var ce choiceEvent
		select {
		case ce = <-merged:
		case <-r.Context().Done():
			v.o.Log.Info("client went away", "id", id) // the deferred cancel frees its sequences
			return
		}
		c, ev := ce.c, ce.ev
		piece := ""
		switch {
		case c.done:
			continue
		case !ev.Done && c.stopped:
			continue
		case !ev.Done:
			now := time.Now()
			if firstToken == 0 {
				firstToken = now.Sub(start)
				v.m.ttft.Observe(firstToken.Seconds())
			}
			if !lastToken[c.index].IsZero() {
				v.m.itl.Observe(now.Sub(lastToken[c.index]).Seconds())
			}
			lastToken[c.index] = now
			c.gen++
			if lps.on {
				e := tokenLP{text: v.tokenText(c.prev, ev.Token), logprob: ev.Logprob}
				for _, t := range ev.Top {
					e.top = append(e.top, topLP{v.tokenText(c.prev, t.Token), t.Logprob})
				}
				c.lps, c.pending = append(c.lps, e), append(c.pending, e)
			}
			c.prev = ev.Token
			var hit bool
			if c.gen < p.MinTokens {
				piece = c.stop.Pass(c.dec.Add(ev.Token)) // no stop string before min_tokens
			} else {
				piece, hit = c.stop.Add(c.dec.Add(ev.Token))
			}
			if hit {
				c.stopped, c.finish = true, engine.FinishStop
				c.cancel() // the scheduler frees its blocks at the next step
			}
		default:
			c.done = true
			left--
			switch {
			case c.stopped:
			case ev.Err != nil:
				c.err = ev.Err
			default:
				c.finish, c.cached = ev.Finish, ev.CachedTokens
				tail, _ := c.stop.Add(c.dec.Flush())
				piece = tail + c.stop.Flush()
			}
		}
		c.text.WriteString(piece)
		// Every generated token is streamed when its step ends, as vLLM
		// does, even when it adds no text yet (part of a UTF-8 character,
		// text held back for a stop string, a token without text): the
		// client sees the model's pace, not bursts.
		if sse != nil && (!ev.Done || c.done && c.err == nil) {
			var fin *string
			if c.done && c.err == nil {
				fin = &c.finish
			}
			var lp any
			if lps.on {
				lp = formatLogprobs(object, c.pending, 0)
				c.pending = c.pending[:0]
			}
			if object == "chat.completion" {
				ch := chatChunk(id, v.created, v.o.ModelName, c.index, &delta{Content: piece}, fin)
				ch["choices"].([]any)[0].(map[string]any)["logprobs"] = lp
				sse.send(ch)
			} else {
				sse.send(map[string]any{"id": id, "object": "text_completion", "created": v.created, "model": v.o.ModelName,
					"choices": []any{map[string]any{"index": c.index, "text": echoOnce(c, echo, piece), "finish_reason": fin, "logprobs": lp}}})
			}
		}
	}
	gen, cached := 0, 0
	for _, c := range choices {
		gen += c.gen
		cached = max(cached, c.cached)
		if !c.req.admittedAt.IsZero() {
			v.m.queue.Observe(c.req.admittedAt.Sub(c.req.submittedAt).Seconds())
		}
		if c.err != nil {
			reason := "error"
			switch {
			case errors.Is(c.err, context.Canceled):
				reason = "cancelled"
			case errors.Is(c.err, ErrDeadline):
				reason = "deadline"
			}
			v.m.rejected.WithLabelValues(reason).Inc()
			v.o.Log.Info("request ended early", "id", id, "error", c.err)
			if sse == nil {
				status := http.StatusInternalServerError
				switch {
				case errors.Is(c.err, context.Canceled):
					status = 499 // the client went away
				case errors.Is(c.err, ErrDeadline):
					status = http.StatusServiceUnavailable
				}
				writeError(w, &apiError{status: status, Message: c.err.Error(), Type: "server_error"})
			}
			return
		}
	}
	v.m.e2e.Observe(time.Since(start).Seconds())
	for _, c := range choices {
		v.m.success.WithLabelValues(c.finish).Inc()
	}
	usage := map[string]any{"prompt_tokens": len(ids), "completion_tokens": gen, "total_tokens": len(ids) + gen,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	v.o.Log.Info("request", "id", id, "object", object, "prompt_tokens", len(ids), "completion_tokens", gen, "n", n,
		"time_to_first_token", firstToken, "e2e", time.Since(start), "stream", f.Stream)
	if sse != nil {
		if f.StreamOptions != nil && f.StreamOptions.IncludeUsage {
			sse.send(map[string]any{"id": id, "object": streamObject(object), "created": v.created, "model": v.o.ModelName, "choices": []any{}, "usage": usage})
		}
		sse.done()
		return
	}
	var out []any
	for _, c := range choices {
		var lp any
		if lps.on {
			lp = formatLogprobs(object, c.lps, len(echo))
		}
		if object == "chat.completion" {
			out = append(out, map[string]any{"index": c.index, "message": map[string]any{"role": "assistant", "content": c.text.String()},
				"finish_reason": c.finish, "logprobs": lp})
		} else {
			out = append(out, map[string]any{"index": c.index, "text": echo + c.text.String(), "finish_reason": c.finish, "logprobs": lp})
		}
	}
	writeJSON(w, map[string]any{"id": id, "object": object, "created": v.created, "model": v.o.ModelName, "choices": out, "usage": usage})
}

// tokenText is the text token id adds after token prev.
func (v *Server) tokenText(prev, id int) string {
	d := v.o.Tokenizer.NewDecoder()
	d.Add(prev)
	return d.Add(id) + d.Flush()
}

// formatLogprobs lays out log-probabilities as OpenAI does: for chat,
// {"content": [{token, logprob, bytes, top_logprobs}]}; for completions,
// {tokens, token_logprobs, top_logprobs, text_offset}, offsets counted from
// offset.
func formatLogprobs(object string, lps []tokenLP, offset int) any {
	bytesOf := func(s string) []int {
		b := make([]int, len(s))
		for i := range len(s) {
			b[i] = int(s[i])
		}
		return b
	}
	if object == "chat.completion" {
		content := []any{}
		for _, e := range lps {
			top := []any{}
			for _, t := range e.top {
				top = append(top, map[string]any{"token": t.text, "logprob": t.logprob, "bytes": bytesOf(t.text)})
			}
			content = append(content, map[string]any{"token": e.text, "logprob": e.logprob, "bytes": bytesOf(e.text), "top_logprobs": top})
		}
		return map[string]any{"content": content}
	}
	tokens, lp, tops, offsets := []string{}, []float32{}, []map[string]float32{}, []int{}
	for _, e := range lps {
		tokens = append(tokens, e.text)
		lp = append(lp, e.logprob)
		top := map[string]float32{}
		for _, t := range e.top {
			if _, dup := top[t.text]; !dup {
				top[t.text] = t.logprob
			}
		}
		tops = append(tops, top)
		offsets = append(offsets, offset)
		offset += len(e.text)
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lp, "top_logprobs": tops, "text_offset": offsets}
}

// deadline is when a request must have started: its X-Request-Deadline
// header (an RFC 3339 time) or its "timeout" (seconds from arrival); zero
// when it has neither.
func deadline(r *http.Request, timeout *float64, arrival time.Time) (time.Time, *apiError) {
	var t time.Time
	if h := r.Header.Get("X-Request-Deadline"); h != "" {
		d, err := time.Parse(time.RFC3339Nano, h)
		if err != nil {
			return t, badRequest("X-Request-Deadline", "X-Request-Deadline %q is not an RFC 3339 time", h)
		}
		t = d
	}
	if timeout != nil {
		if *timeout <= 0 || *timeout > 86400 {
			return t, badRequest("timeout", "timeout must be between 0 and 86400 seconds, got %g", *timeout)
		}
		d := arrival.Add(time.Duration(*timeout * float64(time.Second)))
		if t.IsZero() || d.Before(t) {
			t = d
		}
	}
	return t, nil
}

// echoOnce prefixes a streamed completion's first piece with the echoed
// prompt.
func echoOnce(c *choice, echo, piece string) string {
	if echo != "" && c.gen <= 1 && !strings.HasPrefix(c.text.String(), echo) {
		return echo + piece
	}
	return piece
}

func streamObject(object string) string {
	if object == "chat.completion" {
		return "chat.completion.chunk"
	}
	return object
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

func chatChunk(id string, created int64, model string, index int, d *delta, finish *string) map[string]any {
	return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
		"choices": []any{map[string]any{"index": index, "delta": d, "finish_reason": finish, "logprobs": nil}}}
}

func newID(object string) string {
	var b [12]byte
	rand.Read(b[:])
	prefix := "cmpl-"
	if object == "chat.completion" {
		prefix = "chatcmpl-"
	}
	return prefix + hex.EncodeToString(b[:])
}

// writeTimeout bounds each write to a client: one that stops reading is
// cut off (its request context ends, which cancels its generation).
const writeTimeout = 30 * time.Second

// sseWriter streams server-sent events.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) send(x any) {
	s.buf.Reset()
	s.buf.WriteString("data: ")
	json.NewEncoder(&s.buf).Encode(x) // ends with a newline
	s.buf.WriteString("\n")
	s.write(s.buf.Bytes())
}

func (s *sseWriter) done() { s.write([]byte("data: [DONE]\n\n")) }

func (s *sseWriter) write(b []byte) {
	s.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	s.w.Write(b)
	s.rc.Flush()
}
