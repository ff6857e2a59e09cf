package main

import (
	"flag"
	"fmt"
	"log/slog"

	"kiln/engine"
	"kiln/serve"
)

// schedFlags are the flags of an engine under serve's scheduler, shared by
// kiln serve and kiln bench throughput so that both run the same load the
// same way.
type schedFlags struct {
	blockSize, maxSeqs, maxTokens, decodePrefill, kvTokens int
	kvFraction                                             float64
	warm, prefix                                           bool
}

func (f *schedFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.blockSize, "block-size", envInt("KILN_BLOCK_SIZE", 16), "tokens per KV-cache block, 1 to 256: smaller blocks waste less of the last block, larger ones mean shorter block tables; the GPU's attention kernels are compiled for it (once, then cached) [KILN_BLOCK_SIZE]")
	fs.IntVar(&f.maxSeqs, "max-num-seqs", envInt("KILN_MAX_NUM_SEQS", 32), "most sequences in the running batch [KILN_MAX_NUM_SEQS]")
	fs.IntVar(&f.maxTokens, "max-num-batched-tokens", envInt("KILN_MAX_NUM_BATCHED_TOKENS", 0), "tokens per step, decode and prompt chunks together (0: the largest step the engine takes) [KILN_MAX_NUM_BATCHED_TOKENS]")
	fs.IntVar(&f.decodePrefill, "decode-prefill-tokens", envInt("KILN_DECODE_PREFILL_TOKENS", 256), "while sequences decode, a step's prompt tokens are at most the larger of this and twice the decoding sequences, so new prompts stall running streams boundedly (0: only --max-num-batched-tokens bounds them) [KILN_DECODE_PREFILL_TOKENS]")
	fs.IntVar(&f.kvTokens, "kv-cache-tokens", envInt("KILN_KV_CACHE_TOKENS", 0), "KV cache size in tokens, shared by all sequences (0: from --kv-cache-fraction) [KILN_KV_CACHE_TOKENS]")
	fs.Float64Var(&f.kvFraction, "kv-cache-fraction", envFloat("KILN_KV_CACHE_FRACTION", 0), "fraction of the memory left after the weights and activations that the KV cache may take, at most a full context for each of --max-num-seqs (0: 0.9 on a GPU, 0.5 on the CPU) [KILN_KV_CACHE_FRACTION]")
	fs.BoolVar(&f.warm, "warmup", envString("KILN_WARMUP", "1") != "0", "on a GPU, run a prompt chunk of each step size and decode batches of 1 to 8, 16, 32, … --max-num-seqs sequences at each context length's power of two first, so that first-use kernel timings and graph captures do not stall the first streams (KILN_WARMUP=0 turns it off) [KILN_WARMUP]")
	fs.BoolVar(&f.prefix, "enable-prefix-caching", envString("KILN_PREFIX_CACHING", "1") != "0", "share the KV blocks of common prompt prefixes between requests (KILN_PREFIX_CACHING=0 turns it off) [KILN_PREFIX_CACHING]")
}

func (f *schedFlags) check() error {
	if f.maxSeqs < 1 || f.maxTokens < 0 || f.decodePrefill < 0 || f.kvTokens < 0 || f.kvFraction < 0 || f.kvFraction > 1 {
		return fmt.Errorf("--max-num-seqs must be >= 1; --max-num-batched-tokens, --decode-prefill-tokens, --kv-cache-tokens >= 0; --kv-cache-fraction in [0, 1]")
	}
	if f.blockSize < 1 || f.blockSize > 256 {
		return fmt.Errorf("--block-size %d: want 1 to 256 tokens", f.blockSize)
	}
	return nil
}

// engineOptions are the engine's options for a context of ctxLen tokens
// (0: the model's own, bounded by memory).
func (f *schedFlags) engineOptions(ctxLen int) engine.Options {
	o := engine.Options{ContextLen: ctxLen, MaxSeqs: f.maxSeqs, BlockSize: f.blockSize, KVCacheFraction: f.kvFraction, PrefixCaching: f.prefix}
	if f.kvTokens > 0 {
		o.KVBlocks = (f.kvTokens + f.blockSize - 1) / f.blockSize
	}
	if o.KVCacheFraction == 0 {
		o.KVCacheFraction = autoKVFraction // set for the backend that opens
	}
	return o
}

// budget is a step's token budget on e.
func (f *schedFlags) budget(e *engineOn) int {
	if f.maxTokens == 0 {
		return e.MaxStepTokens()
	}
	return f.maxTokens
}

// warmUp runs, on a GPU and when asked, a step of every shape the scheduler
// can form (engine.Warm), logging it; it reports whether it ran cleanly.
// A warm-up only moves first-use work earlier: a step of it that fails
// (out of memory at a shape the scheduler would shrink) is logged, and the
// run goes on as it would without it.
func (f *schedFlags) warmUp(log *slog.Logger, e *engineOn) bool {
	gpu := gpuOf(e.backend)
	if !f.warm || gpu == nil {
		return false
	}
	err := logWarm(log, gpu, "warmed up", func() (engine.WarmStats, error) { return e.Warm(f.maxSeqs, f.budget(e), e.ContextLen()) })
	return err == nil
}

// config is the scheduler's configuration on e.
func (f *schedFlags) config(e *engineOn) serve.Config {
	return serve.Config{MaxNumSeqs: f.maxSeqs, MaxNumBatchedTokens: f.budget(e), DecodePrefillTokens: f.decodePrefill}
}
