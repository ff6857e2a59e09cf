package compile

import (
	"slices"
	"testing"

	"kiln/ir"
)

func TestDeadcode(t *testing.T) {
	b := newBuilder(t)
	pos := b.Op(ir.Positions, ir.Attrs{}) // read only by the dead rope and the fused write
	table := b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 8, HeadDim: 4}})
	x := b.act(8)
	live := []*ir.Node{}
	for _, n := range b.G.Nodes {
		if n.Op != ir.Positions && n.Op != ir.RopeTable {
			live = append(live, n)
		}
	}
	unusedW := b.weight("unused", 0, 4, 8)
	deadMM := b.Node(ir.MatMul, ir.Attrs{}, x, unusedW)
	deadChain := b.Node(ir.SiLU, ir.Attrs{}, deadMM.Out())
	deadRope := b.Node(ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, x, pos, table)

	// A cache write whose state nothing reads, with its own producers.
	kw := b.weight("kw", 0, 4, 8)
	k := b.Node(ir.MatMul, ir.Attrs{}, x, kw)
	write := b.Node(ir.KVWrite, ir.Attrs{Layer: 0, KVHeads: 1, HeadDim: 4}, k.Out(), k.Out())
	// A fused write likewise.
	fused := b.Node(ir.RoPEKVWrite, ir.Attrs{Layer: 1, KVHeads: 1, HeadDim: 4}, k.Out(), k.Out(), pos, table)
	sel := b.Node(ir.SelectRows, ir.Attrs{}, x)
	g := b.outputs(sel.Out())

	live = append(live, pos.Def, table.Def, kw.Def, k, write, fused, sel)
	// keep graph order
	var want []*ir.Node
	for _, n := range g.Nodes {
		if slices.Contains(live, n) {
			want = append(want, n)
		}
	}
	total := len(g.Nodes)
	run(t, g, "deadcode", deadcode, everything)
	if !slices.Equal(g.Nodes, want) {
		t.Errorf("kept\n%v\nwant %v", g, want)
	}
	for _, n := range []*ir.Node{unusedW.Def, deadMM, deadChain, deadRope} {
		if inGraph(g, n) {
			t.Errorf("dead %v kept", n.Op)
		}
	}
	// The removed tail is cleared so dropped nodes can be collected.
	if tail := g.Nodes[len(g.Nodes):total]; slices.ContainsFunc(tail, func(n *ir.Node) bool { return n != nil }) {
		t.Errorf("removed nodes still referenced past the end")
	}
	// Idempotent.
	before := g.String()
	run(t, g, "deadcode", deadcode, everything)
	if g.String() != before {
		t.Errorf("second deadcode changed the graph")
	}
}

func TestDeadcodeKeepsEverythingLive(t *testing.T) {
	g := buildTiny(t, tinyConfig())
	// Nothing is dead in a freshly built graph.
	n := len(g.Nodes)
	run(t, g, "deadcode", deadcode, everything)
	if len(g.Nodes) != n {
		t.Errorf("deadcode removed %d nodes of a graph without dead code", n-len(g.Nodes))
	}
}

func TestDeadcodeMultiOutput(t *testing.T) {
	// A node stays when any of its outputs is live.
	b := newBuilder(t)
	x := b.act(12)
	split := b.Node(ir.Split, ir.Attrs{Sizes: []int{4, 8}}, x)
	g := b.outputs(split.Outputs[1])
	run(t, g, "deadcode", deadcode, everything)
	if !inGraph(g, split) {
		t.Errorf("split removed though its second output is the graph's")
	}
}
