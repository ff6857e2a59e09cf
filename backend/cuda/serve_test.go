package cuda_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"kiln/bench"
	"kiln/demo"
	"kiln/engine"
	"kiln/serve"
	"kiln/tensor"
)

// TestServeStreamsEveryToken runs kiln serve's scheduler and API on the GPU
// with the situation that made streams bursty in issue 15: a random model
// whose ids mostly decode to no text with the tokenizer in use (the demo
// model's 4,096 tokens against a 32,000-token vocabulary). Sixteen
// concurrent streams must each carry one chunk per generated token, as
// many as the usage's completion tokens, and end with [DONE].
func TestServeStreamsEveryToken(t *testing.T) {
	b := backendOf(t, "bf16")
	s := bench.Shape{Name: "stream", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 32000, Context: 1024}
	e := openEngine(t, randomModel(t, s, tensor.BF16, 5), b, engine.Options{MaxSeqs: 16, KVCacheFraction: 0.5})
	dm, tok, err := demo.Load()
	if err != nil {
		t.Fatal(err)
	}
	dm.Close()
	sch, err := serve.NewScheduler(e, serve.Config{MaxNumSeqs: 16, MaxNumBatchedTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sch.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	v := serve.NewServer(sch, serve.Options{ModelName: "random", Tokenizer: tok, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	v.SetReady(true)
	ts := httptest.NewServer(v.Handler())
	defer ts.Close()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"prompt": "In the beginning God created", "max_tokens": 48, "ignore_eos": true, "temperature": 1, "seed": ` +
				strings.Repeat("1", 1+i%5) + `, "stream": true, "stream_options": {"include_usage": true}}`
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			tokens, empty, usage := 0, 0, -1
			for _, line := range strings.Split(string(data), "\n") {
				line = strings.TrimPrefix(line, "data: ")
				if !strings.HasPrefix(line, "{") {
					continue
				}
				var ch struct {
					Choices []struct {
						Text         string
						FinishReason *string `json:"finish_reason"`
					}
					Usage *struct {
						CompletionTokens int `json:"completion_tokens"`
					}
				}
				if err := json.Unmarshal([]byte(line), &ch); err != nil {
					t.Errorf("stream %d: chunk %q: %v", i, line, err)
					return
				}
				if ch.Usage != nil {
					usage = ch.Usage.CompletionTokens
				}
				for _, c := range ch.Choices {
					if c.FinishReason == nil {
						tokens++
						if c.Text == "" {
							empty++
						}
					}
				}
			}
			if !strings.HasSuffix(string(data), "data: [DONE]\n\n") || usage != 48 || tokens != usage {
				t.Errorf("stream %d: %d token chunks (%d without text) for %d completion tokens", i, tokens, empty, usage)
			}
			if i == 0 {
				t.Logf("stream 0: %d token chunks, %d of them without text", tokens, empty)
			}
		}()
	}
	wg.Wait()
}
