package compile

// fuse-qkv: projections that read the same input (Q, K and V of attention;
// also gate and up of the MLP) become one matrix product over their stacked
// weights followed by a Split, so the input is read once and the backend runs
// one large product instead of several small ones. Biases (Qwen2) are stacked
// the same way when every projection has one. The stacked weights are
// ConcatRows nodes, which fold-constants turns into constants.
//
// To place the fused nodes at the first projection, every node without inputs
// (weights, constants, step inputs) is first hoisted to the top of the graph;
// such nodes depend on nothing, so their order is free.

import (
	"kiln/ir"
)

func fuseQKV(g *ir.Graph, t Target) error {
	if !t.Supports(ir.Split) {
		return nil
	}
	hoistSources(g)
	uses := g.Uses()
	done := map[*ir.Value]bool{}
	nodes := append([]*ir.Node(nil), g.Nodes...)
	for _, n := range nodes {
		if n.Op != ir.MatMul || done[n.Inputs[0]] {
			continue
		}
		x := n.Inputs[0]
		done[x] = true
		var group []*ir.Node
		for _, u := range uses[x] {
			if u.Op == ir.MatMul && u.Inputs[0] == x && isConstant(u.Inputs[1]) && u.Inputs[1].DType == n.Inputs[1].DType {
				group = append(group, u)
			}
		}
		if len(group) < 2 {
			continue
		}
		if err := stackProjections(g, group, uses); err != nil {
			return err
		}
		uses = g.Uses()
	}
	return nil
}

func isConstant(v *ir.Value) bool {
	return v.Def.Op == ir.Weight || v.Def.Op == ir.Const
}

// hoistSources moves input-less nodes to the front, keeping relative order.
func hoistSources(g *ir.Graph) {
	var sources, rest []*ir.Node
	for _, n := range g.Nodes {
		if len(n.Inputs) == 0 {
			sources = append(sources, n)
		} else {
			rest = append(rest, n)
		}
	}
	g.Nodes = append(sources, rest...)
}

func stackProjections(g *ir.Graph, group []*ir.Node, uses map[*ir.Value][]*ir.Node) error {
	first := group[0]
	x := first.Inputs[0]
	weights := make([]*ir.Value, len(group))
	sizes := make([]int, len(group))
	for i, mm := range group {
		weights[i] = mm.Inputs[1]
		sizes[i] = mm.Out().Shape.Last()
	}
	// Stack biases only when each projection's sole reader adds one.
	biasAdds := make([]*ir.Node, len(group))
	biases := make([]*ir.Value, len(group))
	for i, mm := range group {
		us := uses[mm.Out()]
		if len(us) != 1 || us[0].Op != ir.AddBias || us[0].Inputs[0] != mm.Out() || !isConstant(us[0].Inputs[1]) {
			biasAdds = nil
			break
		}
		biasAdds[i] = us[0]
		biases[i] = us[0].Inputs[1]
	}
	if biasAdds != nil {
		for _, b := range biases[1:] {
			if b.DType != biases[0].DType {
				biasAdds = nil
				break
			}
		}
	}

	var added []*ir.Node
	add := func(op ir.Op, a ir.Attrs, in ...*ir.Value) (*ir.Node, error) {
		n, err := g.NewNode(op, a, in...)
		if err == nil {
			added = append(added, n)
		}
		return n, err
	}
	w, err := add(ir.ConcatRows, ir.Attrs{}, weights...)
	if err != nil {
		return err
	}
	mm, err := add(ir.MatMul, ir.Attrs{}, x, w.Out())
	if err != nil {
		return err
	}
	out := mm.Out()
	if biasAdds != nil {
		b, err := add(ir.ConcatRows, ir.Attrs{}, biases...)
		if err != nil {
			return err
		}
		ab, err := add(ir.AddBias, ir.Attrs{}, out, b.Out())
		if err != nil {
			return err
		}
		out = ab.Out()
	}
	split, err := add(ir.Split, ir.Attrs{Sizes: sizes}, out)
	if err != nil {
		return err
	}
	for _, n := range added {
		g.InsertBefore(first, n)
	}
	for i, p := range group {
		old := p.Out()
		if biasAdds != nil {
			old = biasAdds[i].Out()
		}
		g.ReplaceUses(old, split.Outputs[i])
	}
	return nil
}
