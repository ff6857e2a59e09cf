// Package engine runs a model: it builds and compiles the model's graph for a
// backend, owns the paged KV cache and its block allocator, runs steps over
// one or more sequences, and generates tokens with a sampler.
//
// Invariants: a sequence's block table always covers its length; a block
// belongs to at most one sequence; steps never exceed the largest shape
// bucket (Prefill splits long prompts into chunks); decoding a token
// allocates nothing on the engine's side.
package engine

import (
	"fmt"
	"math"
	"slices"
	"time"

	"kiln/arch"
	"kiln/backend"
	"kiln/compile"
	"kiln/ir"
	"kiln/model"
)

// Options configure an engine.
type Options struct {
	// ContextLen is the longest sequence served (0: the model's own, or
	// less when KVCacheFraction's share of the memory holds less: then one
	// sequence of what it holds).
	ContextLen int
	// ContextCap, with ContextLen 0, bounds that default context (a draft
	// model needs no more than its target's).
	ContextCap int
	// MaxSeqs is how many sequences may hold KV blocks at once (default 1).
	MaxSeqs int
	// BlockSize is the number of token slots in a KV block (default 16).
	BlockSize int
	// KVBlocks is the size of the KV cache in blocks, shared by all
	// sequences (0: room for MaxSeqs sequences of ContextLen tokens, or
	// what KVCacheFraction allows). With neither KVBlocks nor
	// KVCacheFraction, and ContextLen 0, that is MaxSeqs of the model's
	// whole context, whatever the memory: set one of the three for a
	// model of long context.
	KVBlocks int
	// PrefixCaching lets sequences share the KV blocks of a common prefix
	// (NewSequenceFor): full blocks are indexed by the hash of their tokens
	// and everything before them, and kept after use until a block is
	// needed.
	PrefixCaching bool
	// KVCacheFP8 stores the KV cache's keys and values as FP8 E4M3
	// (backend.KVSpec.FP8): a quarter of the CPU's float32 cache.
	KVCacheFP8 bool
	// KVCacheF16 stores them as IEEE half precision (backend.KVSpec.F16):
	// half the CPU's float32 cache, as llama.cpp keeps it.
	KVCacheF16 bool
	// KVCacheFraction, when KVBlocks is 0 and the backend reports its
	// memory, sizes the cache to this fraction of the memory left once the
	// weights and the largest step's activations are in place, at most
	// MaxSeqs full contexts and at least one.
	KVCacheFraction float64
	// Buckets are the step sizes plans are built for (default
	// compile.DefaultBuckets).
	Buckets compile.Buckets
	// Compile adjusts compilation (disabled passes, verification, dumps).
	Compile compile.Options
	// DraftModel, when set, is loaded beside the model as its draft model
	// for speculative decoding (Draft): a model of the same vocabulary
	// whose keys and values share the KV cache's blocks. Each block holds
	// both models' entries for its tokens, so one block table serves both
	// (the draft's sequences borrow their target's, Borrow), and the cache
	// is sized for the two.
	DraftModel *model.Model
}

// MinAutoContextLen is the least context a default (ContextLen 0) may be
// bounded to by memory: below it, New fails as for an explicit context.
const MinAutoContextLen = 256

// Engine runs one model on one backend.
type Engine struct {
	Config   model.Config
	Compiled *compile.Compiled
	loaded   backend.Loaded
	buckets  compile.Buckets
	execs    map[compile.Bucket]backend.Executable
	kv       backend.KVCache
	spec     backend.KVSpec
	ctxLen   int
	vocab    int

	pool   *blockPool
	prefix PrefixStats
	copies int        // blocks copied on write
	cow    [][2]int32 // this step's copies
	logits []float32
	batch  backend.Batch
	ids    []int                  // StepSample's result
	devIDs []int32                // ids from a device sampler
	params []backend.SampleParams // per-row device sampling parameters
	steps  uint64                 // steps started, to catch a sequence named twice in one

	specStats SpecStats // speculative decoding's counters

	// draft is the draft model's engine (Options.DraftModel), sharing
	// pool; owner is, in a draft engine, the engine it drafts for.
	draft, owner *Engine

	// Startup is the time New spent in each of its phases, in order.
	Startup []Phase
}

// Phase is one part of a start and the time it took.
type Phase struct {
	Name string
	Time time.Duration
}

// phases times the parts of a start.
type phases struct {
	list []Phase
	last time.Time
}

// done ends the phase named name.
func (p *phases) done(name string) {
	now := time.Now()
	p.list = append(p.list, Phase{name, now.Sub(p.last)})
	p.last = now
}

// New builds, compiles and loads m for b.
func New(m *model.Model, b backend.Backend, opts Options) (*Engine, error) {
	c := m.Config
	ctx := opts.ContextLen
	auto := ctx <= 0
	if auto {
		ctx = c.MaxPositions
		if opts.ContextCap > 0 {
			ctx = min(ctx, opts.ContextCap)
		}
	}
	if ctx > c.MaxPositions {
		return nil, fmt.Errorf("context length %d exceeds the model's %d", ctx, c.MaxPositions)
	}
	if opts.MaxSeqs <= 0 {
		opts.MaxSeqs = 1
	}
	if opts.BlockSize <= 0 {
		opts.BlockSize = 16
	}
	// The backend may build its attention kernels for the cache's block
	// size (a constant of their arithmetic).
	opts.Compile.KVBlockSize = opts.BlockSize
	if opts.Buckets == nil {
		opts.Buckets = compile.DefaultBuckets
	}
	if err := opts.Buckets.Validate(); err != nil {
		return nil, err
	}
	ph := phases{last: time.Now()}
	compiled, loaded, err := compileLoad(m, b, ctx, opts.Compile, &ph)
	if err != nil {
		return nil, err
	}
	blocksPerSeq := (ctx + opts.BlockSize - 1) / opts.BlockSize
	blocks := blocksPerSeq * opts.MaxSeqs
	spec := kvSpec(c, b, opts, blocks)
	var d *Engine // the draft model's engine, its cache not yet made
	if opts.DraftModel != nil {
		d, err = newDraft(opts.DraftModel, c, b, ctx, opts, &ph)
		if err != nil {
			loaded.Close()
			return nil, err
		}
	}
	closeAll := func() {
		loaded.Close()
		if d != nil {
			d.loaded.Close()
		}
	}
	execs := map[compile.Bucket]backend.Executable{}
	mem, reports := loaded.(backend.MemoryReporter)
	switch {
	case opts.KVBlocks > 0:
		spec.Blocks = opts.KVBlocks
	case opts.KVCacheFraction > 0 && reports:
		// What every step needs first (a backend that can reserve it for
		// every bucket's plan does, else the largest step's executable is
		// built), then the cache from what is left.
		err := reserveSteps(loaded, compiled, opts.Buckets, opts.MaxSeqs, ctx, execs)
		if err == nil && d != nil {
			err = reserveSteps(d.loaded, d.Compiled, opts.Buckets, opts.MaxSeqs, d.ctxLen, d.execs)
		}
		var free int64
		if err == nil {
			free, err = mem.FreeMemory()
		}
		if err != nil {
			closeAll()
			return nil, err
		}
		one := spec
		one.Blocks = 1
		blockBytes := mem.KVBytes(one)
		if d != nil { // a block holds the draft's entries too
			one := d.spec
			one.Blocks = 1
			blockBytes += d.loaded.(backend.MemoryReporter).KVBytes(one)
		}
		fit := int(opts.KVCacheFraction * float64(free) / float64(blockBytes))
		if auto && fit < blocksPerSeq && fit*opts.BlockSize >= MinAutoContextLen {
			// The model's own context does not fit: the default is what
			// does, for one sequence.
			ctx, blocksPerSeq = fit*opts.BlockSize, fit
		}
		if fit < blocksPerSeq {
			closeAll()
			return nil, fmt.Errorf("kv cache: %.0f%% of the %d MiB left holds %d tokens, less than one context of %d",
				100*opts.KVCacheFraction, free>>20, fit*opts.BlockSize, ctx)
		}
		spec.Blocks = min(blocks, fit)
		ph.done("step memory")
	}
	kv, err := loaded.NewKVCache(spec)
	if err == nil && d != nil {
		d.spec.Blocks = spec.Blocks
		d.ctxLen = min(d.ctxLen, ctx)
		d.kv, err = d.loaded.NewKVCache(d.spec)
	}
	if err != nil {
		closeAll()
		return nil, err
	}
	ph.done("kv cache")
	e := &Engine{
		Config: c, Compiled: compiled, loaded: loaded, buckets: opts.Buckets,
		execs: execs, kv: kv, spec: spec, ctxLen: ctx,
		vocab: compiled.Graph.Outputs[0].Shape.Last(), Startup: ph.list,
	}
	e.pool = newBlockPool(spec.Blocks, opts.PrefixCaching)
	e.buffers(opts)
	if d != nil {
		e.draft, d.owner, d.pool = d, e, e.pool
	}
	return e, nil
}

// kvSpec is the KV cache of blocks blocks for a model of config c on b.
func kvSpec(c model.Config, b backend.Backend, opts Options, blocks int) backend.KVSpec {
	kvHeads := c.NumKVHeads
	if g, ok := b.(*backend.Group); ok {
		kvHeads /= len(g.Ranks) // each rank caches its own heads
	}
	return backend.KVSpec{Layers: c.NumLayers, Blocks: blocks, BlockSize: opts.BlockSize, KVHeads: kvHeads, HeadDim: c.HeadDim,
		FP8: opts.KVCacheFP8, F16: opts.KVCacheF16}
}

// buffers makes e's step buffers: logits and batch for opts' largest step.
func (e *Engine) buffers(opts Options) {
	maxT := opts.Buckets.Max()
	e.logits = make([]float32, maxT*e.vocab)
	e.batch = backend.Batch{
		Tokens: make([]int32, 0, maxT), Positions: make([]int32, 0, maxT), SeqIndex: make([]int32, 0, maxT),
		Seqs: make([]backend.Seq, 0, opts.MaxSeqs), Rows: make([]int32, 0, maxT),
	}
}

// newDraft compiles and loads the draft model dm for a target of config c
// and context ctx on b: the engine New completes with a cache and the
// target's pool. Its context is the target's, or the draft model's own
// when shorter (a sequence past it gets no drafts).
func newDraft(dm *model.Model, c model.Config, b backend.Backend, ctx int, opts Options, ph *phases) (*Engine, error) {
	dc := dm.Config
	if dc.VocabSize != c.VocabSize {
		return nil, fmt.Errorf("draft model: its vocabulary has %d tokens, the model's %d", dc.VocabSize, c.VocabSize)
	}
	dctx := min(ctx, dc.MaxPositions)
	co := opts.Compile
	co.After = nil
	compiled, loaded, err := compileLoad(dm, b, dctx, co, ph)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	d := &Engine{
		Config: dc, Compiled: compiled, loaded: loaded, buckets: opts.Buckets,
		execs: map[compile.Bucket]backend.Executable{}, spec: kvSpec(dc, b, opts, 0), ctxLen: dctx,
		vocab: compiled.Graph.Outputs[0].Shape.Last(),
	}
	d.buffers(opts)
	return d, nil
}

// compileLoad builds m's graph for a context of ctx, compiles it for b and
// loads it; for a tensor-parallel group (backend.Group), one shard a rank,
// rank 0's compiled graph returned.
func compileLoad(m *model.Model, b backend.Backend, ctx int, opts compile.Options, ph *phases) (*compile.Compiled, backend.Loaded, error) {
	group, _ := b.(*backend.Group)
	targets := []backend.Backend{b}
	if group != nil {
		targets = group.Ranks
	}
	var cs []*compile.Compiled
	for r, t := range targets {
		g, err := arch.Build(m, arch.Options{ContextLen: ctx})
		if err != nil {
			return nil, nil, err
		}
		o := opts
		if group != nil {
			o.Shard = compile.Shard{Rank: r, Ranks: len(targets)}
		}
		if r > 0 {
			o.After = nil // rank 0's graph stands for the others'
		}
		c, err := compile.Compile(g, t, o)
		if err != nil {
			return nil, nil, err
		}
		cs = append(cs, c)
	}
	ph.done("graph")
	var loaded backend.Loaded
	var err error
	if group != nil {
		loaded, err = group.LoadShards(cs)
	} else {
		loaded, err = b.Load(cs[0])
	}
	if err != nil {
		return nil, nil, err
	}
	ph.done("load")
	return cs[0], loaded, nil
}

// reserveSteps sets aside the backend memory of every step the buckets
// allow, before the KV cache is sized from what is left: through
// backend.StepReserver where the backend offers it, else by building the
// largest bucket's executable (into execs).
func reserveSteps(loaded backend.Loaded, c *compile.Compiled, buckets compile.Buckets, maxSeqs, ctx int, execs map[compile.Bucket]backend.Executable) error {
	if r, ok := loaded.(backend.StepReserver); ok {
		var plans []*compile.Plan
		for _, bk := range buckets.All() {
			p, err := c.Plan(bk)
			if err != nil {
				return err
			}
			plans = append(plans, p)
		}
		return r.ReserveSteps(plans, maxSeqs, ctx)
	}
	bk, err := buckets.For(buckets.Max(), buckets.Max())
	if err != nil {
		return err
	}
	p, err := c.Plan(bk)
	if err != nil {
		return err
	}
	execs[bk], err = loaded.Executable(p)
	return err
}

// Close releases the backend's resources (a draft model's too).
func (e *Engine) Close() error {
	if e.owner != nil {
		return nil // a draft engine closes with its owner
	}
	if e.draft != nil {
		e.draft.loaded.Close()
	}
	return e.loaded.Close()
}

// Draft is the draft model's engine (Options.DraftModel; nil without one).
// Its sequences borrow the block tables of the engine's (Borrow); its
// NewSequence takes blocks of the shared cache as the engine's does.
func (e *Engine) Draft() *Engine { return e.draft }

// Vocab is the number of logits per row.
func (e *Engine) Vocab() int { return e.vocab }

// ContextLen is the longest sequence the engine serves.
func (e *Engine) ContextLen() int { return e.ctxLen }

// KVSpec describes the engine's KV cache.
func (e *Engine) KVSpec() backend.KVSpec { return e.spec }

// KVBytes is the KV cache's memory on the backend (at 4 bytes an element
// when the backend does not say).
func (e *Engine) KVBytes() int64 {
	if m, ok := e.loaded.(backend.MemoryReporter); ok {
		return m.KVBytes(e.spec)
	}
	return e.spec.Bytes()
}

// MaxSeqs is the most sequences one step may hold.
func (e *Engine) MaxSeqs() int { return cap(e.batch.Seqs) }

// MaxStepTokens is the most tokens one step may hold.
func (e *Engine) MaxStepTokens() int { return e.buckets.Max() }

// Executable returns (building on first use) the executable for bucket b.
func (e *Engine) Executable(b compile.Bucket) (backend.Executable, error) {
	if x, ok := e.execs[b]; ok {
		return x, nil
	}
	p, err := e.Compiled.Plan(b)
	if err != nil {
		return nil, err
	}
	x, err := e.loaded.Executable(p)
	if err != nil {
		return nil, err
	}
	e.execs[b] = x
	return x, nil
}

// Sequence is one token sequence with KV blocks in the engine's cache.
type Sequence struct {
	blocks []int32
	len    int
	freed  bool
	inStep uint64 // the engine step that last included it
	// tokens are the sequence's tokens, and hashes the chain hashes of its
	// full blocks (for prefix caching).
	tokens []int
	hashes []uint64
	// owner is, for a draft engine's borrowed sequence (Borrow), the
	// target's sequence whose block table it writes through.
	owner *Sequence
}

// Len is the number of tokens in the cache.
func (s *Sequence) Len() int { return s.len }

// Blocks is the number of KV blocks the sequence holds.
func (s *Sequence) Blocks() int { return len(s.blocks) }

// NewSequence starts an empty sequence.
func (e *Engine) NewSequence() *Sequence {
	return &Sequence{blocks: make([]int32, 0, (e.ctxLen+e.spec.BlockSize-1)/e.spec.BlockSize)}
}

// Borrow starts a sequence of draft engine e that keeps its keys and values
// in target's blocks (the draft model's entries of them): its tokens are
// target's first tokens, written by the draft model. It takes no blocks of
// its own: it may hold only as many tokens as target's blocks have room for
// (the target's Reserve makes room past the target's length), and it drops
// nothing when truncated or freed. What the target does to its blocks
// (copies, releases) is the caller's to track.
func (e *Engine) Borrow(target *Sequence) (*Sequence, error) {
	if e.owner == nil {
		return nil, fmt.Errorf("borrow a block table: the engine is no draft engine")
	}
	return &Sequence{owner: target}, nil
}

// Reserve makes s's block table hold n tokens past its length in blocks of
// its own, without adding tokens (all of them, or none when the cache has
// too few free): a shared partial block it would write
// into is copied now (copy-on-write, as a step would), and blocks are
// added. A draft model that shares the cache writes its drafts' entries
// there before the step that verifies them. The reserved blocks are s's as
// any others: a later step writes into them, Truncate and Free release
// them.
func (e *Engine) Reserve(s *Sequence, n int) error {
	if s.freed || s.owner != nil {
		return fmt.Errorf("reserve on a freed or borrowed sequence")
	}
	if need := e.BlocksToGrow(s, n); need > e.pool.available() {
		return fmt.Errorf("kv cache is full (%d blocks wanted, %d free)", need, e.pool.available())
	}
	e.cow = e.cow[:0]
	if n > 0 {
		if err := e.unshare(s); err != nil {
			return err
		}
	}
	if err := e.copyOnWrite(); err != nil {
		return err
	}
	return e.grow(s, s.len+n)
}

// NewSequenceFor starts a sequence that will hold prompt: with prefix
// caching, it starts with the cached full blocks that hold the beginning of
// prompt (never the last token, whose logits the caller needs), and Len says
// how many tokens they hold; the caller steps only the rest.
func (e *Engine) NewSequenceFor(prompt []int) *Sequence {
	s := e.NewSequence()
	if !e.indexes(s) {
		return s
	}
	bs := e.spec.BlockSize
	e.prefix.Queries += len(prompt)
	var parent uint64
	for (s.len + bs) <= len(prompt)-1 {
		b, h, ok := e.pool.lookup(parent, prompt[s.len:s.len+bs])
		if !ok {
			break
		}
		s.blocks = append(s.blocks, b)
		s.hashes = append(s.hashes, h)
		s.tokens = append(s.tokens, prompt[s.len:s.len+bs]...)
		s.len += bs
		parent = h
	}
	e.prefix.Hits += s.len
	return s
}

// Fork starts a sequence holding the same tokens as s, sharing its blocks.
// Full blocks are never written again; the first write into a shared
// partial block copies it (copy-on-write), so the two diverge from there.
func (e *Engine) Fork(s *Sequence) *Sequence {
	f := e.NewSequence()
	used := s.blocks[:(s.len+e.spec.BlockSize-1)/e.spec.BlockSize] // not blocks reserved past s's tokens (Reserve)
	f.blocks = append(f.blocks, used...)
	for _, b := range used {
		e.pool.share(b)
	}
	f.len = s.len
	f.tokens = append(f.tokens, s.tokens...)
	f.hashes = append(f.hashes, s.hashes...)
	return f
}

// Copies is the number of blocks copied on write so far.
func (e *Engine) Copies() int { return e.copies }

// PrefixStats count prompt tokens looked up in the prefix cache and found.
type PrefixStats struct{ Queries, Hits int }

// PrefixStats returns the prefix cache's counters.
func (e *Engine) PrefixStats() PrefixStats { return e.prefix }

// Free returns a sequence's blocks to the cache.
func (e *Engine) Free(s *Sequence) {
	if s.freed {
		return
	}
	s.freed = true
	if s.owner != nil { // borrowed: the blocks are the owner's
		s.blocks, s.len = nil, 0
		return
	}
	for _, b := range s.blocks {
		e.pool.release(b)
	}
	s.blocks = s.blocks[:0]
	s.len = 0
}

// BlocksToGrow is the number of KV blocks s must take to hold n more
// tokens, counting the copy of a shared partial block it would write into.
func (e *Engine) BlocksToGrow(s *Sequence, n int) int {
	bs := e.spec.BlockSize
	need := max(0, (s.len+n+bs-1)/bs-len(s.blocks))
	if n > 0 && s.len%bs != 0 && e.pool.shared(s.blocks[s.len/bs]) {
		need++
	}
	return need
}

// FreeBlocks is the number of unused KV blocks.
func (e *Engine) FreeBlocks() int { return e.pool.available() }

// grow makes s's block table cover n tokens.
func (e *Engine) grow(s *Sequence, n int) error {
	if n > e.ctxLen {
		return fmt.Errorf("sequence of %d tokens exceeds the context length %d", n, e.ctxLen)
	}
	for len(s.blocks)*e.spec.BlockSize < n {
		b, ok := e.pool.take()
		if !ok {
			return fmt.Errorf("kv cache is full (%d blocks of %d tokens)", e.spec.Blocks, e.spec.BlockSize)
		}
		s.blocks = append(s.blocks, b)
	}
	return nil
}

// Item is one sequence's part of a step: tokens appended to it.
type Item struct {
	Seq    *Sequence
	Tokens []int
	// AllRows asks for the logits of every token, not just the last.
	AllRows bool
}

// Step appends each item's tokens to its sequence in one batched step and
// returns the logits: for each item, one row per token when AllRows is set,
// else one row for its last token, in item order. The returned slice is
// reused by the next step.
func (e *Engine) Step(items []Item) ([]float32, error) {
	x, err := e.prepare(items)
	if err != nil {
		return nil, err
	}
	b := &e.batch
	out := e.logits[:len(b.Rows)*e.vocab]
	if err := x.Run(b, e.kv, out); err != nil {
		return nil, err
	}
	e.advance(items)
	return out, nil
}

// StepSample is Step followed by the choice of each item's next token by its
// sampler (samplers[i] for items[i]; AllRows is not allowed). A nil sampler
// chooses nothing (a prompt chunk that is not its prompt's last): its id is
// -1, and no sampler's random state moves for it. On a backend that samples
// on the device, only the ids come back from it. The returned slice is
// reused by the next call. The samplers' Accept is not called.
func (e *Engine) StepSample(items []Item, samplers []*Sampler) ([]int, error) {
	ids, _, err := e.stepSample(items, samplers, false)
	return ids, err
}

// StepSampleLogits is StepSample with the logits of each item's last token
// brought back to the host (for log-probabilities): rows of Vocab(), in item
// order, reused by the next step. The tokens are chosen on the host, as the
// device would choose them.
func (e *Engine) StepSampleLogits(items []Item, samplers []*Sampler) ([]int, []float32, error) {
	return e.stepSample(items, samplers, true)
}

// Rows is what a step that wants several rows of one item brought back
// (Step with AllRows, or StepGreedy): every row's logits, or, with Logits
// nil, every row's greedy choice. Sample and Verify decide a row as the
// sampler would from its logits.
type Rows struct {
	Logits []float32
	IDs    []int
	Vocab  int
}

// Row is row at's logits (nil when only the choices came back).
func (o Rows) Row(at int) []float32 {
	if o.Logits == nil {
		return nil
	}
	return o.Logits[at*o.Vocab : (at+1)*o.Vocab]
}

// Sample is s's choice from row at (Sampler.Sample).
func (o Rows) Sample(s *Sampler, at int) int {
	if o.Logits == nil {
		return o.IDs[at]
	}
	return s.Sample(o.Row(at))
}

// Verify is s's decision on draft d from row at (Sampler.Verify).
func (o Rows) Verify(s *Sampler, at, d int) (int, bool) {
	if o.Logits == nil {
		return o.IDs[at], o.IDs[at] == d
	}
	return s.Verify(o.Row(at), d)
}

// StepGreedy is Step with each logit row's greedy choice (Argmax) in place
// of the logits, in row order (an AllRows item's rows, one row for each
// other item): on a backend that samples on the device only the ids come
// back (a step verifying k drafts brings k+1 ids instead of k+1 rows of
// logits). The returned slice is reused by the next step.
func (e *Engine) StepGreedy(items []Item) ([]int, error) {
	x, err := e.prepare(items)
	if err != nil {
		return nil, err
	}
	b := &e.batch
	e.ids = e.ids[:0]
	if sx, ok := x.(backend.SamplingExecutable); ok {
		e.params = slices.Grow(e.params[:0], len(b.Rows))[:len(b.Rows)]
		clear(e.params) // greedy, no history
		if err := e.runSample(sx); err != nil {
			return nil, err
		}
		for _, id := range e.devIDs {
			e.ids = append(e.ids, int(id))
		}
	} else {
		out := e.logits[:len(b.Rows)*e.vocab]
		if err := x.Run(b, e.kv, out); err != nil {
			return nil, err
		}
		for r := range b.Rows {
			e.ids = append(e.ids, Argmax(out[r*e.vocab:(r+1)*e.vocab]))
		}
	}
	e.advance(items)
	return e.ids, nil
}

func (e *Engine) stepSample(items []Item, samplers []*Sampler, wantLogits bool) ([]int, []float32, error) {
	if len(samplers) != len(items) {
		return nil, nil, fmt.Errorf("step of %d items with %d samplers", len(items), len(samplers))
	}
	for i, it := range items {
		if it.AllRows {
			return nil, nil, fmt.Errorf("item %d: sampling takes the last row only", i)
		}
	}
	x, err := e.prepare(items)
	if err != nil {
		return nil, nil, err
	}
	b := &e.batch
	e.ids = e.ids[:0]
	if sx, ok := x.(backend.SamplingExecutable); ok && !wantLogits {
		e.params = e.params[:0]
		for _, s := range samplers {
			if s == nil {
				e.params = append(e.params, backend.SampleParams{}) // greedy, cheapest; ignored
				continue
			}
			e.params = append(e.params, s.deviceParams())
		}
		if err := e.runSample(sx); err != nil {
			return nil, nil, err
		}
		for i, id := range e.devIDs {
			if samplers[i] == nil {
				id = -1
			}
			e.ids = append(e.ids, int(id))
		}
		e.advance(items)
		return e.ids, nil, nil
	}
	out := e.logits[:len(b.Rows)*e.vocab]
	if err := x.Run(b, e.kv, out); err != nil {
		return nil, nil, err
	}
	for i, s := range samplers {
		id := -1
		if s != nil {
			id = s.Sample(out[i*e.vocab : (i+1)*e.vocab])
		}
		e.ids = append(e.ids, id)
	}
	e.advance(items)
	return e.ids, out, nil
}

// runSample runs the prepared step on the device with e.params, a row's
// each, into e.devIDs.
func (e *Engine) runSample(sx backend.SamplingExecutable) error {
	n := len(e.batch.Rows)
	e.devIDs = slices.Grow(e.devIDs[:0], n)[:n]
	return sx.RunSample(&e.batch, e.kv, e.params, e.devIDs)
}

// prepare fills e.batch with items' tokens (growing their block tables) and
// returns the executable of its bucket.
func (e *Engine) prepare(items []Item) (backend.Executable, error) {
	e.steps++
	e.cow = e.cow[:0]
	b := &e.batch
	b.Tokens, b.Positions, b.SeqIndex, b.Seqs, b.Rows = b.Tokens[:0], b.Positions[:0], b.SeqIndex[:0], b.Seqs[:0], b.Rows[:0]
	total := 0
	for _, it := range items {
		total += len(it.Tokens)
	}
	if total == 0 || total > e.buckets.Max() {
		return nil, fmt.Errorf("step of %d tokens (1 to %d allowed)", total, e.buckets.Max())
	}
	if len(items) > cap(b.Seqs) {
		return nil, fmt.Errorf("step of %d sequences, engine holds %d", len(items), cap(b.Seqs))
	}
	for i, it := range items {
		if it.Seq.freed {
			return nil, fmt.Errorf("step on a freed sequence")
		}
		if len(it.Tokens) == 0 {
			return nil, fmt.Errorf("item %d has no tokens", i)
		}
		if it.Seq.inStep == e.steps {
			return nil, fmt.Errorf("item %d repeats a sequence of the step", i)
		}
		it.Seq.inStep = e.steps
		if err := e.makeRoom(it.Seq, len(it.Tokens)); err != nil {
			return nil, err
		}
		for j, tok := range it.Tokens {
			if tok < 0 || tok >= e.vocab || tok > math.MaxInt32 {
				return nil, fmt.Errorf("token id %d out of range [0,%d)", tok, e.vocab)
			}
			if it.AllRows || j == len(it.Tokens)-1 {
				b.Rows = append(b.Rows, int32(len(b.Tokens)))
			}
			b.Tokens = append(b.Tokens, int32(tok))
			b.Positions = append(b.Positions, int32(it.Seq.len+j))
			b.SeqIndex = append(b.SeqIndex, int32(i))
		}
		b.Seqs = append(b.Seqs, backend.Seq{Blocks: it.Seq.blocks, Len: it.Seq.len + len(it.Tokens)})
	}
	bucket, err := e.buckets.For(len(b.Tokens), len(b.Rows))
	if err != nil {
		return nil, err
	}
	if err := e.copyOnWrite(); err != nil {
		return nil, err
	}
	return e.Executable(bucket)
}

// copyOnWrite makes the block copies unshare queued (e.cow) and empties
// the queue.
func (e *Engine) copyOnWrite() error {
	if len(e.cow) == 0 {
		return nil
	}
	if err := e.kv.CopyBlocks(e.cow); err != nil {
		return err
	}
	e.copies += len(e.cow)
	e.cow = e.cow[:0]
	return nil
}

// makeRoom readies s's block table for n more tokens: its own copy of a
// shared block it writes into, and new blocks; a borrowed sequence writes
// through its owner's table, which must have the room already.
func (e *Engine) makeRoom(s *Sequence, n int) error {
	o := s.owner
	if o == nil {
		if err := e.unshare(s); err != nil {
			return err
		}
		return e.grow(s, s.len+n)
	}
	if o.freed {
		return fmt.Errorf("a draft sequence of a freed sequence")
	}
	if s.len+n > min(e.ctxLen, len(o.blocks)*e.spec.BlockSize) {
		return fmt.Errorf("draft sequence of %d tokens past the %d its target's blocks hold (Reserve them)", s.len+n, len(o.blocks)*e.spec.BlockSize)
	}
	s.blocks = o.blocks
	return nil
}

// unshare gives s its own copy of the partial block it is about to write
// into when another sequence shares it (queued in e.cow for the step).
func (e *Engine) unshare(s *Sequence) error {
	bs := e.spec.BlockSize
	if s.len%bs == 0 {
		return nil
	}
	i := s.len / bs
	old := s.blocks[i]
	if !e.pool.shared(old) {
		return nil
	}
	b, ok := e.pool.take()
	if !ok {
		return fmt.Errorf("kv cache is full (%d blocks of %d tokens)", e.spec.Blocks, e.spec.BlockSize)
	}
	e.cow = append(e.cow, [2]int32{old, b})
	e.pool.release(old)
	s.blocks[i] = b
	return nil
}

// advance records that a step appended items' tokens to their sequences.
func (e *Engine) advance(items []Item) {
	bs := e.spec.BlockSize
	for _, it := range items {
		s := it.Seq
		s.len += len(it.Tokens)
		if !e.indexes(s) {
			continue
		}
		s.tokens = append(s.tokens, it.Tokens...)
		for full := len(s.hashes); (full+1)*bs <= s.len; full++ {
			var parent uint64
			if full > 0 {
				parent = s.hashes[full-1]
			}
			s.hashes = append(s.hashes, e.pool.index(s.blocks[full], parent, s.tokens[full*bs:(full+1)*bs]))
		}
	}
}

// indexes reports whether s's full blocks go in the prefix cache: with
// prefix caching, for the target's own sequences (a draft engine's blocks
// hold no target entries to share, and a borrowed sequence's are its
// target's).
func (e *Engine) indexes(s *Sequence) bool {
	return e.pool.prefix && s.owner == nil && e.owner == nil
}

// Truncate drops s's tokens from n on (a speculative step's rejected
// drafts): their keys and values stay in the cache to be written over, the
// blocks past n are released, and a block indexed as full with the dropped
// tokens is indexed no more.
func (e *Engine) Truncate(s *Sequence, n int) error {
	if s.freed || n < 0 || n > s.len {
		return fmt.Errorf("truncate a sequence of %d tokens to %d", s.len, n)
	}
	if s.owner != nil { // borrowed: the blocks are the owner's
		s.len = n
		return nil
	}
	bs := e.spec.BlockSize
	if e.indexes(s) {
		full := n / bs
		for i := full; i < len(s.hashes); i++ {
			e.pool.unindex(s.blocks[i], s.hashes[i])
		}
		s.hashes = s.hashes[:min(full, len(s.hashes))]
		s.tokens = s.tokens[:n]
	}
	keep := (n + bs - 1) / bs
	for _, b := range s.blocks[keep:] {
		e.pool.release(b)
	}
	s.blocks = s.blocks[:keep]
	s.len = n
	return nil
}

// Prefill appends tokens to s in chunks of at most MaxStepTokens and returns
// the logits of the last token (allRows: of every token, freshly allocated).
func (e *Engine) Prefill(s *Sequence, tokens []int, allRows bool) ([]float32, error) {
	var all []float32
	var last []float32
	for start := 0; start < len(tokens); start += e.buckets.Max() {
		end := min(start+e.buckets.Max(), len(tokens))
		item := [1]Item{{Seq: s, Tokens: tokens[start:end], AllRows: allRows}}
		out, err := e.Step(item[:])
		if err != nil {
			return nil, err
		}
		if allRows {
			all = append(all, out...)
		}
		last = out
	}
	if allRows {
		return all, nil
	}
	if last == nil {
		return nil, fmt.Errorf("prefill of no tokens")
	}
	return last, nil
}

// Kernels lists, for bucket b, each plan node with the kernel chosen for it.
func (e *Engine) Kernels(b compile.Bucket) ([]*ir.Node, []string, error) {
	x, err := e.Executable(b)
	if err != nil {
		return nil, nil, err
	}
	var nodes []*ir.Node
	for _, n := range e.Compiled.Graph.Nodes {
		if n.Op != ir.Weight && n.Op != ir.Const {
			nodes = append(nodes, n)
		}
	}
	return nodes, x.Kernels(), nil
}
