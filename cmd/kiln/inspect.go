package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"kiln/compile"
	"kiln/ir"
	"kiln/model"
)

func cmdInspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	after := fs.String("after", "", `print the graph after this pass ("input" for the built graph, "all" for every pass, "shard" for rank 0's part under --tensor-parallel-size); passes: `+strings.Join(compile.PassNames(), ", "))
	tokens := fs.Int("tokens", 1, "tokens per step of the shape bucket whose plan is shown")
	rows := fs.Int("rows", 1, "logit rows of the shape bucket whose plan is shown")
	buffers := fs.Bool("buffers", false, "list every activation buffer of the plan")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one MODEL argument, got %d", len(pos))
	}
	if *after != "" && *after != "all" && *after != "input" && *after != "shard" && !slices.Contains(compile.PassNames(), *after) {
		return fmt.Errorf("--after: unknown pass %q (passes: input, %s)", *after, strings.Join(compile.PassNames(), ", "))
	}
	m, err := openModel(pos[0])
	if err != nil {
		return err
	}
	defer m.Close()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	printSummary(out, m)

	var passLines []string
	ef2 := ef
	e, err := newEngineWithCompile(m, &ef2, compile.Options{Verify: true, After: func(pass string, g *ir.Graph) {
		passLines = append(passLines, fmt.Sprintf("  %-20s %5d nodes", pass, len(g.Nodes)))
		if *after == "all" || *after == pass {
			fmt.Fprintf(out, "\n# graph after %s\n%s", pass, g)
		}
	}})
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintf(out, "\npasses (graph verified after each)\n%s\n", strings.Join(passLines, "\n"))

	bucket, err := compile.DefaultBuckets.For(*tokens, *rows)
	if err != nil {
		return err
	}
	plan, err := e.Compiled.Plan(bucket)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nbuffer plan for bucket tokens=%d rows=%d\n", bucket.Tokens, bucket.Rows)
	fmt.Fprintf(out, "  %d activation buffers, peak %s (without reuse %s)\n", len(plan.Buffers), bytesString(int64(plan.ArenaBytes)), bytesString(int64(plan.UnsharedBytes)))
	kv := e.KVSpec()
	fmt.Fprintf(out, "  kv cache %s: %d blocks of %d tokens, %d layers, %d kv heads of %d\n", bytesString(kv.Bytes()), kv.Blocks, kv.BlockSize, kv.Layers, kv.KVHeads, kv.HeadDim)
	if *buffers {
		for _, n := range plan.Graph.Nodes {
			for _, v := range n.Outputs {
				if b, ok := plan.Buffers[v]; ok {
					fmt.Fprintf(out, "  %-6v %-14s offset %10d  bytes %10d\n", v, n.Op, b.Offset, b.Bytes)
				}
			}
		}
	}
	nodes, kernels, err := e.Kernels(bucket)
	if err != nil {
		return err
	}
	counts := map[string]int{}
	var order []string
	for i, n := range nodes {
		key := fmt.Sprintf("%-16s %s", n.Op, kernels[i])
		if counts[key] == 0 {
			order = append(order, key)
		}
		counts[key]++
	}
	sort.Strings(order)
	fmt.Fprintf(out, "\nkernels (%d steps)\n", len(nodes))
	for _, k := range order {
		fmt.Fprintf(out, "  %4d × %s\n", counts[k], k)
	}
	return nil
}

func printSummary(out *bufio.Writer, m *model.Model) {
	c := m.Config
	fmt.Fprintf(out, "model     %s (%s)\n", m.Path, m.Format)
	fmt.Fprintf(out, "arch      %s: %d layers, hidden %d, %d heads, %d kv heads, head dim %d, ffn %d, vocab %d, context %d\n",
		c.Arch, c.NumLayers, c.HiddenSize, c.NumHeads, c.NumKVHeads, c.HeadDim, c.IntermediateSize, c.VocabSize, c.MaxPositions)
	attn := "MHA"
	switch {
	case c.NumKVHeads == 1:
		attn = "MQA"
	case c.NumKVHeads < c.NumHeads:
		attn = fmt.Sprintf("GQA (%d queries per kv head)", c.NumHeads/c.NumKVHeads)
	}
	window := "full"
	if c.SlidingWindow > 0 {
		window = fmt.Sprintf("sliding window %d", c.SlidingWindow)
	}
	fmt.Fprintf(out, "attention %s, %s, qkv bias %v, rms eps %g\n", attn, window, c.QKVBias, c.RMSNormEps)
	scaling := "none"
	if c.RopeScaling.Type != "" {
		scaling = fmt.Sprintf("%s ×%g", c.RopeScaling.Type, c.RopeScaling.Factor)
	}
	if c.RopeFreqFactors != nil {
		scaling = "per-pair frequency factors"
	}
	fmt.Fprintf(out, "rope      theta %g, %s pairs, scaling %s\n", c.RopeTheta, c.RopeStyle, scaling)
	fmt.Fprintf(out, "embedding tied %v\n", c.TiedEmbeddings)
	dtypes := map[string]int64{}
	for _, t := range m.Tensors {
		dtypes[t.DType.String()] += int64(len(t.Data))
	}
	var parts []string
	for d, n := range dtypes {
		parts = append(parts, fmt.Sprintf("%s %s", d, bytesString(n)))
	}
	sort.Strings(parts)
	fmt.Fprintf(out, "params    %s in %d tensors, %s (%s)\n", groupDigits(m.ParamCount()), len(m.Tensors), bytesString(m.ParamBytes()), strings.Join(parts, ", "))
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func groupDigits(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
