package compile

// fuse-rope-kv-write: KVWrite(RoPE(k, pos, table), v) → RoPEKVWrite(k, v, pos,
// table): the keys are rotated on their way into the cache, never stored
// rotated in an activation buffer.

import "kiln/ir"

func fuseRoPEKVWrite(g *ir.Graph, t Target) error {
	return applyRule(g, t, ir.RoPEKVWrite, func(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
		if n.Op != ir.KVWrite {
			return false, nil
		}
		rope := producer(n.Inputs[0], ir.RoPE)
		if rope == nil || !soleUse(g, rope.Out(), uses) {
			return false, nil
		}
		// The fused op rotates by the cache's head split: only fuse a RoPE
		// that uses the same one.
		if rope.Attrs.Heads != n.Attrs.KVHeads || rope.Attrs.HeadDim != n.Attrs.HeadDim {
			return false, nil
		}
		a := n.Attrs
		a.Interleaved = rope.Attrs.Interleaved
		fused, err := g.NewNode(ir.RoPEKVWrite, a, rope.Inputs[0], n.Inputs[1], rope.Inputs[1], rope.Inputs[2])
		if err != nil {
			return false, err
		}
		replaceWith(g, n, fused, n.Out())
		g.Remove(n) // a cache write is never dead code: remove it here
		return true, nil
	})
}
