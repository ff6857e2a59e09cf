package cuda

import (
	"fmt"
	"os"
	"strconv"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/ir"
	"kiln/tensor"
)

// moeTileMinRows is the smallest step whose expert products run on the
// tensor cores (kernels.MoE.TileMinRows): KILN_MOE_TILE_ROWS when set (0:
// never, for comparisons), else 1: on the H200 (2026-11-26, moe-7b-a1b)
// the tiles beat the CUDA cores' expert kernels at every batch, 1 (+26%),
// 8, 16, 64 (2.6×) and a prefill of 512 (12×).
func moeTileMinRows() int {
	if v, err := strconv.Atoi(os.Getenv("KILN_MOE_TILE_ROWS")); err == nil {
		return v
	}
	return 1
}

// moeShape is ir.MoE node n's shape for the kernels (no pointers yet).
func moeShape(n *ir.Node) kernels.MoE {
	a := n.Attrs
	m := kernels.MoE{E: a.Experts, K: a.TopK, Norm: a.NormTopK, Dim: int(n.Inputs[0].Shape.Last()), Inter: int(n.Inputs[2].Shape[0])}
	if a.Shared {
		m.SharedInter = int(n.Inputs[2+3*a.Experts].Shape[0])
	}
	return m
}

// uploadMoETables checks every MoE layer of the graph against what the
// kernels take and uploads its table of weight pointers (gate, up and down
// of every expert, then the shared expert's), at load: no step allocates
// device memory. The weights are uploaded (weightDTypes gives a mixture's
// matrices the activation dtype: GGUF blocks and FP8 are widened, at 2
// bytes an element in bf16).
func (l *loaded) uploadMoETables() error {
	for _, n := range l.compiled.Graph.Nodes {
		if n.Op != ir.MoE {
			continue
		}
		if err := moeShape(n).Check(); err != nil {
			return err
		}
		a := n.Attrs
		ptrs := make([]uint64, 3*a.Experts+3)
		for i := 2; i < 2+3*a.Experts+3*b2i(a.Shared); i++ {
			w, ok := l.weights[n.Inputs[i].Def]
			if !ok {
				return fmt.Errorf("cuda: moe weight %q was not uploaded", n.Inputs[i].Def.Attrs.Name)
			}
			if j := i - 2; j < 3*a.Experts {
				ptrs[(j%3)*a.Experts+j/3] = uint64(w.p) // expert j/3's gate, up or down
			} else {
				ptrs[j] = uint64(w.p)
			}
		}
		p, err := l.alloc(8 * len(ptrs))
		if err != nil {
			return err
		}
		if err := l.dev.Upload(p, cu.AsBytes(ptrs)); err != nil {
			return err
		}
		l.moeTables[n] = p
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// moeOf binds MoE node nd for the kernels: its activations and weights in
// the activation dtype, its table of weight pointers (uploadMoETables).
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
	tab, ok := l.moeTables[nd.n]
	if !ok {
		return m, fmt.Errorf("cuda: moe node n%d has no table of its experts", nd.n.ID)
	}
	a := nd.n.Attrs
	if l.gemv != nil && l.act != cu.F32 {
		m.Tiles, m.TileMinRows = l.gemv, moeTileMinRows()
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
