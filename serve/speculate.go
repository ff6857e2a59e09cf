package serve

import (
	"slices"
	"time"
)

// Speculation in a batch: a verifying step carries every drafting
// request's drafts, so the whole batch waits for the drafts of each. Each
// request's governor (engine.Governor) can judge only its own tokens a
// second, and in a batch it sees other requests' drafts in its plain
// steps' times too; so the step is planned for the batch: of the requests
// whose governors let them draft, the best ones by expected kept drafts
// draft, as many as make the most tokens a second by the steps' costs the
// scheduler has measured (stepCosts), none when plain steps make more (a
// large batch, where a step's cost grows with its tokens).

// stepCosts is what a step costs by the bucket of its token count (the
// weights are read once a step, and each token costs about the same
// whether a prompt's, a draft's or a decoding sequence's): moving means, falling at
// once to a faster step as the governor's plain mean does (a first step's
// captures and kernel timings do not linger), each with the step it was
// last measured at.
type stepCosts struct {
	bucket   func(tokens int) int // the engine's step bucket of a token count
	byBucket map[int]stepCost
	steps    uint64 // steps recorded or planned
}

type stepCost struct {
	seconds float64
	at      uint64 // steps when last measured
}

// costStale is the age, in steps, after which a bucket's cost is measured
// again when the plan could use it: a cost chosen against is otherwise
// never measured again (a warmer cache, a longer context).
const costStale = 256

func newStepCosts(bucket func(int) int) *stepCosts {
	return &stepCosts{bucket: bucket, byBucket: map[int]stepCost{}}
}

// record notes a step of tokens tokens that took d.
func (c *stepCosts) record(tokens int, d time.Duration) {
	b := c.bucket(tokens)
	x := d.Seconds()
	if old, ok := c.byBucket[b]; ok {
		x = min(moveMean(old.seconds, x), x)
	}
	c.byBucket[b] = stepCost{x, c.steps}
}

// cost is the step cost of tokens tokens: its bucket's, else (never
// measured) the nearest smaller measured bucket's, as if a step cost no
// more with more tokens, so that the plan tries the bucket and measures
// it. known is false when there is neither; stale when the bucket's own
// cost is old or missing.
func (c *stepCosts) cost(tokens int) (seconds float64, known, stale bool) {
	b := c.bucket(tokens)
	if e, ok := c.byBucket[b]; ok {
		return e.seconds, true, c.steps-e.at > costStale
	}
	best := 0
	for k, e := range c.byBucket {
		if k < b && k > best {
			best, seconds = k, e.seconds
		}
	}
	return seconds, best > 0, true
}

// governorWeight is the newest measurement's weight in the step costs'
// moving means (as in engine.Governor).
const governorWeight = 0.25

// draftCandidate is a decoding request that may draft this step: the
// tokens it is expected to draft and to have kept, and the time its
// drafting takes.
type draftCandidate struct {
	r            *Request
	item         int // r's item in the step
	drafts, kept float64
	draftTime    time.Duration
}

// planDrafts orders cands best first (most kept drafts expected) and
// returns how many of them draft in a step of n decoding sequences and
// prompt tokens of prompts (prompt chunks follow the drafts, within the
// step's budget of maxTokens): the number that makes the most generated
// tokens a second, n plus the kept drafts over the step's cost and the
// drafting's time. A cost not yet measured is measured: the plan with no
// drafts first, then (optimistically priced) the others; a stale one is
// measured again when it is the plain step's or every candidate's.
func planDrafts(n, prompt, maxTokens int, cands []draftCandidate, costs *stepCosts) int {
	slices.SortStableFunc(cands, func(a, b draftCandidate) int {
		switch {
		case a.kept > b.kept:
			return -1
		case a.kept < b.kept:
			return 1
		}
		return 0
	})
	costs.steps++
	if len(cands) == 0 {
		return 0
	}
	base := min(n+prompt, maxTokens)
	plain, known, stale := costs.cost(base)
	if !known || stale {
		return 0
	}
	best, bestRate := 0, float64(n)/plain
	drafts, gain, drafting := 0.0, float64(n), 0.0
	for m, c := range cands {
		drafts += c.drafts
		gain += c.kept
		drafting += c.draftTime.Seconds()
		cost, _, stale := costs.cost(min(base+int(drafts+0.5), maxTokens))
		if stale && m == len(cands)-1 {
			return len(cands)
		}
		if rate := gain / (cost + drafting); rate > bestRate {
			best, bestRate = m+1, rate
		}
	}
	return best
}

// draftMeans are moving means of the tokens drafted and kept in a step
// that asked for drafts (none drafted: none kept).
type draftMeans struct{ drafts, kept float64 }

// passedWeight is the weight of the batch's means in a request's, each
// step the plan passes it over: a request once found to draft poorly is
// tried again in time (its text may repeat later).
const passedWeight = 1.0 / 32

// candidate is decoding request r, item i of the step, as a candidate to
// draft up to k tokens: with its own means once measured, else the batch's.
func (s *Scheduler) candidate(r *Request, i, k int) draftCandidate {
	m := s.specMeans
	if r.measured {
		m = r.means
	}
	return draftCandidate{r: r, item: i, drafts: min(m.drafts, float64(k)), kept: min(m.kept, float64(k)), draftTime: r.draftTime}
}

// passed moves r's means toward the batch's: the plan passed r over.
func (s *Scheduler) passed(r *Request) {
	if r.measured {
		r.means.drafts += passedWeight * (s.specMeans.drafts - r.means.drafts)
		r.means.kept += passedWeight * (s.specMeans.kept - r.means.kept)
	}
}

// drafted records that r drafted n tokens (n may be 0).
func (s *Scheduler) drafted(r *Request, n int) {
	s.specMeans.drafts = moveMean(s.specMeans.drafts, float64(n))
	if !r.measured {
		r.measured, r.means = true, draftMeans{drafts: float64(n), kept: s.specMeans.kept}
	} else {
		r.means.drafts = moveMean(r.means.drafts, float64(n))
	}
	if n == 0 {
		s.kept(r, 0)
	}
}

// kept records that r kept n of its drafts.
func (s *Scheduler) kept(r *Request, n int) {
	s.specMeans.kept = moveMean(s.specMeans.kept, float64(n))
	r.means.kept = moveMean(r.means.kept, float64(n))
}

func moveMean(old, x float64) float64 { return old + governorWeight*(x-old) }
