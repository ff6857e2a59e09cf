package compile

// fuse-add-rmsnorm: RMSNorm(Add(x, r), w) → AddRMSNorm(x, r, w), which returns
// both the residual sum and its normalisation, so the sum is read once.
// The fused node takes the Add's place; the sum keeps its other readers.

import "kiln/ir"

func fuseAddRMSNorm(g *ir.Graph, t Target) error {
	return applyRule(g, t, ir.AddRMSNorm, func(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
		if n.Op != ir.RMSNorm || n.Attrs.HeadDim > 0 {
			return false, nil // a norm of heads is no residual's
		}
		add := producer(n.Inputs[0], ir.Add)
		if add == nil {
			return false, nil
		}
		fused, err := g.NewNode(ir.AddRMSNorm, ir.Attrs{Eps: n.Attrs.Eps}, add.Inputs[0], add.Inputs[1], n.Inputs[1])
		if err != nil {
			return false, err
		}
		// The norm's weight may be defined after the add: place the fused node
		// at the norm, and move the sum's earlier readers... there are none
		// in practice, but make sure rather than assume.
		at := add
		if definedAfter(g, n.Inputs[1].Def, add) {
			at = n
			for _, u := range uses[add.Out()] {
				if u != n && before(g, u, n) {
					return false, nil
				}
			}
		}
		replaceWith(g, at, fused, add.Out(), n.Out())
		return true, nil
	})
}

// before reports whether a comes earlier than b in g.
func before(g *ir.Graph, a, b *ir.Node) bool {
	for _, n := range g.Nodes {
		if n == a {
			return true
		}
		if n == b {
			return false
		}
	}
	return false
}

// definedAfter reports whether def comes later than at in g.
func definedAfter(g *ir.Graph, def, at *ir.Node) bool { return before(g, at, def) }
