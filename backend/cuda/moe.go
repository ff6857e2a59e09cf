package cuda

import (
	"fmt"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/ir"
	"kiln/tensor"
)

// moeShape is ir.MoE node n's shape for the kernels (no pointers yet).
func moeShape(n *ir.Node) kernels.MoE {
	a := n.Attrs
	m := kernels.MoE{E: a.Experts, K: a.TopK, Norm: a.NormTopK, Dim: int(n.Inputs[0].Shape.Last()), Inter: int(n.Inputs[2].Shape[0])}
	if a.Shared {
		m.SharedInter = int(n.Inputs[2+3*a.Experts].Shape[0])
	}
	return m
}

// moeOf binds MoE node nd for the kernels: its weights must be matrices
// of the activation dtype (not GGUF blocks nor FP8: such a model runs on
// the CPU under --device auto); the table of the experts' pointers is
// uploaded once a layer (gate, up and down of every expert, then the
// shared expert's).
func (l *loaded) moeOf(nd *node) (kernels.MoE, error) {
	m := moeShape(nd.n)
	if err := m.Check(); err != nil {
		return m, err
	}
	if nd.in[0].dtype != l.act {
		return m, fmt.Errorf("cuda: moe of %v activations", nd.in[0].dtype)
	}
	for _, o := range nd.in[1:] {
		if o.dtype != l.act || o.blocks != tensor.Invalid || o.scales != 0 {
			return m, fmt.Errorf("cuda: moe weight %s is %v (blocks %v): the expert kernels take %v matrices", o.v.Def.Attrs.Name, o.dtype, o.blocks, l.act)
		}
	}
	a := nd.n.Attrs
	tab, ok := l.moeTables[nd.in[2].p]
	if !ok {
		ptrs := make([]uint64, 3*a.Experts+3)
		for e := range a.Experts {
			for j := range 3 {
				ptrs[j*a.Experts+e] = uint64(nd.in[2+3*e+j].p)
			}
		}
		if a.Shared {
			for j := range 3 {
				ptrs[3*a.Experts+j] = uint64(nd.in[2+3*a.Experts+j].p)
			}
		}
		p, err := l.alloc(8 * len(ptrs))
		if err != nil {
			return m, err
		}
		if err := l.dev.Upload(p, cu.AsBytes(ptrs)); err != nil {
			return m, err
		}
		l.moeTables[nd.in[2].p] = p
		tab = p
	}
	m.X, m.Out, m.Router = nd.in[0].p, nd.out[0].p, nd.in[1].p
	m.Gate, m.Up, m.Down = tab, tab.Add(8*a.Experts), tab.Add(16*a.Experts)
	if a.Shared {
		s := tab.Add(24 * a.Experts)
		m.SharedGate, m.SharedUp, m.SharedDown = s, s.Add(8), s.Add(16)
		if a.SharedGate {
			m.SharedScale = nd.in[2+3*a.Experts+3].p
		}
	}
	return m, nil
}
