// Package compile turns an architecture's ir.Graph into execution plans for
// one backend.
//
// Compilation has two stages. The graph passes, listed in order in passes
// below (one pass per file), rewrite the graph once: fusion by rewrite rules,
// constant folding, dead-code elimination. Then, for each shape bucket (a
// number of tokens per step and of logit rows), the memory planner assigns
// every activation an offset in one arena; the resulting Plan is built once
// per bucket and reused for every step that fits it.
//
// Invariants: a pass leaves a graph that ir.Verify accepts (checked after
// every pass when Options.Verify is set, as tests do); the compiled graph
// contains only ops the target supports (fusion rules fire only when the
// target implements the fused op, and Compile fails naming any op it does
// not); RopeTable and ConcatRows never survive compilation.
package compile

import (
	"fmt"
	"strings"

	"kiln/ir"
)

// Target is what the compiler needs to know about a backend.
type Target interface {
	Name() string
	Supports(op ir.Op) bool
}

// LazyStacker is a Target that takes stacked matrices (ConcatRows of
// constants, folded) as tensors of Parts (tensor.Tensor.Parts) and copies
// each part where it goes: the fold then copies no weights on the host.
type LazyStacker interface {
	StacksLazily() bool
}

type pass struct {
	name     string
	fn       func(g *ir.Graph, t Target) error
	required bool // runs even when disabled by Options
}

// passes is the ordered pass list.
var passes = []pass{
	{name: "fuse-qkv", fn: fuseQKV},
	{name: "fuse-swiglu", fn: fuseSwiGLU},
	{name: "fuse-add-rmsnorm", fn: fuseAddRMSNorm},
	{name: "fuse-rope-kv-write", fn: fuseRoPEKVWrite},
	{name: "fuse-packed", fn: fusePacked},
	{name: "fuse-matmul-bias", fn: fuseMatMulBias},
	{name: "fold-constants", fn: foldConstants, required: true},
	{name: "deadcode", fn: deadcode, required: true},
}

// passOrder lists constraints: the first pass must run before the second.
var passOrder = [...][2]string{
	{"fuse-qkv", "fold-constants"},           // the stacked weights fuse-qkv makes are folded
	{"fuse-add-rmsnorm", "deadcode"},         // fusions leave dead adds and norms
	{"fuse-swiglu", "deadcode"},              // ... and dead SiLUs
	{"fuse-rope-kv-write", "deadcode"},       // ... and dead RoPEs
	{"fuse-qkv", "deadcode"},                 // ... and dead matmuls
	{"fold-constants", "deadcode"},           // folding orphans its inputs
	{"fuse-rope-kv-write", "fold-constants"}, // no reason beyond keeping folding last among rewrites
	{"fuse-qkv", "fuse-packed"},              // fuse-packed removes the splits fuse-qkv makes
	{"fuse-swiglu", "fuse-packed"},           // ... read by SwiGLU
	{"fuse-rope-kv-write", "fuse-packed"},    // ... and by RoPEKVWrite
	{"fuse-packed", "deadcode"},              // ... leaving them dead
	{"fuse-qkv", "fuse-matmul-bias"},         // the stacked biases are added to the stacked product
	{"fuse-matmul-bias", "deadcode"},         // fusion leaves the unbiased products dead
	{"fuse-matmul-bias", "fold-constants"},   // ... whose stacked weights are then folded
}

func init() {
	if err := checkPassOrder(passes, passOrder[:]); err != nil {
		panic(err)
	}
}

// checkPassOrder reports the first ordering constraint that ps violates.
func checkPassOrder(ps []pass, order [][2]string) error {
	index := map[string]int{}
	for i, p := range ps {
		index[p.name] = i
	}
	for _, c := range order {
		a, aok := index[c[0]]
		b, bok := index[c[1]]
		if !aok || !bok {
			return fmt.Errorf("compile: ordering constraint names unknown pass %v", c)
		}
		if a >= b {
			return fmt.Errorf("compile: pass %s must come before %s", c[0], c[1])
		}
	}
	return nil
}

// PassNames lists the graph passes in order.
func PassNames() []string {
	names := make([]string, len(passes))
	for i, p := range passes {
		names[i] = p.name
	}
	return names
}

// Options adjust compilation.
type Options struct {
	// Disable names optional passes to skip (e.g. "fuse-qkv").
	Disable []string
	// Verify runs ir.Verify after every pass.
	Verify bool
	// After, when set, is called with the graph after each pass (for
	// `kiln inspect --after`); "input" names the graph before any pass.
	After func(pass string, g *ir.Graph)
	// Shard, when Ranks > 1, makes the graph rank Rank's part of a
	// tensor-parallel group (shard.go), before any other pass.
	Shard Shard
	// KVBlockSize, when set, is the tokens a block of the KV cache the
	// graph will run with holds: a backend may build its attention
	// kernels for that block size alone (the CUDA backend makes it a
	// constant of their address arithmetic). 0: any.
	KVBlockSize int
}

// Compiled is a graph compiled for a target, ready to be planned per bucket.
type Compiled struct {
	Graph  *ir.Graph
	Target Target
	// KVBlockSize is Options.KVBlockSize: the KV cache's tokens a block,
	// 0 when not known at compile time.
	KVBlockSize int
	plans       map[Bucket]*Plan
}

// Compile runs the pass list on g (which it modifies) for target t.
func Compile(g *ir.Graph, t Target, opts Options) (*Compiled, error) {
	if err := g.Verify(); err != nil {
		return nil, fmt.Errorf("compile: input graph: %w", err)
	}
	if opts.KVBlockSize < 0 {
		return nil, fmt.Errorf("compile: KV-cache block size %d", opts.KVBlockSize)
	}
	if opts.After != nil {
		opts.After("input", g)
	}
	if opts.Shard.Ranks > 1 {
		if err := shard(g, opts.Shard); err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		if err := g.Verify(); err != nil {
			return nil, fmt.Errorf("compile: after sharding: %w", err)
		}
		if opts.After != nil {
			opts.After("shard", g)
		}
	}
	disabled := map[string]bool{}
	for _, d := range opts.Disable {
		disabled[d] = true
	}
	for _, p := range passes {
		if disabled[p.name] && !p.required {
			continue
		}
		if err := p.fn(g, t); err != nil {
			return nil, fmt.Errorf("compile: pass %s: %w", p.name, err)
		}
		if opts.Verify {
			if err := g.Verify(); err != nil {
				return nil, fmt.Errorf("compile: after pass %s: %w", p.name, err)
			}
		}
		if opts.After != nil {
			opts.After(p.name, g)
		}
	}
	var missing []string
	seen := map[ir.Op]bool{}
	for _, n := range g.Nodes {
		if !t.Supports(n.Op) && !seen[n.Op] {
			seen[n.Op] = true
			missing = append(missing, n.Op.String())
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("compile: backend %s does not implement %s", t.Name(), strings.Join(missing, ", "))
	}
	return &Compiled{Graph: g, Target: t, KVBlockSize: opts.KVBlockSize, plans: map[Bucket]*Plan{}}, nil
}

// Plan returns the plan for bucket b, building it on first use.
func (c *Compiled) Plan(b Bucket) (*Plan, error) {
	if p, ok := c.plans[b]; ok {
		return p, nil
	}
	p, err := planMemory(c.Graph, b)
	if err != nil {
		return nil, err
	}
	c.plans[b] = p
	return p, nil
}
