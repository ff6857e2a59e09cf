package serve

import (
	"encoding/json"
	"testing"
)

// FuzzRequest feeds arbitrary bodies to the request decoding and validation
// of both endpoints: an error is fine, a panic is not.
func FuzzRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0.5, "stop": ["a", "b"], "n": 2}`,
		`{"prompt": [1, 2, 3], "top_k": -1, "top_p": 0.9, "seed": -4, "logprobs": null}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stream": true, "stream_options": {"include_usage": true}}`,
		`{"prompt": ["a", "b"], "stop": 3}`, `{"max_tokens": 1e99}`, `[]`, `null`, `{"temperature": NaN}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var c completionRequest
		if json.Unmarshal(body, &c) == nil {
			c.params(16)
			promptOf(c.Prompt)
		}
		var ch chatRequest
		if json.Unmarshal(body, &ch) == nil {
			ch.params(0)
			for _, m := range ch.Messages {
				contentText(m.Content)
			}
		}
	})
}
