package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"kiln/engine"
	"kiln/loadgen"
	"kiln/serve"
)

// throughputReport is kiln bench throughput's JSON report.
type throughputReport struct {
	Schema string `json:"schema"`
	// Config is the workload (kiln bench compare refuses to set runs of
	// different ones against each other).
	Config         map[string]any `json:"config"`
	Model          string         `json:"model"`
	Backend        string         `json:"backend"`
	MaxNumSeqs     int            `json:"max_num_seqs"`
	Requests       int            `json:"requests"`
	Warmup         int            `json:"warmup"`
	PromptTokens   int            `json:"prompt_tokens"` // of the timed requests
	OutputTokens   int            `json:"output_tokens"`
	CachedPrompt   float64        `json:"cached_prompt_share"`
	Seconds        float64        `json:"seconds"`
	RequestsPerSec float64        `json:"requests_per_s"`
	OutputPerSec   float64        `json:"output_tokens_per_s"`
	TotalPerSec    float64        `json:"total_tokens_per_s"`
	Steps          uint64         `json:"steps"`
	OutputPerStep  float64        `json:"output_tokens_per_step"`
	StepMs         float64        `json:"ms_per_step"`
	// OutsideSteps is the share of the scheduler's loop spent outside
	// engine steps (gathering, handing out tokens).
	OutsideSteps float64 `json:"scheduler_outside_steps"`
	Preemptions  uint64  `json:"preemptions"`
}

// cmdBenchThroughput measures offline throughput as vLLM's bench
// throughput does: every request handed to the scheduler at once, in
// process (no HTTP, no client), the scheduler and engine configured as
// kiln serve with the same flags. Its prompts are those kiln bench serve
// sends with the same --seed and lengths, so the two measure the same
// load; what serving loses against this is the server's and the client's.
func cmdBenchThroughput(args []string) error {
	fs := flag.NewFlagSet("bench throughput", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	var schf schedFlags
	schf.register(fs)
	num := fs.Int("num-requests", 1000, "requests timed, all submitted at once")
	warmup := fs.Int("warmup-requests", -1, "requests run to completion before the timed ones, not counted (-1: --max-num-seqs)")
	var wf workloadFlags
	wf.register(fs, "every request generates exactly that: end-of-sequence tokens ignored")
	seed := fs.Uint64("seed", 1, "seed of the prompts and lengths (kiln bench serve's --seed draws the same)")
	budgetFile := fs.String("budget", "", "TOML file of targets (min_output_tokens_per_s, min_total_tokens_per_s, min_requests_per_s): exit 1 when one is missed")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	out := fs.String("output", "", "also write the JSON report to this file")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("give at most one MODEL")
	}
	if err := schf.check(); err != nil {
		return err
	}
	if *num < 1 || *warmup < -1 {
		return fmt.Errorf("--num-requests must be >= 1 and --warmup-requests >= 0")
	}
	if *warmup < 0 {
		*warmup = schf.maxSeqs
	}
	var budget *throughputBudget
	if *budgetFile != "" {
		text, err := os.ReadFile(*budgetFile)
		if err != nil {
			return err
		}
		budget = &throughputBudget{}
		if err := loadgen.DecodeBudget(string(text), budget); err != nil {
			return err
		}
	}
	w, err := wf.workload(fs)
	if err != nil {
		return err
	}
	m, tok, err := openModelOrDemo(pos, ef.tokenizer)
	if err != nil {
		return err
	}
	defer m.Close()
	// Counted as kiln bench serve --tokenizer counts them, encoded as kiln
	// serve encodes a completion's prompt.
	w.Tokens = func(s string) int { return len(tok.Encode(s, false)) }
	prompts, err := w.Prompts(*warmup+*num, *seed)
	if err != nil {
		return err
	}
	e, err := newEngineOptions(m, &ef, schf.engineOptions(ef.ctx))
	if err != nil {
		return err
	}
	defer e.Close()
	schf.warmUp(slog.New(slog.NewTextHandler(os.Stderr, nil)), e)
	cfg := schf.config(e)
	cfg.MaxQueuedRequests = *warmup + *num
	sched, err := serve.NewScheduler(e.Engine, cfg)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sched.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	requests := func(ps []loadgen.Prompt) []*serve.Request {
		rs := make([]*serve.Request, len(ps))
		for i, p := range ps {
			rs[i] = &serve.Request{Prompt: tok.Encode(p.Text, true),
				Params: engine.SamplingParams{MaxTokens: p.OutputTokens, MinTokens: p.OutputTokens, IgnoreStop: true}}
		}
		return rs
	}
	if *warmup > 0 {
		if _, err := runAll(sched, requests(prompts[:*warmup])); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	timed := requests(prompts[*warmup:])
	before := sched.Stats()
	start := time.Now()
	counts, err := runAll(sched, timed)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	after := sched.Stats()
	steps := after.Steps - before.Steps
	config := map[string]any{"model": m.Path, "num_requests": *num, "warmup_requests": *warmup, "max_num_seqs": schf.maxSeqs,
		"prompt_tokens": w.PromptTokens, "output_tokens": w.OutputTokens, "shared_prefix": w.SharedPrefix, "profile": wf.profile,
		"dataset": wf.dataset, "corpus": wf.corpus}
	r := throughputReport{Schema: "kiln.bench.throughput/v1", Config: config, Model: m.Path, Backend: e.backend.Name(), MaxNumSeqs: schf.maxSeqs,
		Requests: *num, Warmup: *warmup, PromptTokens: counts.prompt, OutputTokens: counts.output,
		CachedPrompt: float64(counts.cached) / float64(max(1, counts.prompt)), Seconds: elapsed.Seconds(),
		RequestsPerSec: float64(*num) / elapsed.Seconds(), OutputPerSec: float64(counts.output) / elapsed.Seconds(),
		TotalPerSec: float64(counts.prompt+counts.output) / elapsed.Seconds(), Steps: steps,
		Preemptions: after.Preemptions - before.Preemptions}
	if steps > 0 {
		r.OutputPerStep = float64(after.GeneratedTokens-before.GeneratedTokens) / float64(steps)
		r.StepMs = (after.StepTime - before.StepTime).Seconds() * 1e3 / float64(steps)
	}
	if loop := after.LoopTime - before.LoopTime; loop > 0 {
		r.OutsideSteps = 1 - (after.StepTime-before.StepTime).Seconds()/loop.Seconds()
	}
	if err := writeReport(r, *out, *asJSON); err != nil {
		return err
	}
	if !*asJSON {
		printThroughput(r)
	}
	if budget == nil {
		return nil
	}
	table := os.Stdout
	if *asJSON {
		table = os.Stderr // stdout holds the JSON alone
	}
	return printVerdicts(table, budget.check(r))
}

// throughputBudget is kiln bench throughput's targets (TOML; absent keys
// are not checked, unknown ones an error).
type throughputBudget struct {
	MinOutputTokensPerS *float64 `toml:"min_output_tokens_per_s"`
	MinTotalTokensPerS  *float64 `toml:"min_total_tokens_per_s"`
	MinRequestsPerS     *float64 `toml:"min_requests_per_s"`
}

// check sets r against the targets, in a fixed order.
func (b *throughputBudget) check(r throughputReport) []loadgen.Verdict {
	var out []loadgen.Verdict
	for _, c := range []struct {
		name   string
		target *float64
		v      float64
	}{
		{"min_output_tokens_per_s", b.MinOutputTokensPerS, r.OutputPerSec},
		{"min_total_tokens_per_s", b.MinTotalTokensPerS, r.TotalPerSec},
		{"min_requests_per_s", b.MinRequestsPerS, r.RequestsPerSec},
	} {
		if c.target != nil {
			out = append(out, loadgen.Verdict{Name: c.name, Target: *c.target, Measured: c.v, OK: c.v >= *c.target})
		}
	}
	return out
}

// printThroughput prints r as a table.
func printThroughput(r throughputReport) {
	fmt.Printf("model %s, backend %s: %d requests submitted at once (after %d warm-up ones), at most %d running; prompts %.1f tokens on average, %.1f output tokens\n",
		r.Model, r.Backend, r.Requests, r.Warmup, r.MaxNumSeqs, float64(r.PromptTokens)/float64(r.Requests), float64(r.OutputTokens)/float64(r.Requests))
	fmt.Printf("| seconds | requests/s | output tok/s | total tok/s | steps | output tokens a step | ms a step | scheduler outside steps | prefix-cache share |\n|---|---|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %.2f | %.2f | %.1f | %.1f | %d | %.1f | %.2f | %.1f%% | %.1f%% |\n", r.Seconds, r.RequestsPerSec, r.OutputPerSec, r.TotalPerSec,
		r.Steps, r.OutputPerStep, r.StepMs, 100*r.OutsideSteps, 100*r.CachedPrompt)
	if r.Preemptions > 0 {
		fmt.Printf("%d preemptions: the KV cache did not hold every running sequence\n", r.Preemptions)
	}
}

// tokenCounts sum the Done events' counts.
type tokenCounts struct{ prompt, output, cached int }

// runAll submits rs to s at once and waits for them all; a request that
// fails fails the run.
func runAll(s *serve.Scheduler, rs []*serve.Request) (tokenCounts, error) {
	var c tokenCounts
	for i, r := range rs {
		if err := s.Submit(r); err != nil {
			return c, fmt.Errorf("request %d: %w", i, err)
		}
	}
	for i, r := range rs {
		for ev := range r.Events {
			if !ev.Done {
				continue
			}
			if ev.Err != nil {
				return c, fmt.Errorf("request %d: %w", i, ev.Err)
			}
			c.prompt += ev.PromptTokens
			c.output += ev.GeneratedTokens
			c.cached += ev.CachedTokens
			break
		}
	}
	return c, nil
}
