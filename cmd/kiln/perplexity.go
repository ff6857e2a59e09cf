package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

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
	res, err := eval.SlidingPerplexity(e.Engine, tok.Encode(string(text), false), w, s)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("perplexity %.4f over %d tokens (%d scored, window %d, stride %d, mean NLL %.4f nats)\n",
		res.PPL, res.Tokens, res.Predicted, res.Window, res.Stride, res.NLL/float64(res.Predicted))
	return nil
}
