// Package loadgen drives an OpenAI-compatible server with streaming requests
// and measures what a user of it sees: time to first token, every
// inter-token gap, time per output token, end-to-end latency, throughput and
// errors. It works against any such server (kiln, vLLM, SGLang, llama.cpp,
// TGI): it needs only streaming /v1/completions or /v1/chat/completions.
//
// Invariant: the generator's own cost is measured (the time between a
// request's planned start and its send), so it can be told apart from the
// server's.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config is one load test.
type Config struct {
	URL   string // base URL, e.g. http://127.0.0.1:8000 (with or without /v1)
	Model string
	Chat  bool   // /v1/chat/completions instead of /v1/completions
	Key   string // API key (Bearer), optional

	// Concurrency > 0 runs a closed loop of that many clients; otherwise
	// Rate requests per second arrive open-loop (Poisson unless Constant).
	Concurrency int
	Rate        float64
	Constant    bool

	// NumRequests and Duration bound the test (either or both); Warmup
	// requests at the start are run but left out of the figures.
	NumRequests int
	Duration    time.Duration
	Warmup      int

	Workload Workload
	Seed     uint64
	Timeout  time.Duration // per request (0: 5 minutes)
	Client   *http.Client  // nil: a client with enough connections
	// Progress, when set, is called about twice a second with the
	// requests sent, finished and failed so far.
	Progress func(sent, done, failed int)
}

// Result is one request's measurements.
type Result struct {
	Start        time.Time       `json:"start"`
	Scheduled    time.Duration   `json:"scheduled_ns"`  // planned start, from the test's start
	SendDelay    time.Duration   `json:"send_delay_ns"` // the generator's lateness in sending it
	TTFT         time.Duration   `json:"ttft_ns"`
	E2E          time.Duration   `json:"e2e_ns"`
	ITL          []time.Duration `json:"itl_ns"`
	InputTokens  int             `json:"input_tokens"`
	OutputTokens int             `json:"output_tokens"`
	// CachedTokens are the prompt tokens the server reports it found in its
	// prefix cache (usage.prompt_tokens_details.cached_tokens); -1: not
	// reported.
	CachedTokens int    `json:"cached_tokens"`
	Error        string `json:"error,omitempty"` // "http 429", "timeout", "broken stream", ...
	Warmup       bool   `json:"warmup,omitempty"`
}

// TPOT is the mean time per output token after the first.
func (r *Result) TPOT() time.Duration {
	if r.OutputTokens < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// Run executes the test and returns every request's result (warm-up
// included, marked), in order of their start. A cancelled ctx stops sending
// and waits for requests in flight.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("loadgen: no URL")
	}
	if cfg.Concurrency <= 0 && cfg.Rate <= 0 {
		return nil, fmt.Errorf("loadgen: give a concurrency or a rate")
	}
	if cfg.NumRequests <= 0 && cfg.Duration <= 0 {
		return nil, fmt.Errorf("loadgen: give a number of requests or a duration")
	}
	if err := cfg.Workload.prepare(); err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	client := cfg.Client
	if client == nil {
		n := max(cfg.Concurrency, 256)
		client = &http.Client{Transport: &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n, MaxConnsPerHost: 0, IdleConnTimeout: 90 * time.Second}}
	}
	rng := newRand(cfg.Seed)
	g := &gen{cfg: cfg, client: client, url: endpoint(cfg.URL, cfg.Chat)}
	start := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	// next hands out the i-th request, or false when the test is over.
	var mu sync.Mutex
	var results []Result
	next := func() (int, request, bool) {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil || (cfg.NumRequests > 0 && len(results) >= cfg.NumRequests) || (!deadline.IsZero() && time.Now().After(deadline)) {
			return 0, request{}, false
		}
		results = append(results, Result{})
		return len(results) - 1, cfg.Workload.next(rng), true
	}
	done, failed := 0, 0
	record := func(i int, r Result) {
		mu.Lock()
		results[i] = r
		done++
		if r.Error != "" {
			failed++
		}
		mu.Unlock()
	}
	if cfg.Progress != nil {
		tick := time.NewTicker(500 * time.Millisecond)
		stopTick := make(chan struct{})
		defer func() { close(stopTick); tick.Stop() }()
		go func() {
			for {
				select {
				case <-tick.C:
					mu.Lock()
					s, d, f := len(results), done, failed
					mu.Unlock()
					cfg.Progress(s, d, f)
				case <-stopTick:
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	if cfg.Concurrency > 0 {
		for c := 0; c < cfg.Concurrency; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i, q, ok := next()
					if !ok {
						return
					}
					record(i, g.do(ctx, q, time.Since(start), start))
				}
			}()
		}
		wg.Wait()
		return finish(results, cfg.Warmup), nil
	}
	// Open loop: each request at its planned time, whatever the others do.
	gap := 1 / cfg.Rate
	at := 0.0
	for first := true; ; first = false {
		if !first {
			if cfg.Constant {
				at += gap
			} else {
				at += rng.ExpFloat64() * gap
			}
		}
		planned := time.Duration(at * float64(time.Second))
		if d := time.Until(start.Add(planned)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		i, q, ok := next()
		if !ok {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			record(i, g.do(ctx, q, planned, start))
		}()
	}
	wg.Wait()
	return finish(results, cfg.Warmup), nil
}

// finish marks the warm-up requests.
func finish(results []Result, warmup int) []Result {
	out := results[:0]
	for _, r := range results {
		if r.Start.IsZero() {
			continue // never sent (the test stopped first)
		}
		out = append(out, r)
	}
	for i := range out {
		out[i].Warmup = i < warmup
	}
	return out
}

func endpoint(base string, chat bool) string {
	base = strings.TrimRight(base, "/")
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	if chat {
		return base + "/chat/completions"
	}
	return base + "/completions"
}

type gen struct {
	cfg    Config
	client *http.Client
	url    string
}

// do sends one streaming request and times its tokens.
func (g *gen) do(ctx context.Context, q request, planned time.Duration, start time.Time) Result {
	r := Result{Scheduled: planned, InputTokens: q.inputTokens, CachedTokens: -1}
	body := map[string]any{"model": g.cfg.Model, "max_tokens": q.outputTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "temperature": 0, "ignore_eos": true, "min_tokens": q.outputTokens}
	if g.cfg.Chat {
		body["messages"] = []map[string]string{{"role": "user", "content": q.prompt}}
	} else {
		body["prompt"] = q.prompt
	}
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", g.url, bytes.NewReader(data))
	if err != nil {
		r.Error = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	if g.cfg.Key != "" {
		req.Header.Set("Authorization", "Bearer "+g.cfg.Key)
	}
	r.Start = time.Now()
	r.SendDelay = max(0, r.Start.Sub(start)-planned)
	resp, err := g.client.Do(req)
	if err != nil {
		r.Error = classify(err)
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		r.Error = fmt.Sprintf("http %d", resp.StatusCode)
		return r
	}
	last := time.Time{}
	chunks, usageOut := 0, -1
	done := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		payload := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if payload == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &ev); err != nil {
			r.Error = "malformed stream"
			return r
		}
		if ev.Usage != nil {
			usageOut = ev.Usage.CompletionTokens
			if ev.Usage.PromptTokens > 0 {
				r.InputTokens = ev.Usage.PromptTokens
			}
			if d := ev.Usage.PromptTokensDetails; d != nil {
				r.CachedTokens = d.CachedTokens
			}
		}
		// A chunk brings a token when it has text, or when it is neither
		// the chat's opening role chunk nor a closing chunk that only
		// carries the finish reason (servers stream a token whose text is
		// not complete yet as an empty chunk).
		token := false
		for _, c := range ev.Choices {
			text := c.Text != "" || c.Delta.Content != ""
			token = token || text || (c.Delta.Role == "" && c.FinishReason == nil)
		}
		if !token {
			continue
		}
		now := time.Now()
		if chunks == 0 {
			r.TTFT = now.Sub(r.Start)
		} else {
			r.ITL = append(r.ITL, now.Sub(last))
		}
		last = now
		chunks++
	}
	r.E2E = time.Since(r.Start)
	if err := sc.Err(); err != nil {
		r.Error = classify(err)
		return r
	}
	if !done {
		r.Error = "broken stream"
		return r
	}
	r.OutputTokens = chunks
	if usageOut >= 0 {
		r.OutputTokens = usageOut
	}
	return r
}

func classify(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	if strings.Contains(err.Error(), "connection refused") {
		return "connection refused"
	}
	return "transport: " + err.Error()
}

// percentile is the p-th percentile (0..100) of sorted xs, interpolated.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	f := pos - float64(lo)
	switch {
	case f == 0 || sorted[lo] == sorted[hi]: // infinite ones too
		return sorted[lo]
	case math.IsInf(sorted[lo], 0) || math.IsInf(sorted[hi], 0):
		if f < 0.5 { // no interpolation with an infinity: the nearer end
			return sorted[lo]
		}
		return sorted[hi]
	}
	return sorted[lo] + (sorted[hi]-sorted[lo])*f
}
