package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"kiln/engine"
	"kiln/internal/testshared"
	"kiln/tokenizer"
)

// server starts the API over loopback on stories260K (CPU), with a fixed
// chat template, and returns its URL and scheduler.
func server(t testing.TB, cfg Config, apiKey string) (string, *Scheduler) {
	t.Helper()
	e := stories(t, max(8, cfg.MaxNumSeqs), 0)
	tok, err := tokenizer.Load(testshared.Path(t, "models", "stories260K", "tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	s := runScheduler(t, e, cfg)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := NewServer(s, Options{ModelName: "stories", Tokenizer: tok, Chat: plainChat{}, StopTokens: []int{2}, APIKey: apiKey, Log: quiet})
	v.SetReady(true)
	ts := httptest.NewServer(v.Handler())
	t.Cleanup(ts.Close)
	return ts.URL, s
}

// plainChat is a stand-in chat template: "role: content" lines.
type plainChat struct{}

func (plainChat) Render(msgs []ChatMessage, gen bool) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.Role + ": " + m.Content + "\n")
	}
	if gen {
		b.WriteString("assistant:")
	}
	return b.String(), nil
}

// engineText is the greedy continuation of prompt by a fresh engine, as the
// server's text.
func engineText(t *testing.T, prompt string, maxTokens int) string {
	t.Helper()
	tok, err := tokenizer.Load(testshared.Path(t, "models", "stories260K", "tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	e := stories(t, 1, 0)
	ids := tok.Encode(prompt, true)
	dec := tok.NewDecoder()
	for _, id := range ids {
		dec.Add(id)
	}
	var b strings.Builder
	if _, err := e.Generate(ids, engine.SamplingParams{MaxTokens: maxTokens, StopTokens: []int{2}}, func(id int) bool {
		b.WriteString(dec.Add(id))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	b.WriteString(dec.Flush())
	return b.String()
}

func client(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
}

// TestCompletionsOpenAIClient drives /v1/completions with the official Go
// client, streaming and not: greedy text equals kiln's own generation, and
// the streamed pieces join to the same text.
func TestCompletionsOpenAIClient(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	c := client(url)
	ctx := context.Background()
	params := openai.CompletionNewParams{
		Model:       "stories",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens:   openai.Int(30),
		Temperature: openai.Float(0),
	}
	resp, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Usage.CompletionTokens == 0 || resp.Usage.PromptTokens == 0 {
		t.Fatalf("response %+v", resp)
	}
	text := resp.Choices[0].Text
	t.Logf("%q (%s, %d+%d tokens)", text, resp.Choices[0].FinishReason, resp.Usage.PromptTokens, resp.Usage.CompletionTokens)

	if want := engineText(t, "Once upon a time", 30); text != want {
		t.Errorf("completion %q, want %q (the engine's own)", text, want)
	}

	stream := c.Completions.NewStreaming(ctx, params)
	var joined strings.Builder
	chunks := 0
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			joined.WriteString(ch.Text)
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if joined.String() != text || chunks < 3 {
		t.Errorf("stream of %d chunks joined to %q, want %q", chunks, joined.String(), text)
	}
}

// TestChatOpenAIClient: /v1/chat/completions, streaming and not, with usage
// in the stream, and stop strings.
func TestChatOpenAIClient(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	c := client(url)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:       "stories",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Tell a story."), openai.UserMessage("A cat.")},
		MaxTokens:   openai.Int(25),
		Temperature: openai.Float(0),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	full := resp.Choices[0].Message.Content
	if full == "" || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("response %+v", resp.Choices)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var joined strings.Builder
	var usage int64
	for stream.Next() {
		ch := stream.Current()
		for _, x := range ch.Choices {
			joined.WriteString(x.Delta.Content)
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if joined.String() != full || usage != 25 {
		t.Errorf("streamed %q (usage %d), want %q (25)", joined.String(), usage, full)
	}
	// A stop string cuts the text before it.
	words := strings.Fields(full)
	if len(words) > 3 {
		params.Stop = openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(words[2])}
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
		resp, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		got := resp.Choices[0].Message.Content
		if want := full[:strings.Index(full, words[2])]; got != want || resp.Choices[0].FinishReason != "stop" {
			t.Errorf("with stop %q: %q (%s), want %q (stop)", words[2], got, resp.Choices[0].FinishReason, want)
		}
	}
}

// post sends a raw JSON body and returns the status and the decoded error.
func post(t *testing.T, url, path, body string, header ...string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(data, &out)
	return resp.StatusCode, resp.Header, out
}

// TestErrors: each kind of bad request is a 4xx with an OpenAI-style error
// naming the problem, and the server keeps serving.
func TestErrors(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	long := strings.Repeat("Once upon a time ", 200)
	for _, tc := range []struct {
		path, body string
		status     int
		param      string
	}{
		{"/v1/completions", `{"model": "stories", "prompt": "x"`, 400, ""},
		{"/v1/completions", `{"model": "gpt-9", "prompt": "x"}`, 400, "model"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "temperature": "hot"}`, 400, "temperature"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "temperature": 7}`, 400, "temperature"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "max_tokens": 0}`, 400, "max_tokens"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "n": 99}`, 400, "n"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "top_k": -5}`, 400, "top_k"},
		{"/v1/completions", `{"model": "stories"}`, 400, "prompt"},
		{"/v1/completions", `{"model": "stories", "prompt": [1, 99999]}`, 400, "prompt"},
		{"/v1/completions", `{"model": "stories", "prompt": "` + long + `", "max_tokens": 10}`, 400, "max_tokens"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "logprobs": 99}`, 400, "logprobs"},
		{"/v1/chat/completions", `{"model": "stories", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}`, 400, "top_logprobs"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "stop": 5}`, 400, "stop"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "max_tokens": 5, "min_tokens": 6}`, 400, "min_tokens"},
		{"/v1/completions", `{"model": "stories", "prompt": "x", "min_tokens": -1}`, 400, "min_tokens"},
		{"/v1/chat/completions", `{"model": "stories", "messages": []}`, 400, "messages"},
		{"/v1/chat/completions", `{"model": "stories", "messages": [{"role": "wizard", "content": "x"}]}`, 400, "messages[0].role"},
		{"/v1/completions", `{"model": "stories", "prompt": "` + strings.Repeat("x", 2<<20) + `"}`, 413, ""},
	} {
		status, _, body := post(t, url, tc.path, tc.body)
		e, _ := body["error"].(map[string]any)
		if status != tc.status || e == nil || e["message"] == "" {
			t.Errorf("%s %.80s: status %d body %v, want %d with an error", tc.path, tc.body, status, body, tc.status)
			continue
		}
		if tc.param != "" && e["param"] != tc.param {
			t.Errorf("%.80s: param %v, want %q (%v)", tc.body, e["param"], tc.param, e["message"])
		}
	}
	// Unknown fields are ignored.
	if status, _, body := post(t, url, "/v1/completions", `{"model": "stories", "prompt": "x", "max_tokens": 2, "frobnicate": true}`); status != 200 {
		t.Errorf("unknown field: status %d %v", status, body)
	}
}

// TestAuth: with an API key, requests without it are refused.
func TestAuth(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "secret")
	if status, _, _ := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2}`); status != 401 {
		t.Errorf("no key: status %d", status)
	}
	if status, _, _ := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2}`, "Authorization", "Bearer secret"); status != 200 {
		t.Errorf("right key: status %d", status)
	}
}

// TestLoad: hundreds of concurrent streams all complete with the text they
// get alone, and no block leaks.
func TestLoad(t *testing.T) {
	ok, overloaded := loadTest(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64, MaxQueuedRequests: 1000}, 300)
	if ok != 300 || overloaded != 0 {
		t.Errorf("%d of 300 streams completed, %d refused", ok, overloaded)
	}
}

// TestOverload: past the queue's bound requests are answered 429 with
// Retry-After at once, the others complete, and no block leaks.
func TestOverload(t *testing.T) {
	ok, overloaded := loadTest(t, Config{MaxNumSeqs: 1, MaxNumBatchedTokens: 64, MaxQueuedRequests: 2}, 100)
	if overloaded == 0 || ok+overloaded != 100 || ok < 2 { // at least the queue's 2 get in
		t.Errorf("%d completed, %d refused of 100", ok, overloaded)
	}
}

// loadTest sends n concurrent streaming requests and checks each answer: a
// 429 with Retry-After, or the text of the prompt alone.
func loadTest(t *testing.T, cfg Config, n int) (ok, overloaded int) {
	url, s := server(t, cfg, "")
	c := client(url)
	ctx := context.Background()
	prompts := []string{"Once upon a time", "The little dog", "Lily was", "One day, a bird"}
	want := map[string]string{}
	for _, p := range prompts {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "stories", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(p)},
			MaxTokens: openai.Int(20), Temperature: openai.Float(0)})
		if err != nil {
			t.Fatal(err)
		}
		want[p] = resp.Choices[0].Text
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := prompts[i%len(prompts)]
			body := `{"model": "stories", "prompt": "` + p + `", "max_tokens": 20, "temperature": 0, "stream": true}`
			req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode == 429 {
				mu.Lock()
				overloaded++
				mu.Unlock()
				if resp.Header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
				return
			}
			data, _ := io.ReadAll(resp.Body)
			var text strings.Builder
			for _, line := range strings.Split(string(data), "\n") {
				line = strings.TrimPrefix(line, "data: ")
				if !strings.HasPrefix(line, "{") {
					continue
				}
				var ch struct {
					Choices []struct{ Text string } `json:"choices"`
				}
				json.Unmarshal([]byte(line), &ch)
				for _, c := range ch.Choices {
					text.WriteString(c.Text)
				}
			}
			if !strings.HasSuffix(string(data), "data: [DONE]\n\n") || text.String() != want[p] {
				t.Errorf("stream %d: %q, want %q", i, text.String(), want[p])
				return
			}
			mu.Lock()
			ok++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("%d completed, %d answered 429; %+v", ok, overloaded, s.Stats())
	waitIdle(t, s)
	if st := s.Stats(); st.FreeBlocks != st.TotalBlocks {
		t.Errorf("%d of %d blocks free after the load", st.FreeBlocks, st.TotalBlocks)
	}
	return ok, overloaded
}

// TestDisconnect: a client that goes away mid-stream frees its sequence.
func TestDisconnect(t *testing.T) {
	url, s := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions",
		strings.NewReader(`{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	resp.Body.Read(buf) // streaming has begun
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st := s.Stats(); st.Running == 0 && st.FreeBlocks == st.TotalBlocks {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("sequence not freed after the client left: %+v", s.Stats())
}

// TestMetrics: /metrics serves the vLLM-style names, with the counts of the
// requests just made.
func TestMetrics(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	for i := 0; i < 3; i++ {
		if status, _, body := post(t, url, "/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}`); status != 200 {
			t.Fatalf("status %d %v", status, body)
		}
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(data)
	for _, want := range []string{
		"kiln:time_to_first_token_seconds_count 3", "kiln:e2e_request_latency_seconds_count 3", "kiln:request_queue_time_seconds_count 3",
		"kiln:inter_token_latency_seconds_count 12", `kiln:request_success_total{finish_reason="length"} 3`,
		"kiln:generation_tokens_total 15", "kiln:num_requests_running 0", "kiln:num_requests_waiting 0", "kiln:kv_cache_usage_perc 0",
		"kiln:prompt_tokens_total", "kiln:prefix_cache_queries_total", "kiln:prefix_cache_hits_total",
		"kiln:jit_fallback_total 0", // the CPU compiles and times nothing
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	value := func(name string) float64 {
		for _, line := range strings.Split(text, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name {
				v, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return v
			}
		}
		t.Fatalf("/metrics lacks %s", name)
		return 0
	}
	// Every step held at least one token per running sequence in its slots.
	alloc, used := value("kiln:kv_cache_slots_allocated_total"), value("kiln:kv_cache_slots_used_total")
	if used <= 0 || used > alloc {
		t.Errorf("KV slots: %v used of %v allocated", used, alloc)
	}
}

// TestDeadline: a request whose deadline has passed, or that the queue
// cannot start in time, is refused at once with 429; a bad deadline is 400.
func TestDeadline(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	past := time.Now().Add(-time.Second).Format(time.RFC3339Nano)
	status, hdr, body := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2}`, "X-Request-Deadline", past)
	if status != 429 || hdr.Get("Retry-After") == "" {
		t.Errorf("past deadline: status %d %v", status, body)
	}
	if status, _, _ := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2}`, "X-Request-Deadline", "soon"); status != 400 {
		t.Errorf("bad deadline: status %d", status)
	}
	if status, _, _ := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2, "timeout": -1}`); status != 400 {
		t.Errorf("negative timeout: status %d", status)
	}
	if status, _, body := post(t, url, "/v1/completions", `{"prompt": "x", "max_tokens": 2, "timeout": 30}`); status != 200 {
		t.Errorf("a timeout it meets: status %d %v", status, body)
	}
}

// TestPrefixReuse: a second request sharing a long prefix with the first
// reports the cached prompt tokens in its usage and gets the same text as
// with no cache.
func TestPrefixReuse(t *testing.T) {
	url, s := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	system := strings.Repeat("Once upon a time there was a little cat. ", 6)
	ask := func(q string) (string, float64) {
		status, _, body := post(t, url, "/v1/completions", `{"prompt": "`+system+q+`", "max_tokens": 12, "temperature": 0}`)
		if status != 200 {
			t.Fatalf("status %d %v", status, body)
		}
		usage := body["usage"].(map[string]any)
		details := usage["prompt_tokens_details"].(map[string]any)
		return body["choices"].([]any)[0].(map[string]any)["text"].(string), details["cached_tokens"].(float64)
	}
	_, cached := ask("The cat")
	if cached != 0 {
		t.Errorf("first request: %v cached tokens", cached)
	}
	text, cached := ask("The dog")
	if cached < 32 {
		t.Errorf("second request: %v cached tokens, want the shared prefix's full blocks", cached)
	}
	if want := engineText(t, system+"The dog", 12); text != want {
		t.Errorf("with a prefix hit %q, want %q (a fresh engine's)", text, want)
	}
	if st := s.Stats(); st.PrefixHits < 32 {
		t.Errorf("stats %+v", st)
	}
}

// TestLogprobs: completions and chat return each generated token's
// log-probability (the model's log-softmax, checked against the engine's
// logits) and the asked-for alternatives; greedy tokens are the most likely.
func TestLogprobs(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	status, _, body := post(t, url, "/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 3}`)
	if status != 200 {
		t.Fatalf("status %d %v", status, body)
	}
	ch := body["choices"].([]any)[0].(map[string]any)
	lp := ch["logprobs"].(map[string]any)
	tokens, values, tops := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any)
	if len(tokens) != 5 || len(values) != 5 || len(tops) != 5 {
		t.Fatalf("logprobs %v", lp)
	}
	var joined strings.Builder
	for i := range tokens {
		joined.WriteString(tokens[i].(string))
		top := tops[i].(map[string]any)
		best := math.Inf(-1)
		for _, v := range top {
			best = math.Max(best, v.(float64))
		}
		if len(top) == 0 || len(top) > 3 || values[i].(float64) > 0 || math.Abs(values[i].(float64)-best) > 1e-6 {
			t.Errorf("token %d: logprob %v, top %v (greedy must be the most likely)", i, values[i], top)
		}
	}
	if joined.String() != ch["text"] {
		t.Errorf("tokens join to %q, text %q", joined.String(), ch["text"])
	}
	// The first token's log-probability from the engine's own logits.
	tok, _ := tokenizer.Load(testshared.Path(t, "models", "stories260K", "tok512.bin"))
	e := stories(t, 1, 0)
	logits, err := e.Prefill(e.NewSequence(), tok.Encode("Once upon a time", true), false)
	if err != nil {
		t.Fatal(err)
	}
	id := engine.Argmax(logits)
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v - logits[id]))
	}
	if want := -math.Log(sum); math.Abs(values[0].(float64)-want) > 1e-5 {
		t.Errorf("first token's logprob %v, engine's %v", values[0], want)
	}

	c := client(url)
	resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "stories", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("A cat.")},
		MaxTokens: openai.Int(6), Temperature: openai.Float(0), Logprobs: openai.Bool(true), TopLogprobs: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	content := resp.Choices[0].Logprobs.Content
	if len(content) != int(resp.Usage.CompletionTokens) {
		t.Fatalf("%d logprob entries for %d tokens", len(content), resp.Usage.CompletionTokens)
	}
	for i, x := range content {
		if len(x.TopLogprobs) != 2 || x.Logprob != x.TopLogprobs[0].Logprob || x.TopLogprobs[1].Logprob > x.TopLogprobs[0].Logprob {
			t.Errorf("entry %d: %+v", i, x)
		}
	}
}

// TestN: n choices come back with their indices; greedy ones agree, and the
// prompt is computed once for all of them.
func TestN(t *testing.T) {
	url, s := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	before := s.Stats().PromptTokens
	status, _, body := post(t, url, "/v1/completions", `{"prompt": "Once upon a time there was a little", "max_tokens": 10, "temperature": 0, "n": 3}`)
	if status != 200 {
		t.Fatalf("status %d %v", status, body)
	}
	choices := body["choices"].([]any)
	if len(choices) != 3 {
		t.Fatalf("%d choices", len(choices))
	}
	texts := map[string]bool{}
	for i, c := range choices {
		m := c.(map[string]any)
		if int(m["index"].(float64)) != i {
			t.Errorf("choice %d has index %v", i, m["index"])
		}
		texts[m["text"].(string)] = true
	}
	if len(texts) != 1 {
		t.Errorf("greedy choices differ: %v", texts)
	}
	prompt := int(body["usage"].(map[string]any)["prompt_tokens"].(float64))
	if got := s.Stats().PromptTokens - before; got != uint64(prompt+2) {
		t.Errorf("%d prompt tokens computed for n=3, want %d (once, and the last token by each fork)", got, prompt+2)
	}
}

// TestMinTokens: min_tokens keeps a stop string from ending a greedy
// completion before that many tokens, as vLLM does (stop tokens:
// TestSchedulerMinTokens).
func TestMinTokens(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	complete := func(body string) (string, string, int) {
		t.Helper()
		status, _, b := post(t, url, "/v1/completions", body)
		if status != 200 {
			t.Fatalf("%s: status %d %v", body, status, b)
		}
		c := b["choices"].([]any)[0].(map[string]any)
		return c["text"].(string), c["finish_reason"].(string), int(b["usage"].(map[string]any)["completion_tokens"].(float64))
	}
	text, fin, k := complete(`{"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "stop": ["."]}`)
	if fin != "stop" || strings.Contains(text, ".") {
		t.Fatalf("stop string: %q (%s)", text, fin)
	}
	text, _, j := complete(`{"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "stop": ["."], "min_tokens": ` + strconv.Itoa(k+8) + `}`)
	if j < k+8 || !strings.Contains(text, ".") {
		t.Errorf("stop string under min_tokens %d: %d tokens, %q", k+8, j, text)
	}
}

// TestStreamEveryToken: each generated token is streamed as its own chunk
// when its step ends, also when it adds no text yet (here, text held back
// because it could begin the stop string "e z"), for completions and chat;
// the stream's token chunks equal the usage's completion tokens, and the
// joined text equals the non-streamed text.
func TestStreamEveryToken(t *testing.T) {
	url, _ := server(t, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64}, "")
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `"max_tokens": 40, "temperature": 0, "stop": ["e z"]`
		if path == "/v1/completions" {
			body = `{"prompt": "Once upon a time", ` + body
		} else {
			body = `{"messages": [{"role": "user", "content": "Once upon a time"}], ` + body
		}
		status, _, whole := post(t, url, path, body+`}`)
		if status != 200 {
			t.Fatalf("%s: status %d %v", path, status, whole)
		}
		c := whole["choices"].([]any)[0].(map[string]any)
		want := c["text"]
		if want == nil {
			want = c["message"].(map[string]any)["content"]
		}
		resp, err := http.Post(url+path, "application/json", strings.NewReader(body+`, "stream": true, "stream_options": {"include_usage": true}}`))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var text strings.Builder
		tokens, empty, usage := 0, 0, -1
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimPrefix(line, "data: ")
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var ch struct {
				Choices []struct {
					Text  string
					Delta struct{ Role, Content string }
					// finish_reason is null in a token's chunk
					FinishReason *string `json:"finish_reason"`
				}
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(line), &ch); err != nil {
				t.Fatalf("%s: chunk %q: %v", path, line, err)
			}
			if ch.Usage != nil {
				usage = ch.Usage.CompletionTokens
			}
			for _, c := range ch.Choices {
				piece := c.Text + c.Delta.Content
				text.WriteString(piece)
				if c.FinishReason == nil && c.Delta.Role == "" {
					tokens++
					if piece == "" {
						empty++
					}
				}
			}
		}
		if text.String() != want || usage <= 0 || tokens != usage || empty == 0 {
			t.Errorf("%s: %d token chunks (%d without text) for %d completion tokens, text %q, want %q and some held back",
				path, tokens, empty, usage, text.String(), want)
		}
	}
}

// TestMetricsCounters: a backend's own counters (Options.Counters) are
// served as they read when /metrics is asked.
func TestMetricsCounters(t *testing.T) {
	e := stories(t, 8, 0)
	s := runScheduler(t, e, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64})
	var n atomic.Int64
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := NewServer(s, Options{ModelName: "stories", Log: quiet,
		Counters: []Counter{{Name: "kiln:test_things_total", Help: "Things.", Value: func() float64 { return float64(n.Load()) }}}})
	ts := httptest.NewServer(v.Handler())
	defer ts.Close()
	for _, want := range []int64{0, 7} {
		n.Store(want)
		resp, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if line := fmt.Sprintf("kiln:test_things_total %d", want); !strings.Contains(string(data), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}
