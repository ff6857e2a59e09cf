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
// Greedy verification keeps the output, up to rounding: a verifying step
// computes its rows with other kernels than a one-token step (other row
// counts, other sums' orders), so in bf16 a near-tie between the two most
// likely tokens may go the other way (plain greedy itself changes so with
// the batch it shares a step with). A run's first such token is reported;
// from there the drafter re-derives the plain greedy continuation of what
// the run has produced (a plain run of the model, its time not counted),
// so the acceptance stays the one set, and says how often it did.
func cmdBenchSpec(args []string) error {
	fs := flag.NewFlagSet("bench spec", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	prompt := fs.String("prompt", "", `prompt text (default "In the beginning", unless --ids)`)
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
	if *prompt == "" && *idsFlag == "" {
		*prompt = "In the beginning"
	}
	m, _, ids, err := openPrompt(pos, ef.tokenizer, *prompt, *idsFlag)
	if err != nil {
		return err
	}
	defer m.Close()
	// Room for two sequences: a drafter that re-derives a continuation
	// runs it beside the speculative run.
	e, err := newEngineOptions(m, &ef, engine.Options{ContextLen: ef.ctx, MaxSeqs: 2, KVCacheFraction: autoKVFraction})
	if err != nil {
		return err
	}
	defer e.Close()
	params := engine.SamplingParams{MaxTokens: *tg, IgnoreStop: true}
	var want []int
	// run generates once (plainly with d nil, else drafting with d at every
	// step) and returns the tokens and the rate of those after the first.
	run := func(d *oracleDrafter) ([]int, float64, error) {
		var got []int
		var first, end time.Time
		emit := func(id int) bool {
			if len(got) == 0 {
				first = time.Now()
				if d != nil {
					d.paused = 0
				}
			}
			got = append(got, id)
			return true
		}
		var err error
		if d == nil {
			_, err = e.Generate(ids, params, emit)
		} else {
			_, err = e.GenerateSpeculative(ids, params, engine.Speculation{Drafter: d, K: *k, Always: true}, emit)
		}
		end = time.Now()
		if err != nil {
			return nil, 0, err
		}
		elapsed := end.Sub(first)
		if d != nil {
			if d.err != nil {
				return nil, 0, d.err
			}
			elapsed -= d.paused
		}
		return got, float64(len(got)-1) / elapsed.Seconds(), nil
	}
	// median runs reps+1 times (the first warms up) and returns the
	// median rate and the earliest token at which a run left the plain
	// run's tokens (-1: none did).
	median := func(d *oracleDrafter) (float64, int, error) {
		var rates []float64
		diverged := -1
		for i := range *reps + 1 {
			if d != nil {
				d.reset()
			}
			got, rate, err := run(d)
			if err != nil {
				return 0, 0, err
			}
			if want == nil {
				want = got
			} else if !slices.Equal(got, want) {
				if at := firstDifference(got, want); diverged < 0 || at < diverged {
					diverged = at
				}
			}
			if i > 0 {
				rates = append(rates, rate)
			}
		}
		slices.Sort(rates)
		return rates[len(rates)/2], diverged, nil
	}
	plain, diverged, err := median(nil)
	if err != nil {
		return err
	}
	if diverged >= 0 {
		return fmt.Errorf("plain greedy runs differ from one another at token %d", diverged)
	}
	fmt.Printf("model %s, backend %s, prompt %d tokens, %d generated, greedy; drafts: the plain run's own tokens, each replaced by a wrong one with chance 1-p\n",
		m.Path, e.backend.Name(), len(ids), *tg)
	fmt.Printf("| p | drafts a step | tokens/s | vs plain | drafted | kept | plain's tokens | drafts re-derived |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Printf("| plain | 0 | %.1f | 1.00× | | | | |\n", plain)
	total := len(ids) + *tg
	// continuation is plain greedy after tokens, to total tokens in all.
	continuation := func(tokens []int) ([]int, error) {
		var out []int
		_, err := e.Generate(tokens, engine.SamplingParams{MaxTokens: total - len(tokens), IgnoreStop: true}, func(id int) bool {
			out = append(out, id)
			return true
		})
		return out, err
	}
	for _, p := range ps {
		d := &oracleDrafter{plain: append(slices.Clone(ids), want...), p: p, vocab: e.Vocab(), rng: rand.New(rand.NewPCG(*seed, 0)), continuation: continuation}
		before := e.SpecStats()
		rate, diverged, err := median(d)
		if err != nil {
			return err
		}
		st := e.SpecStats()
		drafted, kept := st.DraftTokens-before.DraftTokens, st.AcceptedTokens-before.AcceptedTokens
		same := "all"
		if diverged >= 0 {
			same = fmt.Sprintf("to token %d", diverged)
		}
		fmt.Printf("| %.2f | %d | %.1f | %.2f× | %d | %d (%.0f%%) | %s | %d |\n", p, *k, rate, rate/plain, drafted, kept, 100*float64(kept)/float64(max(1, drafted)), same, d.rederived)
	}
	return nil
}

// oracleDrafter drafts the tokens of want that follow a sequence, each
// replaced by another with chance 1-p. want starts as the plain run's
// tokens (plain); where a sequence leaves it (rounding), want becomes the
// sequence and its plain greedy continuation, and the time that took is
// added to paused.
type oracleDrafter struct {
	plain        []int
	want         []int
	p            float64
	vocab        int
	rng          *rand.Rand
	continuation func(tokens []int) ([]int, error)
	paused       time.Duration
	rederived    int // continuations derived, over every run
	err          error
}

// reset readies o for a run.
func (o *oracleDrafter) reset() {
	o.want, o.paused, o.err = o.plain, 0, nil
}

func (o *oracleDrafter) Draft(tokens []int, k int) []int {
	n := len(tokens)
	if n >= len(o.plain) || o.err != nil {
		return nil
	}
	if n > len(o.want) || !slices.Equal(tokens, o.want[:n]) {
		t0 := time.Now()
		rest, err := o.continuation(tokens)
		o.paused += time.Since(t0)
		if err != nil {
			o.err = fmt.Errorf("the plain continuation of a speculative run: %w", err)
			return nil
		}
		o.want = append(slices.Clone(tokens), rest...)
		o.rederived++
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
