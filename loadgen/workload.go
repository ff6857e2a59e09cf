package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Dist is a distribution of token counts.
type Dist struct {
	Kind     string  // "fixed" (Mean), "uniform" (Min..Max), "normal" or "lognormal" (Mean, Std; clamped to Min..Max when set), "histogram" (Values, Weights)
	Mean     float64 // for fixed, normal, lognormal
	Std      float64
	Min, Max int
	// A histogram: Values[i] drawn with probability Weights[i]/ΣWeights.
	Values  []int
	Weights []float64
}

func (d Dist) validate(what string) error {
	switch d.Kind {
	case "fixed", "":
		if d.Mean < 1 {
			return fmt.Errorf("loadgen: %s: a fixed count must be at least 1, got %g", what, d.Mean)
		}
	case "uniform":
		if d.Min < 1 || d.Max < d.Min {
			return fmt.Errorf("loadgen: %s: uniform needs 1 <= min <= max, got %d..%d", what, d.Min, d.Max)
		}
	case "normal", "lognormal":
		if d.Mean < 1 || d.Std < 0 {
			return fmt.Errorf("loadgen: %s: %s needs mean >= 1 and std >= 0", what, d.Kind)
		}
	case "histogram":
		var total float64
		for i, v := range d.Values {
			if v < 1 || i >= len(d.Weights) || d.Weights[i] < 0 {
				return fmt.Errorf("loadgen: %s: a histogram needs counts >= 1 with weights >= 0", what)
			}
			total += d.Weights[i]
		}
		if len(d.Values) == 0 || len(d.Values) != len(d.Weights) || total <= 0 {
			return fmt.Errorf("loadgen: %s: a histogram needs as many weights as counts, not all zero", what)
		}
	default:
		return fmt.Errorf("loadgen: %s: unknown distribution %q (fixed, uniform, normal, lognormal, histogram)", what, d.Kind)
	}
	return nil
}

// draw returns a count of at least 1.
func (d Dist) draw(r *rand.Rand) int {
	var x float64
	switch d.Kind {
	case "uniform":
		return d.Min + r.IntN(d.Max-d.Min+1)
	case "histogram":
		var total float64
		for _, w := range d.Weights {
			total += w
		}
		u := r.Float64() * total
		for i, w := range d.Weights {
			if u -= w; u < 0 {
				return d.Values[i]
			}
		}
		return d.Values[len(d.Values)-1]
	case "normal":
		x = d.Mean + d.Std*r.NormFloat64()
	case "lognormal":
		// Parameters of the underlying normal that give this mean and std.
		v := math.Log(1 + d.Std*d.Std/(d.Mean*d.Mean))
		x = math.Exp(math.Log(d.Mean) - v/2 + math.Sqrt(v)*r.NormFloat64())
	default:
		x = d.Mean
	}
	n := int(math.Round(x))
	if d.Min > 0 {
		n = max(n, d.Min)
	}
	if d.Max > 0 {
		n = min(n, d.Max)
	}
	return max(n, 1)
}

// Workload describes the requests: prompt and output lengths, the text
// prompts are drawn from, and how much of each prompt is a prefix shared by
// all requests.
type Workload struct {
	PromptTokens, OutputTokens Dist
	// Corpus is the text prompts are built from (see next); empty: a
	// built-in pangram text.
	Corpus string
	// SharedPrefix is the fraction (0..1) of each prompt that is the same
	// for every request (it exercises prefix caches).
	SharedPrefix float64
	// Tokens counts a text's tokens with the served model's tokenizer; nil:
	// about 4 tokens for every 3 words, and the counts reported are those.
	Tokens func(string) int
	// Dataset, when set, supplies the prompts (in order, wrapping around)
	// instead of the corpus; an item's OutputTokens, when set, overrides the
	// output distribution.
	Dataset []Item

	words  []string
	cursor int
}

func (w *Workload) prepare() error {
	if len(w.Dataset) == 0 {
		if err := w.PromptTokens.validate("prompt tokens"); err != nil {
			return err
		}
	}
	if err := w.OutputTokens.validate("output tokens"); err != nil {
		return err
	}
	if w.SharedPrefix < 0 || w.SharedPrefix > 1 {
		return fmt.Errorf("loadgen: shared prefix %g must be in [0, 1]", w.SharedPrefix)
	}
	text := w.Corpus
	if strings.TrimSpace(text) == "" {
		text = "The quick brown fox jumps over the lazy dog while five boxing wizards jump quickly and a wise old owl watches."
	}
	w.words = strings.Fields(text)
	return nil
}

// Item is one prompt of a dataset.
type Item struct {
	Prompt       string `json:"prompt"`
	OutputTokens int    `json:"output_tokens,omitempty"`
}

// Profiles are built-in workloads: typical prompt and output lengths of a
// kind of traffic.
var Profiles = map[string]Workload{
	// Chat: medium prompts (system prompt and history), medium answers.
	"chat": {PromptTokens: Dist{Kind: "lognormal", Mean: 512, Std: 256, Min: 16, Max: 4096},
		OutputTokens: Dist{Kind: "lognormal", Mean: 256, Std: 128, Min: 8, Max: 1024}, SharedPrefix: 0.2},
	// Retrieval-augmented generation: long prompts, short answers.
	"rag": {PromptTokens: Dist{Kind: "uniform", Min: 2048, Max: 4096},
		OutputTokens: Dist{Kind: "normal", Mean: 128, Std: 32, Min: 16, Max: 512}},
	// Code completion: long shared file context, short completions.
	"code": {PromptTokens: Dist{Kind: "normal", Mean: 1024, Std: 256, Min: 64, Max: 4096},
		OutputTokens: Dist{Kind: "lognormal", Mean: 64, Std: 48, Min: 4, Max: 512}, SharedPrefix: 0.5},
}

// Prompt is a request's prompt text and output length.
type Prompt struct {
	Text         string
	OutputTokens int
}

// Prompts draws the first n requests that Run sends with seed: the same
// load for an in-process run (kiln bench throughput) as for a served one.
func (w *Workload) Prompts(n int, seed uint64) ([]Prompt, error) {
	if err := w.prepare(); err != nil {
		return nil, err
	}
	rng := newRand(seed)
	out := make([]Prompt, n)
	for i := range out {
		q := w.next(rng)
		out[i] = Prompt{Text: q.prompt, OutputTokens: q.outputTokens}
	}
	return out, nil
}

// newRand is the source of a run's requests.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 99)) }

// request is one request to send.
type request struct {
	prompt                    string
	inputTokens, outputTokens int
}

// next draws a request. Beyond the shared prefix (the corpus's first
// words, in order) a prompt is the corpus's words drawn at random with r,
// so no two prompts share a prefix a KV cache could reuse, within a run or
// between runs of other seeds (as vLLM's random prompts); runs of the same
// seed send the same prompts.
func (w *Workload) next(r *rand.Rand) request {
	if len(w.Dataset) > 0 {
		it := w.Dataset[w.cursor%len(w.Dataset)]
		w.cursor++
		out := it.OutputTokens
		if out <= 0 {
			out = w.OutputTokens.draw(r)
		}
		return request{prompt: it.Prompt, inputTokens: w.count(it.Prompt), outputTokens: out}
	}
	n := w.PromptTokens.draw(r)
	shared := int(math.Round(w.SharedPrefix * float64(n)))
	prefix := w.take(shared, func(i int) string { return w.words[i%len(w.words)] })
	rest := w.take(n-shared, func(int) string { return w.words[r.IntN(len(w.words))] })
	prompt := strings.TrimSpace(prefix + " " + rest)
	return request{prompt: prompt, inputTokens: w.count(prompt), outputTokens: w.OutputTokens.draw(r)}
}

// take builds text of about n tokens from word(0), word(1), ….
func (w *Workload) take(n int, word func(int) string) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	for i := 0; ; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(word(i))
		words := i + 1
		if w.Tokens == nil && (words*4+2)/3 >= n {
			break
		}
		if w.Tokens != nil && words%8 == 0 && w.Tokens(b.String()) >= n {
			break
		}
		if words > 64*n+64 {
			break
		}
	}
	return b.String()
}

func (w *Workload) count(text string) int {
	if w.Tokens != nil {
		return w.Tokens(text)
	}
	return (len(strings.Fields(text))*4 + 2) / 3
}
