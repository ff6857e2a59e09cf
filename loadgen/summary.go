package loadgen

import (
	"math"
	"slices"
	"time"
)

// Stats summarises one latency, in milliseconds.
type Stats struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	N    int     `json:"n"`
}

func statsOf(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	ms := make([]float64, len(ds))
	var sum float64
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
		sum += ms[i]
	}
	slices.Sort(ms)
	return Stats{Mean: sum / float64(len(ms)), P50: percentile(ms, 50), P90: percentile(ms, 90), P95: percentile(ms, 95),
		P99: percentile(ms, 99), Max: ms[len(ms)-1], N: len(ms)}
}

// SLO is what a request must meet to count toward goodput (0: no limit).
type SLO struct {
	TTFT time.Duration
	TPOT time.Duration
}

// Cost prices GPU time.
type Cost struct {
	GPUHourPrice float64 // per GPU-hour
	GPUs         int
}

// Summary is a load test's figures, warm-up excluded.
type Summary struct {
	Requests  int            `json:"requests"`
	Errors    map[string]int `json:"errors"`
	ErrorRate float64        `json:"error_rate"`
	Seconds   float64        `json:"seconds"` // from the first measured request's start to the last one's end

	RequestsPerS     float64 `json:"requests_per_s"`
	InputTokensPerS  float64 `json:"input_tokens_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	GoodputPerS      float64 `json:"goodput_requests_per_s"` // requests meeting the SLO, per second
	CostPer1kTokens  float64 `json:"cost_per_1k_output_tokens,omitempty"`
	// CachedPromptShare is the share of the prompt tokens the server
	// found in its prefix cache, over the requests whose usage says
	// (prompt_tokens_details.cached_tokens); nil when none does. A high
	// share means the figures are not those of new prompts.
	CachedPromptShare *float64 `json:"cached_prompt_share,omitempty"`

	TTFT Stats `json:"ttft"`
	ITL  Stats `json:"itl"`
	TPOT Stats `json:"tpot"`
	E2E  Stats `json:"e2e"`
	// SendDelay is the generator's own lateness in sending requests (open
	// loop), so that it is never mistaken for the server's.
	SendDelay Stats `json:"generator_send_delay"`
}

// Summarize computes the figures of results (warm-up excluded).
func Summarize(results []Result, slo SLO, cost Cost) Summary {
	s := Summary{Errors: map[string]int{}}
	var ttft, itl, tpot, e2e, send []time.Duration
	var first, last time.Time
	var in, out, good, cachedIn, cached int
	for _, r := range results {
		if r.Warmup {
			continue
		}
		s.Requests++
		send = append(send, r.SendDelay)
		if first.IsZero() || r.Start.Before(first) {
			first = r.Start
		}
		if end := r.Start.Add(r.E2E); end.After(last) {
			last = end
		}
		if r.Error != "" {
			s.Errors[r.Error]++
			continue
		}
		in += r.InputTokens
		out += r.OutputTokens
		if r.CachedTokens >= 0 {
			cachedIn += r.InputTokens
			cached += r.CachedTokens
		}
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		itl = append(itl, r.ITL...)
		if r.OutputTokens > 1 {
			tpot = append(tpot, r.TPOT())
		}
		if (slo.TTFT == 0 || r.TTFT <= slo.TTFT) && (slo.TPOT == 0 || r.TPOT() <= slo.TPOT) {
			good++
		}
	}
	if s.Requests == 0 {
		return s
	}
	failed := 0
	for _, n := range s.Errors {
		failed += n
	}
	s.ErrorRate = float64(failed) / float64(s.Requests)
	s.Seconds = last.Sub(first).Seconds()
	if s.Seconds > 0 {
		s.RequestsPerS = float64(s.Requests-failed) / s.Seconds
		s.InputTokensPerS = float64(in) / s.Seconds
		s.OutputTokensPerS = float64(out) / s.Seconds
		s.GoodputPerS = float64(good) / s.Seconds
	}
	if cost.GPUHourPrice > 0 && s.OutputTokensPerS > 0 {
		perSecond := cost.GPUHourPrice * float64(max(cost.GPUs, 1)) / 3600
		s.CostPer1kTokens = perSecond / s.OutputTokensPerS * 1000
	}
	if cachedIn > 0 {
		share := float64(cached) / float64(cachedIn)
		s.CachedPromptShare = &share
	}
	s.TTFT, s.ITL, s.TPOT, s.E2E, s.SendDelay = statsOf(ttft), statsOf(itl), statsOf(tpot), statsOf(e2e), statsOf(send)
	if math.IsNaN(s.TTFT.P50) {
		s.TTFT = Stats{}
	}
	return s
}
