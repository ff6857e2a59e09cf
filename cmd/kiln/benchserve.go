package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"kiln/loadgen"
)

// cmdBenchServe load-tests an OpenAI-compatible server.
func cmdBenchServe(args []string) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8000", "the server's base URL")
	model := fs.String("model", "", "model name to send")
	chat := fs.Bool("chat", false, "use /v1/chat/completions (default /v1/completions)")
	key := fs.String("api-key", envString("KILN_API_KEY", ""), "Bearer key [KILN_API_KEY]")
	concurrency := fs.String("concurrency", "", "closed loop: this many clients, each sending its next request when the last ends; a list (1,4,16) sweeps")
	rate := fs.String("rate", "", "open loop: requests per second (Poisson arrivals unless --constant); a list (1,2,4) sweeps")
	constant := fs.Bool("constant", false, "open loop with evenly spaced arrivals")
	num := fs.Int("num-requests", 0, "requests to send (0: until --duration)")
	duration := fs.Duration("duration", 0, "how long to send requests (0: until --num-requests)")
	warmup := fs.Int("warmup", 0, "first requests left out of the figures")
	var wf workloadFlags
	wf.register(fs, "ignore_eos is sent so servers that support it generate exactly that")
	tokFile := fs.String("tokenizer", "", "count prompt tokens with this tokenizer (tokenizer.json, tokenizer.bin or a model) instead of about 4 per 3 words")
	sloTTFT := fs.Float64("slo-ttft-ms", 0, "goodput counts requests with TTFT at most this (0: no limit)")
	sloTPOT := fs.Float64("slo-tpot-ms", 0, "and time per output token at most this (0: no limit)")
	price := fs.Float64("gpu-hour-price", 0, "price of one GPU-hour, for the cost per 1,000 output tokens")
	gpus := fs.Int("gpus", 1, "GPUs the server uses")
	budgetFile := fs.String("budget", "", "TOML file of targets: exit non-zero when one is missed")
	out := fs.String("output", "", "write the results (summary, verdicts, every request) as JSON to this file")
	htmlOut := fs.String("html", "", "write a self-contained HTML report with charts to this file")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	timeout := fs.Duration("timeout", 5*time.Minute, "per-request timeout")
	seed := fs.Uint64("seed", 1, "seed of the workload: its prompts and lengths (runs of one seed send the same prompts)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	w, err := wf.workload(fs)
	if err != nil {
		return err
	}
	var budget *loadgen.Budget // checked against every run of a sweep
	if *budgetFile != "" {
		text, err := os.ReadFile(*budgetFile)
		if err != nil {
			return err
		}
		if budget, err = loadgen.ParseBudget(string(text)); err != nil {
			return err
		}
	}
	if *tokFile != "" {
		tok, err := loadTokenizerFile(*tokFile)
		if err != nil {
			return err
		}
		w.Tokens = func(s string) int { return len(tok.Encode(s, false)) }
	}
	concs, err := parseList(*concurrency)
	if err != nil {
		return fmt.Errorf("--concurrency: %w", err)
	}
	rates, err := parseList(*rate)
	if err != nil {
		return fmt.Errorf("--rate: %w", err)
	}
	if (len(concs) == 0) == (len(rates) == 0) {
		return fmt.Errorf("give --concurrency or --rate (one of them)")
	}
	levels, name := concs, "concurrency"
	if len(rates) > 0 {
		levels, name = rates, "rate"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	type run struct {
		Level    float64           `json:"level"`
		Summary  loadgen.Summary   `json:"summary"`
		Verdicts []loadgen.Verdict `json:"budget"`
		Requests []loadgen.Result  `json:"requests"`
	}
	var runs []run
	for _, level := range levels {
		cfg := loadgen.Config{URL: *url, Model: *model, Chat: *chat, Key: *key, Constant: *constant,
			NumRequests: *num, Duration: *duration, Warmup: *warmup, Workload: w, Seed: *seed, Timeout: *timeout}
		if pw := progressWriter(); pw != nil {
			began := time.Now()
			cfg.Progress = func(sent, done, failed int) {
				fmt.Fprintf(pw, "\r%s %g: %d sent, %d done, %d failed, %.0f s ", name, level, sent, done, failed, time.Since(began).Seconds())
			}
		}
		if name == "concurrency" {
			cfg.Concurrency = int(level)
		} else {
			cfg.Rate = level
		}
		results, err := loadgen.Run(ctx, cfg)
		if cfg.Progress != nil {
			fmt.Fprintln(os.Stderr)
		}
		if err != nil {
			return err
		}
		sum := loadgen.Summarize(results, loadgen.SLO{TTFT: ms(*sloTTFT), TPOT: ms(*sloTPOT)}, loadgen.Cost{GPUHourPrice: *price, GPUs: *gpus})
		r := run{Level: level, Summary: sum, Requests: results}
		if budget != nil {
			r.Verdicts = budget.Check(sum)
		}
		runs = append(runs, r)
		if len(levels) > 1 {
			fmt.Printf("\n## %s %g\n\n", name, level)
		}
		if *asJSON {
			data, _ := json.MarshalIndent(sum, "", "  ")
			fmt.Println(string(data))
		} else {
			printServeSummary(sum)
		}
	}
	if len(levels) > 1 {
		fmt.Printf("\n| %s | requests/s | output tokens/s | p50 TTFT ms | p99 TTFT ms | p50 ITL ms | p99 ITL ms | errors |\n|---|---|---|---|---|---|---|---|\n", name)
		for _, r := range runs {
			s := r.Summary
			fmt.Printf("| %g | %.2f | %.1f | %.2f | %.2f | %.2f | %.2f | %.1f%% |\n", r.Level, s.RequestsPerS, s.OutputTokensPerS,
				s.TTFT.P50, s.TTFT.P99, s.ITL.P50, s.ITL.P99, 100*s.ErrorRate)
		}
	}
	if *out != "" {
		doc := map[string]any{"schema": "kiln.bench.serve/v1", "date": time.Now().UTC().Format(time.RFC3339),
			"config": map[string]any{"url": *url, "model": *model, "chat": *chat, name: levels,
				"num_requests": *num, "duration_s": duration.Seconds(), "warmup": *warmup, "prompt_tokens": w.PromptTokens, "output_tokens": w.OutputTokens,
				"profile": wf.profile, "dataset": wf.dataset, "shared_prefix": w.SharedPrefix}}
		// The top level holds the first run, so that compare reads any file.
		doc["summary"], doc["budget"], doc["requests"] = runs[0].Summary, runs[0].Verdicts, runs[0].Requests
		if len(runs) > 1 {
			doc["sweep"] = runs
		}
		if err := writeReport(doc, *out, false); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		var levels []loadgen.Level
		for _, r := range runs {
			levels = append(levels, loadgen.Level{Label: fmt.Sprintf("%s %g", name, r.Level), Level: r.Level, Summary: r.Summary, Requests: r.Requests})
		}
		f, err := os.Create(*htmlOut)
		if err != nil {
			return err
		}
		var loads []string
		for _, r := range runs {
			loads = append(loads, fmt.Sprintf("%g", r.Level))
		}
		info := [][2]string{
			{"workload", fmt.Sprintf("%v requests (%v warm-up), prompt tokens %s, output tokens %s, %s %s%s", *num, *warmup, wf.prompt, wf.output, name, strings.Join(loads, ", "), profileNote(wf.profile, wf.dataset))},
			{"model", cmp.Or(*model, "the server's")}, {"server", *url}, {"date", time.Now().UTC().Format("2006-01-02 15:04 MST")},
		}
		err = loadgen.WriteHTML(f, "kiln bench serve: "+*url, info, levels)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	sum := runs[len(runs)-1].Summary
	var verdicts []loadgen.Verdict
	for _, r := range runs {
		for _, v := range r.Verdicts {
			if len(runs) > 1 {
				v.Name += fmt.Sprintf(" (%s %g)", name, r.Level)
			}
			verdicts = append(verdicts, v)
		}
	}
	failed := 0
	if len(verdicts) > 0 {
		fmt.Printf("\n| budget | target | measured | |\n|---|---|---|---|\n")
		for _, v := range verdicts {
			mark := "ok"
			if !v.OK {
				mark = "MISSED"
				failed++
			}
			fmt.Printf("| %s | %g | %.4g | %s |\n", v.Name, v.Target, v.Measured, mark)
		}
	}
	if sum.Requests == 0 {
		return fmt.Errorf("no request was measured")
	}
	if sum.ErrorRate == 1 {
		var kinds []string
		for kind, n := range sum.Errors {
			kinds = append(kinds, fmt.Sprintf("%s: %d", kind, n))
		}
		return fmt.Errorf("all %d requests failed (%s)", sum.Requests, strings.Join(kinds, ", "))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d budget targets missed", failed, len(verdicts))
	}
	return nil
}

func ms(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }

// parseList reads "4" or "1,4,16" (empty: none).
func parseList(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// readDataset reads a JSONL file of {"prompt", "output_tokens"} lines.
func readDataset(path string) ([]loadgen.Item, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var items []loadgen.Item
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var it loadgen.Item
		if err := json.Unmarshal([]byte(line), &it); err != nil || it.Prompt == "" {
			return nil, fmt.Errorf("%s line %d: want {\"prompt\": \"...\"}", path, i+1)
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s: no prompts", path)
	}
	return items, nil
}

// parseDist reads N, uniform:MIN:MAX, normal:MEAN:STD or lognormal:MEAN:STD.
func parseDist(s string) (loadgen.Dist, error) {
	parts := strings.Split(s, ":")
	num := func(i int) (float64, error) {
		if i >= len(parts) {
			return 0, fmt.Errorf("%q: missing a number", s)
		}
		return strconv.ParseFloat(parts[i], 64)
	}
	var d loadgen.Dist
	var err error
	switch parts[0] {
	case "uniform":
		var lo, hi float64
		if lo, err = num(1); err == nil {
			hi, err = num(2)
		}
		d = loadgen.Dist{Kind: "uniform", Min: int(lo), Max: int(hi)}
	case "hist", "histogram":
		// hist:64=0.5,128=0.3,512=0.2
		d = loadgen.Dist{Kind: "histogram"}
		if len(parts) != 2 {
			return d, fmt.Errorf("%q: want hist:COUNT=WEIGHT,COUNT=WEIGHT,...", s)
		}
		for _, kv := range strings.Split(parts[1], ",") {
			k, v, ok := strings.Cut(kv, "=")
			n, err1 := strconv.Atoi(k)
			w, err2 := strconv.ParseFloat(v, 64)
			if !ok || err1 != nil || err2 != nil {
				return d, fmt.Errorf("%q: want hist:COUNT=WEIGHT,COUNT=WEIGHT,...", s)
			}
			d.Values, d.Weights = append(d.Values, n), append(d.Weights, w)
		}
		return d, nil
	case "normal", "lognormal":
		var mean, std float64
		if mean, err = num(1); err == nil {
			std, err = num(2)
		}
		d = loadgen.Dist{Kind: parts[0], Mean: mean, Std: std}
	default:
		var n float64
		n, err = num(0)
		d = loadgen.Dist{Kind: "fixed", Mean: n}
	}
	if err != nil || len(parts) > 3 {
		return d, fmt.Errorf("%q: want N, uniform:MIN:MAX, normal:MEAN:STD or lognormal:MEAN:STD", s)
	}
	return d, nil
}

func printServeSummary(s loadgen.Summary) {
	fmt.Printf("%d requests in %.2f s, error rate %.2f%%", s.Requests, s.Seconds, 100*s.ErrorRate)
	for kind, n := range s.Errors {
		fmt.Printf(", %s: %d", kind, n)
	}
	fmt.Printf("\nthroughput: %.2f requests/s, %.1f input tokens/s, %.1f output tokens/s, goodput %.2f requests/s",
		s.RequestsPerS, s.InputTokensPerS, s.OutputTokensPerS, s.GoodputPerS)
	if s.CostPer1kTokens > 0 {
		fmt.Printf(", %.5f per 1,000 output tokens", s.CostPer1kTokens)
	}
	if c := s.CachedPromptShare; c != nil {
		fmt.Printf("\nprompt tokens the server found in its prefix cache: %.1f%%", 100**c)
		if *c > 0.5 {
			fmt.Printf(" (most of them: these are not the figures of new prompts)")
		}
	}
	fmt.Printf("\n\n| ms | mean | p50 | p90 | p95 | p99 | max |\n|---|---|---|---|---|---|---|\n")
	for _, r := range []struct {
		name string
		st   loadgen.Stats
	}{{"TTFT", s.TTFT}, {"ITL", s.ITL}, {"TPOT", s.TPOT}, {"E2E", s.E2E}, {"generator send delay", s.SendDelay}} {
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.name, r.st.Mean, r.st.P50, r.st.P90, r.st.P95, r.st.P99, r.st.Max)
	}
}

// profileNote names the workload's profile and dataset, when given.
func profileNote(profile, dataset string) string {
	var s string
	if profile != "" {
		s += ", profile " + profile
	}
	if dataset != "" {
		s += ", dataset " + dataset
	}
	return s
}

// workloadFlags are the flags of a workload (kiln bench serve's and
// kiln bench throughput's, so that both draw the same requests).
type workloadFlags struct {
	prompt, output, corpus, profile, dataset string
	shared                                   float64
}

// register adds the flags to fs; outputNote says how the output length is
// kept to.
func (f *workloadFlags) register(fs *flag.FlagSet, outputNote string) {
	fs.StringVar(&f.prompt, "prompt-tokens", "128", "prompt length: N, uniform:MIN:MAX, normal:MEAN:STD, lognormal:MEAN:STD or hist:COUNT=WEIGHT,...")
	fs.StringVar(&f.output, "output-tokens", "128", "output length, same forms ("+outputNote+")")
	fs.StringVar(&f.corpus, "corpus", "", "text file whose words prompts are drawn from (default: a built-in sentence)")
	fs.Float64Var(&f.shared, "shared-prefix", 0, "fraction of each prompt shared by all requests (0..1)")
	fs.StringVar(&f.profile, "profile", "", "a built-in workload (chat, rag, code) for the lengths and shared prefix not given by flags")
	fs.StringVar(&f.dataset, "dataset", "", `JSONL file of prompts, one {"prompt": "...", "output_tokens": N} per line (output_tokens optional)`)
}

// workload is the workload the flags of fs (parsed) describe: a profile
// fills in the lengths and shared prefix not set by flags.
func (f *workloadFlags) workload(fs *flag.FlagSet) (loadgen.Workload, error) {
	var w loadgen.Workload
	pd, err := parseDist(f.prompt)
	if err != nil {
		return w, fmt.Errorf("--prompt-tokens: %w", err)
	}
	od, err := parseDist(f.output)
	if err != nil {
		return w, fmt.Errorf("--output-tokens: %w", err)
	}
	w = loadgen.Workload{PromptTokens: pd, OutputTokens: od, SharedPrefix: f.shared}
	if f.profile != "" {
		p, ok := loadgen.Profiles[f.profile]
		if !ok {
			return w, fmt.Errorf("--profile %q: want chat, rag or code", f.profile)
		}
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		if !set["prompt-tokens"] {
			w.PromptTokens = p.PromptTokens
		}
		if !set["output-tokens"] {
			w.OutputTokens = p.OutputTokens
		}
		if !set["shared-prefix"] {
			w.SharedPrefix = p.SharedPrefix
		}
	}
	if f.dataset != "" {
		if w.Dataset, err = readDataset(f.dataset); err != nil {
			return w, err
		}
	}
	if f.corpus != "" {
		text, err := os.ReadFile(f.corpus)
		if err != nil {
			return w, err
		}
		w.Corpus = string(text)
	}
	return w, nil
}
