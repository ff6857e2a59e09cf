package compile

// fuse-swiglu: Mul(SiLU(gate), up) → SwiGLU(gate, up), the gated feed-forward
// activation of Llama's MLP, when the SiLU result has no other reader.

import "kiln/ir"

func fuseSwiGLU(g *ir.Graph, t Target) error {
	return applyRule(g, t, ir.SwiGLU, func(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
		if n.Op != ir.Mul {
			return false, nil
		}
		for i := 0; i < 2; i++ {
			act := producer(n.Inputs[i], ir.SiLU)
			if act == nil || !soleUse(g, act.Out(), uses) {
				continue
			}
			fused, err := g.NewNode(ir.SwiGLU, ir.Attrs{}, act.Inputs[0], n.Inputs[1-i])
			if err != nil {
				return false, err
			}
			replaceWith(g, n, fused, n.Out())
			return true, nil
		}
		return false, nil
	})
}
