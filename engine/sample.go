package engine

// Sampling turns one row of logits into a token id. The order is that of
// Hugging Face and vLLM: penalties (repetition on every token seen, frequency
// and presence on generated tokens), then temperature, then the filters top-k,
// top-p and min-p, then a draw from the remaining distribution. Temperature 0
// is greedy: the first index of the largest logit, as torch.argmax.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"kiln/backend"
)

// SamplingParams control token choice and when generation stops.
type SamplingParams struct {
	Temperature       float64 // 0: greedy
	TopK              int     // 0: off
	TopP              float64 // 0 or 1: off
	MinP              float64 // 0: off
	RepetitionPenalty float64 // 0 or 1: off
	FrequencyPenalty  float64
	PresencePenalty   float64
	Seed              uint64
	MaxTokens         int   // 0: up to the context length
	StopTokens        []int // end generation (not emitted)
	StopStrings       []string
	// IgnoreStop keeps generating through stop tokens.
	IgnoreStop bool
	// MinTokens is the fewest tokens generated before a stop token or a
	// stop string may end generation (vLLM's min_tokens): until then the
	// stop tokens' logits are -inf, so they are never chosen.
	MinTokens int
}

// Validate rejects out-of-range parameters.
func (p *SamplingParams) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("temperature %g must be >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top-k %d must be >= 0", p.TopK)
	case p.TopP < 0 || p.TopP > 1 || math.IsNaN(p.TopP):
		return fmt.Errorf("top-p %g must be in [0, 1]", p.TopP)
	case p.MinP < 0 || p.MinP > 1 || math.IsNaN(p.MinP):
		return fmt.Errorf("min-p %g must be in [0, 1]", p.MinP)
	case p.RepetitionPenalty < 0 || math.IsNaN(p.RepetitionPenalty):
		return fmt.Errorf("repetition penalty %g must be > 0", p.RepetitionPenalty)
	case math.Abs(p.FrequencyPenalty) > 2 || math.IsNaN(p.FrequencyPenalty):
		return fmt.Errorf("frequency penalty %g must be in [-2, 2]", p.FrequencyPenalty)
	case math.Abs(p.PresencePenalty) > 2 || math.IsNaN(p.PresencePenalty):
		return fmt.Errorf("presence penalty %g must be in [-2, 2]", p.PresencePenalty)
	case p.MaxTokens < 0:
		return fmt.Errorf("max tokens %d must be >= 0", p.MaxTokens)
	case p.MinTokens < 0:
		return fmt.Errorf("min tokens %d must be >= 0", p.MinTokens)
	case p.MaxTokens > 0 && p.MinTokens > p.MaxTokens:
		return fmt.Errorf("min tokens %d exceeds max tokens %d", p.MinTokens, p.MaxTokens)
	}
	return nil
}

// Sampler chooses tokens for one sequence. It keeps the counts penalties need
// and reuses its buffers, so Sample allocates nothing.
type Sampler struct {
	p        SamplingParams
	rng      *rand.Rand
	seen     []bool  // token appeared in prompt or output (repetition penalty)
	outCount []int32 // times generated (frequency/presence penalties)
	logits   []float32
	cands    []candidate
	// hist lists the tokens seen (prompt and output) with their output
	// counts, for a device sampler's penalties; histIdx[id]-1 indexes it.
	hist    []backend.HistoryEntry
	histIdx []int32
	// generated counts accepted tokens (for MinTokens); banned is the
	// device history while stop tokens are banned, rebuilt per choice.
	generated int
	banned    []backend.HistoryEntry
}

type candidate struct {
	id int32
	p  float32 // logit, then probability
}

// NewSampler makes a sampler over a vocabulary of vocab ids, primed with the
// prompt (for the repetition penalty). The per-token state is allocated only
// for the penalties that need it, and the host buffers on first use.
func NewSampler(p SamplingParams, vocab int, prompt []int) *Sampler {
	s := &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))}
	if p.penalized() {
		s.seen = make([]bool, vocab)
		s.outCount = make([]int32, vocab)
		s.histIdx = make([]int32, vocab)
		for _, id := range prompt {
			if id >= 0 && id < vocab {
				s.seen[id] = true
				s.entry(id)
			}
		}
	}
	return s
}

// penalized reports whether any penalty is on.
func (p *SamplingParams) penalized() bool {
	rep := p.RepetitionPenalty
	return (rep != 0 && rep != 1) || p.FrequencyPenalty != 0 || p.PresencePenalty != 0
}

// Accept records a generated token.
func (s *Sampler) Accept(id int) {
	s.generated++
	if s.seen != nil && id >= 0 && id < len(s.seen) {
		s.seen[id] = true
		s.outCount[id]++
		s.entry(id).Count++
	}
}

// PlainGreedy reports whether the sampler's choices are each row's Argmax
// as it comes: temperature 0, no penalty, no banned stop token (a ban only
// lifts as tokens are taken, so this stays true once it is).
func (s *Sampler) PlainGreedy() bool {
	return s.p.Temperature == 0 && !s.p.penalized() && !s.Banning()
}

// Banning reports whether the stop tokens are banned from the next choice:
// fewer than MinTokens tokens were generated (and stop tokens stop).
func (s *Sampler) Banning() bool {
	return !s.p.IgnoreStop && s.generated < s.p.MinTokens && len(s.p.StopTokens) > 0
}

// ban sets the stop tokens' logits to -inf while Banning.
func (s *Sampler) ban(l []float32) {
	if !s.Banning() {
		return
	}
	for _, id := range s.p.StopTokens {
		if id >= 0 && id < len(l) {
			l[id] = float32(math.Inf(-1))
		}
	}
}

// deviceHistory is the history a device sampler applies: the penalties'
// entries, with the stop tokens marked Banned (added when absent) while
// Banning.
func (s *Sampler) deviceHistory() []backend.HistoryEntry {
	var h []backend.HistoryEntry
	if s.p.penalized() {
		h = s.hist
	}
	if !s.Banning() {
		return h
	}
	s.banned = append(s.banned[:0], h...)
	for _, id := range s.p.StopTokens {
		if id < 0 || id > math.MaxInt32 {
			continue
		}
		at := -1
		if s.histIdx != nil && id < len(s.histIdx) {
			at = int(s.histIdx[id]) - 1
		} else {
			at = slices.IndexFunc(s.banned, func(e backend.HistoryEntry) bool { return e.ID == int32(id) })
		}
		if at >= 0 {
			s.banned[at].Banned = true
		} else {
			s.banned = append(s.banned, backend.HistoryEntry{ID: int32(id), Banned: true})
		}
	}
	return s.banned
}

// entry returns id's history entry, adding it when new.
func (s *Sampler) entry(id int) *backend.HistoryEntry {
	if s.histIdx[id] == 0 {
		s.hist = append(s.hist, backend.HistoryEntry{ID: int32(id), Seen: true})
		s.histIdx[id] = int32(len(s.hist))
	}
	return &s.hist[s.histIdx[id]-1]
}

// deviceParams describes the next choice for a device sampler, drawing the
// random number Sample would draw, so that both give the same token.
func (s *Sampler) deviceParams() backend.SampleParams {
	p := backend.SampleParams{
		Temperature: s.p.Temperature, TopK: s.p.TopK, TopP: s.p.TopP, MinP: s.p.MinP,
		RepetitionPenalty: s.p.RepetitionPenalty, FrequencyPenalty: s.p.FrequencyPenalty, PresencePenalty: s.p.PresencePenalty,
	}
	if s.p.Temperature != 0 {
		p.U = s.rng.Float64()
	}
	p.History = s.deviceHistory()
	return p
}

// Sample picks a token from one row of logits (which it does not modify).
func (s *Sampler) Sample(row []float32) int {
	l := s.prepared(row)
	if s.p.Temperature == 0 {
		return Argmax(l)
	}
	c, total := s.survivors(l)
	return s.draw(c, total, -1)
}

// Verify decides a drafted token by speculative sampling's rule (Leviathan
// et al., 2023, for a drafter that proposes one token for certain) against
// this row: the draft is kept with its probability p(draft) under the
// sampler's distribution; else a token is drawn from that distribution
// without the draft, renormalized. So the token returned is distributed as
// Sample's: draft with p(draft), any other x with (1−p(draft))·p(x)/(1−p(draft)).
// Greedy keeps the draft when it is the argmax, else returns the argmax.
// It does not Accept.
func (s *Sampler) Verify(row []float32, draft int) (id int, kept bool) {
	l := s.prepared(row)
	if s.p.Temperature == 0 {
		a := Argmax(l)
		return a, a == draft
	}
	c, total := s.survivors(l)
	var pd float64
	for _, x := range c {
		if int(x.id) == draft {
			pd = float64(x.p)
		}
	}
	if s.rng.Float64()*total < pd {
		return draft, true
	}
	return s.draw(c, total-pd, draft), false
}

// prepared is row with the penalties and the stop tokens' ban applied, in
// the sampler's buffer.
func (s *Sampler) prepared(row []float32) []float32 {
	if len(s.logits) < len(row) {
		s.logits = make([]float32, len(row))
		s.cands = make([]candidate, 0, len(row))
	}
	l := s.logits[:len(row)]
	copy(l, row)
	s.penalize(l)
	s.ban(l)
	return l
}

// survivors is the distribution the filters leave: temperature, top-k,
// softmax, top-p, min-p; the probabilities sum to total (not renormalized
// after the filters: draws scale by it).
func (s *Sampler) survivors(l []float32) ([]candidate, float64) {
	inv := float32(1 / s.p.Temperature)
	c := s.cands[:0]
	for i, v := range l {
		c = append(c, candidate{id: int32(i), p: v * inv})
	}
	if s.p.TopK > 0 && s.p.TopK < len(c) {
		slices.SortFunc(c, byLogitDesc)
		c = c[:s.p.TopK]
	}
	// Softmax over the survivors.
	maxL := float32(math.Inf(-1))
	for _, x := range c {
		maxL = max(maxL, x.p)
	}
	var sum float64
	for i := range c {
		e := math.Exp(float64(c[i].p - maxL))
		c[i].p = float32(e)
		sum += e
	}
	for i := range c {
		c[i].p = float32(float64(c[i].p) / sum)
	}
	if s.p.TopP > 0 && s.p.TopP < 1 {
		slices.SortFunc(c, byLogitDesc)
		var cum float64
		keep := len(c)
		for i, x := range c {
			cum += float64(x.p)
			if cum >= s.p.TopP {
				keep = i + 1
				break
			}
		}
		c = c[:keep]
	}
	if s.p.MinP > 0 {
		var top float32
		for _, x := range c {
			top = max(top, x.p)
		}
		cut := float32(s.p.MinP) * top
		kept := c[:0]
		for _, x := range c {
			if x.p >= cut {
				kept = append(kept, x)
			}
		}
		c = kept
	}
	var total float64
	for _, x := range c {
		total += float64(x.p)
	}
	return c, total
}

// draw picks from c at U·total along the probabilities, skipping the id
// exclude (-1: none; total then leaves its mass out).
func (s *Sampler) draw(c []candidate, total float64, exclude int) int {
	r := s.rng.Float64() * total
	last := -1
	for _, x := range c {
		if int(x.id) == exclude {
			continue
		}
		last = int(x.id)
		r -= float64(x.p)
		if r < 0 {
			return last
		}
	}
	return last
}

func byLogitDesc(a, b candidate) int {
	switch {
	case a.p > b.p:
		return -1
	case a.p < b.p:
		return 1
	}
	return int(a.id - b.id)
}

func (s *Sampler) penalize(l []float32) {
	if !s.p.penalized() {
		return
	}
	rep := float32(s.p.RepetitionPenalty)
	freq, pres := float32(s.p.FrequencyPenalty), float32(s.p.PresencePenalty)
	for i := range l {
		if rep != 0 && rep != 1 && s.seen[i] {
			if l[i] > 0 {
				l[i] /= rep
			} else {
				l[i] *= rep
			}
		}
		if n := s.outCount[i]; n > 0 {
			l[i] -= freq*float32(n) + pres
		}
	}
}

// Argmax returns the first index of the largest value (NaN never wins).
func Argmax(l []float32) int {
	best := 0
	for i, v := range l {
		if v > l[best] || (l[best] != l[best] && v == v) {
			best = i
		}
	}
	return best
}
