package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"kiln/engine"
)

// cmdBenchSpec measures speculative decoding's verification at batch 1 at
// acceptance rates it sets: the drafts are the model's own greedy
// continuation (found by a plain run first), each draft token replaced by
// a wrong one with probability 1-p. Real drafters' acceptance depends on
// the model and the text; this separates what the engine's verifying steps
// cost from how good the drafts are, on any model (a random one included).
// Every speculative run must give the plain run's tokens (greedy
// verification keeps the output): a difference is an error.
func cmdBenchSpec(args []string) error {
	fs := flag.NewFlagSet("bench spec", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	prompt := fs.String("prompt", "", "prompt text (default: the demo's opening line, or --ids)")
	idsFlag := fs.String("ids", "", "prompt as token ids, e.g. 1,2,3 (a model without a tokenizer)")
	tg := fs.Int("tg", 256, "tokens generated a run")
	k := fs.Int("num-speculative-tokens", 4, "tokens drafted a step")
	accepts := fs.String("accept", "1,0.9,0.8,0.6,0.4", "chances that each draft token is right, comma-separated")
	reps := fs.Int("reps", 3, "timed runs of each, after one warm-up; the median is reported")
	seed := fs.Uint64("seed", 1, "seed of the drafts' errors")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("want at most one MODEL argument, got %d", len(pos))
	}
	ps, err := parseAccepts(*accepts)
	if err != nil {
		return err
	}
	if *tg < 1 || *k < 1 || *reps < 1 || (*prompt != "" && *idsFlag != "") {
		return fmt.Errorf("--tg, --num-speculative-tokens and --reps must be >= 1; give --prompt or --ids, not both")
	}
	var ids []int
	if *idsFlag != "" {
		if ids, err = parseIDs(*idsFlag); err != nil {
			return err
		}
	}
	m, tok, err := openRunModel(pos, ef.tokenizer, ids != nil)
	if err != nil {
		return err
	}
	defer m.Close()
	if ids == nil {
		text := *prompt
		if text == "" {
			text = "In the beginning"
		}
		ids = tok.Encode(text, true)
		if len(ids) == 0 {
			return fmt.Errorf("the prompt is empty")
		}
	}
	e, err := newEngine(m, &ef)
	if err != nil {
		return err
	}
	defer e.Close()
	params := engine.SamplingParams{MaxTokens: *tg, IgnoreStop: true}
	var want []int
	// run generates once (plainly with sp nil) and returns the tokens and
	// the rate of those after the first.
	run := func(sp *engine.Speculation) ([]int, float64, error) {
		var got []int
		var first, end time.Time
		emit := func(id int) bool {
			if len(got) == 0 {
				first = time.Now()
			}
			got = append(got, id)
			return true
		}
		var err error
		if sp == nil {
			_, err = e.Generate(ids, params, emit)
		} else {
			_, err = e.GenerateSpeculative(ids, params, *sp, emit)
		}
		end = time.Now()
		if err != nil {
			return nil, 0, err
		}
		return got, float64(len(got)-1) / end.Sub(first).Seconds(), nil
	}
	median := func(sp *engine.Speculation) (float64, error) {
		var rates []float64
		for i := range *reps + 1 {
			got, rate, err := run(sp)
			if err != nil {
				return 0, err
			}
			if want == nil {
				want = got
			} else if !slices.Equal(got, want) {
				return 0, fmt.Errorf("speculative output differs from plain greedy output at token %d", firstDifference(got, want))
			}
			if i > 0 { // the first run warms up
				rates = append(rates, rate)
			}
		}
		slices.Sort(rates)
		return rates[len(rates)/2], nil
	}
	plain, err := median(nil)
	if err != nil {
		return err
	}
	fmt.Printf("model %s, backend %s, prompt %d tokens, %d generated, greedy; drafts: the plain run's own tokens, each replaced by a wrong one with chance 1-p\n",
		m.Path, e.backend.Name(), len(ids), *tg)
	fmt.Printf("| p | drafts a step | tokens/s | vs plain | drafted | kept |\n|---|---|---|---|---|---|\n")
	fmt.Printf("| plain | 0 | %.1f | 1.00× | | |\n", plain)
	for _, p := range ps {
		d := &oracleDrafter{want: append(slices.Clone(ids), want...), p: p, vocab: e.Vocab(), rng: rand.New(rand.NewPCG(*seed, 0))}
		before := e.SpecStats()
		rate, err := median(&engine.Speculation{Drafter: d, K: *k, Always: true})
		if err != nil {
			return err
		}
		st := e.SpecStats()
		drafted, kept := st.DraftTokens-before.DraftTokens, st.AcceptedTokens-before.AcceptedTokens
		fmt.Printf("| %.2f | %d | %.1f | %.2f× | %d | %d (%.0f%%) |\n", p, *k, rate, rate/plain, drafted, kept, 100*float64(kept)/float64(max(1, drafted)))
	}
	return nil
}

// oracleDrafter drafts the tokens of want that follow a sequence, each
// replaced by another with chance 1-p.
type oracleDrafter struct {
	want  []int
	p     float64
	vocab int
	rng   *rand.Rand
}

func (o *oracleDrafter) Draft(tokens []int, k int) []int {
	n := len(tokens)
	if n >= len(o.want) || !slices.Equal(tokens, o.want[:n]) {
		return nil
	}
	d := slices.Clone(o.want[n:min(n+k, len(o.want))])
	for i := range d {
		if o.rng.Float64() >= o.p {
			d[i] = (d[i] + 1) % o.vocab
		}
	}
	return d
}

func parseAccepts(s string) ([]float64, error) {
	var ps []float64
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || p < 0 || p > 1 {
			return nil, fmt.Errorf("--accept %q: want chances from 0 to 1, comma-separated", s)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func firstDifference(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
