package compile

import (
	"fmt"

	"kiln/ir"
)

// Shard is one rank's part of a tensor-parallel group of Ranks ranks.
type Shard struct{ Rank, Ranks int }

// shard rewrites g into rank s.Rank's part of a Megatron-style
// tensor-parallel graph (Shoeybi et al., 2019), run before any fusion:
//
//   - attention: the Q, K and V projections (with their biases) are
//     column-parallel, each rank taking Heads/Ranks query heads and
//     KVHeads/Ranks KV heads (its KV cache holds only those); the output
//     projection is row-parallel, its partial sums added by an AllReduce;
//   - the SwiGLU MLP: gate and up column-parallel, down row-parallel and an
//     AllReduce; a mixture of experts splits each expert the same way;
//   - the embedding is vocabulary-parallel (each rank looks up its rows,
//     zeros elsewhere, and an AllReduce adds them) and the LM head
//     column-parallel over the vocabulary, its logits gathered by an
//     AllGather; when the vocabulary does not divide among the ranks both
//     stay whole on every rank.
//
// Norms, RoPE tables and routers stay whole. Heads, KV heads and MLP widths
// that do not divide among the ranks are errors.
func shard(g *ir.Graph, s Shard) error {
	if s.Ranks < 2 || s.Rank < 0 || s.Rank >= s.Ranks {
		return fmt.Errorf("rank %d of %d", s.Rank, s.Ranks)
	}
	sh := &sharder{g: g, s: s, cuts: map[*ir.Node]string{}}
	for _, n := range append([]*ir.Node(nil), g.Nodes...) {
		var err error
		switch n.Op {
		case ir.Attention:
			err = sh.attention(n)
		case ir.Mul:
			err = sh.mlp(n)
		case ir.MoE:
			err = sh.moe(n)
		case ir.Embed:
			err = sh.embed(n)
		}
		if err != nil {
			return err
		}
	}
	if err := sh.head(); err != nil {
		return err
	}
	return g.Reinfer()
}

type sharder struct {
	g    *ir.Graph
	s    Shard
	cuts map[*ir.Node]string // each weight's cut, so that a shared weight is cut once and one way
}

// part is this rank's [lo, hi) of n things.
func (sh *sharder) part(n int, what string) (lo, hi int, err error) {
	if n%sh.s.Ranks != 0 {
		return 0, 0, fmt.Errorf("tensor parallel: %d %s do not divide among %d ranks", n, what, sh.s.Ranks)
	}
	k := n / sh.s.Ranks
	return sh.s.Rank * k, (sh.s.Rank + 1) * k, nil
}

// cut replaces weight v's tensor by its rows (byRows) or columns [lo, hi).
func (sh *sharder) cut(v *ir.Value, byRows bool, lo, hi int) error {
	w := v.Def
	if w.Op != ir.Weight && w.Op != ir.Const {
		return fmt.Errorf("tensor parallel: %v of n%d is not a weight", w.Op, w.ID)
	}
	key := fmt.Sprintf("cols %d:%d", lo, hi)
	if byRows {
		key = fmt.Sprintf("rows %d:%d", lo, hi)
	}
	if prev, ok := sh.cuts[w]; ok {
		if prev != key {
			return fmt.Errorf("tensor parallel: %s cut as %s and as %s", w.Attrs.Name, prev, key)
		}
		return nil
	}
	t := w.Attrs.Tensor
	var err error
	if byRows {
		t, err = t.SliceRows(lo, hi)
	} else {
		t, err = t.SliceCols(lo, hi)
	}
	if err != nil {
		return fmt.Errorf("tensor parallel: %w", err)
	}
	w.Attrs.Tensor = t
	sh.cuts[w] = key
	return nil
}

// columnParallel walks back from v, an attention input of heads heads of
// headDim, through its per-head norm, RoPE and bias to its projection,
// cutting each to this rank's heads.
func (sh *sharder) columnParallel(v *ir.Value, heads, headDim int) error {
	lo, hi, err := sh.part(heads, "heads")
	if err != nil {
		return err
	}
	for {
		n := v.Def
		switch {
		case n.Op == ir.RoPE:
			n.Attrs.Heads = hi - lo
		case n.Op == ir.RMSNorm && n.Attrs.HeadDim > 0:
		case n.Op == ir.RMSNorm:
			return fmt.Errorf("tensor parallel: q or k normalized over all heads at once (OLMoE) cannot be split by heads")
		case n.Op == ir.AddBias:
			if err := sh.cut(n.Inputs[1], true, lo*headDim, hi*headDim); err != nil {
				return err
			}
		case n.Op == ir.MatMul:
			return sh.cut(n.Inputs[1], true, lo*headDim, hi*headDim)
		default:
			return fmt.Errorf("tensor parallel: an attention input comes from %v (n%d), not a projection", n.Op, n.ID)
		}
		v = n.Inputs[0]
	}
}

// rowParallel cuts the weight of product mm (whose input is sharded) to
// columns [lo, hi) and adds the ranks' partial products after it.
func (sh *sharder) rowParallel(mm *ir.Node, lo, hi int) error {
	if mm.Op != ir.MatMul {
		return fmt.Errorf("tensor parallel: a sharded value is read by %v (n%d), not a product", mm.Op, mm.ID)
	}
	if err := sh.cut(mm.Inputs[1], false, lo, hi); err != nil {
		return err
	}
	return sh.after(mm, ir.AllReduce)
}

// after makes every reader of n's output read op(n's output) instead.
func (sh *sharder) after(n *ir.Node, op ir.Op) error {
	c, err := sh.g.NewNode(op, ir.Attrs{Ranks: sh.s.Ranks}, n.Out())
	if err != nil {
		return fmt.Errorf("tensor parallel: %w", err)
	}
	sh.g.ReplaceUses(n.Out(), c.Out())
	for i, x := range sh.g.Nodes {
		if x == n {
			sh.g.Nodes = append(sh.g.Nodes[:i+1], append([]*ir.Node{c}, sh.g.Nodes[i+1:]...)...)
			return nil
		}
	}
	return fmt.Errorf("tensor parallel: n%d not in the graph", n.ID)
}

// onlyReader is the single node that reads v.
func (sh *sharder) onlyReader(v *ir.Value) (*ir.Node, error) {
	var r *ir.Node
	for _, n := range sh.g.Nodes {
		for _, in := range n.Inputs {
			if in == v {
				if r != nil && r != n {
					return nil, fmt.Errorf("tensor parallel: %v of n%d has several readers", v, v.Def.ID)
				}
				r = n
			}
		}
	}
	if r == nil {
		return nil, fmt.Errorf("tensor parallel: %v of n%d is never read", v, v.Def.ID)
	}
	return r, nil
}

func (sh *sharder) attention(att *ir.Node) error {
	a := att.Attrs
	if a.KVHeads%sh.s.Ranks != 0 || a.Heads%sh.s.Ranks != 0 {
		return fmt.Errorf("tensor parallel: %d heads and %d KV heads do not divide among %d ranks", a.Heads, a.KVHeads, sh.s.Ranks)
	}
	kvw := att.Inputs[1].Def
	if kvw.Op != ir.KVWrite {
		return fmt.Errorf("tensor parallel: attention reads the cache after %v (n%d), not a cache write", kvw.Op, kvw.ID)
	}
	if err := sh.columnParallel(att.Inputs[0], a.Heads, a.HeadDim); err != nil {
		return err
	}
	for _, kv := range kvw.Inputs {
		if err := sh.columnParallel(kv, a.KVHeads, a.HeadDim); err != nil {
			return err
		}
	}
	att.Attrs.Heads /= sh.s.Ranks
	att.Attrs.KVHeads /= sh.s.Ranks
	kvw.Attrs.KVHeads /= sh.s.Ranks
	out, err := sh.onlyReader(att.Out())
	if err != nil {
		return err
	}
	lo, hi, _ := sh.part(a.Heads, "heads")
	return sh.rowParallel(out, lo*a.HeadDim, hi*a.HeadDim)
}

// mlp shards a gated MLP, Mul(SiLU(x·gateᵀ), x·upᵀ)·downᵀ (or GELU's, Gemma's
// GeGLU); any other Mul stays whole.
func (sh *sharder) mlp(mul *ir.Node) error {
	act, up := mul.Inputs[0].Def, mul.Inputs[1].Def
	if (act.Op != ir.SiLU && act.Op != ir.GELUTanh) || up.Op != ir.MatMul || act.Inputs[0].Def.Op != ir.MatMul {
		return nil
	}
	gate := act.Inputs[0].Def
	width := gate.Inputs[1].Shape[0]
	lo, hi, err := sh.part(int(width), "MLP rows")
	if err != nil {
		return err
	}
	if err := sh.cut(gate.Inputs[1], true, lo, hi); err != nil {
		return err
	}
	if err := sh.cut(up.Inputs[1], true, lo, hi); err != nil {
		return err
	}
	down, err := sh.onlyReader(mul.Out())
	if err != nil {
		return err
	}
	return sh.rowParallel(down, lo, hi)
}

// moe shards every expert (and the shared one) as mlp does; the router
// stays whole.
func (sh *sharder) moe(n *ir.Node) error {
	width := int(n.Inputs[2].Shape[0])
	lo, hi, err := sh.part(width, "expert rows")
	if err != nil {
		return err
	}
	for e := 0; e < n.Attrs.Experts; e++ {
		gate, up, down := n.Inputs[2+3*e], n.Inputs[3+3*e], n.Inputs[4+3*e]
		if err := sh.cut(gate, true, lo, hi); err != nil {
			return err
		}
		if err := sh.cut(up, true, lo, hi); err != nil {
			return err
		}
		if err := sh.cut(down, false, lo, hi); err != nil {
			return err
		}
	}
	if n.Attrs.Shared {
		// The shared expert split as a dense MLP; its gate, a scale of
		// each row, stays whole.
		at := 2 + 3*n.Attrs.Experts
		lo, hi, err := sh.part(int(n.Inputs[at].Shape[0]), "shared expert rows")
		if err != nil {
			return err
		}
		for i, byRows := range []bool{true, true, false} {
			if err := sh.cut(n.Inputs[at+i], byRows, lo, hi); err != nil {
				return err
			}
		}
	}
	return sh.after(n, ir.AllReduce)
}

// vocabulary is the rank's rows of a vocabulary of n, or ok false when it
// does not divide (the embedding and head then stay whole).
func (sh *sharder) vocabulary(n int) (lo, hi int, ok bool) {
	lo, hi, err := sh.part(n, "tokens")
	return lo, hi, err == nil
}

func (sh *sharder) embed(n *ir.Node) error {
	lo, hi, ok := sh.vocabulary(int(n.Inputs[0].Shape[0]))
	if !ok {
		return nil
	}
	if err := sh.cut(n.Inputs[0], true, lo, hi); err != nil {
		return err
	}
	n.Attrs.Ranks, n.Attrs.VocabStart = sh.s.Ranks, lo
	return sh.after(n, ir.AllReduce)
}

// head shards the LM head: the graph's output, a product by [V,D] (soft-capped
// after the gather, when the model caps its logits).
func (sh *sharder) head() error {
	if len(sh.g.Outputs) != 1 {
		return fmt.Errorf("tensor parallel: the graph has %d outputs, want the logits", len(sh.g.Outputs))
	}
	mm := sh.g.Outputs[0].Def
	if mm.Op == ir.SoftCap {
		mm = mm.Inputs[0].Def
	}
	if mm.Op != ir.MatMul {
		return fmt.Errorf("tensor parallel: the logits come from %v, not a product", mm.Op)
	}
	lo, hi, ok := sh.vocabulary(int(mm.Inputs[1].Shape[0]))
	if !ok {
		return nil
	}
	if err := sh.cut(mm.Inputs[1], true, lo, hi); err != nil {
		return err
	}
	return sh.after(mm, ir.AllGather)
}
