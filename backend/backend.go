// Package backend defines the small interface every execution target (CPU,
// CUDA) implements, and the batch description a step runs on.
//
// A backend loads a compiled graph once (its weights become resident), then
// builds one Executable per plan (shape bucket). Running an executable
// processes one Batch: it writes the batch's keys and values into the KV
// cache and returns the logits of the rows the batch asks for.
package backend

import (
	"errors"
	"fmt"

	"kiln/compile"
)

// Backend is an execution target.
type Backend interface {
	compile.Target
	// Load makes a compiled graph's weights resident on the target.
	Load(c *compile.Compiled) (Loaded, error)
}

// Loaded is a compiled graph resident on a target.
type Loaded interface {
	// NewKVCache allocates a paged KV cache for the graph's attention layers.
	NewKVCache(spec KVSpec) (KVCache, error)
	// Executable prepares the plan of one bucket for running.
	Executable(p *compile.Plan) (Executable, error)
	Close() error
}

// Executable runs the steps of one bucket.
type Executable interface {
	// Kernels names the kernel chosen for each node of the plan, in order.
	Kernels() []string
	// Run executes one step. logits receives len(b.Rows)×vocab float32
	// (nil: the logits are not wanted, as on a tensor-parallel group's
	// ranks after the first).
	Run(b *Batch, kv KVCache, logits []float32) error
}

// KVCache is a backend's paged key/value storage.
type KVCache interface {
	Spec() KVSpec
	// CopyBlocks copies, in every layer, the keys and values of block
	// pair[0] into block pair[1], before the next step runs (copy-on-write
	// of a block that sequences shared).
	CopyBlocks(pairs [][2]int32) error
}

// KVSpec sizes a paged KV cache: for each layer, Blocks blocks of BlockSize
// token slots, each slot holding KVHeads×HeadDim keys and as many values.
// FP8 stores keys and values as FP8 E4M3 (tensor.F32ToE4M3: scale 1, as
// vLLM's --kv-cache-dtype fp8 without calibrated scales, saturating at
// ±448) instead of the backend's own dtype.
type KVSpec struct {
	Layers, Blocks, BlockSize, KVHeads, HeadDim int
	// FP8 stores keys and values as E4M3 codes; F16 (the CPU's) as IEEE
	// half precision.
	FP8, F16 bool
}

// Bytes is the cache's size at 4 bytes an element (the CPU's float32), 2
// in F16, 1 in FP8.
func (s KVSpec) Bytes() int64 {
	elem := int64(4)
	switch {
	case s.FP8:
		elem = 1
	case s.F16:
		elem = 2
	}
	return 2 * int64(s.Layers) * int64(s.Blocks) * int64(s.BlockSize) * int64(s.KVHeads) * int64(s.HeadDim) * elem
}

// Seq is one sequence of a batch.
type Seq struct {
	// Blocks is the sequence's block table: logical block i of the sequence
	// is physical block Blocks[i] of the cache.
	Blocks []int32
	// Len is the number of tokens of the sequence in the cache once this step
	// has run (its earlier tokens plus the ones in this batch).
	Len int
}

// Batch is one step: T tokens from one or more sequences.
type Batch struct {
	Tokens    []int32 // T token ids
	Positions []int32 // T positions within their sequences
	SeqIndex  []int32 // T: which Seqs entry each token belongs to
	Seqs      []Seq
	// Rows lists the token indices (into Tokens) whose logits are wanted,
	// in the order the logits are returned.
	Rows []int32
}

// Validate checks the batch against a cache of the given spec, so that a bad
// batch is an error rather than an out-of-range access in a kernel.
func (b *Batch) Validate(spec KVSpec) error {
	t := len(b.Tokens)
	if t == 0 || len(b.Positions) != t || len(b.SeqIndex) != t {
		return fmt.Errorf("batch: %d tokens, %d positions, %d sequence indices", t, len(b.Positions), len(b.SeqIndex))
	}
	for i := range b.Tokens {
		s := int(b.SeqIndex[i])
		if s < 0 || s >= len(b.Seqs) {
			return fmt.Errorf("batch: token %d belongs to sequence %d of %d", i, s, len(b.Seqs))
		}
		p := int(b.Positions[i])
		if p < 0 || p >= b.Seqs[s].Len {
			return fmt.Errorf("batch: token %d at position %d, sequence length %d", i, p, b.Seqs[s].Len)
		}
	}
	for i, s := range b.Seqs {
		if s.Len > len(s.Blocks)*spec.BlockSize {
			return fmt.Errorf("batch: sequence %d of %d tokens has %d blocks of %d", i, s.Len, len(s.Blocks), spec.BlockSize)
		}
		for _, blk := range s.Blocks {
			if blk < 0 || int(blk) >= spec.Blocks {
				return fmt.Errorf("batch: sequence %d uses block %d of %d", i, blk, spec.Blocks)
			}
		}
	}
	for _, r := range b.Rows {
		if r < 0 || int(r) >= t {
			return fmt.Errorf("batch: logit row %d of %d tokens", r, t)
		}
	}
	return nil
}

// SampleParams chooses one row's token on the device, with the semantics of
// the engine's sampler (engine.Sampler): penalties, temperature, top-k,
// top-p, min-p, then a draw at U·(total mass) over the survivors in the
// sampler's order. Temperature 0 is greedy.
type SampleParams struct {
	Temperature, TopP, MinP                              float64
	TopK                                                 int
	RepetitionPenalty, FrequencyPenalty, PresencePenalty float64
	// U is the uniform number in [0,1) the host drew for this row.
	U float64
	// History lists the tokens the penalties apply to (nil: none).
	History []HistoryEntry
}

// HistoryEntry is one token of a sequence's history.
type HistoryEntry struct {
	ID    int32
	Count int32 // times generated (frequency and presence penalties)
	Seen  bool  // in the prompt or the output (repetition penalty)
	// Banned makes the token's logit -inf (a stop token before the
	// request's min_tokens).
	Banned bool
}

// SamplingExecutable is an Executable that can also choose each logit row's
// token on the device, so that only the ids cross back to the host.
type SamplingExecutable interface {
	Executable
	// RunSample executes one step like Run and writes one token id per row
	// of b.Rows into ids, chosen by params (one per row).
	RunSample(b *Batch, kv KVCache, params []SampleParams, ids []int32) error
}

// Worker is a Loaded whose work runs on a thread of its own (a GPU's
// worker thread, which owns its context). A tensor-parallel group hands
// each rank's step to its rank's worker and then waits for them all, so
// that the ranks start at once and no goroutine is started and woken for
// each rank on every step.
type Worker interface {
	// Go hands f to the worker and returns at once, with an error only
	// when the worker cannot take it (closed); wait returns f's error once
	// it has run. Call wait once.
	Go(f func() error) (wait func() error, err error)
}

// ErrOutOfMemory marks an error caused by a failed device memory
// allocation: a step that fails with it may succeed smaller, or after its
// caller frees something, so the scheduler retries it rather than failing
// its requests.
var ErrOutOfMemory = errors.New("out of memory")

// StepReserver is a Loaded that sets aside, before the KV cache is sized
// from the memory left, the memory every step the engine can form will
// need (for steps of up to maxSeqs sequences of up to context tokens, on
// the given plans), so that no step allocates device memory afterwards.
type StepReserver interface {
	ReserveSteps(plans []*compile.Plan, maxSeqs, context int) error
}

// SharedMemory is a Loaded whose memory is the host's, shared with the
// other ranks of a tensor-parallel group (the CPU's): the group divides the
// free memory it reports among its ranks.
type SharedMemory interface {
	SharesHostMemory() bool
}

// MemoryReporter is a Loaded that can size its KV cache from the memory it
// has left.
type MemoryReporter interface {
	// FreeMemory is the memory, in bytes, available for the KV cache now.
	FreeMemory() (int64, error)
	// KVBytes is the memory a cache of spec takes on this backend.
	KVBytes(spec KVSpec) int64
}
