package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln/backend/cuda"
	"kiln/chat"
	"kiln/demo"
	"kiln/engine"
	"kiln/model"
	"kiln/serve"
)

// cmdServe runs the OpenAI-compatible server.
func cmdServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	var sf specFlags
	sf.register(fs)
	host := fs.String("host", envString("KILN_HOST", "127.0.0.1"), "address to listen on [KILN_HOST]")
	port := fs.Int("port", envInt("KILN_PORT", 8000), "port to listen on [KILN_PORT]")
	name := fs.String("served-model-name", envString("KILN_SERVED_MODEL_NAME", ""), "the model's name in the API (default: the model's directory or file name) [KILN_SERVED_MODEL_NAME]")
	apiKey := fs.String("api-key", envString("KILN_API_KEY", ""), "require this key as a Bearer token [KILN_API_KEY]")
	var schf schedFlags
	schf.register(fs)
	maxQueued := fs.Int("max-queued-requests", envInt("KILN_MAX_QUEUED_REQUESTS", 1024), "waiting requests beyond which new ones get 429 [KILN_MAX_QUEUED_REQUESTS]")
	maxQueuedTokens := fs.Int("max-queued-tokens", envInt("KILN_MAX_QUEUED_TOKENS", 1<<20), "waiting prompt tokens beyond which new requests get 429 [KILN_MAX_QUEUED_TOKENS]")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "on SIGTERM/SIGINT, how long in-flight requests may take to finish")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := sf.check(); err != nil { // before the model loads
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("give at most one MODEL")
	}
	if err := schf.check(); err != nil {
		return err
	}
	if *maxQueued < 0 || *maxQueuedTokens < 0 || *port < 0 || *port > 65535 {
		return fmt.Errorf("--max-queued-* must be >= 0; --port in 0..65535")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The port first: a clash fails now, not after the model loads
	// (connections wait in the listen queue meanwhile).
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info("starting", "version", versionString(), "address", ln.Addr().String())
	m, tok, err := openModelOrDemo(pos, ef.tokenizer)
	if err != nil {
		return err
	}
	defer m.Close()
	if *name == "" {
		*name = modelName(m.Path, isDemo(pos))
	}
	o := schf.engineOptions(ef.ctx)
	closeDraft, err := sf.openDraft(&o)
	if err != nil {
		return err
	}
	defer closeDraft()
	loadStart := time.Now()
	e, err := newEngineOptions(m, &ef, o)
	if err != nil {
		return err
	}
	defer e.Close()
	loaded := []any{"load_s", fmt.Sprintf("%.1f", time.Since(loadStart).Seconds()), "start", phaseList(e.Startup)}
	if ef.tp > 1 {
		loaded = append(loaded, "tensor_parallel_size", ef.tp) // the GPU figures below are rank 0's
	}
	gpu := gpuOf(e.backend)
	if gpu != nil {
		st := gpu.Device.KernelCache().Stats()
		gs := gpu.Stats()
		loaded = append(loaded, "weights_gb", fmt.Sprintf("%.2f", float64(gs.Uploaded)/1e9), "upload_s", fmt.Sprintf("%.1f", gs.UploadTime.Seconds()),
			"kernels_s", fmt.Sprintf("%.1f", gs.KernelTime.Seconds()), "kernel_modules_compiled", st.Compiled, "nvrtc_s", fmt.Sprintf("%.1f", st.BuildTime.Seconds()))
	}
	budget := schf.budget(e)
	speculation, err := sf.speculation(e)
	if err != nil {
		return err
	}
	if schf.warmUp(log, e) && speculation != nil {
		logWarm(log, gpu, "warmed up speculation", func() (engine.WarmStats, error) {
			return warmSpeculation(e, speculation, min(sf.disableAboveSeq, schf.maxSeqs), e.ContextLen(), true)
		})
	}
	cfg := schf.config(e)
	cfg.Speculation, cfg.SpeculateMaxSeqs = speculation, sf.disableAboveSeq
	cfg.MaxQueuedRequests, cfg.MaxQueuedTokens, cfg.SlowStep = *maxQueued, *maxQueuedTokens, slowStepLog(log, gpu)
	sched, err := serve.NewScheduler(e.Engine, cfg)
	if err != nil {
		return err
	}
	spec := e.KVSpec()
	log.Info("model loaded", "model", *name, "backend", e.backend.Name(), "context", e.ContextLen(),
		"kv_cache_blocks", spec.Blocks, "kv_cache_tokens", spec.Blocks*spec.BlockSize, "kv_cache_mib", e.KVBytes()>>20,
		"max_num_seqs", schf.maxSeqs, "max_num_batched_tokens", budget, "decode_prefill_tokens", schf.decodePrefill)
	log.Info("startup", loaded...)
	opts := serve.Options{ModelName: *name, Tokenizer: tok, StopTokens: stopTokens(m, tok), APIKey: *apiKey, Log: log}
	if gpu != nil {
		opts.JITWork = func() int64 {
			modules, choices := gpu.JITWork()
			return modules + choices
		}
		opts.Counters = []serve.Counter{
			{Name: "kiln:cuda_steps_total", Help: "Engine steps the GPU ran (rank 0's with tensor parallelism).",
				Value: func() float64 { steps, _, _ := gpu.GraphWork(); return float64(steps) }},
			{Name: "kiln:cuda_graph_captures_total", Help: "CUDA graphs captured: a decode step's composition seen a second time.",
				Value: func() float64 { _, captures, _ := gpu.GraphWork(); return float64(captures) }},
			{Name: "kiln:cuda_graph_replays_total", Help: "Steps replayed from a captured CUDA graph (the others ran kernel by kernel).",
				Value: func() float64 { _, _, replays := gpu.GraphWork(); return float64(replays) }},
		}
	}
	if t, err := chatTemplate(m, isDemo(pos)); err != nil {
		log.Warn("no chat template: /v1/chat/completions will answer 400", "reason", err)
	} else {
		opts.Chat = chatAdapter{t}
	}
	api := serve.NewServer(sched, opts)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	schedCtx, stopSched := context.WithCancel(context.Background())
	schedDone := make(chan struct{})
	go func() { sched.Run(schedCtx); close(schedDone) }()
	srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
	api.SetReady(true)
	log.Info("listening", "address", "http://"+ln.Addr().String()+"/v1")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		stopSched()
		<-schedDone
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: no new requests, finishing those in flight", "grace", *grace)
	api.SetReady(false)
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	err = srv.Shutdown(sctx) // waits for in-flight handlers, hence their generations
	stopSched()
	<-schedDone
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// chatTemplate is the model's chat template: the demo's, a GGUF file's
// tokenizer.chat_template, or a Hugging Face folder's (chat_template.jinja or
// tokenizer_config.json).
func chatTemplate(m *model.Model, demoModel bool) (*chat.Template, error) {
	switch {
	case demoModel:
		return chat.FromTokenizerConfigFS(demo.FS(), ".")
	case m.Metadata != nil:
		return chat.FromGGUF(m.Metadata)
	case m.Format == "llama2c":
		return nil, fmt.Errorf("llama2.c checkpoints carry no chat template")
	}
	return chat.FromTokenizerConfig(m.Path)
}

// chatAdapter renders the server's conversations with a chat template.
type chatAdapter struct{ t *chat.Template }

func (a chatAdapter) Render(msgs []serve.ChatMessage, addGenerationPrompt bool) (string, error) {
	cm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	return a.t.Render(cm, chat.Options{AddGenerationPrompt: addGenerationPrompt})
}

// modelName is the default served model name: the model's file or directory
// name, or "kiln-demo".
func modelName(path string, demo bool) string {
	if demo || path == "" {
		return "kiln-demo"
	}
	return filepath.Base(path)
}

// logWarm runs a warm-up and logs what it ran (msg) and what the GPU did
// meanwhile, or where it stopped; it returns the warm-up's error.
func logWarm(log *slog.Logger, gpu *cuda.Backend, msg string, warm func() (engine.WarmStats, error)) error {
	before := gpu.Stats()
	w, err := warm()
	after := gpu.Stats()
	if err != nil {
		log.Warn("warm-up stopped", "warm_up", msg, "err", err, "steps", w.Steps)
	}
	log.Info(msg, "took_s", fmt.Sprintf("%.1f", w.Took.Seconds()), "steps", w.Steps, "decode_batches", fmt.Sprint(w.Batches),
		"longest_sequence_before", fmt.Sprint(w.Contexts), "prompt_chunks", fmt.Sprint(w.Chunks),
		"graph_captures", after.GraphCaptures-before.GraphCaptures, "first_use_races", after.Raced.Races-before.Raced.Races)
	return err
}

// slowStepLog logs the scheduler's slow steps on a GPU, with what the GPU
// (rank 0 under tensor parallelism) did since the previous one that a
// steady step does not: graph captures, decode workspace growths, products
// and attention splits timed at first use (by name). On the CPU, whose
// prompt chunks take many times a decode step's time, it is nil.
func slowStepLog(log *slog.Logger, gpu *cuda.Backend) func(serve.SlowStep) {
	if gpu == nil {
		return nil
	}
	last := gpu.Stats()
	return func(st serve.SlowStep) {
		now := gpu.Stats()
		args := []any{"took_ms", st.Took.Milliseconds(), "mean_ms", fmt.Sprintf("%.1f", float64(st.Mean.Microseconds())/1e3),
			"seqs", st.Seqs, "tokens", st.Tokens, "speculating", st.Speculating,
			"since_last_slow_step", fmt.Sprintf("graph captures %d, workspace growths %d, first-use races %d, modules compiled %d",
				now.GraphCaptures-last.GraphCaptures, now.WorkspaceGrowths-last.WorkspaceGrowths, now.Raced.Races-last.Raced.Races, len(now.Compiles)-len(last.Compiles))}
		if len(now.Choices) > len(last.Choices) {
			args = append(args, "timed", choiceNames(now.Choices[len(last.Choices):], 6))
		}
		last = now
		log.Warn("slow step", args...)
	}
}

// choiceNames lists the shapes of first-use choices (cuda.Stats.Choices,
// each "shape: candidates' times: kept"), at most n of them.
func choiceNames(choices []string, n int) string {
	var names []string
	for i, c := range choices {
		if i == n {
			names = append(names, fmt.Sprintf("and %d more", len(choices)-n))
			break
		}
		name, _, _ := strings.Cut(c, ":")
		names = append(names, name)
	}
	return strings.Join(names, "; ")
}
