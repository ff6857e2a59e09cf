// Package eval measures model quality: perplexity over a text, the check that
// a quantization or a kernel change did not hurt a model.
package eval

import (
	"fmt"
	"math"

	"kiln/engine"
)

// Perplexity is the result of a sliding-window perplexity run.
type Perplexity struct {
	Tokens    int     `json:"tokens"`    // tokens in the text
	Predicted int     `json:"predicted"` // tokens scored (all but the first)
	NLL       float64 `json:"nll"`       // summed negative log-likelihood, nats
	PPL       float64 `json:"perplexity"`
	Window    int     `json:"window"`
	Stride    int     `json:"stride"`
	// Partial: the run stopped early (Progress said so); the figures are
	// those of the windows scored.
	Partial bool `json:"partial,omitempty"`
}

// SlidingPerplexity scores ids the way Hugging Face's perplexity guide does:
// windows of window tokens start every stride tokens; in each window only the
// tokens not scored by an earlier window are predicted, each conditioned on
// everything before it in the window; the first token is never predicted.
// Perplexity is exp of the mean negative log-likelihood.
func SlidingPerplexity(e *engine.Engine, ids []int, window, stride int) (Perplexity, error) {
	return SlidingPerplexityProgress(e, ids, window, stride, nil)
}

// SlidingPerplexityProgress is SlidingPerplexity calling progress, when
// set, after each window with the result so far (its PPL that of the tokens
// scored); progress returning false stops the run, whose result is then
// Partial.
func SlidingPerplexityProgress(e *engine.Engine, ids []int, window, stride int, progress func(sofar Perplexity) bool) (Perplexity, error) {
	res := Perplexity{Tokens: len(ids), Window: window, Stride: stride}
	switch {
	case len(ids) < 2:
		return res, fmt.Errorf("perplexity needs at least 2 tokens, got %d", len(ids))
	case window < 2 || window > e.ContextLen():
		return res, fmt.Errorf("window %d must be in [2, %d] (the context length)", window, e.ContextLen())
	case stride < 1 || stride > window:
		return res, fmt.Errorf("stride %d must be in [1, window %d]", stride, window)
	}
	v := e.Vocab()
	prevEnd := 0
	for begin := 0; begin < len(ids); begin += stride {
		end := min(begin+window, len(ids))
		input := ids[begin:end]
		seq := e.NewSequence()
		logits, err := e.Prefill(seq, input, true)
		e.Free(seq)
		if err != nil {
			return res, err
		}
		// Position j predicts input[j+1]; score the targets after prevEnd.
		first := max(prevEnd-begin, 1)
		for t := first; t < len(input); t++ {
			res.NLL += -logSoftmaxAt(logits[(t-1)*v:t*v], input[t])
			res.Predicted++
		}
		prevEnd = end
		if end == len(ids) {
			break
		}
		if progress != nil {
			sofar := res
			sofar.PPL = math.Exp(res.NLL / float64(res.Predicted))
			if !progress(sofar) {
				res.Partial = true
				break
			}
		}
	}
	res.PPL = math.Exp(res.NLL / float64(res.Predicted))
	return res, nil
}

// logSoftmaxAt is log(softmax(row)[id]), computed in float64.
func logSoftmaxAt(row []float32, id int) float64 {
	return float64(row[id]) - logSumExp(row)
}

// logSumExp is log(Σ exp(row)), computed in float64.
func logSumExp(row []float32) float64 {
	m := math.Inf(-1)
	for _, x := range row {
		m = math.Max(m, float64(x))
	}
	var sum float64
	for _, x := range row {
		sum += math.Exp(float64(x) - m)
	}
	return m + math.Log(sum)
}

// KLDivergence compares two models' next-token distributions over the same
// positions (p and q: rows of vocab logits): the mean over rows of
// KL(softmax(p) ‖ softmax(q)) in nats, and the share of rows whose most
// likely token is the same (llama-perplexity --kl-divergence reports both).
func KLDivergence(p, q []float32, vocab int) (kl, top1 float64) {
	rows := len(p) / vocab
	if rows == 0 || len(q) != len(p) {
		return math.NaN(), math.NaN()
	}
	same := 0
	for r := range rows {
		pr, qr := p[r*vocab:(r+1)*vocab], q[r*vocab:(r+1)*vocab]
		lp, lq := logSumExp(pr), logSumExp(qr)
		bp, bq := 0, 0
		for i := range pr {
			a, b := float64(pr[i])-lp, float64(qr[i])-lq
			kl += math.Exp(a) * (a - b)
			if pr[i] > pr[bp] {
				bp = i
			}
			if qr[i] > qr[bq] {
				bq = i
			}
		}
		if bp == bq {
			same++
		}
	}
	return kl / float64(rows), float64(same) / float64(rows)
}
