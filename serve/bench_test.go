package serve

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkServeStreams runs 64 concurrent streaming completions of 128
// tokens each through the HTTP API on stories260K (CPU), after a short
// prompt (12 tokens) or a long one (about 128), and reports the output rate,
// the share of the scheduler's time spent outside engine steps (HTTP,
// tokenization, streaming and the scheduler itself run beside it), and the
// share of allocated KV slots left empty.
//
//	go test -run XXX -bench ServeStreams -benchtime 3x ./serve
func BenchmarkServeStreams(b *testing.B) {
	short := "Once upon a time, in a town far away,"
	long := strings.Repeat("Once upon a time, there was a little girl named Lily. ", 9)
	for _, p := range []struct{ name, prompt string }{{"prompt12", short}, {"prompt128", long}} {
		b.Run(p.name, func(b *testing.B) { benchStreams(b, p.prompt) })
	}
}

func benchStreams(b *testing.B, prompt string) {
	const streams = 64
	url, s := server(b, Config{MaxNumSeqs: streams, MaxNumBatchedTokens: 256}, "")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := s.Stats()
		start := time.Now()
		var wg sync.WaitGroup
		for j := 0; j < streams; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := `{"prompt": "` + prompt + `", "max_tokens": 128, "temperature": 0.8, "seed": ` + strconv.Itoa(i*streams+j) + `, "stream": true}`
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
				}
				resp.Body.Close()
			}()
		}
		wg.Wait()
		after := s.Stats()
		loop, step := after.LoopTime-before.LoopTime, after.StepTime-before.StepTime
		b.ReportMetric(float64(after.GeneratedTokens-before.GeneratedTokens)/time.Since(start).Seconds(), "tokens/s")
		b.ReportMetric(100*float64(loop-step)/float64(loop), "%outside-step")
		alloc, used := after.KVSlotsAllocated-before.KVSlotsAllocated, after.KVSlotsUsed-before.KVSlotsUsed
		b.ReportMetric(100*(1-float64(used)/float64(alloc)), "%kv-empty")
	}
}
