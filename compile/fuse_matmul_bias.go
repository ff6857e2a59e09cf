package compile

// fuse-matmul-bias: AddBias(MatMul(x, w), b) → MatMulBias(x, w, b), when
// the product has no other reader: the bias is added in the product's
// epilogue (cuBLASLt's) instead of in a pass of its own (Qwen2's Q/K/V
// biases, stacked or not).

import "kiln/ir"

func fuseMatMulBias(g *ir.Graph, t Target) error {
	return applyRule(g, t, ir.MatMulBias, func(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error) {
		if n.Op != ir.AddBias {
			return false, nil
		}
		mm := producer(n.Inputs[0], ir.MatMul)
		if mm == nil || !soleUse(g, mm.Out(), uses) {
			return false, nil
		}
		fused, err := g.NewNode(ir.MatMulBias, ir.Attrs{}, mm.Inputs[0], mm.Inputs[1], n.Inputs[1])
		if err != nil {
			return false, err
		}
		replaceWith(g, n, fused, n.Out())
		return true, nil
	})
}
