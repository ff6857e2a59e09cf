package engine

import (
	"fmt"
	"time"
)

// WarmStats says what Warm ran.
type WarmStats struct {
	Steps    int           // steps run
	Batches  []int         // the decode batch sizes stepped
	Runs     []int         // the tokens a sequence brings in the steps of several
	Contexts []int         // the longest sequence's tokens before the steps, for each context
	Chunks   []int         // the prompt chunks' token counts stepped
	Took     time.Duration // in all
}

// Warm runs, before a server takes requests, steps of the shapes it will
// meet first, so that their first-use work (a backend's kernel timings at
// new token counts and context lengths, CUDA graph captures) does not stall
// its first streams:
//   - a prompt chunk of each token bucket up to maxTokens (one sequence);
//   - for each size up to 8, each power of two past it up to maxSeqs, and
//     maxSeqs, that many sequences decoded three steps (a composition's
//     first step runs directly, its second is captured, its third replays
//     the capture), sampled as the server samples: one-token sequences,
//     then again with one of them holding 64, 128, 256, … tokens, up to
//     maxContext, so each decode batch also meets the longer contexts (a
//     decode step's attention is chosen by its longest sequence's power
//     of two);
//   - at each of those contexts, maxSeqs sequences bringing 2, 4, … 16
//     tokens each, while that fits maxTokens (steps of several tokens a
//     sequence: prompt tails beside decoding sequences, verified drafts).
//
// Every sequence is freed after; their blocks stay in the prefix cache
// like any freed sequence's. It stops at the first error.
func (e *Engine) Warm(maxSeqs, maxTokens, maxContext int) (st WarmStats, err error) {
	start := time.Now()
	defer func() { st.Took = time.Since(start) }()
	maxSeqs = min(maxSeqs, e.MaxSeqs())
	maxTokens = min(maxTokens, e.MaxStepTokens(), e.ctxLen-1)
	step := e.warmStep(&st)
	for _, n := range e.buckets {
		if n > maxTokens {
			break
		}
		s := e.NewSequence()
		err := step([]Item{{Seq: s, Tokens: make([]int, n)}})
		e.Free(s)
		if err != nil {
			return st, fmt.Errorf("warm-up: a prompt chunk of %d tokens: %w", n, err)
		}
		st.Chunks = append(st.Chunks, n)
	}
	if maxSeqs < 1 {
		return st, nil
	}
	batches := warmBatches(maxSeqs)
	st.Batches = batches
	var runs []int
	for r := 2; r <= decodeRun && maxSeqs*r <= maxTokens; r *= 2 {
		runs = append(runs, r)
	}
	st.Runs = runs
	var shapes []warmShape
	for _, n := range batches {
		shapes = append(shapes, warmShape{n, 1})
	}
	for _, r := range runs {
		shapes = append(shapes, warmShape{maxSeqs, r})
	}
	return st, e.warmSteps(&st, shapes, maxContext, maxTokens, step)
}

// WarmVerify runs, before speculative decoding of k drafts a step, the
// verifying steps it will meet first: 1 to seqs sequences (Warm's batch
// sizes) each bringing its last token and k drafts, every row's greedy
// choice made where the logits are (greedy verification's steps) or every
// row's logits returned (sampled verification's), three times at each
// context bucket up to maxContext, as Warm's decode steps. A verifying
// step's rows make other kernels, choices and graphs than a decode step's,
// which Warm runs. A draft model's engine is warmed by its own Warm (its
// draft steps run over the drafting sequences together, DraftBatch).
func (e *Engine) WarmVerify(k, seqs, maxContext int, greedy bool) (st WarmStats, err error) {
	start := time.Now()
	defer func() { st.Took = time.Since(start) }()
	run := min(k+1, decodeRun)
	seqs = min(seqs, e.MaxSeqs(), e.MaxStepTokens()/run)
	if seqs < 1 || k < 1 {
		return st, nil
	}
	verify := func(items []Item) error {
		for i := range items {
			items[i].AllRows = true
		}
		var err error
		if greedy {
			_, err = e.StepGreedy(items)
		} else {
			_, err = e.Step(items)
		}
		st.Steps++
		return err
	}
	var shapes []warmShape
	st.Batches = warmBatches(seqs)
	for _, n := range st.Batches {
		shapes = append(shapes, warmShape{n, run})
	}
	st.Runs = []int{run}
	return st, e.warmSteps(&st, shapes, maxContext, e.MaxStepTokens(), verify)
}

// WarmDecode runs one sequence's one-token decode steps, three times at
// each context bucket up to maxContext, as Warm's: a single stream's
// warm-up (kiln run's), its long sequence filled in the largest steps.
func (e *Engine) WarmDecode(maxContext int) (st WarmStats, err error) {
	start := time.Now()
	defer func() { st.Took = time.Since(start) }()
	st.Batches = []int{1}
	return st, e.warmSteps(&st, []warmShape{{1, 1}}, maxContext, e.MaxStepTokens(), e.warmStep(&st))
}

// warmStep is a step that samples each item's last row greedily, counted
// in st.
func (e *Engine) warmStep(st *WarmStats) func([]Item) error {
	greedy := NewSampler(SamplingParams{}, e.vocab, nil)
	return func(items []Item) error {
		samplers := make([]*Sampler, len(items))
		for i := range samplers {
			samplers[i] = greedy
		}
		_, err := e.StepSample(items, samplers)
		st.Steps++
		return err
	}
}

// warmSteps steps shapes (step) at each context bucket up to maxContext,
// the long sequence filled by greedy steps of up to fill tokens.
func (e *Engine) warmSteps(st *WarmStats, shapes []warmShape, maxContext, fill int, step func([]Item) error) error {
	prefill := e.warmStep(st)
	for _, c := range warmContexts(min(maxContext, e.ctxLen)) {
		if err := e.warmContext(shapes, c, fill, prefill, step); err != nil {
			return err
		}
		st.Contexts = append(st.Contexts, c)
	}
	return nil
}

// warmShape is a step's sequences and the tokens each brings.
type warmShape struct{ seqs, run int }

// warmContexts are the longest sequence's tokens before a warm-up's steps,
// for each context bucket: none (the smallest, 64), then each power of two
// from 64 on, with room for the steps (at most 3 of decodeRun tokens, each
// shape starting again from there), which stay within its bucket.
func warmContexts(maxContext int) []int {
	contexts := []int{0}
	for c := 64; c+3*decodeRun <= maxContext; c *= 2 {
		contexts = append(contexts, c)
	}
	return contexts
}

// warmBatches are the decode batches a warm-up steps: every size up to 8
// (a GPU's products choose between kernels for each such row count), then
// powers of two, then most.
func warmBatches(most int) []int {
	var batches []int
	for n := 1; n < most; {
		batches = append(batches, n)
		if n < 8 {
			n++
		} else {
			n *= 2
		}
	}
	return append(batches, most)
}

// decodeRun is the most tokens a sequence brings to the steps Warm runs
// with several tokens a sequence: backend/cuda's decodeMaxRun, the most a
// sequence may bring to a step run as a decode step (longer runs are
// prefill, timed by the prompt chunks' steps).
const decodeRun = 16

// warmContext steps each shape three times; the first sequence of each is
// first prefilled to long tokens in chunks of at most maxTokens (prefill's
// steps), and cut back to them after each shape's steps.
func (e *Engine) warmContext(shapes []warmShape, long, maxTokens int, prefill, step func([]Item) error) error {
	first := e.NewSequence()
	defer e.Free(first)
	for done := 0; done < long; {
		n := min(long-done, maxTokens)
		if err := prefill([]Item{{Seq: first, Tokens: make([]int, n)}}); err != nil {
			return fmt.Errorf("warm-up: a prompt chunk of %d tokens: %w", n, err)
		}
		done += n
	}
	for _, sh := range shapes {
		tokens := make([]int, sh.run)
		items := []Item{{Seq: first, Tokens: tokens}}
		for range sh.seqs - 1 {
			items = append(items, Item{Seq: e.NewSequence(), Tokens: tokens})
		}
		var err error
		for range 3 {
			if err = step(items); err != nil {
				err = fmt.Errorf("warm-up: a step of %d sequences of %d tokens, the longest of %d: %w", sh.seqs, sh.run, first.Len()+sh.run, err)
				break
			}
		}
		for _, it := range items[1:] {
			e.Free(it.Seq)
		}
		if err == nil {
			err = e.Truncate(first, long)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
