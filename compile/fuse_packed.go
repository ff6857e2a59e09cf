package compile

// fuse-packed: the Split that fuse-qkv puts after a stacked projection is
// dropped where its readers can take the stacked product apart themselves,
// so its copy is never made:
//
//	SwiGLU(Split(gu))                      → SwiGLUPacked(gu)
//	RoPE(q), RoPEKVWrite(k, v) of Split(qkv) → RoPEQKVWrite(qkv)
//
// Each fires only when the split's outputs have no other reader.

import "kiln/ir"

func fusePacked(g *ir.Graph, t Target) error {
	// The earlier fusions leave their matched nodes for deadcode; those
	// still read the split's outputs. Drop them first.
	if err := deadcode(g, t); err != nil {
		return err
	}
	if err := applyRule(g, t, ir.SwiGLUPacked, fuseSwiGLUPacked); err != nil {
		return err
	}
	return applyRule(g, t, ir.RoPEQKVWrite, fuseRoPEQKVWrite)
}

// splitRead returns the Split whose outputs are exactly vs, in order, each
// read only once, or nil.
func splitRead(g *ir.Graph, uses map[*ir.Value][]*ir.Node, vs ...*ir.Value) *ir.Node {
	sp := producer(vs[0], ir.Split)
	if sp == nil || len(sp.Outputs) != len(vs) {
		return nil
	}
	for i, v := range vs {
		if sp.Outputs[i] != v || !soleUse(g, v, uses) {
			return nil
		}
	}
	return sp
}

func fuseSwiGLUPacked(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
	if n.Op != ir.SwiGLU {
		return false, nil
	}
	sp := splitRead(g, uses, n.Inputs[0], n.Inputs[1])
	if sp == nil || sp.Attrs.Sizes[0] != sp.Attrs.Sizes[1] {
		return false, nil
	}
	fused, err := g.NewNode(ir.SwiGLUPacked, ir.Attrs{}, sp.Inputs[0])
	if err != nil {
		return false, err
	}
	replaceWith(g, n, fused, n.Out())
	return true, nil
}

func fuseRoPEQKVWrite(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
	if n.Op != ir.RoPEKVWrite {
		return false, nil
	}
	sp := producer(n.Inputs[0], ir.Split)
	if sp == nil || len(sp.Outputs) != 3 {
		return false, nil
	}
	us := uses[sp.Outputs[0]]
	if len(us) != 1 || us[0].Op != ir.RoPE {
		return false, nil
	}
	rope := us[0]
	if splitRead(g, uses, rope.Inputs[0], n.Inputs[0], n.Inputs[1]) == nil {
		return false, nil
	}
	a := n.Attrs
	ra := rope.Attrs
	// The same positions, table and rotation for q and k.
	if rope.Inputs[1] != n.Inputs[2] || rope.Inputs[2] != n.Inputs[3] || ra.HeadDim != a.HeadDim || ra.Interleaved != a.Interleaved {
		return false, nil
	}
	a.Heads = ra.Heads
	fused, err := g.NewNode(ir.RoPEQKVWrite, a, sp.Inputs[0], n.Inputs[2], n.Inputs[3])
	if err != nil {
		return false, err
	}
	// The fused node goes where the first of the two was: every reader of
	// q or of the state comes after it, and its inputs come before both.
	at := n
	for _, m := range g.Nodes {
		if m == rope || m == n {
			at = m
			break
		}
	}
	replaceWith(g, at, fused, rope.Out(), n.Out())
	g.Remove(n) // a cache write is never dead code: remove it here
	return true, nil
}
