package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"

	"kiln/tune"
)

// commandDoc is what kiln help CMD (and CMD -h) says before the flags.
type commandDoc struct {
	usage    string   // the synopsis after "kiln "
	about    string   // what the command does
	examples []string // command lines
}

// modelArg explains MODEL, for every command that takes one.
const modelArg = `MODEL is a Hugging Face directory (config.json, *.safetensors), a .gguf
file, or a llama2.c .bin (give its tokenizer.bin with --tokenizer); "demo"
or no MODEL (run, serve, bench model, logits, perplexity) is the built-in
demo model.`

var docs = map[string]commandDoc{
	"run": {"run [MODEL] [--prompt TEXT | --ids 1,2,3] [flags]",
		"Generates text from a prompt (or from standard input when neither --prompt nor --ids is given) and prints it as it comes.",
		[]string{`kiln run --prompt "In the beginning"`, `kiln run ./Llama-3.2-1B-Instruct --prompt "Hello" --temperature 0 --max-tokens 64 --verbose`,
			`echo "Once upon a time" | kiln run model.gguf --speculative ngram`}},
	"chat": {"chat [MODEL] [--system TEXT] [flags]",
		"An interactive conversation rendered with the model's chat template: each line of standard input is your turn (/clear starts over, /bye or the end of input ends), the model's reply streams as it comes; Ctrl-C ends a reply.",
		[]string{`kiln chat`, `kiln chat ./Qwen2.5-0.5B-Instruct --system "You answer in one sentence."`}},
	"logits": {"logits [MODEL] --ids 1,2,3 [--rows all]", "Prints the logits of a prompt's last token (or of every token) as JSON.",
		[]string{`kiln logits --ids 1,2,3`}},
	"tokenize":   {"tokenize --tokenizer FILE --text TEXT", "Prints the token ids of a text.", []string{`kiln tokenize --tokenizer ./model --text "Hello, world"`}},
	"detokenize": {"detokenize --tokenizer FILE --ids 1,2,3", "Prints the text of token ids.", []string{`kiln detokenize --tokenizer ./model --ids 9906,11,1917`}},
	"inspect": {"inspect MODEL [--after PASS] [--tokens N] [--rows N] [--buffers]",
		"Prints a model's config, its graph after the compiler's passes, the memory plan of a step and the kernel chosen for each node.",
		[]string{`kiln inspect model.gguf --after fuse-qkv`, `kiln inspect ./model --tensor-parallel-size 2 --after shard`}},
	"perplexity": {"perplexity [MODEL] --file TEXT [--window N] [--stride N]",
		"Measures a model's perplexity on a text file (sliding windows, as llama-perplexity).",
		[]string{`kiln perplexity --file ../shared/corpora/war-and-peace.txt --window 256`}},
	"quantize": {"quantize MODEL OUT [--to q8_0|q4_0|q4_k_m|q5_k_m|f16|bf16|f32|fp8]", "Writes a model in a quantized format (GGUF, or FP8 safetensors).",
		[]string{`kiln quantize ./model model-q4_k_m.gguf --to q4_k_m`}},
	"bench model": {"bench model [MODEL | --random SHAPE] [--pp 512] [--tg 128] [--batch 1,4] [--depth N] [flags]",
		"Measures prompt processing and generation speed against the hardware's limits (memory bandwidth, a large GEMM) measured in the same run.",
		[]string{`kiln bench model`, `kiln bench model --random llama3-8b --device cuda --batch 1,64`}},
	"bench serve": {"bench serve [--url URL] [--concurrency N] [--num-requests N] [flags]",
		"Drives an OpenAI-compatible server (kiln serve, vLLM, ...) with a load and reports throughput, TTFT, ITL and TPOT percentiles.",
		[]string{`kiln bench serve --url http://127.0.0.1:8000 --concurrency 16 --num-requests 200 --html report.html`}},
	"bench throughput": {"bench throughput [MODEL] [--num-requests 1000] [--prompt-tokens 128] [--output-tokens 128] [--max-num-seqs N] [flags]",
		"Measures offline throughput as vLLM's bench throughput: every request handed to kiln serve's scheduler at once, in process, with the prompts kiln bench serve draws with the same --seed and workload flags; set the scheduler's flags as for kiln serve.",
		[]string{`kiln bench throughput ./model --device cuda --max-num-seqs 256 --num-requests 5120`}},
	"bench compare": {"bench compare BASE.json NEW.json", "Compares two kiln bench serve runs and flags regressions.",
		[]string{`kiln bench compare before.json after.json`}},
	"bench spec": {"bench spec [MODEL] [--ids 1,2,3 | --prompt TEXT] [--tg 256] [--num-speculative-tokens 4] [--accept 1,0.8,0.6]",
		"Measures speculative decoding at batch 1 at acceptance rates it sets: the drafts are the model's own greedy tokens, each made wrong with chance 1-p.",
		[]string{`kiln bench spec ./model --device cuda --ids 1,2,3 --accept 1,0.8,0.6`}},
	"tune": {"tune MODEL [--device cpu|cuda] [flags] | tune list | tune export FILE | tune import FILE",
		"Times the kernel choices for MODEL on this machine and keeps the fastest, for run and serve to take.",
		[]string{`kiln tune ./model --device cuda`, `kiln tune list`}},
	"compile": {"compile MODEL --device cuda -o DIR [flags]", "Builds an ahead-of-time artifact (compiled kernels and tuned choices) for MODEL on this kind of GPU.",
		[]string{`kiln compile ./model --device cuda -o model.kiln`}},
	"serve": {"serve [MODEL] [--host 127.0.0.1] [--port 8000] [flags]",
		"Serves MODEL through an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions) with continuous batching.",
		[]string{`kiln serve`, `kiln serve ./model --device cuda --port 8000 --max-num-seqs 64`, `kiln serve ./model --tensor-parallel-size 2`}},
	"version":    {"version", "Prints kiln's version.", nil},
	"completion": {"completion bash|zsh|fish", "Prints a shell completion script (source it, e.g. source <(kiln completion bash)).", []string{`source <(kiln completion bash)`}},
	"help":       {"help [COMMAND]", "Prints kiln's commands, or one command's help.", []string{`kiln help run`}},
}

// takesModel lists the commands whose help explains MODEL.
var takesModel = map[string]bool{"run": true, "chat": true, "logits": true, "inspect": true, "perplexity": true, "quantize": true,
	"bench model": true, "bench spec": true, "bench throughput": true, "tune": true, "compile": true, "serve": true}

// printHelp writes fs's command help: synopsis, description, MODEL,
// examples, then the flags.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	d, ok := docs[fs.Name()]
	if !ok {
		d = commandDoc{usage: fs.Name() + " [flags]"}
	}
	fmt.Fprintf(w, "usage: kiln %s\n\n", d.usage)
	if d.about != "" {
		fmt.Fprintf(w, "%s\n\n", d.about)
	}
	if takesModel[fs.Name()] {
		fmt.Fprintf(w, "%s\n\n", modelArg)
	}
	if len(d.examples) > 0 {
		fmt.Fprintf(w, "examples:\n")
		for _, e := range d.examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "flags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// errFlagNames asks parseFlags for the command's flag names (shell
// completion's kiln __flags CMD).
const flagNamesArg = "--__flag-names"

// helpCommand is kiln help [COMMAND].
func helpCommand(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stdout, usage)
		return nil
	}
	name := strings.Join(args, " ")
	if name == "bench" {
		fmt.Fprint(os.Stdout, benchUsage)
		return nil
	}
	if d, ok := docs[name]; ok && d.about != "" && (name == "version" || name == "completion" || name == "help") {
		fmt.Fprintf(os.Stdout, "usage: kiln %s\n\n%s\n", d.usage, d.about)
		return nil
	}
	cmd, rest := commands[args[0]], append(args[1:], "-h")
	if cmd == nil {
		return fmt.Errorf("no command %q (kiln help lists them)", name)
	}
	return cmd(rest)
}

// versionString is kiln's version line.
func versionString() string {
	return fmt.Sprintf("kiln %s (%s, %s/%s)", tune.KilnVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// completion prints a completion script for shell.
func completion(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one shell: bash, zsh or fish")
	}
	var names []string
	for n := range commands {
		if !strings.HasPrefix(n, "__") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	cmds := strings.Join(names, " ")
	switch args[0] {
	case "bash":
		fmt.Printf(`_kiln() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "%s" -- "$cur"))
		return
	fi
	local cmd=${COMP_WORDS[1]}
	if [ "$cmd" = bench ] && [ "$COMP_CWORD" -eq 2 ]; then
		COMPREPLY=($(compgen -W "model serve throughput compare spec" -- "$cur"))
		return
	fi
	[ "$cmd" = bench ] && cmd="bench ${COMP_WORDS[2]}"
	if [[ "$cur" == -* ]]; then
		COMPREPLY=($(compgen -W "$(kiln __flags $cmd 2>/dev/null)" -- "$cur"))
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -F _kiln kiln
`, cmds)
	case "zsh":
		fmt.Printf(`#compdef kiln
_kiln() {
	if (( CURRENT == 2 )); then
		compadd %s
	elif [[ ${words[2]} == bench && CURRENT == 3 ]]; then
		compadd model serve throughput compare spec
	elif [[ ${words[CURRENT]} == -* ]]; then
		local cmd=${words[2]}
		[[ $cmd == bench ]] && cmd="bench ${words[3]}"
		compadd -- ${(f)"$(kiln __flags ${=cmd} 2>/dev/null | tr ' ' '\n')"}
	else
		_files
	fi
}
compdef _kiln kiln
`, cmds)
	case "fish":
		fmt.Printf("complete -c kiln -f -n '__fish_use_subcommand' -a '%s'\n", cmds)
		fmt.Printf("complete -c kiln -f -n '__fish_seen_subcommand_from bench' -a 'model serve throughput compare spec'\n")
		for _, n := range names {
			if n == "bench" || n == "help" || n == "version" || n == "completion" {
				continue
			}
			fmt.Printf("complete -c kiln -n '__fish_seen_subcommand_from %s' -a '(kiln __flags %s 2>/dev/null | string split \" \")'\n", n, n)
		}
	default:
		return fmt.Errorf("shell %q: want bash, zsh or fish", args[0])
	}
	return nil
}

// flagNames is kiln __flags CMD: the command's flags, space-separated.
func flagNames(args []string) error {
	if len(args) == 0 {
		return errors.New("want a command")
	}
	cmd := commands[args[0]]
	if cmd == nil {
		return fmt.Errorf("no command %q", args[0])
	}
	err := cmd(append(args[1:], flagNamesArg))
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}
