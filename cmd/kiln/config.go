package main

// Every flag that has an environment fallback is declared here, and this is
// the only file that reads the environment.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"kiln/engine"
	"os"
	"strconv"
	"strings"

	"kiln/tune"
)

func envString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		fmt.Fprintf(os.Stderr, "kiln: ignoring %s=%q: not an integer\n", name, v)
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, ok := os.LookupEnv(name); ok {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
		fmt.Fprintf(os.Stderr, "kiln: ignoring %s=%q: not a number\n", name, v)
	}
	return def
}

func envBool(name string) bool {
	v := strings.ToLower(os.Getenv(name))
	return v == "1" || v == "true" || v == "yes"
}

// engineFlags are the flags shared by every command that runs a model.
type engineFlags struct {
	tokenizer    string
	threads      int
	ctx          int
	reference    bool
	stack        bool
	device       string
	dtype        string
	graphs       bool
	pdl          bool
	epilogues    bool
	foldNorms    bool
	expertBlocks bool
	fp8          bool
	blocks       bool
	kvDType      string
	tune         string
	artifact     string
	kernels      string
	tp           int
}

func (e *engineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.tokenizer, "tokenizer", envString("KILN_TOKENIZER", ""), "tokenizer file (tokenizer.json, llama2.c tokenizer.bin, or a model) [KILN_TOKENIZER]")
	fs.IntVar(&e.threads, "threads", envInt("KILN_THREADS", 0), "CPU worker threads, 0 for all cores [KILN_THREADS]")
	fs.IntVar(&e.ctx, "ctx", envInt("KILN_CONTEXT", 0), "context length, 0 for the model's own (less when the KV cache's share of the memory holds less: then what it holds, for one sequence) [KILN_CONTEXT]")
	fs.BoolVar(&e.reference, "reference", envBool("KILN_CPU_REFERENCE"), "use the plain reference kernels [KILN_CPU_REFERENCE]")
	fs.StringVar(&e.device, "device", envString("KILN_DEVICE", "auto"), "where to run: auto (the GPU when one is usable, else the CPU), cpu, or cuda [KILN_DEVICE]")
	fs.StringVar(&e.dtype, "dtype", envString("KILN_DTYPE", "auto"), "GPU compute dtype: auto (bf16, or f16 for an f16 checkpoint), bf16, f16 or f32 [KILN_DTYPE]")
	fs.BoolVar(&e.pdl, "cuda-pdl", envString("KILN_CUDA_PDL", "1") != "0", "launch kernels as programmatic dependent launches on Hopper GPUs, each scheduled while the previous one finishes (KILN_CUDA_PDL=0 turns them off) [KILN_CUDA_PDL]")
	fs.BoolVar(&e.epilogues, "cuda-epilogues", envString("KILN_CUDA_EPILOGUES", "1") != "0", "compute SwiGLU, and RoPE with the KV-cache writes, in the epilogue of the decode GEMV that produces their input (KILN_CUDA_EPILOGUES=0 runs them as kernels of their own) [KILN_CUDA_EPILOGUES]")
	fs.BoolVar(&e.foldNorms, "cuda-fold-norms", envString("KILN_CUDA_FOLD_NORMS", "1") != "0", "in bf16, fold the RMSNorm before the Q/K/V and gate/up products into them: its gain into their weights at load, its residual add into the product before it, its 1/rms into the RoPE or SwiGLU after them (or into the decode GEMV itself on its CUDA cores), so that no norm kernel runs where those products run on cuBLASLt or that GEMV (KILN_CUDA_FOLD_NORMS=0 runs the norms as kernels of their own) [KILN_CUDA_FOLD_NORMS]")
	fs.BoolVar(&e.expertBlocks, "cuda-expert-blocks", envBool("KILN_CUDA_EXPERT_BLOCKS"), "keep a GGUF mixture's experts in their blocks on the GPU too, each step widening the experts it routed rows to into one layer's scratch, instead of widening them at upload: a third of the GPU memory for a Q4_K_M file, at about half the speed (off by default) [KILN_CUDA_EXPERT_BLOCKS]")
	fs.BoolVar(&e.fp8, "cuda-fp8", envString("KILN_CUDA_FP8", "1") != "0", "keep an FP8 checkpoint's matrices in E4M3 on GPUs of compute capability 8.9 on and multiply them in FP8 (KILN_CUDA_FP8=0 widens them to the compute dtype) [KILN_CUDA_FP8]")
	fs.BoolVar(&e.blocks, "cuda-blocks", envString("KILN_CUDA_BLOCKS", "1") != "0", "keep a GGUF file's block-quantized matrices (Q4_0 to Q8_0, IQ4_NL, Q2_K to Q6_K) in their blocks on the GPU, dequantized for each product (KILN_CUDA_BLOCKS=0 widens them to the compute dtype at upload) [KILN_CUDA_BLOCKS]")
	fs.BoolVar(&e.graphs, "cuda-graphs", envString("KILN_CUDA_GRAPHS", "1") != "0", "replay decode steps from captured CUDA graphs (KILN_CUDA_GRAPHS=0 turns them off) [KILN_CUDA_GRAPHS]")
	fs.BoolVar(&e.stack, "stack-projections", envBool("KILN_STACK_PROJECTIONS"), "stack Q/K/V and gate/up weights into single products (copies them out of the file mapping) [KILN_STACK_PROJECTIONS]")
	fs.StringVar(&e.tune, "tune", envString("KILN_TUNE", tune.Cached), "tuned choices: cached (on a GPU take the first-use choices (GEMV, cuBLASLt or an external kernel, cuBLASLt's algorithm, decode attention's split, prefill attention's build) the tune cache holds for this device, and time and keep the rest; on the CPU take the tilings kiln tune MODEL found), full (a GPU times all again and keeps them), off (a GPU times all and keeps none; the CPU runs its default tilings) or defaults (nothing timed: every choice's built-in default, the untuned baseline); the cache is $KILN_TUNE_DIR or the user cache directory's kiln/tune [KILN_TUNE]")
	fs.StringVar(&e.artifact, "artifact", envString("KILN_ARTIFACT", ""), "GPU: start from this ahead-of-time artifact (kiln compile MODEL --device cuda -o DIR): its compiled kernels and tuned choices, for this model on this kind of GPU; what it lacks is compiled or timed at run time (kiln:jit_fallback_total) [KILN_ARTIFACT]")
	fs.StringVar(&e.kernels, "kernels", envString("KILN_KERNELS_DIR", ""), "GPU: a directory of external kernels (NAME.cu and NAME.json, docs/EXTERNAL_KERNELS.md), each compiled for the device and offered to the first-use races of the decode products it takes: checked against cuBLASLt's result on random inputs, then kept only where it beats the default in every timing [KILN_KERNELS_DIR]")
	fs.IntVar(&e.tp, "tensor-parallel-size", envInt("KILN_TENSOR_PARALLEL_SIZE", 1), "shard the model over this many devices (tensor parallelism: GPUs 0…N-1 through NCCL, or on the CPU N ranks in one process); heads, KV heads and the MLP width must divide by it [KILN_TENSOR_PARALLEL_SIZE]")
	fs.StringVar(&e.kvDType, "kv-cache-dtype", envString("KILN_KV_CACHE_DTYPE", "auto"), "KV cache element type: auto (the backend's: float32 on the CPU, the compute dtype on a GPU), f16 (the CPU: half precision, half float32's bytes, as llama.cpp keeps it) or fp8 (E4M3, scale 1: half the bytes of bf16 and a quarter of float32; on a GPU compute capability 8.9+ with f16/bf16 activations) [KILN_KV_CACHE_DTYPE]")
}

// kvCache sets the cache element type --kv-cache-dtype asks for in o.
func (e *engineFlags) kvCache(o *engine.Options) error {
	switch strings.ToLower(e.kvDType) {
	case "", "auto":
	case "fp8", "fp8_e4m3":
		o.KVCacheFP8 = true
	case "f16", "fp16", "float16":
		o.KVCacheF16 = true
	default:
		return fmt.Errorf("--kv-cache-dtype %q: want auto, f16 or fp8", e.kvDType)
	}
	return nil
}

// parseFlags parses args, allowing the positional MODEL argument before or
// after the flags, and returns the positional arguments.
//
// -h prints the command's help (printHelp) to standard output; a bad flag
// is one line naming it, not the whole list.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	if len(args) == 1 && args[0] == flagNamesArg {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
		fmt.Println(strings.Join(names, " "))
		return nil, flag.ErrHelp
	}
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printHelp(os.Stdout, fs)
				return nil, err
			}
			return nil, fmt.Errorf("%v (kiln help %s)", err, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseIDs parses "1,2,3".
func parseIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--ids is empty")
	}
	var ids []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--ids: %q is not a token id", f)
		}
		ids = append(ids, n)
	}
	return ids, nil
}

// specFlags choose speculative decoding (kiln run, kiln serve).
type specFlags struct {
	method          string
	tokens          int
	lookupMin       int
	lookupMax       int
	disableAboveSeq int
	draftModel      string
}

func (f *specFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.method, "speculative", envString("KILN_SPECULATIVE", ""), `speculative decoding: "ngram" drafts by prompt lookup (the tokens that followed the sequence's last n tokens earlier in it), "draft" with --draft-model; the drafts are verified in one step: greedy output is unchanged, sampled output keeps its distribution ("": off, or draft when --draft-model is given) [KILN_SPECULATIVE]`)
	fs.IntVar(&f.tokens, "num-speculative-tokens", 4, "--speculative: tokens drafted a step")
	fs.IntVar(&f.lookupMin, "prompt-lookup-min", 1, "--speculative ngram: the shortest n-gram matched")
	fs.IntVar(&f.lookupMax, "prompt-lookup-max", 4, "--speculative ngram: the longest n-gram matched")
	fs.IntVar(&f.disableAboveSeq, "speculative-max-seqs", 4, "kiln serve --speculative: draft only while a step decodes at most this many sequences (larger batches are compute-bound)")
	fs.StringVar(&f.draftModel, "draft-model", envString("KILN_DRAFT_MODEL", ""), "--speculative draft: a smaller model of the same vocabulary that drafts greedily, on the same device, its keys and values in the blocks of the same KV cache [KILN_DRAFT_MODEL]")
}

// check validates the flags (before any model loads).
func (f *specFlags) check() error {
	if f.method == "" && f.draftModel != "" {
		f.method = "draft"
	}
	switch f.method {
	case "":
		return nil
	case "ngram", "draft":
	default:
		return fmt.Errorf("--speculative %q: want ngram or draft", f.method)
	}
	if (f.method == "draft") != (f.draftModel != "") {
		return fmt.Errorf("--speculative draft goes with --draft-model (and only it)")
	}
	if f.tokens < 1 || f.lookupMin < 1 || f.lookupMax < f.lookupMin || f.disableAboveSeq < 0 {
		return fmt.Errorf("--num-speculative-tokens %d must be positive, --prompt-lookup-min %d ≤ --prompt-lookup-max %d, --speculative-max-seqs %d ≥ 0",
			f.tokens, f.lookupMin, f.lookupMax, f.disableAboveSeq)
	}
	return nil
}

// openDraft opens the draft model the flags name, if any, into o (the
// target engine loads it beside its model, its entries in the same KV
// cache); close closes it once the engine is closed.
func (f *specFlags) openDraft(o *engine.Options) (close func(), err error) {
	if err := f.check(); err != nil || f.method != "draft" {
		return func() {}, err
	}
	m, err := openModel(f.draftModel)
	if err != nil {
		return nil, fmt.Errorf("--draft-model: %w", err)
	}
	o.DraftModel = m
	return func() { m.Close() }, nil
}

// speculation is what the flags ask for (nil: none) for the engine target,
// which loaded the draft model when one is asked for (openDraft).
func (f *specFlags) speculation(target *engineOn) (*engine.Speculation, error) {
	if err := f.check(); err != nil || f.method == "" {
		return nil, err
	}
	if f.method == "ngram" {
		return &engine.Speculation{Drafter: engine.NGram{MinN: f.lookupMin, MaxN: f.lookupMax}, K: f.tokens}, nil
	}
	d := target.Draft()
	if d == nil {
		return nil, fmt.Errorf("--draft-model: the engine has no draft model")
	}
	return &engine.Speculation{Drafter: engine.ModelDrafter{E: d}, K: f.tokens}, nil
}

// warmSpeculation runs, on a GPU, the steps speculation meets first, so
// that their first-use work (kernel timings, graph captures) is not paid
// by the first drafts (nor counted against them by the engine's governor):
// the target's verifying steps of 1 to seqs sequences, greedy (and
// sampled, with sampled) at each context bucket up to maxContext
// (engine.WarmVerify), and a draft model's steps of 1 to seqs sequences
// (its Warm: its draft steps run over the drafting sequences together).
func warmSpeculation(e *engineOn, sp *engine.Speculation, seqs, maxContext int, sampled bool) (engine.WarmStats, error) {
	var all engine.WarmStats
	add := func(st engine.WarmStats, err error) error {
		all.Steps += st.Steps
		all.Took += st.Took
		return err
	}
	if err := add(e.WarmVerify(sp.K, seqs, maxContext, true)); err != nil {
		return all, err
	}
	if sampled {
		if err := add(e.WarmVerify(sp.K, seqs, maxContext, false)); err != nil {
			return all, err
		}
	}
	if d, ok := sp.Drafter.(engine.ModelDrafter); ok {
		return all, add(d.E.Warm(seqs, d.E.MaxStepTokens(), maxContext))
	}
	return all, nil
}
