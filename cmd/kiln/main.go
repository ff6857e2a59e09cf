// Command kiln loads, compiles, runs, inspects and benchmarks language models.
//
// This package only parses flags and wires packages together; the work is
// done in model, tokenizer, arch, compile, backend, engine and bench.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

const usage = `kiln: run language models

usage:
  kiln run [MODEL] [--prompt TEXT | --ids 1,2,3] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--json]
  kiln logits MODEL --ids 1,2,3
  kiln tokenize --tokenizer FILE --text TEXT
  kiln detokenize --tokenizer FILE --ids 1,2,3
  kiln inspect MODEL [--after PASS] [--tokens N]
  kiln perplexity MODEL --file TEXT [--window N] [--stride N]
  kiln quantize MODEL OUT.gguf [--to q8_0|q4_0|f16|bf16|f32]
  kiln bench model MODEL [--pp 512] [--tg 128] [--batch 1,4]
  kiln tune MODEL [--device cpu|cuda] [--threads N] [--prefill N] [--batch 1,16,64,256] [--depth 512] | kiln tune list | export FILE | import FILE [--device cpu|cuda]
  kiln compile MODEL --device cuda -o DIR [--prefill N] [--depth N] [--batch 1,2,4,...,256]
  kiln serve [MODEL] [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [--api-key KEY] [--artifact DIR]

MODEL is a Hugging Face directory, a .gguf file, or a llama2.c .bin (with
--tokenizer for its tokenizer.bin); kiln run without one uses the built-in
demo model, and so does kiln serve. Run "kiln COMMAND -h" for a command's flags.
`

var commands = map[string]func(args []string) error{
	"run":        cmdRun,
	"logits":     cmdLogits,
	"tokenize":   cmdTokenize,
	"detokenize": cmdDetokenize,
	"inspect":    cmdInspect,
	"perplexity": cmdPerplexity,
	"quantize":   cmdQuantize,
	"bench":      cmdBench,
	"serve":      cmdServe,
	"tune":       cmdTune,
	"compile":    cmdCompile,
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprint(os.Stderr, usage)
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kiln: unknown command %q (run kiln help)\n", os.Args[1])
		os.Exit(2)
	}
	if err := cmd(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if code, ok := err.(exitCode); ok {
			os.Exit(int(code))
		}
		fmt.Fprintf(os.Stderr, "kiln %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// exitCode is the error of a command whose failure was already reported
// (a child process's): kiln exits with it and prints nothing more.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }
