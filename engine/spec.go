package engine

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Speculative decoding: a drafter proposes the next few tokens, one target
// step over the last token and the drafts (k+1 positions, as a prefill
// runs them) scores them all, and each draft is kept or not by the
// sampler's rule (Sampler.Verify), so that greedy output is the plain
// greedy output and sampled output keeps its distribution. Every step
// yields at least one token: the first rejected draft's replacement, or
// after k kept drafts one more from the last row. The rejected drafts'
// cache entries are dropped (Truncate).

// Drafter proposes tokens to follow a sequence.
type Drafter interface {
	// Draft returns up to k tokens to follow tokens (nil: none).
	Draft(tokens []int, k int) []int
}

// SessionDrafter is a Drafter that keeps state for each sequence (a draft
// model's cache): each sequence drafts through a Session of its own, and
// releases it when done.
type SessionDrafter interface {
	Drafter
	// Session drafts for target, the target engine's sequence that
	// holds the tokens drafted for, but for the last (nil: none).
	Session(target *Sequence) DraftSession
}

// DraftSession drafts for one sequence.
type DraftSession interface {
	Drafter
	Release()
}

// BatchDrafter is a SessionDrafter that drafts for several of its sessions
// at once (a draft model's steps batched over their sequences): up to k[i]
// tokens after tokens[i] for sessions[i].
type BatchDrafter interface {
	SessionDrafter
	DraftBatch(sessions []DraftSession, tokens [][]int, k []int) [][]int
}

// Session is sp's drafter for the target engine's sequence target (see
// SessionDrafter) and the function that releases it.
func (sp Speculation) Session(target *Sequence) (Drafter, func()) {
	if sd, ok := sp.Drafter.(SessionDrafter); ok {
		s := sd.Session(target)
		return s, s.Release
	}
	return sp.Drafter, func() {}
}

// ModelDrafter drafts with a smaller model of the same vocabulary:
// greedily, k steps of it a draft, each sequence's tokens kept in a
// sequence of the draft engine E and cut back to what the target kept
// before the next draft. When E is an engine's Draft, the draft model's
// entries are kept in the target sequence's own blocks (Borrow), with room
// reserved for the drafts (Reserve) before they are written; else in
// blocks of E's own cache.
type ModelDrafter struct{ E *Engine }

// Draft implements Drafter for a one-off draft (a session of its own, in
// blocks of its own).
func (m ModelDrafter) Draft(tokens []int, k int) []int {
	s := m.Session(nil)
	defer s.Release()
	return s.Draft(tokens, k)
}

// Session implements SessionDrafter.
func (m ModelDrafter) Session(target *Sequence) DraftSession {
	s := &modelSession{e: m.E}
	if m.E.owner != nil {
		s.target = target
	}
	return s
}

type modelSession struct {
	e       *Engine
	target  *Sequence // the target's sequence whose blocks seq borrows (nil: seq has its own)
	seq     *Sequence
	toks    []int   // the tokens in seq
	wrote   []int32 // target's block table when the draft model last wrote through it
	trusted int     // how many of toks' entries a next draft may keep
}

func (s *modelSession) Release() {
	if s.seq != nil {
		s.e.Free(s.seq)
		s.seq = nil
	}
}

// Draft runs the draft model over what tokens has beyond what it holds,
// then k greedy steps. A failed step (the cache full) drafts less.
func (s *modelSession) Draft(tokens []int, k int) []int {
	return ModelDrafter{E: s.e}.DraftBatch([]DraftSession{s}, [][]int{tokens}, []int{k})[0]
}

// begin readies s to draft up to k tokens after tokens: its sequence cut
// back to what it holds of tokens (in blocks its target still holds), room
// for the drafts reserved on the target, and a long catch-up prefilled.
// It returns the tokens the first draft step appends (the rest of what the
// draft model has not seen, and the last token) and the drafts it may
// make, or 0 when it cannot draft.
func (s *modelSession) begin(tokens []int, k int) ([]int, int) {
	if k <= 0 || len(tokens) < 1 {
		return nil, 0
	}
	k = min(k, s.e.ctxLen-len(tokens))
	if k <= 0 {
		return nil, 0
	}
	held := len(tokens) - 1 // the cache holds all but the last token
	c := 0
	for c < min(len(s.toks), held, s.trusted) && s.toks[c] == tokens[c] {
		c++
	}
	if s.target != nil {
		if s.target.freed {
			return nil, 0
		}
		// Room in the target's blocks for the drafts' entries (k steps
		// write from held on), then the entries the draft model wrote
		// are its only in blocks the target still holds where they were
		// (a block copied on write has the target's entries only).
		if err := s.e.owner.Reserve(s.target, held+k-s.target.len); err != nil {
			return nil, 0
		}
		bs := s.e.spec.BlockSize
		for i := 0; i*bs < c; i++ {
			if i >= len(s.wrote) || s.wrote[i] != s.target.blocks[i] {
				c = i * bs
				break
			}
		}
	}
	if s.seq == nil {
		var err error
		if s.seq, err = s.newSequence(); err != nil {
			return nil, 0
		}
	}
	if err := s.e.Truncate(s.seq, c); err != nil {
		return nil, 0
	}
	s.toks = s.toks[:c]
	if s.target != nil {
		s.wrote = append(s.wrote[:0], s.target.blocks...)
	}
	// The entries of tokens the draft model sees as a sequence's (before
	// held) are kept for the next draft; the last token's and the drafts'
	// are written where the target may release the blocks (Truncate after
	// verifying; a step that drops its drafts) and are written again.
	s.trusted = held
	if s.target != nil {
		s.trusted = min(held, s.target.len)
	}
	if held-c >= s.e.buckets.Max()/2 {
		// A long catch-up (a new sequence's prompt) in steps of its own.
		if _, err := s.e.Prefill(s.seq, tokens[c:held], false); err != nil {
			s.reset()
			return nil, 0
		}
		s.toks = append(s.toks, tokens[c:held]...)
		c = held
	}
	return tokens[c:], k
}

// DraftBatch drafts for several sessions of m at once, up to k[i] tokens
// after tokens[i] for session i: the draft model's steps run over the
// sessions together (k steps for a batch, not for each session), greedily,
// as many sessions in a batch as a step holds. A session that is not one
// of m's drafts alone. A failed step ends its batch's drafts there.
func (m ModelDrafter) DraftBatch(sessions []DraftSession, tokens [][]int, k []int) [][]int {
	out := make([][]int, len(sessions))
	var batch []drafting
	total := 0
	for i, ds := range sessions {
		s, ok := ds.(*modelSession)
		if !ok || s.e != m.E {
			out[i] = ds.Draft(tokens[i], k[i])
			continue
		}
		first, n := s.begin(tokens[i], k[i])
		if n == 0 {
			continue
		}
		if total+len(first) > m.E.buckets.Max() || len(batch) == m.E.MaxSeqs() {
			m.run(batch, out)
			batch, total = batch[:0], 0
		}
		batch = append(batch, drafting{s: s, first: first, k: n, at: i})
		total += len(first)
	}
	m.run(batch, out)
	return out
}

// drafting is one session's part of a batch of draft steps: the tokens
// its first step appends, its drafts wanted, and its place in the result.
type drafting struct {
	s     *modelSession
	first []int
	k, at int
}

// run steps batch's sessions together, drafts into out.
func (m ModelDrafter) run(batch []drafting, out [][]int) {
	steps := 0
	for _, d := range batch {
		steps = max(steps, d.k)
	}
	greedy := NewSampler(SamplingParams{}, m.E.vocab, nil) // chosen on the device where it samples
	items := make([]Item, 0, len(batch))
	samplers := make([]*Sampler, 0, len(batch))
	owners := make([]drafting, 0, len(batch))
	for step := range steps {
		items, samplers, owners = items[:0], samplers[:0], owners[:0]
		for _, d := range batch {
			if step >= d.k {
				continue
			}
			t := d.first
			if step > 0 {
				t = out[d.at][step-1:] // the last draft
			}
			items = append(items, Item{Seq: d.s.seq, Tokens: t})
			samplers = append(samplers, greedy)
			owners = append(owners, d)
		}
		ids, err := m.E.StepSample(items, samplers)
		if err != nil {
			return
		}
		for n, d := range owners {
			d.s.toks = append(d.s.toks, items[n].Tokens...)
			out[d.at] = append(out[d.at], ids[n])
		}
	}
}

// newSequence is the session's draft sequence: borrowing its target's
// blocks, or with blocks of its own.
func (s *modelSession) newSequence() (*Sequence, error) {
	if s.target != nil {
		return s.e.Borrow(s.target)
	}
	return s.e.NewSequence(), nil
}

// reset drops the session's cache after a failure.
func (s *modelSession) reset() {
	s.Release()
	s.toks = s.toks[:0]
}

// NGram drafts by prompt lookup (vLLM's ngram method, no draft model): it
// finds the sequence's last n tokens earlier in it, n from MaxN down to
// MinN, the most recent occurrence first, and proposes the tokens that
// followed them there.
type NGram struct{ MinN, MaxN int }

// Draft implements Drafter.
func (g NGram) Draft(tokens []int, k int) []int {
	if k <= 0 {
		return nil
	}
	for n := min(g.MaxN, len(tokens)-1); n >= max(1, g.MinN); n-- {
		suffix := tokens[len(tokens)-n:]
		for i := len(tokens) - n - 1; i >= 0; i-- {
			if slices.Equal(tokens[i:i+n], suffix) {
				return tokens[i+n : min(i+n+k, len(tokens))]
			}
		}
	}
	return nil
}

// Speculation configures speculative decoding: Drafter proposes up to K
// tokens a step. Drafting pauses while it does not pay (Governor), unless
// Always (tests and comparisons: the same drafts whatever the timings).
type Speculation struct {
	Drafter Drafter
	K       int
	Always  bool
}

// SpecStats count speculative steps (vLLM's spec_decode counters): the
// steps that verified drafts, the tokens drafted, and those kept.
type SpecStats struct{ Drafts, DraftTokens, AcceptedTokens int }

// SpecStats returns the engine's speculative decoding counters.
func (e *Engine) SpecStats() SpecStats { return e.specStats }

// Governor decides whether drafting pays for one sequence: a verifying
// step yields the kept drafts and one token, and costs more than a plain
// step (on a compute-bound device, as much more as it has tokens). It keeps
// moving means of a plain step's time, a verifying step's and the tokens a
// verifying step yields, and while verifying yields fewer tokens a second
// than plain steps it drafts nothing for a while: 8 steps, doubling each
// time verifying is found not to pay again, up to 256 (then a verifying
// step measures again).
type Governor struct {
	plain, verify, yield float64 // moving means: seconds, seconds, tokens
	pause, backoff       int
	sincePlain           int // verifying steps since the last plain one
}

const (
	governorWeight   = 0.25 // of the newest measurement in the means
	governorMinPause = 8
	governorMaxPause = 256
	// governorRefresh verifying steps in a row are followed by a plain
	// one, so that the plain steps' mean is not left at a first step's
	// (a graph capture, a kernel timed on first use: slower than the
	// steps after it, so that drafting would seem to pay when it does not).
	governorRefresh = 32
	// governorProbeShare is the share of plain decoding's time that
	// probes which do not pay may lose (see Verified).
	governorProbeShare = 0.02
)

func ewma(old, x float64) float64 {
	if old == 0 {
		return x
	}
	return old + governorWeight*(x-old)
}

// Drafting reports whether the next step should draft (a pause counts
// down one step each call).
func (g *Governor) Drafting() bool {
	if g.pause > 0 {
		g.pause--
		if g.pause == 0 { // the next probe decides afresh
			g.verify, g.yield = 0, 0
		}
		return false
	}
	return g.sincePlain < governorRefresh
}

// PlainStep records a plain step's time. The plain steps' mean falls to a
// step faster than it at once (rises only by the moving mean), so that a
// slow first step does not linger in it.
func (g *Governor) PlainStep(d time.Duration) {
	g.plain = min(ewma(g.plain, d.Seconds()), d.Seconds())
	g.sincePlain = 0
}

// Verified records a verifying step's time and the tokens it yielded, and
// pauses drafting when verifying yields fewer tokens a second than plain
// steps would (a plain step is taken first when none was measured yet).
func (g *Governor) Verified(d time.Duration, tokens int) {
	if g.plain == 0 {
		// A plain step next, to compare with; this first verifying step
		// is not counted (it holds a draft model's prefill of the prompt,
		// and first-use work).
		g.pause = 1
		return
	}
	g.verify, g.yield = ewma(g.verify, d.Seconds()), ewma(g.yield, float64(tokens))
	g.sincePlain++
	if g.yield*g.plain >= g.verify {
		g.backoff = 0
		return
	}
	// Each probe that does not pay loses its time beyond the plain steps'
	// for its tokens; the pause after it is long enough that the probes
	// lose at most governorProbeShare of the time (a draft model's
	// drafts make a costly probe), and at least twice the last.
	lost := min((g.verify-g.yield*g.plain)/(governorProbeShare*g.plain), governorMaxPause)
	g.backoff = min(max(governorMinPause, 2*g.backoff, int(math.Ceil(lost))), governorMaxPause)
	g.pause = g.backoff
}

// GenerateSpeculative is Generate with speculative decoding: when sp's
// drafter proposes tokens, one step verifies them all. The tokens are those
// Generate would give for greedy sampling, and follow the same
// distribution otherwise (their random draws differ). A step without
// drafts is Generate's.
func (e *Engine) GenerateSpeculative(prompt []int, p SamplingParams, sp Speculation, emit func(id int) bool) (Result, error) {
	res := Result{PromptTokens: len(prompt)}
	if sp.Drafter == nil || sp.K < 1 {
		return res, fmt.Errorf("speculation: no drafter, or %d tokens a step", sp.K)
	}
	seq, err := e.startGeneration(prompt, p)
	if err != nil {
		return res, err
	}
	defer e.Free(seq)
	last := len(prompt) - 1
	sampler := NewSampler(p, e.vocab, prompt)
	history := slices.Clone(prompt)
	drafter, release := sp.Session(seq)
	defer release()
	var gov Governor
	// take records a chosen token; done says generation ended (the token
	// was a stop, emit declined, or a length was reached).
	take := func(id int) (done bool) {
		if !p.IgnoreStop && res.GeneratedTokens >= p.MinTokens && slices.Contains(p.StopTokens, id) {
			res.FinishReason = FinishStop
			return true
		}
		sampler.Accept(id)
		res.GeneratedTokens++
		history = append(history, id)
		if !emit(id) {
			res.FinishReason = FinishStop
			return true
		}
		return false
	}
	next := prompt[last]
	for {
		// Room: the cache holds next and the drafts, and a token after
		// them must fit the context; no more drafts than tokens wanted.
		k := min(sp.K, e.ctxLen-seq.len-2, e.buckets.Max()-1)
		if p.MaxTokens > 0 {
			k = min(k, p.MaxTokens-res.GeneratedTokens-1)
		}
		var draft []int
		t0 := time.Now() // a step's time counts its drafting (a draft model's steps)
		if sp.Always || gov.Drafting() {
			draft = drafter.Draft(history, k)
		}
		var id int
		// Plain greedy choices are each row's argmax: they are made where
		// the logits are (StepGreedy), and only the ids come back.
		greedy := sampler.PlainGreedy()
		if len(draft) == 0 {
			ids, err := e.StepSample([]Item{{Seq: seq, Tokens: []int{next}}}, []*Sampler{sampler})
			if err != nil {
				return res, err
			}
			id = ids[0]
			gov.PlainStep(time.Since(t0))
		} else {
			base := seq.len
			it := Item{Seq: seq, Tokens: append([]int{next}, draft...), AllRows: true}
			rows := Rows{Vocab: e.vocab}
			if greedy {
				rows.IDs, err = e.StepGreedy([]Item{it})
			} else {
				rows.Logits, err = e.Step([]Item{it})
			}
			if err != nil {
				return res, err
			}
			e.specStats.Drafts++
			e.specStats.DraftTokens += len(draft)
			kept := 0
			id = -1
			for i, d := range draft {
				got, ok := rows.Verify(sampler, i, d)
				if !ok {
					id = got
					break
				}
				kept++
				e.specStats.AcceptedTokens++
				if take(d) {
					return res, nil
				}
			}
			if id < 0 { // every draft kept: one more from the last row
				id = rows.Sample(sampler, len(draft))
			}
			if err := e.Truncate(seq, base+1+kept); err != nil {
				return res, err
			}
			gov.Verified(time.Since(t0), kept+1)
		}
		if take(id) {
			return res, nil
		}
		if (p.MaxTokens > 0 && res.GeneratedTokens >= p.MaxTokens) || seq.len+1 >= e.ctxLen {
			res.FinishReason = FinishLength
			return res, nil
		}
		next = id
	}
}
