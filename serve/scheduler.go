// Package serve is kiln's OpenAI-compatible server: a scheduler that runs
// many requests through one engine with continuous batching and chunked
// prefill, and the HTTP API on top of it.
//
// Invariants: only the scheduler's goroutine touches the engine; a request's
// events are delivered on a channel with room for all of them, so a slow
// client never stalls a step; a request that leaves (finished, cancelled,
// failed) has returned its KV blocks before the next step.
package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kiln/backend"
	"kiln/engine"
)

// Config bounds the scheduler.
type Config struct {
	// MaxNumSeqs is the most sequences in the running batch.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget, shared by decoding
	// sequences (one token each) and prompt chunks.
	MaxNumBatchedTokens int
	// DecodePrefillTokens bounds the prompt tokens of a step in which
	// sequences decode: at most max(DecodePrefillTokens, 2 × the decoding
	// sequences), so that a new request's prefill stretches the running
	// streams' step by a bounded share (0: no bound but the budget's).
	DecodePrefillTokens int
	// MaxQueuedRequests and MaxQueuedTokens bound the waiting queue (in
	// requests, and in prompt tokens); over them Submit refuses.
	MaxQueuedRequests, MaxQueuedTokens int
	// Speculation, when set, drafts tokens for decoding sequences and
	// verifies them in the step (engine.Speculation), while a step holds
	// at most SpeculateMaxSeqs decoding sequences (larger batches are
	// compute-bound: drafts would cost more than they save).
	Speculation      *engine.Speculation
	SpeculateMaxSeqs int
	// SlowStep, when set, hears of each step that took over slowStepMin
	// and over slowStepFactor times the steps' moving mean: a graph
	// capture, a first-use kernel timing or an allocation inside a step
	// is otherwise seen only as a stall in every stream.
	SlowStep func(SlowStep)
}

// SlowStep describes a step that took far longer than the steps before it.
type SlowStep struct {
	Took, Mean   time.Duration // the step's time; the moving mean before it
	Seqs, Tokens int           // the step's sequences and tokens
	Speculating  bool          // the step verified drafts
}

const (
	slowStepMin    = 250 * time.Millisecond
	slowStepFactor = 8
)

// Event is one step of a request's output: a generated token, or the end.
type Event struct {
	Token int // the generated token (when !Done)
	// Logprob is the token's log-probability under the model (its raw
	// logits' log-softmax), and Top the most likely tokens with theirs, when
	// the request asks for log-probabilities.
	Logprob float32
	Top     []TokenLogprob
	Done    bool   // the last event
	Finish  string // engine.FinishStop or engine.FinishLength (when Done without Err)
	Err     error  // why the request failed or was cancelled (when Done)
	// Counts, in the last event: CachedTokens of the prompt came from the
	// prefix cache.
	PromptTokens, GeneratedTokens, CachedTokens int
}

// TokenLogprob is a token with its log-probability.
type TokenLogprob struct {
	Token   int
	Logprob float32
}

// Request is one generation.
type Request struct {
	Prompt   []int
	Params   engine.SamplingParams
	Priority int // higher first; FCFS among equals
	// StartBy, when set, is when the request must have started running: one
	// the queue cannot start in time is refused at once (ErrDeadline), and
	// one still waiting then is dropped with ErrDeadline.
	StartBy time.Time
	// Logprobs asks for each generated token's log-probability and the
	// TopLogprobs most likely alternatives. Steps that carry such a request
	// bring the logits to the host.
	Logprobs    bool
	TopLogprobs int
	// Ctx cancels the request (a client that went away): its sequence is
	// dropped and its blocks freed at the next step.
	Ctx context.Context
	// Events receives the output, then one Done event; Submit makes it.
	Events <-chan Event

	events  chan Event
	arrival uint64
	// submittedAt and admittedAt (first admission) time the queue wait;
	// read them after the Done event.
	submittedAt, admittedAt time.Time

	// Scheduler state.
	tokens    []int // prompt, then generated tokens
	generated int
	cached    int // tokens[:cached] are in the sequence's KV cache
	seq       *engine.Sequence
	// cachedPrompt is how many prompt tokens the prefix cache held when
	// the request was first admitted.
	cachedPrompt int
	// followers are the rest of a group, waiting to fork this request's
	// sequence once its prompt but the last token is in the cache.
	followers []*Request
	sampler   *engine.Sampler
	admitted  uint64 // admission order, for preemption
	// draft is the tokens drafted for this step (speculation), after its
	// last token in the step's item; drafter drafts them (made at the
	// first draft, released when r finishes).
	draft        []int
	drafter      engine.Drafter
	releaseDraft func()
	// gov pauses r's drafting while its verifying steps (their drafting
	// included, draftTime) yield fewer tokens a second than its plain
	// ones, as kiln run's speculation does.
	gov       engine.Governor
	draftTime time.Duration
	mayDraft  bool // gov's answer for the step being gathered
}

// ErrOverloaded is returned by Submit when the waiting queue is full.
var ErrOverloaded = errors.New("serve: the server is at capacity")

// ErrDeadline is the error of a request that could not start before its
// StartBy.
var ErrDeadline = errors.New("serve: the request cannot start before its deadline")

// ErrStopped is the error of requests left when the scheduler stops.
var ErrStopped = errors.New("serve: the server is shutting down")

// Scheduler runs requests on one engine.
type Scheduler struct {
	e   *engine.Engine
	cfg Config

	mu           sync.Mutex
	waiting      []*Request
	queuedTokens int
	arrivals     uint64
	stopped      bool
	wake         chan struct{}
	runTime      time.Duration // moving mean of the time requests spend running

	running   []*Request // owned by the loop
	admitted  uint64
	stats     Stats
	statsMu   sync.Mutex
	items     []engine.Item
	samplers  []*engine.Sampler
	itemOwner []*Request
	// limit bounds the steps after one failed for lack of device memory.
	limit stepLimit
	// broken is the error that left the engine unable to run steps (a
	// tensor-parallel group aborted), or nil.
	broken atomic.Pointer[error]
	// meanStep is the moving mean of the steps' times (for SlowStep).
	meanStep time.Duration
	// drafting is the step's decoding requests that draft (gather's), and
	// draftTime the time the step waited for their drafts.
	drafting  []draftItem
	draftTime time.Duration
	// now is the clock steps and drafts are timed by (time.Now; tests
	// give the governors a modeled device's clock).
	now func() time.Time
	// gov judges drafting for the batch: verifying steps' decoded tokens
	// over their time and their drafting's, against plain steps' time for
	// each decoded token. Each request's own governor (Request.gov) judges
	// its drafts by its own tokens, which in a batch cannot see that its
	// drafts slow every request's step; drafting pauses when either says
	// it does not pay.
	gov engine.Governor
}

// Broken is the error that left the engine unable to run steps, or nil:
// requests then fail at once.
func (s *Scheduler) Broken() error {
	if e := s.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// stepLimit bounds a step's tokens and sequences (0: unbounded) after a
// step failed with backend.ErrOutOfMemory: each such failure halves the
// step, and a bound is doubled again after liftAfter good steps, until it
// no longer binds. A one-token step that fails is retried, then preempts
// its request (recomputed when readmitted); after maxOOMAtOne such
// failures in a row the step's requests fail.
type stepLimit struct {
	tokens, seqs int
	good         int // steps run since the last failure
	atOne        int // one-token steps failed in a row
	rotate       int // first decoding sequence taken while bounded
}

const (
	liftAfter   = 16
	maxOOMAtOne = 3
)

// Stats are the scheduler's counters and gauges.
type Stats struct {
	Running, Waiting int
	Steps            uint64
	Preemptions      uint64
	PromptTokens     uint64 // prompt tokens computed (recomputation included)
	GeneratedTokens  uint64
	FreeBlocks       int
	TotalBlocks      int
	// Prompt tokens looked up in the prefix cache, and found there.
	PrefixQueries, PrefixHits int
	// StepTime is the time spent in engine steps, LoopTime the time of the
	// scheduler's steps around them (gathering, sampling bookkeeping,
	// handing out tokens); LoopTime-StepTime is the scheduler's overhead.
	StepTime, LoopTime time.Duration
	// KVSlotsAllocated and KVSlotsUsed sum, over steps, the running
	// sequences' block slots and the tokens in them: 1 - used/allocated is
	// the share of allocated KV memory left empty.
	KVSlotsAllocated, KVSlotsUsed int64
	// OOMRetries counts steps that failed for lack of device memory and
	// were retried smaller (or whose request was preempted), not failed.
	OOMRetries uint64
	// Speculative decoding (vLLM's spec_decode counters): the sequences'
	// steps that verified drafts, the tokens drafted, and those kept.
	SpecDrafts, SpecDraftTokens, SpecAcceptedTokens uint64
}

// NewScheduler makes a scheduler for e; Run starts it.
func NewScheduler(e *engine.Engine, cfg Config) (*Scheduler, error) {
	if cfg.MaxNumSeqs <= 0 || cfg.MaxNumBatchedTokens <= 0 {
		return nil, fmt.Errorf("serve: max-num-seqs %d and max-num-batched-tokens %d must be positive", cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens)
	}
	if cfg.MaxNumBatchedTokens > e.MaxStepTokens() {
		return nil, fmt.Errorf("serve: max-num-batched-tokens %d exceeds the engine's largest step of %d", cfg.MaxNumBatchedTokens, e.MaxStepTokens())
	}
	if cfg.MaxNumSeqs > e.MaxSeqs() {
		return nil, fmt.Errorf("serve: max-num-seqs %d exceeds the engine's %d sequences", cfg.MaxNumSeqs, e.MaxSeqs())
	}
	cfg.MaxNumSeqs = min(cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens)
	return &Scheduler{e: e, cfg: cfg, wake: make(chan struct{}, 1), now: time.Now}, nil
}

// Submit queues r, or refuses with ErrOverloaded when the queue is full. The
// prompt must fit the context with room for one generated token.
func (s *Scheduler) Submit(r *Request) error { return s.SubmitGroup([]*Request{r}) }

// SubmitGroup queues requests of one prompt (the n choices of an API
// request) as a group: the first computes the prompt, the others fork its
// KV blocks before its last token and share them (a shared partial block is
// copied on its first write), so the prompt is computed once. The group is
// refused or queued as a whole.
func (s *Scheduler) SubmitGroup(rs []*Request) error {
	if len(rs) == 0 {
		return fmt.Errorf("serve: empty group")
	}
	if err := s.Broken(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	for _, r := range rs {
		if !slices.Equal(r.Prompt, rs[0].Prompt) {
			return fmt.Errorf("serve: a group's requests must share their prompt")
		}
		if err := s.prepare(r); err != nil {
			return err
		}
	}
	if len(rs) > s.cfg.MaxNumSeqs {
		return fmt.Errorf("serve: a group of %d requests, the running batch holds %d", len(rs), s.cfg.MaxNumSeqs)
	}
	r := rs[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	if (s.cfg.MaxQueuedRequests > 0 && len(s.waiting)+len(rs) > s.cfg.MaxQueuedRequests) ||
		(s.cfg.MaxQueuedTokens > 0 && s.queuedTokens+len(r.Prompt) > s.cfg.MaxQueuedTokens) {
		return ErrOverloaded
	}
	now := time.Now()
	if !r.StartBy.IsZero() && now.Add(s.queueWait(r.Priority)).After(r.StartBy) {
		return ErrDeadline
	}
	for _, f := range rs {
		s.arrivals++
		f.arrival = s.arrivals
		f.submittedAt = now
	}
	r.followers = rs[1:]
	s.enqueue(r)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// prepare checks r and sets up its event channel.
func (s *Scheduler) prepare(r *Request) error {
	if len(r.Prompt) == 0 {
		return fmt.Errorf("serve: empty prompt")
	}
	if len(r.Prompt) >= s.e.ContextLen() {
		return fmt.Errorf("serve: prompt of %d tokens leaves no room in the context of %d", len(r.Prompt), s.e.ContextLen())
	}
	if err := r.Params.Validate(); err != nil {
		return err
	}
	if need := s.e.BlocksToGrow(s.e.NewSequence(), len(r.Prompt)+1); need > s.e.KVSpec().Blocks {
		return fmt.Errorf("serve: prompt of %d tokens needs %d KV blocks, the cache has %d", len(r.Prompt), need, s.e.KVSpec().Blocks)
	}
	if r.Ctx == nil {
		r.Ctx = context.Background()
	}
	max := s.e.ContextLen() - len(r.Prompt) + 1
	if r.Params.MaxTokens > 0 {
		max = min(max, r.Params.MaxTokens+1)
	}
	r.events = make(chan Event, max+1)
	r.Events = r.events
	r.tokens = slices.Clone(r.Prompt)
	return nil
}

// queueWait estimates how long a request of the given priority would wait
// (s.mu held): the requests ahead of it, in waves of MaxNumSeqs, each wave
// taking the recent mean time a request spends running. An estimate: a
// request refused by it might have made it, and the deadline is still
// enforced in the queue.
func (s *Scheduler) queueWait(priority int) time.Duration {
	ahead := 0
	for _, w := range s.waiting {
		if w.Priority >= priority {
			ahead++
		}
	}
	if ahead == 0 {
		return 0
	}
	waves := (ahead + s.cfg.MaxNumSeqs - 1) / s.cfg.MaxNumSeqs
	return time.Duration(waves) * s.runTime
}

// enqueue inserts r in priority order, FCFS among equals (s.mu held).
func (s *Scheduler) enqueue(r *Request) {
	i, _ := slices.BinarySearchFunc(s.waiting, r, func(a, b *Request) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return int(a.arrival) - int(b.arrival)
	})
	s.waiting = slices.Insert(s.waiting, i, r)
	s.queuedTokens += len(r.tokens)
}

// Stats returns a snapshot of the counters.
func (s *Scheduler) Stats() Stats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return s.stats
}

// Run steps the engine until ctx ends, then fails what is left with
// ErrStopped.
func (s *Scheduler) Run(ctx context.Context) {
	defer s.shutdown()
	for {
		s.mu.Lock()
		idle := len(s.waiting) == 0 && len(s.running) == 0
		s.mu.Unlock()
		if idle {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.step()
	}
}

// Idle reports whether nothing is waiting or running.
func (s *Scheduler) Idle() bool {
	st := s.Stats()
	return st.Running == 0 && st.Waiting == 0
}

func (s *Scheduler) shutdown() {
	s.mu.Lock()
	s.stopped = true
	left := append(s.waiting, s.running...)
	s.waiting, s.queuedTokens = nil, 0
	s.mu.Unlock()
	for _, r := range left {
		s.finish(r, "", ErrStopped)
	}
	s.running = nil
	s.publish()
}

// step runs one engine step: drop cancelled requests, admit waiting ones,
// gather one token per decoding sequence and prompt chunks up to the token
// budget, make room in the KV cache (preempting if needed), step, and hand
// out the tokens.
func (s *Scheduler) step() {
	start := time.Now()
	defer func() {
		s.statsMu.Lock()
		s.stats.LoopTime += time.Since(start)
		s.statsMu.Unlock()
	}()
	s.dropCancelled()
	s.admit()
	s.gather()
	if len(s.items) == 0 {
		s.publish()
		return
	}
	t0 := s.now()
	var ids []int
	var logits []float32
	var err error
	speculating := slices.ContainsFunc(s.itemOwner, func(r *Request) bool { return len(r.draft) > 0 })
	// Drafts of plain greedy requests are verified by each row's argmax,
	// chosen where the logits are; any other speculating step brings every
	// row back.
	greedyOnly := speculating && !slices.ContainsFunc(s.itemOwner, func(r *Request) bool { return r.Logprobs || !r.sampler.PlainGreedy() })
	switch {
	case greedyOnly:
		ids, err = s.e.StepGreedy(s.items)
	case speculating:
		logits, err = s.e.Step(s.items)
	case slices.ContainsFunc(s.itemOwner, func(r *Request) bool { return r.Logprobs }):
		ids, logits, err = s.e.StepSampleLogits(s.items, s.samplers)
	default:
		ids, err = s.e.StepSample(s.items, s.samplers)
	}
	stepTime := s.now().Sub(t0)
	if errors.Is(err, backend.ErrOutOfMemory) && s.shrink() {
		s.publish()
		return
	}
	if err != nil {
		if errors.Is(err, backend.ErrGroupAborted) {
			// The engine cannot run steps any more: every request ends
			// and Broken says why (the server's /health answers 503).
			s.broken.Store(&err)
			for _, r := range slices.Clone(s.running) {
				s.remove(r)
				s.finish(r, "", fmt.Errorf("serve: step failed: %w", err))
			}
			s.mu.Lock()
			waiting := s.waiting
			s.waiting, s.queuedTokens = nil, 0
			s.mu.Unlock()
			for _, r := range waiting {
				s.finish(r, "", fmt.Errorf("serve: %w", err))
			}
			s.publish()
			return
		}
		// A step error is not any one request's fault that we can tell:
		// fail the step's requests, keep serving.
		for _, r := range slices.Clone(s.itemOwner) {
			s.remove(r)
			s.finish(r, "", fmt.Errorf("serve: step failed: %w", err))
		}
		s.publish()
		return
	}
	s.loosen()
	s.noteStepTime(stepTime, speculating)
	var alloc, used int64
	for _, r := range s.running {
		alloc += int64(r.seq.Blocks() * s.e.KVSpec().BlockSize)
		used += int64(r.seq.Len())
	}
	s.statsMu.Lock()
	s.stats.Steps++
	s.stats.StepTime += stepTime
	s.stats.KVSlotsAllocated += alloc
	s.stats.KVSlotsUsed += used
	s.statsMu.Unlock()
	if speculating {
		if decoded := s.verify(engine.Rows{Logits: logits, IDs: ids, Vocab: s.e.Vocab()}, stepTime); decoded > 0 {
			s.gov.Verified(stepTime+s.draftTime, decoded)
		}
		s.publish()
		return
	}
	decoding := 0
	for i, r := range slices.Clone(s.itemOwner) {
		n := len(s.items[i].Tokens)
		if decode := r.generated > 0 && n == 1 && r.cached == len(r.tokens)-1; !decode {
			s.count(n, 0) // prompt tokens, or generated ones recomputed
		} else if s.cfg.Speculation != nil {
			r.gov.PlainStep(stepTime)
			decoding++
		}
		r.cached += n
		if r.cached == len(r.tokens) {
			var row []float32
			if logits != nil && r.Logprobs {
				v := s.e.Vocab()
				row = logits[i*v : (i+1)*v]
			}
			s.emit(r, ids[i], row)
		}
	}
	if decoding > 0 {
		s.gov.PlainStep(stepTime / time.Duration(decoding)) // a decoded token's share
	}
	s.publish()
}

// noteStepTime moves the steps' mean time on and tells Config.SlowStep of
// a step far over it.
func (s *Scheduler) noteStepTime(took time.Duration, speculating bool) {
	mean := s.meanStep
	if mean == 0 {
		s.meanStep = took
	} else {
		s.meanStep += (took - mean) / 16
	}
	if s.cfg.SlowStep == nil || took <= slowStepMin || mean == 0 || took <= slowStepFactor*mean {
		return
	}
	tokens := 0
	for _, it := range s.items {
		tokens += len(it.Tokens)
	}
	s.cfg.SlowStep(SlowStep{Took: took, Mean: mean, Seqs: len(s.items), Tokens: tokens, Speculating: speculating})
}

// verify finishes a step that verified drafts (a row for each token of a
// drafted item, one for each other item's last token) and took stepTime:
// each drafted request keeps its drafts up to the first its sampler
// rejects and its cache drops the rest; every request that completed its
// tokens takes its next token from its last row as a plain step would.
func (s *Scheduler) verify(rows engine.Rows, stepTime time.Duration) (decoded int) {
	at := 0 // the next row
	for i, r := range slices.Clone(s.itemOwner) {
		it := s.items[i]
		n := len(it.Tokens)
		first := at
		if it.AllRows {
			at += n
		} else {
			at++
		}
		draft := r.draft
		r.draft = nil
		if len(draft) == 0 {
			if decode := r.generated > 0 && n == 1 && r.cached == len(r.tokens)-1; !decode {
				s.count(n, 0)
			} else {
				r.gov.PlainStep(stepTime)
				decoded++
			}
			r.cached += n
			if r.cached == len(r.tokens) {
				s.emit(r, rows.Sample(r.sampler, first), s.logprobRow(r, rows.Row(first)))
			}
			continue
		}
		// The item was the request's last token and its drafts: each draft
		// is verified after the ones before it are taken (the sampler's
		// penalties and min_tokens see them); a stop or a limit ends r.
		base := r.seq.Len() - n
		r.cached = base + 1
		kept, final := 0, -1
		for j, d := range draft {
			got, ok := rows.Verify(r.sampler, first+j, d)
			if !ok {
				final = got
				break
			}
			kept++
			r.cached++ // the draft's entry stays in the cache
			s.emit(r, d, s.logprobRow(r, rows.Row(first+j)))
			if r.seq == nil {
				break
			}
		}
		r.gov.Verified(stepTime+r.draftTime, kept+1)
		decoded += kept + 1
		s.statsMu.Lock()
		s.stats.SpecDrafts++
		s.stats.SpecDraftTokens += uint64(len(draft))
		s.stats.SpecAcceptedTokens += uint64(kept)
		s.statsMu.Unlock()
		if r.seq == nil {
			continue // finished on a kept draft
		}
		if err := s.e.Truncate(r.seq, base+1+kept); err != nil {
			s.remove(r)
			s.finish(r, "", fmt.Errorf("serve: speculative step: %w", err))
			continue
		}
		if final < 0 { // every draft kept: one more from the last row
			final = rows.Sample(r.sampler, first+kept)
		}
		s.emit(r, final, s.logprobRow(r, rows.Row(first+kept)))
	}
	return decoded
}

// logprobRow is row when r wants log-probabilities, else nil.
func (s *Scheduler) logprobRow(r *Request, row []float32) []float32 {
	if r.Logprobs {
		return row
	}
	return nil
}

func (s *Scheduler) count(prompt, gen int) {
	s.statsMu.Lock()
	s.stats.PromptTokens += uint64(prompt)
	s.stats.GeneratedTokens += uint64(gen)
	s.statsMu.Unlock()
}

// emit handles a sampled token of r (with its logits row when r wants
// log-probabilities): a stop token or a limit ends r.
func (s *Scheduler) emit(r *Request, id int, row []float32) {
	p := &r.Params
	if !p.IgnoreStop && r.generated >= p.MinTokens && slices.Contains(p.StopTokens, id) {
		s.remove(r)
		s.finish(r, engine.FinishStop, nil)
		return
	}
	r.sampler.Accept(id)
	r.tokens = append(r.tokens, id)
	r.generated++
	s.count(0, 1)
	ev := Event{Token: id}
	if row != nil {
		ev.Logprob, ev.Top = logprobs(row, id, r.TopLogprobs)
	}
	r.events <- ev
	if (p.MaxTokens > 0 && r.generated >= p.MaxTokens) || len(r.tokens) >= s.e.ContextLen() {
		s.remove(r)
		s.finish(r, engine.FinishLength, nil)
	}
}

// finish sends r's last event and frees its sequence; followers it has not
// forked go on without it (or stop with it, at shutdown).
func (s *Scheduler) finish(r *Request, reason string, err error) {
	if r.seq != nil {
		s.e.Free(r.seq)
		r.seq = nil
	}
	if r.releaseDraft != nil {
		r.releaseDraft()
		r.drafter, r.releaseDraft = nil, nil
	}
	if errors.Is(err, ErrStopped) {
		for _, f := range r.followers {
			s.finish(f, "", err)
		}
		r.followers = nil
	} else {
		s.orphan(r)
	}
	if err == nil && !r.admittedAt.IsZero() {
		ran := time.Since(r.admittedAt)
		s.mu.Lock()
		s.runTime += (ran - s.runTime) / 8
		s.mu.Unlock()
	}
	r.events <- Event{Done: true, Finish: reason, Err: err, PromptTokens: len(r.Prompt), GeneratedTokens: r.generated, CachedTokens: r.cachedPrompt}
}

// remove takes r out of the running batch.
func (s *Scheduler) remove(r *Request) {
	if i := slices.Index(s.running, r); i >= 0 {
		s.running = slices.Delete(s.running, i, i+1)
	}
}

func (s *Scheduler) dropCancelled() {
	for _, r := range slices.Clone(s.running) {
		if err := r.Ctx.Err(); err != nil {
			s.remove(r)
			s.finish(r, "", err)
		}
	}
	s.mu.Lock()
	var gone []*Request
	var why []error
	now := time.Now()
	s.waiting = slices.DeleteFunc(s.waiting, func(r *Request) bool {
		err := r.Ctx.Err()
		if err == nil && !r.StartBy.IsZero() && r.admittedAt.IsZero() && now.After(r.StartBy) {
			err = ErrDeadline
		}
		if err != nil {
			gone = append(gone, r)
			why = append(why, err)
			s.queuedTokens -= len(r.tokens)
			return true
		}
		return false
	})
	s.mu.Unlock()
	for i, r := range gone {
		s.finish(r, "", why[i])
	}
}

// admit moves waiting requests into the running batch, in queue order, while
// the batch has room and the cache can hold the head's tokens besides one
// more block for every running sequence.
func (s *Scheduler) admit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	reserve := len(s.running)
	for len(s.waiting) > 0 {
		r := s.waiting[0]
		if len(s.running)+1+len(r.followers) > s.cfg.MaxNumSeqs {
			return
		}
		seq := s.e.NewSequenceFor(r.tokens) // starts with the cached blocks of its prefix
		// The group's followers each need a block or two of their own.
		need := s.e.BlocksToGrow(seq, len(r.tokens)-seq.Len()+1) + 2*len(r.followers)
		if need+reserve > s.e.FreeBlocks() && len(s.running) > 0 {
			s.e.Free(seq)
			return // wait for blocks to come back
		}
		s.waiting = s.waiting[1:]
		s.queuedTokens -= len(r.tokens)
		r.seq, r.cached = seq, seq.Len()
		if r.admittedAt.IsZero() {
			r.cachedPrompt = seq.Len()
		}
		if r.sampler == nil {
			r.sampler = engine.NewSampler(r.Params, s.e.Vocab(), r.Prompt)
		}
		s.admitted++
		r.admitted = s.admitted
		if r.admittedAt.IsZero() {
			r.admittedAt = time.Now()
		}
		s.running = append(s.running, r)
		reserve += 1 + len(r.followers)
	}
}

// fork starts r's followers on forks of its sequence, now that the cache
// holds r's prompt but its last token; each then computes that token (and
// its own first sample) in the coming step.
func (s *Scheduler) fork(r *Request) {
	for _, f := range r.followers {
		if err := f.Ctx.Err(); err != nil {
			s.finish(f, "", err)
			continue
		}
		f.seq, f.cached = s.e.Fork(r.seq), r.cached
		f.sampler = engine.NewSampler(f.Params, s.e.Vocab(), f.Prompt)
		s.admitted++
		f.admitted = s.admitted
		f.admittedAt = time.Now()
		s.running = append(s.running, f)
	}
	r.followers = nil
}

// orphan gives r's unforked followers their own way: the first leads the
// rest, back in the queue (r is leaving without having forked them).
func (s *Scheduler) orphan(r *Request) {
	if len(r.followers) == 0 {
		return
	}
	lead := r.followers[0]
	lead.followers = r.followers[1:]
	r.followers = nil
	s.mu.Lock()
	s.enqueue(lead)
	s.mu.Unlock()
}

// gather builds the step: one token for each decoding sequence, then prompt
// chunks in admission order up to the budget; preempts when the cache
// cannot hold the step.
func (s *Scheduler) gather() {
	for _, r := range slices.Clone(s.running) {
		if len(r.followers) > 0 && r.cached == len(r.tokens)-1 {
			s.fork(r)
		}
	}
	// The governors are asked once a step (a pause counts steps), before
	// any retry below: the batch's, and each request's.
	if sp := s.cfg.Speculation; sp != nil {
		batch := s.gov.Drafting()
		for _, r := range s.running {
			mine := r.gov.Drafting()
			r.mayDraft = sp.Always || batch && mine
		}
	}
	noDrafts := false // set when the drafts' blocks would preempt a request
	for {
		s.items, s.samplers, s.itemOwner = s.items[:0], s.samplers[:0], s.itemOwner[:0]
		budget, seqs := s.cfg.MaxNumBatchedTokens, len(s.running)
		first := 0 // the decoding sequence taken first
		if l := &s.limit; l.tokens > 0 {
			// Bounded after a step ran out of memory: decoding sequences
			// take turns, so that none waits for long.
			budget, seqs = min(budget, l.tokens), l.seqs
			l.rotate++
			first = l.rotate
		}
		need := 0
		add := func(r *Request, n int) {
			s.items = append(s.items, engine.Item{Seq: r.seq, Tokens: r.tokens[r.cached : r.cached+n]})
			var smp *engine.Sampler
			if r.cached+n == len(r.tokens) {
				smp = r.sampler
			}
			s.samplers = append(s.samplers, smp)
			s.itemOwner = append(s.itemOwner, r)
			budget -= n
			need += s.e.BlocksToGrow(r.seq, n)
		}
		decoding := 0
		for _, r := range s.running {
			if len(r.tokens)-r.cached == 1 {
				decoding++
			}
		}
		spec := s.cfg.Speculation
		speculate := spec != nil && decoding <= s.cfg.SpeculateMaxSeqs && s.limit.tokens == 0 && !noDrafts
		drafting := s.drafting[:0] // decoding requests that draft, and their items
		for k := range s.running {
			r := s.running[(first+k)%len(s.running)]
			r.draft = nil
			if len(r.tokens)-r.cached == 1 && budget > 0 && len(s.items) < seqs {
				add(r, 1)
				if speculate && r.mayDraft {
					drafting = append(drafting, draftItem{r, len(s.items) - 1})
				}
			}
		}
		s.drafting = drafting
		drafted := len(drafting) > 0 && s.addDrafts(drafting, spec, &budget, &need)
		prompts := budget // the prompt tokens the step may still take
		if decoding > 0 && s.cfg.DecodePrefillTokens > 0 {
			prompts = min(prompts, max(s.cfg.DecodePrefillTokens, 2*decoding))
		}
		for _, r := range s.running {
			left := len(r.tokens) - r.cached
			if len(r.followers) > 0 {
				left-- // stop before the last token: the group forks there
			}
			if len(s.items) >= seqs {
				break
			}
			if n := min(left, budget, prompts); n > 0 && (left > 1 || len(r.followers) > 0) {
				add(r, n)
				prompts -= n
			}
		}
		if need <= s.e.FreeBlocks() || len(s.running) <= 1 {
			return
		}
		if drafted {
			// Drafts are optional: the step goes without them before
			// any request is preempted for room (and the blocks a
			// draft model reserved for them go back).
			noDrafts = true
			for _, d := range drafting {
				s.dropReserved(d.r)
			}
			continue
		}
		s.preempt()
	}
}

// dropReserved releases the blocks r's sequence holds past its tokens (a
// draft model that shares the cache reserves them for its drafts).
func (s *Scheduler) dropReserved(r *Request) {
	if r.seq != nil {
		s.e.Truncate(r.seq, r.seq.Len()) // to its own length: cannot fail
	}
}

// draftItem is a decoding request that drafts this step, and its item.
type draftItem struct {
	r    *Request
	item int
}

// addDrafts drafts tokens after each of the decoding requests ds, within the
// step's token budget, the tokens each may still generate and the context,
// and makes their items carry them (every row's logits wanted): all at
// once where the drafter batches its work (a draft model's steps over all
// their sequences; each request's drafting time is then the batch's), else
// one request after another (each timed on its own). The step waits for
// all of it (s.draftTime). It reports whether any drafted.
func (s *Scheduler) addDrafts(ds []draftItem, spec *engine.Speculation, budget, need *int) bool {
	sessions := make([]engine.Drafter, 0, len(ds))
	tokens := make([][]int, 0, len(ds))
	ks := make([]int, 0, len(ds))
	ones := make([]int, 0, len(ds))
	left := *budget
	for _, d := range ds {
		r := d.r
		k := min(spec.K, left, s.e.ContextLen()-len(r.tokens)-1)
		if p := r.Params; p.MaxTokens > 0 {
			k = min(k, p.MaxTokens-r.generated-1)
		}
		k = max(k, 0)
		left -= k
		if r.drafter == nil {
			r.drafter, r.releaseDraft = spec.Session(r.seq)
		}
		sessions, tokens, ks = append(sessions, r.drafter), append(tokens, r.tokens), append(ks, k)
		// The blocks the item's token needs, counted in need: a draft
		// model that shares the cache takes them, and the drafts', as it
		// drafts.
		ones = append(ones, s.e.BlocksToGrow(r.seq, 1))
	}
	t0 := s.now()
	var drafts [][]int
	bd, batched := spec.Drafter.(engine.BatchDrafter)
	if batched {
		ss := make([]engine.DraftSession, len(sessions))
		for i, d := range sessions {
			ss[i] = d.(engine.DraftSession)
		}
		drafts = bd.DraftBatch(ss, tokens, ks)
	} else {
		for i, d := range sessions {
			t := s.now()
			drafts = append(drafts, d.Draft(tokens[i], ks[i]))
			ds[i].r.draftTime = s.now().Sub(t)
		}
	}
	s.draftTime = s.now().Sub(t0)
	any := false
	for i, d := range ds {
		r, draft := d.r, drafts[i]
		if batched {
			r.draftTime = s.draftTime
		}
		if len(draft) == 0 {
			s.dropReserved(r)
			*need += s.e.BlocksToGrow(r.seq, 1) - ones[i]
			continue
		}
		*need += s.e.BlocksToGrow(r.seq, 1+len(draft)) - ones[i]
		s.items[d.item].Tokens = append(slices.Clip(s.items[d.item].Tokens), draft...)
		s.items[d.item].AllRows = true
		*budget -= len(draft)
		r.draft = draft
		any = true
	}
	return any
}

// shrink answers a step that failed for lack of device memory: the next
// steps take at most half its tokens and sequences; a single token is
// retried, then its request preempted (recomputed when readmitted). It
// reports false when the step's requests should fail instead.
func (s *Scheduler) shrink() bool {
	tokens := 0
	for _, it := range s.items {
		tokens += len(it.Tokens)
	}
	l := &s.limit
	l.good = 0
	if tokens > 1 {
		l.tokens, l.seqs, l.atOne = max(1, tokens/2), max(1, len(s.items)/2), 0
	} else {
		// One token: retried as it is first (the failed step gave back
		// its graphs' memory), then its request makes way for the others
		// (recomputed when readmitted), then it fails.
		l.atOne++
		switch {
		case l.atOne > maxOOMAtOne:
			l.atOne = 0
			return false
		case l.atOne == 2 && len(s.running) > 1:
			s.requeue(s.itemOwner[0])
		}
	}
	s.statsMu.Lock()
	s.stats.OOMRetries++
	s.statsMu.Unlock()
	return true
}

// loosen counts a step that ran, doubling the bounds after liftAfter of
// them, until they no longer bind.
func (s *Scheduler) loosen() {
	l := &s.limit
	l.atOne = 0
	if l.tokens == 0 {
		return
	}
	if l.good++; l.good < liftAfter {
		return
	}
	l.good = 0
	l.tokens, l.seqs = 2*l.tokens, 2*l.seqs
	if l.tokens >= s.cfg.MaxNumBatchedTokens && l.seqs >= s.cfg.MaxNumSeqs {
		*l = stepLimit{}
	}
}

// preempt returns the blocks of the lowest-priority, most recently admitted
// running request and puts it back at the head of its priority in the
// queue; it will be recomputed (its generated tokens included) when
// readmitted, and its sampler keeps its state.
func (s *Scheduler) preempt() {
	victim := s.running[0]
	for _, r := range s.running[1:] {
		if r.Priority < victim.Priority || (r.Priority == victim.Priority && r.admitted > victim.admitted) {
			victim = r
		}
	}
	s.requeue(victim)
}

// requeue preempts running request r: its blocks go back, and it waits at
// the head of its priority in the queue, to be recomputed (its generated
// tokens included) when readmitted; its sampler keeps its state.
func (s *Scheduler) requeue(r *Request) {
	s.remove(r)
	s.e.Free(r.seq)
	r.seq, r.cached = nil, 0
	if r.releaseDraft != nil { // a new draft session when readmitted
		r.releaseDraft()
		r.drafter, r.releaseDraft = nil, nil
	}
	s.mu.Lock()
	s.enqueue(r)
	s.mu.Unlock()
	s.statsMu.Lock()
	s.stats.Preemptions++
	s.statsMu.Unlock()
}

// publish refreshes the gauges.
func (s *Scheduler) publish() {
	s.mu.Lock()
	waiting := len(s.waiting)
	s.mu.Unlock()
	s.statsMu.Lock()
	s.stats.Running, s.stats.Waiting = len(s.running), waiting
	s.stats.FreeBlocks, s.stats.TotalBlocks = s.e.FreeBlocks(), s.e.KVSpec().Blocks
	ps := s.e.PrefixStats()
	s.stats.PrefixQueries, s.stats.PrefixHits = ps.Queries, ps.Hits
	s.statsMu.Unlock()
}

// logprobs is the log-probability of token id under the log-softmax of row,
// and the top most likely tokens (highest first, lower id first on ties).
func logprobs(row []float32, id, top int) (float32, []TokenLogprob) {
	maxL := float32(math.Inf(-1))
	for _, v := range row {
		maxL = max(maxL, v)
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v - maxL))
	}
	lse := float64(maxL) + math.Log(sum)
	lp := func(i int) float32 { return float32(float64(row[i]) - lse) }
	var best []TokenLogprob
	for i, v := range row {
		if len(best) == top && (top == 0 || v <= row[best[top-1].Token]) {
			continue
		}
		at := len(best)
		for at > 0 && row[best[at-1].Token] < v {
			at--
		}
		best = slices.Insert(best, at, TokenLogprob{Token: i})
		if len(best) > top {
			best = best[:top]
		}
	}
	for i := range best {
		best[i].Logprob = lp(best[i].Token)
	}
	return lp(id), best
}
