package compile

import "kiln/ir"

// Epilogues: a backend may run an elementwise op that takes a matrix
// product apart in the product's own epilogue (the CUDA backend's decode
// GEMV computes SwiGLUPacked and RoPEQKVWrite that way), writing the op's
// outputs while the product's inputs are still being read. The memory plan
// keeps those inputs live through the op, so that its outputs never share
// their memory.

// epilogueOps are the ops a product's epilogue may compute.
var epilogueOps = map[ir.Op]bool{ir.SwiGLUPacked: true, ir.RoPEQKVWrite: true}

// EpilogueReaders maps each MatMul of g whose product is read by exactly
// one node, an op of epilogueOps taking it as its first input, and is not a
// graph output, to that reader.
func EpilogueReaders(g *ir.Graph) map[*ir.Node]*ir.Node {
	return soleReaders(g, func(r *ir.Node, prod *ir.Value) bool { return epilogueOps[r.Op] && r.Inputs[0] == prod })
}

// ResidualReaders maps each MatMul of g whose product is read by exactly
// one node, an AddRMSNorm adding it to the residual, and is not a graph
// output, to that reader: a backend may add the residual in the product's
// epilogue and write the sum there (the CUDA backend's folded norms), so
// the memory plan keeps the product's inputs live through the norm too.
func ResidualReaders(g *ir.Graph) map[*ir.Node]*ir.Node {
	return soleReaders(g, func(r *ir.Node, prod *ir.Value) bool {
		return r.Op == ir.AddRMSNorm && (r.Inputs[0] == prod || r.Inputs[1] == prod)
	})
}

// liveThrough lists the maps of products to the readers their inputs
// stay live through in the memory plan: EpilogueReaders, ResidualReaders.
func liveThrough(g *ir.Graph) []map[*ir.Node]*ir.Node {
	return []map[*ir.Node]*ir.Node{EpilogueReaders(g), ResidualReaders(g)}
}

// soleReaders maps each MatMul of g with one output, read by exactly one
// node for which ok holds and not a graph output, to that reader.
func soleReaders(g *ir.Graph, ok func(reader *ir.Node, prod *ir.Value) bool) map[*ir.Node]*ir.Node {
	readers := map[*ir.Value][]*ir.Node{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			readers[in] = append(readers[in], n)
		}
	}
	for _, o := range g.Outputs {
		readers[o] = append(readers[o], nil)
	}
	fused := map[*ir.Node]*ir.Node{}
	for _, n := range g.Nodes {
		if n.Op != ir.MatMul || len(n.Outputs) != 1 {
			continue
		}
		rs := readers[n.Outputs[0]]
		if len(rs) == 1 && rs[0] != nil && ok(rs[0], n.Outputs[0]) {
			fused[n] = rs[0]
		}
	}
	return fused
}
