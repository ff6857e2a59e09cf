package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"

	"kiln/chat"
	"kiln/engine"
)

// cmdChat is an interactive conversation with a model, each turn rendered
// with the model's chat template: a line of standard input is a user turn
// (/clear starts over, /bye or end of input ends), the reply streams as it
// comes.
func cmdChat(args []string) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	system := fs.String("system", "", "a system prompt")
	maxTokens := fs.Int("max-tokens", 512, "most tokens a reply")
	temp := fs.Float64("temperature", 0.8, "sampling temperature, 0 for greedy")
	topK := fs.Int("top-k", 40, "keep the K most likely tokens, 0 for all")
	topP := fs.Float64("top-p", 0.95, "keep the most likely tokens up to this probability mass, 1 for all")
	minP := fs.Float64("min-p", 0.05, "drop tokens less likely than this fraction of the most likely one")
	seed := fs.Int64("seed", -1, "sampling seed, -1 for a random one")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("want at most one MODEL argument, got %d", len(pos))
	}
	if *maxTokens <= 0 || *temp < 0 || *temp > 2 || *topP < 0 || *topP > 1 || *minP < 0 || *minP > 1 || *topK < 0 || ef.threads < 0 {
		return fmt.Errorf("--max-tokens %d (1 or more), --temperature %g (0 to 2), --top-p %g and --min-p %g (0 to 1), --top-k %d and --threads %d (0 or more)",
			*maxTokens, *temp, *topP, *minP, *topK, ef.threads)
	}
	m, tok, err := openModelOrDemo(pos, ef.tokenizer)
	if err != nil {
		return err
	}
	defer m.Close()
	tpl, err := chatTemplate(m, isDemo(pos))
	if err != nil {
		return fmt.Errorf("no chat template: %w", err)
	}
	e, err := newEngine(m, &ef)
	if err != nil {
		return err
	}
	defer e.Close()
	s := uint64(*seed)
	if *seed < 0 {
		s = rand.Uint64()
	}
	var msgs []chat.Message
	if *system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: *system})
	}
	first := len(msgs)
	st, err := os.Stdin.Stat()
	tty := err == nil && st.Mode()&os.ModeCharDevice != 0 // a terminal: prompt for each turn
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for {
		if tty {
			out.WriteString(">>> ")
			out.Flush()
		}
		if !in.Scan() {
			break
		}
		line := strings.TrimSpace(in.Text())
		switch line {
		case "":
			continue
		case "/bye":
			return nil
		case "/clear":
			msgs = msgs[:first]
			continue
		}
		msgs = append(msgs, chat.Message{Role: "user", Content: line})
		text, err := tpl.Render(msgs, chat.Options{AddGenerationPrompt: true})
		if err != nil {
			return err
		}
		ids := tok.Encode(text, false)
		if len(ids) >= e.ContextLen() {
			// The turn is dropped; the conversation so far stays.
			fmt.Fprintf(os.Stderr, "kiln: the conversation would have %d tokens, the context %d: say less, or /clear to start over\n", len(ids), e.ContextLen())
			msgs = msgs[:len(msgs)-1]
			continue
		}
		s++
		params := engine.SamplingParams{Temperature: *temp, TopK: *topK, TopP: *topP, MinP: *minP, Seed: s,
			MaxTokens: *maxTokens, StopTokens: stopTokens(m, tok)}
		dec := tok.NewDecoder()
		for _, id := range ids {
			dec.Add(id)
		}
		var reply strings.Builder
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C ends the reply
		_, err = e.Generate(ids, params, func(id int) bool {
			piece := dec.Add(id)
			reply.WriteString(piece)
			out.WriteString(piece)
			out.Flush()
			return ctx.Err() == nil
		})
		stop()
		if err != nil {
			return err
		}
		piece := dec.Flush()
		reply.WriteString(piece)
		out.WriteString(piece + "\n")
		out.Flush()
		msgs = append(msgs, chat.Message{Role: "assistant", Content: strings.TrimSpace(reply.String())})
	}
	return in.Err()
}
