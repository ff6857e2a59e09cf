package engine

import (
	"fmt"
	"slices"
)

// Finish reasons, as in the OpenAI API.
const (
	FinishStop   = "stop"   // a stop token or stop string
	FinishLength = "length" // max tokens or the context length
)

// Result summarises one generation.
type Result struct {
	PromptTokens, GeneratedTokens int
	FinishReason                  string
}

// startGeneration checks p and prompt and returns a sequence holding the
// prompt but its last token: the last token's step also chooses the first
// generated token (on the device when the backend samples there).
func (e *Engine) startGeneration(prompt []int, p SamplingParams) (*Sequence, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, fmt.Errorf("generate: empty prompt")
	}
	if len(prompt) >= e.ctxLen {
		return nil, fmt.Errorf("generate: prompt of %d tokens leaves no room in the context of %d", len(prompt), e.ctxLen)
	}
	seq := e.NewSequence()
	if last := len(prompt) - 1; last > 0 {
		if _, err := e.Prefill(seq, prompt[:last], false); err != nil {
			e.Free(seq)
			return nil, err
		}
	}
	return seq, nil
}

// Generate runs prompt through a fresh sequence and samples tokens until a
// stop condition, calling emit with each generated token (a stop token is not
// emitted). emit returns false to stop (e.g. on a stop string).
func (e *Engine) Generate(prompt []int, p SamplingParams, emit func(id int) bool) (Result, error) {
	res := Result{PromptTokens: len(prompt)}
	seq, err := e.startGeneration(prompt, p)
	if err != nil {
		return res, err
	}
	defer e.Free(seq)
	last := len(prompt) - 1
	sampler := NewSampler(p, e.vocab, prompt)
	samplers := [1]*Sampler{sampler}
	var tok [1]int
	items := [1]Item{{Seq: seq, Tokens: prompt[last:]}}
	for {
		ids, err := e.StepSample(items[:], samplers[:])
		if err != nil {
			return res, err
		}
		id := ids[0]
		if !p.IgnoreStop && res.GeneratedTokens >= p.MinTokens && slices.Contains(p.StopTokens, id) {
			res.FinishReason = FinishStop
			return res, nil
		}
		sampler.Accept(id)
		res.GeneratedTokens++
		if !emit(id) {
			res.FinishReason = FinishStop
			return res, nil
		}
		if (p.MaxTokens > 0 && res.GeneratedTokens >= p.MaxTokens) || seq.len+1 >= e.ctxLen {
			res.FinishReason = FinishLength
			return res, nil
		}
		tok[0] = id
		items[0] = Item{Seq: seq, Tokens: tok[:]}
	}
}
