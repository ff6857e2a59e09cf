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
  kiln run [MODEL] [--prompt TEXT | --ids 1,2,3] [--max-tokens N] [--temperature T] [--json] [--verbose]
  kiln chat [MODEL] [--system TEXT]
  kiln serve [MODEL] [--host 127.0.0.1] [--port 8000] [--max-num-seqs N] [--api-key KEY]
  kiln logits [MODEL] --ids 1,2,3
  kiln perplexity [MODEL] --file TEXT [--window N] [--stride N]
  kiln tokenize --tokenizer FILE --text TEXT
  kiln detokenize --tokenizer FILE --ids 1,2,3
  kiln inspect MODEL [--after PASS] [--tokens N]
  kiln quantize MODEL OUT [--to q8_0|q4_k_m|fp8|...]
  kiln bench model [MODEL | --random SHAPE] [--pp 512] [--tg 128] [--batch 1,4]
  kiln bench serve [--url URL] [--concurrency N] [--num-requests N] [--html FILE]
  kiln bench compare BASE.json NEW.json
  kiln bench spec [MODEL] [--tg 256] [--num-speculative-tokens 4] [--accept 1,0.8,0.6]
  kiln tune MODEL [--device cpu|cuda] | kiln tune list | export FILE | import FILE
  kiln compile MODEL --device cuda -o DIR
  kiln completion bash|zsh|fish
  kiln version
  kiln help [COMMAND]

MODEL is a Hugging Face directory, a .gguf file, or a llama2.c .bin (with
--tokenizer for its tokenizer.bin); "demo" or no MODEL is the built-in demo
model. Run "kiln help COMMAND" (or "kiln COMMAND -h") for a command's
description, examples and flags.
`

// benchUsage is kiln bench's.
const benchUsage = `usage:
  kiln bench model [MODEL | --random SHAPE] [flags]   speed of a model against the hardware's limits
  kiln bench serve [--url URL] [flags]                load on an OpenAI-compatible server
  kiln bench throughput [MODEL] [flags]               offline throughput: every request at once, in process
  kiln bench compare BASE.json NEW.json               regressions between two bench serve runs
  kiln bench spec [MODEL] [flags]                     speculative decoding at acceptance rates it sets
Run "kiln help bench model" (serve, throughput, compare, spec) for the flags.
`

var commands = map[string]func(args []string) error{
	"run":        cmdRun,
	"chat":       cmdChat,
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
	"version": func([]string) error {
		fmt.Println(versionString())
		return nil
	},
}

// The commands about the commands (registered here: they read the map).
func init() {
	commands["help"] = helpCommand
	commands["completion"] = completion
	commands["__flags"] = flagNames
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "-h", "--help":
		fmt.Print(usage)
		return
	case "-v", "--version":
		fmt.Println(versionString())
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
