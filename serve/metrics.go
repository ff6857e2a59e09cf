package serve

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the server's Prometheus metrics, named after vLLM's so that
// existing dashboards translate (vllm: → kiln:).
type metrics struct {
	reg                       *prometheus.Registry
	ttft, itl, e2e, queue     prometheus.Histogram
	success                   *prometheus.CounterVec // by finish_reason
	rejected                  *prometheus.CounterVec // by reason
	prefixQueries, prefixHits prometheus.Counter
}

func newMetrics(s *Scheduler, jitWork func() int64, counters []Counter) *metrics {
	reg := prometheus.NewRegistry()
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	hist := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latency})
		reg.MustRegister(h)
		return h
	}
	m := &metrics{
		reg:   reg,
		ttft:  hist("kiln:time_to_first_token_seconds", "Time from a request's arrival to its first generated token."),
		itl:   hist("kiln:inter_token_latency_seconds", "Time between two consecutive tokens of a request."),
		e2e:   hist("kiln:e2e_request_latency_seconds", "Time from a request's arrival to its last token."),
		queue: hist("kiln:request_queue_time_seconds", "Time a request waited before it first ran."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln:request_success_total",
			Help: "Requests finished, by finish reason."}, []string{"finish_reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln:requests_rejected_total",
			Help: "Requests refused or failed, by reason."}, []string{"reason"}),
	}
	reg.MustRegister(m.success, m.rejected)
	gauge := func(name, help string, f func(Stats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.Stats()) }))
	}
	gauge("kiln:num_requests_running", "Requests in the running batch.", func(st Stats) float64 { return float64(st.Running) })
	gauge("kiln:num_requests_waiting", "Requests waiting to run.", func(st Stats) float64 { return float64(st.Waiting) })
	gauge("kiln:kv_cache_usage_perc", "Fraction of the KV cache's blocks in use (0 to 1).", func(st Stats) float64 {
		if st.TotalBlocks == 0 {
			return 0
		}
		return 1 - float64(st.FreeBlocks)/float64(st.TotalBlocks)
	})
	counter := func(name, help string, f func(Stats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(s.Stats()) }))
	}
	counter("kiln:prompt_tokens_total", "Prompt tokens computed (recomputation after preemption included).", func(st Stats) float64 { return float64(st.PromptTokens) })
	counter("kiln:generation_tokens_total", "Tokens generated.", func(st Stats) float64 { return float64(st.GeneratedTokens) })
	counter("kiln:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", func(st Stats) float64 { return float64(st.PrefixQueries) })
	counter("kiln:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", func(st Stats) float64 { return float64(st.PrefixHits) })
	counter("kiln:engine_step_seconds_total", "Time the scheduler spent in engine steps.", func(st Stats) float64 { return st.StepTime.Seconds() })
	counter("kiln:scheduler_loop_seconds_total", "Time the scheduler spent in its steps, engine steps included (the difference is its own overhead).",
		func(st Stats) float64 { return st.LoopTime.Seconds() })
	counter("kiln:kv_cache_slots_allocated_total", "Running sequences' allocated KV slots, summed over steps.",
		func(st Stats) float64 { return float64(st.KVSlotsAllocated) })
	counter("kiln:kv_cache_slots_used_total", "Tokens held in the running sequences' allocated KV slots, summed over steps (1 - used/allocated is the share left empty).",
		func(st Stats) float64 { return float64(st.KVSlotsUsed) })
	counter("kiln:num_preemptions_total", "Sequences preempted for lack of KV blocks (or of device memory for a one-token step).", func(st Stats) float64 { return float64(st.Preemptions) })
	counter("kiln:spec_decode_num_drafts_total", "Sequence steps that verified drafted tokens (speculative decoding).", func(st Stats) float64 { return float64(st.SpecDrafts) })
	counter("kiln:spec_decode_num_draft_tokens_total", "Tokens drafted for speculative decoding.", func(st Stats) float64 { return float64(st.SpecDraftTokens) })
	counter("kiln:spec_decode_num_accepted_tokens_total", "Drafted tokens kept by verification.", func(st Stats) float64 { return float64(st.SpecAcceptedTokens) })
	counter("kiln:num_oom_retries_total", "Steps that failed for lack of device memory and were retried smaller instead of failing their requests.", func(st Stats) float64 { return float64(st.OOMRetries) })
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kiln:jit_fallback_total",
		Help: "Kernel modules compiled and first-use choices (product kernels, decode attention splits) timed at run time: with --artifact, what the artifact did not hold."},
		func() float64 {
			if jitWork == nil {
				return 0
			}
			return float64(jitWork())
		}))
	for _, c := range counters {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.Name, Help: c.Help}, c.Value))
	}
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }
