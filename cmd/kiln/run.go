package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"kiln/engine"
	"kiln/model"
	"kiln/tokenizer"
)

func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	prompt := fs.String("prompt", "", "prompt text")
	idsFlag := fs.String("ids", "", "prompt as token ids, e.g. 1,2,3")
	maxTokens := fs.Int("max-tokens", 256, "most tokens to generate")
	temp := fs.Float64("temperature", 0.8, "sampling temperature, 0 for greedy")
	topK := fs.Int("top-k", 40, "keep the K most likely tokens, 0 for all")
	topP := fs.Float64("top-p", 0.95, "keep the most likely tokens up to this probability mass, 1 for all")
	minP := fs.Float64("min-p", 0.05, "drop tokens less likely than this fraction of the most likely one")
	repPen := fs.Float64("repeat-penalty", 1, "repetition penalty (1: off)")
	freqPen := fs.Float64("frequency-penalty", 0, "frequency penalty")
	presPen := fs.Float64("presence-penalty", 0, "presence penalty")
	seed := fs.Int64("seed", -1, "sampling seed, -1 for a random one")
	var stops stringList
	fs.Var(&stops, "stop", "stop string (repeatable)")
	asJSON := fs.Bool("json", false, `print one JSON object {"ids": [...], "text": "..."}`)
	var sf specFlags
	sf.register(fs)
	warm := fs.Bool("warmup", envString("KILN_WARMUP", "1") != "0", "on a GPU, run the decode steps at each context length's power of two (with --speculative the verifying steps and a draft model's too) once before the prompt, so that their first-use kernel timings and graph captures do not stall the stream nor mislead the choice to draft (KILN_WARMUP=0 turns it off) [KILN_WARMUP]")
	verbose := fs.Bool("verbose", false, "after the output, print timings to stderr as ollama run --verbose does: the prompt's tokens and rate (to the first generated token), the generated tokens and rate after it")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("want at most one MODEL argument, got %d", len(pos))
	}
	if *prompt != "" && *idsFlag != "" {
		return fmt.Errorf("give --prompt or --ids, not both")
	}
	if *maxTokens <= 0 {
		return fmt.Errorf("--max-tokens %d must be positive", *maxTokens)
	}
	// The server's limits, checked before the model loads.
	if *temp < 0 || *temp > 2 || *topP < 0 || *topP > 1 || *minP < 0 || *minP > 1 || *topK < 0 || ef.threads < 0 {
		return fmt.Errorf("--temperature %g (0 to 2), --top-p %g and --min-p %g (0 to 1), --top-k %d and --threads %d (0 or more)", *temp, *topP, *minP, *topK, ef.threads)
	}
	if *prompt == "" && *idsFlag == "" {
		// No prompt given: standard input's, when it is not a terminal.
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice == 0 {
			b, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fmt.Errorf("reading the prompt from standard input: %w", err)
			}
			*prompt = strings.TrimSuffix(string(b), "\n")
		}
	}
	if err := sf.check(); err != nil {
		return err
	}
	m, tok, ids, err := openPrompt(pos, ef.tokenizer, *prompt, *idsFlag)
	if err != nil {
		return err
	}
	defer m.Close()
	if tok == nil && len(stops) > 0 {
		return fmt.Errorf("--stop needs a tokenizer (give --tokenizer)")
	}
	s := uint64(*seed)
	if *seed < 0 {
		s = rand.Uint64()
	}
	params := engine.SamplingParams{
		Temperature: *temp, TopK: *topK, TopP: *topP, MinP: *minP,
		RepetitionPenalty: *repPen, FrequencyPenalty: *freqPen, PresencePenalty: *presPen,
		Seed: s, MaxTokens: *maxTokens, StopTokens: stopTokens(m, tok), StopStrings: stops,
	}
	if err := params.Validate(); err != nil {
		return err
	}
	o := engine.Options{ContextLen: ef.ctx, KVCacheFraction: autoKVFraction}
	closeDraft, err := sf.openDraft(&o)
	if err != nil {
		return err
	}
	defer closeDraft()
	e, err := newEngineOptions(m, &ef, o)
	if err != nil {
		return err
	}
	defer e.Close()
	spec, err := sf.speculation(e)
	if err != nil {
		return err
	}
	if *warm && gpuOf(e.backend) != nil {
		// The one-token decode steps at each context bucket the run will
		// meet, and with --speculative the verifying steps (the engine's
		// governor compares the two). The warm-up only moves first-use
		// work earlier: a step of it that fails is reported and the run
		// goes on without the rest, as kiln serve's does.
		longest := len(ids) + *maxTokens
		w, err := e.WarmDecode(longest)
		if err == nil && spec != nil {
			greedy := engine.NewSampler(params, e.Vocab(), ids).PlainGreedy()
			var sw engine.WarmStats
			sw, err = warmSpeculation(e, spec, 1, longest, !greedy)
			w.Steps, w.Took = w.Steps+sw.Steps, w.Took+sw.Took
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kiln: warm-up stopped after %d steps: %v\n", w.Steps, err)
		}
		if *verbose {
			fmt.Fprintf(os.Stderr, "kiln: warmed up: %d steps in %v\n", w.Steps, w.Took.Round(time.Millisecond))
		}
	}

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var gen []int
	var text []byte
	show := func(s string) {
		text = append(text, s...)
		if !*asJSON {
			out.WriteString(s)
			out.Flush()
		}
	}
	var start, first, end time.Time
	var res engine.Result
	generated := 0
	// Ctrl-C ends the generation: what came so far is printed (and the
	// JSON written) as at any other end.
	interrupt, stopInterrupt := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stopInterrupt()
	generate := func(prompt []int, p engine.SamplingParams, emit func(int) bool) (engine.Result, error) {
		timed := func(id int) bool {
			if generated == 0 {
				first = time.Now()
			}
			generated++
			return emit(id) && interrupt.Err() == nil
		}
		start = time.Now()
		defer func() { end = time.Now() }()
		if spec != nil {
			return e.GenerateSpeculative(prompt, p, *spec, timed)
		}
		return e.Generate(prompt, p, timed)
	}
	if tok == nil {
		// No tokenizer: the ids are the output (space-separated on the
		// terminal, the JSON's text empty).
		res, err = generate(ids, params, func(id int) bool {
			if !*asJSON {
				if len(gen) > 0 {
					out.WriteString(" ")
				}
				out.WriteString(strconv.Itoa(id))
				out.Flush()
			}
			gen = append(gen, id)
			return true
		})
	} else {
		dec := tok.NewDecoder()
		for _, id := range ids {
			dec.Add(id) // prime the decoder with the prompt so spacing continues
		}
		stop := engine.NewStopStrings(stops)
		res, err = generate(ids, params, func(id int) bool {
			gen = append(gen, id)
			piece, stopped := stop.Add(dec.Add(id))
			show(piece)
			return !stopped
		})
		if err == nil {
			piece, _ := stop.Add(dec.Flush())
			show(piece + stop.Flush())
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		if gen == nil {
			gen = []int{}
		}
		err = json.NewEncoder(out).Encode(struct {
			IDs  []int  `json:"ids"`
			Text string `json:"text"`
		}{gen, string(text)})
	} else {
		out.WriteString("\n")
	}
	out.Flush()
	if interrupt.Err() != nil {
		fmt.Fprintf(os.Stderr, "kiln: interrupted after %d tokens\n", generated)
	}
	if res.FinishReason == engine.FinishLength && res.GeneratedTokens < *maxTokens {
		fmt.Fprintf(os.Stderr, "kiln: stopped at the context length of %d tokens (a prompt of %d, %d generated); --max-tokens %d asked for more (--ctx sets the context)\n",
			e.ContextLen(), res.PromptTokens, res.GeneratedTokens, *maxTokens)
	}
	if *verbose && generated > 0 {
		pe, ev := first.Sub(start), end.Sub(first)
		fmt.Fprintf(os.Stderr, "prompt eval count:    %d token(s)\nprompt eval duration: %v\nprompt eval rate:     %.2f tokens/s\n",
			len(ids), pe.Round(time.Microsecond), float64(len(ids))/pe.Seconds())
		fmt.Fprintf(os.Stderr, "eval count:           %d token(s)\neval duration:        %v\neval rate:            %.2f tokens/s\n",
			generated-1, ev.Round(time.Microsecond), float64(generated-1)/max(ev.Seconds(), 1e-9))
	}
	if spec != nil {
		st := e.SpecStats()
		fmt.Fprintf(os.Stderr, "kiln: speculative decoding: %d steps verified %d drafted tokens, %d kept (%.0f%%)\n",
			st.Drafts, st.DraftTokens, st.AcceptedTokens, 100*float64(st.AcceptedTokens)/float64(max(1, st.DraftTokens)))
	}
	return err
}

// openPrompt opens run's model and its tokenizer (openRunModel) and the
// prompt's ids: idsFlag's, or text encoded (an empty encoding starts from
// the vocabulary's BOS token).
func openPrompt(pos []string, tokenizerFlag, text, idsFlag string) (*model.Model, *tokenizer.Tokenizer, []int, error) {
	var ids []int
	if idsFlag != "" {
		var err error
		if ids, err = parseIDs(idsFlag); err != nil {
			return nil, nil, nil, err
		}
	}
	m, tok, err := openRunModel(pos, tokenizerFlag, ids != nil)
	if err != nil {
		return nil, nil, nil, err
	}
	if ids == nil {
		ids = tok.Encode(text, true)
		if len(ids) == 0 && tok.BOS() >= 0 {
			ids = []int{tok.BOS()}
		}
		if len(ids) == 0 {
			m.Close()
			return nil, nil, nil, fmt.Errorf("the prompt is empty and the vocabulary has no BOS token to start from")
		}
	}
	return m, tok, ids, nil
}

// openRunModel opens run's model and its tokenizer. With prompt ids given
// (haveIDs) and no --tokenizer, a model that carries no tokenizer runs
// without one: tok is nil and the output is ids.
func openRunModel(args []string, tokenizerFlag string, haveIDs bool) (*model.Model, *tokenizer.Tokenizer, error) {
	if !haveIDs || len(args) == 0 || tokenizerFlag != "" {
		return openModelOrDemo(args, tokenizerFlag)
	}
	m, err := openModel(args[0])
	if err != nil {
		return nil, nil, err
	}
	tok, err := openTokenizer("", m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln: no tokenizer (%v): printing token ids\n", err)
		return m, nil, nil
	}
	return m, tok, nil
}

type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
