package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"kiln/artifact"
	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/backend/cuda"
	"kiln/compile"
	"kiln/demo"
	"kiln/engine"
	"kiln/model"
	"kiln/tokenizer"
	"kiln/tune"
)

// openModel loads the model at path; "demo" is the built-in demo model (a
// directory of that name is ./demo).
func openModel(path string) (*model.Model, error) {
	switch path {
	case "":
		return nil, fmt.Errorf("no MODEL given")
	case "demo":
		m, _, err := demo.Load()
		return m, err
	}
	return model.Load(path)
}

// removeOnSignal removes dir when the process is interrupted or terminated,
// or its output's reader goes away (SIGPIPE), then exits; the returned
// function stops watching.
func removeOnSignal(dir string) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			os.RemoveAll(dir)
			if sig == syscall.SIGPIPE {
				os.Exit(141)
			}
			os.Exit(130)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// modelPath is the MODEL of args: the first, or the demo model's name when
// there is none (saying so on stderr).
func modelPath(args []string) string {
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "kiln: no model given, using the built-in %s\n", demo.Name)
		return "demo"
	}
	return args[0]
}

// isDemo reports whether a command's arguments name the built-in demo
// model: none, or "demo".
func isDemo(args []string) bool { return len(args) == 0 || args[0] == "demo" }

// openModelOrDemo opens the model named by args (and its tokenizer), or the
// built-in demo model when args is empty, saying so on stderr.
func openModelOrDemo(args []string, tokenizerFlag string) (*model.Model, *tokenizer.Tokenizer, error) {
	if isDemo(args) {
		if len(args) == 0 {
			fmt.Fprintf(os.Stderr, "kiln: no model given, using the built-in %s\n", demo.Name)
		}
		m, tok, err := demo.Load()
		if err == nil && tokenizerFlag != "" {
			tok, err = loadTokenizerFile(tokenizerFlag)
			if err == nil {
				err = checkVocab(tok, m)
			}
		}
		return m, tok, err
	}
	m, err := openModel(args[0])
	if err != nil {
		return nil, nil, err
	}
	tok, err := openTokenizer(tokenizerFlag, m)
	if err == nil {
		err = checkVocab(tok, m)
	}
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, tok, nil
}

// checkVocab refuses a tokenizer that does not fit the model: more tokens
// than the model has rows (ids out of range), or far fewer (another
// model's vocabulary: checkpoints pad theirs by a few hundred rows at most,
// under 5%).
func checkVocab(tok *tokenizer.Tokenizer, m *model.Model) error {
	n, v := tok.VocabSize(), m.Config.VocabSize
	if n > v || float64(n) < 0.95*float64(v) {
		return fmt.Errorf("the tokenizer has %d tokens, the model %d: not this model's tokenizer (--tokenizer)", n, v)
	}
	return nil
}

// openTokenizer finds the tokenizer: the --tokenizer file when given, else the
// one inside the model (a Hugging Face directory's tokenizer.json, a GGUF
// file's vocabulary). llama2.c checkpoints carry none.
func openTokenizer(flagPath string, m *model.Model) (*tokenizer.Tokenizer, error) {
	if flagPath != "" {
		return loadTokenizerFile(flagPath)
	}
	switch {
	case m == nil:
		return nil, fmt.Errorf("no --tokenizer given")
	case m.Path == "demo" && m.Format != "gguf" && m.Format != "llama2c":
		return tokenizer.LoadFS(demo.FS(), "demo")
	case m.Metadata != nil:
		return tokenizer.FromGGUF(m.Metadata)
	case m.Format == "llama2c":
		return nil, fmt.Errorf("%s is a llama2.c checkpoint: give its tokenizer.bin with --tokenizer", m.Path)
	}
	return tokenizer.Load(m.Path)
}

// loadTokenizerFile loads a tokenizer.json, a tokenizer.bin, a model
// directory, or a .gguf model's vocabulary.
func loadTokenizerFile(path string) (*tokenizer.Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if !st.IsDir() && strings.EqualFold(filepath.Ext(path), ".gguf") {
		m, err := model.Load(path)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		return tokenizer.FromGGUF(m.Metadata)
	}
	return tokenizer.Load(path)
}

// newEngine compiles m for the backend the flags choose.
func newEngine(m *model.Model, f *engineFlags) (*engineOn, error) {
	return newEngineWithCompile(m, f, compile.Options{})
}

// backend opens the backend --device chooses. Under "auto" a machine
// without a usable GPU runs on the CPU after a one-line notice.
func (f *engineFlags) backend() (backend.Backend, error) {
	if _, _, err := cuda.ParseDType(f.dtype); err != nil {
		return nil, fmt.Errorf("--dtype: %w", err)
	}
	if _, err := tune.ParseMode(f.tune); err != nil {
		return nil, fmt.Errorf("--tune: %w", err)
	}
	cpuBackend := &cpu.Backend{Reference: f.reference, Threads: f.threads, StackProjections: f.stack, Tune: f.tune}
	if f.tp < 0 || f.tp == 0 {
		return nil, fmt.Errorf("--tensor-parallel-size %d: want 1 or more", f.tp)
	}
	if f.tp > 1 {
		return f.group(cpuBackend)
	}
	if f.kernels != "" && (f.device == "cpu" || f.reference || (f.device == "auto" || f.device == "") && cuda.Available() != nil) {
		return nil, fmt.Errorf("--kernels offers CUDA kernels: it needs a GPU (--device cuda)")
	}
	switch f.device {
	case "cpu":
		return cpuBackend, nil
	case "cuda", "gpu":
		if f.reference {
			return nil, fmt.Errorf("--reference selects the CPU's reference kernels: use it with --device cpu")
		}
		b, err := cuda.Open(0, f.dtype)
		if err != nil {
			return nil, err
		}
		f.configure(b)
		return b, nil
	case "auto", "":
		if f.reference {
			return cpuBackend, nil
		}
		if err := cuda.Available(); err != nil {
			fmt.Fprintf(os.Stderr, "kiln: running on the CPU (no usable GPU: %v)\n", err)
			return cpuBackend, nil
		}
		b, err := cuda.Open(0, f.dtype)
		if err != nil {
			return nil, err
		}
		f.configure(b)
		return b, nil
	}
	return nil, fmt.Errorf("--device %q: want auto, cpu or cuda", f.device)
}

// group opens the tensor-parallel group --tensor-parallel-size asks for:
// GPUs 0…N-1 under cuda (or auto with a usable GPU), else N CPU ranks
// configured as like.
func (f *engineFlags) group(like *cpu.Backend) (backend.Backend, error) {
	if f.artifact != "" {
		return nil, fmt.Errorf("--artifact starts one GPU: it cannot be used with --tensor-parallel-size %d", f.tp)
	}
	gpu := f.device == "cuda" || f.device == "gpu"
	switch f.device {
	case "cpu":
	case "cuda", "gpu", "auto", "":
		if f.reference && gpu {
			return nil, fmt.Errorf("--reference selects the CPU's reference kernels: use it with --device cpu")
		}
		if !gpu && (f.reference || cuda.Available() != nil) {
			if !f.reference {
				fmt.Fprintf(os.Stderr, "kiln: running on the CPU (no usable GPU: %v)\n", cuda.Available())
			}
			break
		}
		g, err := cuda.OpenGroup(f.tp, f.dtype)
		if err != nil {
			return nil, fmt.Errorf("--tensor-parallel-size %d: %w", f.tp, err)
		}
		for _, b := range cuda.GroupRanks(g) {
			f.configure(b)
		}
		return g, nil
	default:
		return nil, fmt.Errorf("--device %q: want auto, cpu or cuda", f.device)
	}
	return cpu.NewGroup(f.tp, *like), nil
}

// gpuOf is the CUDA backend of b: b itself, or rank 0 of a CUDA group; nil
// for the CPU.
func gpuOf(b backend.Backend) *cuda.Backend {
	switch b := b.(type) {
	case *cuda.Backend:
		return b
	case *backend.Group:
		if rs := cuda.GroupRanks(b); rs != nil {
			return rs[0]
		}
	}
	return nil
}

// progressWriter is stderr when it is a terminal (the weight-upload progress
// line redraws itself), else nil.
func progressWriter() io.Writer {
	if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		return os.Stderr
	}
	return nil
}

// bucketsFor is the step sizes plans are built for: the default, and on a
// GPU prefill chunks up to 2048 tokens (larger products use the matrix units
// better; the arena of a 2048-token plan is a few hundred MB).
func bucketsFor(b backend.Backend) compile.Buckets {
	if gpuOf(b) != nil {
		return append(slices.Clone(compile.DefaultBuckets), 1024, 2048)
	}
	return compile.DefaultBuckets
}

// autoKVFraction asks newEngineOptions for the KV cache fraction that suits
// the backend it opens (kvFractionFor).
const autoKVFraction = -1

// kvFractionFor is the share of the memory left after the weights and
// activations that the KV cache takes by default: most of a GPU's, half of
// the host's (which the rest of the machine shares).
func kvFractionFor(b backend.Backend) float64 {
	if gpuOf(b) != nil {
		return 0.9
	}
	return 0.5
}

// closeBackend releases what backend opened (the GPU device).
func closeBackend(b backend.Backend) {
	switch b := b.(type) {
	case *cuda.Backend:
		b.Close()
	case *backend.Group:
		if cuda.GroupRanks(b) != nil {
			if err := cuda.CloseGroup(b); err != nil {
				fmt.Fprintln(os.Stderr, "kiln:", err)
			}
		}
	}
}

// engineOn is an engine with the backend it owns.
type engineOn struct {
	*engine.Engine
	backend backend.Backend
}

func (e *engineOn) Close() error {
	err := e.Engine.Close()
	closeBackend(e.backend)
	return err
}

func newEngineWithCompile(m *model.Model, f *engineFlags, co compile.Options) (*engineOn, error) {
	return newEngineOptions(m, f, engine.Options{ContextLen: f.ctx, Compile: co, KVCacheFraction: autoKVFraction})
}

func newEngineOptions(m *model.Model, f *engineFlags, o engine.Options) (*engineOn, error) {
	if err := f.kvCache(&o); err != nil {
		return nil, err
	}
	b, err := f.backend()
	if err != nil {
		return nil, err
	}
	if err := f.startFrom(b, m); err != nil {
		closeBackend(b)
		return nil, err
	}
	if o.Buckets == nil {
		o.Buckets = bucketsFor(b)
	}
	auto := o.KVCacheFraction == autoKVFraction
	if auto {
		o.KVCacheFraction = kvFractionFor(b)
	}
	e, err := engine.New(m, b, o)
	if _, gpu := b.(*cuda.Backend); err != nil && gpu && (f.device == "auto" || f.device == "") && f.artifact == "" {
		// Under auto, a model the GPU backend cannot take runs on the CPU.
		closeBackend(b)
		fmt.Fprintf(os.Stderr, "kiln: running on the CPU (the GPU cannot run this model: %v)\n", err)
		b = &cpu.Backend{Threads: f.threads, StackProjections: f.stack}
		o.Buckets = bucketsFor(b)
		if auto {
			o.KVCacheFraction = kvFractionFor(b)
		}
		e, err = engine.New(m, b, o)
	}
	if err != nil {
		closeBackend(b)
		return nil, err
	}
	return &engineOn{Engine: e, backend: b}, nil
}

// stopTokens are the ids that end generation: the model's and the
// tokenizer's end-of-sequence ids.
func stopTokens(m *model.Model, tok *tokenizer.Tokenizer) []int {
	stops := append([]int(nil), m.Config.EOS...)
	if tok != nil {
		for _, id := range tok.EOS() {
			if !slices.Contains(stops, id) {
				stops = append(stops, id)
			}
		}
	}
	return stops
}

// configure applies the CUDA flags to b.
func (f *engineFlags) configure(b *cuda.Backend) {
	b.Progress, b.NoGraphs, b.NoPDL, b.NoEpilogues, b.NoFP8, b.WidenBlocks = progressWriter(), !f.graphs, !f.pdl, !f.epilogues, !f.fp8, !f.blocks
	b.NoFoldNorms, b.ExpertBlocks = !f.foldNorms, f.expertBlocks
	b.Tune = f.tune
	b.ExternalDir = f.kernels
	b.OnRace = gpuRaceProgress
	b.Trials = gpuTrials
}

// gpuRaceProgress, when set (kiln tune --device cuda), receives each
// first-use race of the GPU backends the flags configure.
var gpuRaceProgress func(line string, so cuda.RaceCounts)

// gpuTrials, when set (kiln tune's child process), journals the races'
// trials of the GPU backends the flags configure (cuda.Backend.Trials).
var gpuTrials *tune.Trials

// startFrom makes b start from the artifact --artifact names, after
// checking that it was built for this device, kiln build and model.
func (f *engineFlags) startFrom(b backend.Backend, m *model.Model) error {
	if f.artifact == "" {
		return nil
	}
	gpu, ok := b.(*cuda.Backend)
	if !ok {
		return fmt.Errorf("--artifact holds GPU kernels: it needs the GPU it was compiled for (--device cuda)")
	}
	if mode, _ := tune.ParseMode(f.tune); mode != tune.Cached {
		return fmt.Errorf("--artifact takes the tuned choices it holds: it cannot be used with --tune %s", f.tune)
	}
	a, err := artifact.Read(f.artifact)
	if err != nil {
		return err
	}
	if err := a.Check(cuda.TuneDevice(gpu.Device), tune.KilnVersion(), artifact.Fingerprint(m)); err != nil {
		return fmt.Errorf("--artifact %s: %w", f.artifact, err)
	}
	gpu.StartFrom(f.artifact)
	fmt.Fprintf(os.Stderr, "kiln: starting from the artifact %s (built %s for %s)\n", f.artifact, a.Created.Format("2006-01-02 15:04 MST"), a.Device.Name)
	return nil
}
