package compile

// deadcode removes nodes none of whose outputs reach a graph output. KV-cache
// writes are always kept: a later step's attention reads what they store.

import "kiln/ir"

func deadcode(g *ir.Graph, _ Target) error {
	live := map[*ir.Node]bool{}
	var work []*ir.Node
	mark := func(n *ir.Node) {
		if n != nil && !live[n] {
			live[n] = true
			work = append(work, n)
		}
	}
	for _, o := range g.Outputs {
		mark(o.Def)
	}
	for _, n := range g.Nodes {
		if n.Op.WritesCache() {
			mark(n)
		}
	}
	for len(work) > 0 {
		n := work[len(work)-1]
		work = work[:len(work)-1]
		for _, in := range n.Inputs {
			mark(in.Def)
		}
	}
	kept := g.Nodes[:0]
	for _, n := range g.Nodes {
		if live[n] {
			kept = append(kept, n)
		}
	}
	for i := len(kept); i < len(g.Nodes); i++ {
		g.Nodes[i] = nil
	}
	g.Nodes = kept
	return nil
}
