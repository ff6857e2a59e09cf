package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

func cmdTokenize(args []string) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	path := fs.String("tokenizer", "", "tokenizer.json, llama2.c tokenizer.bin, or a model (directory or .gguf)")
	text := fs.String("text", "", "text to encode")
	special := fs.Bool("add-special", false, "add the BOS/EOS tokens the tokenizer's post-processor adds")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("--tokenizer is required")
	}
	tok, err := loadTokenizerFile(*path)
	if err != nil {
		return err
	}
	ids := tok.Encode(*text, *special)
	if ids == nil {
		ids = []int{}
	}
	return json.NewEncoder(os.Stdout).Encode(struct {
		IDs []int `json:"ids"`
	}{ids})
}

func cmdDetokenize(args []string) error {
	fs := flag.NewFlagSet("detokenize", flag.ContinueOnError)
	path := fs.String("tokenizer", "", "tokenizer.json, llama2.c tokenizer.bin, or a model (directory or .gguf)")
	idsFlag := fs.String("ids", "", "token ids, e.g. 1,2,3")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("--tokenizer is required")
	}
	ids, err := parseIDs(*idsFlag)
	if err != nil {
		return err
	}
	tok, err := loadTokenizerFile(*path)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if id >= tok.VocabSize() {
			return fmt.Errorf("token id %d is outside the vocabulary of %d", id, tok.VocabSize())
		}
	}
	return json.NewEncoder(os.Stdout).Encode(struct {
		Text string `json:"text"`
	}{tok.Decode(ids)})
}
