package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"kiln/eval"
)

func cmdPerplexity(args []string) error {
	fs := flag.NewFlagSet("perplexity", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	file := fs.String("file", "", "text file to score")
	window := fs.Int("window", 0, "tokens per window, 0 for the context length")
	stride := fs.Int("stride", 0, "tokens between window starts, 0 for half the window")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("want at most one MODEL argument, got %d", len(pos))
	}
	if *file == "" {
		return fmt.Errorf("--file is required")
	}
	text, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	m, err := openModel(modelPath(pos))
	if err != nil {
		return err
	}
	defer m.Close()
	tok, err := openTokenizer(ef.tokenizer, m)
	if err == nil {
		err = checkVocab(tok, m)
	}
	if err != nil {
		return err
	}
	e, err := newEngine(m, &ef)
	if err != nil {
		return err
	}
	defer e.Close()
	w := *window
	if w == 0 {
		w = e.ContextLen()
	}
	s := *stride
	if s == 0 {
		s = max(w/2, 1)
	}
	ids := tok.Encode(string(text), false)
	// Progress: a line redrawn on a terminal, else a line every tenth of
	// the text; an interrupt (Ctrl-C) ends the run with what it has.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tty := progressWriter() != nil
	nextLine := 0
	progress := func(p eval.Perplexity) bool {
		done := min(p.Predicted+1, len(ids))
		switch {
		case tty:
			fmt.Fprintf(os.Stderr, "\rperplexity %.4f after %d of %d tokens (%.0f%%)", p.PPL, done, len(ids), 100*float64(done)/float64(len(ids)))
		case done >= nextLine:
			fmt.Fprintf(os.Stderr, "perplexity %.4f after %d of %d tokens\n", p.PPL, done, len(ids))
			nextLine = done + len(ids)/10
		}
		return ctx.Err() == nil
	}
	res, err := eval.SlidingPerplexityProgress(e.Engine, ids, w, s, progress)
	if tty {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	if res.Partial {
		fmt.Fprintf(os.Stderr, "kiln: interrupted: the result of the %d tokens scored so far\n", res.Predicted+1)
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("perplexity %.4f over %d tokens (%d scored, window %d, stride %d, mean NLL %.4f nats)\n",
		res.PPL, res.Tokens, res.Predicted, res.Window, res.Stride, res.NLL/float64(res.Predicted))
	return nil
}
