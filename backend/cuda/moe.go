package cuda

import (
	"fmt"
	"os"
	"slices"
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

// moeLayout is one MoE layer's tables (uploadMoETables): ptrs, the
// experts' matrices the kernels read (gate of every expert, then up, then
// down, then the shared expert's three), srcs the blocks' pointers of those
// in GGUF blocks (0 elsewhere), scratch each such entry's offset into the
// shared scratch (-1 for none) and scratchBytes its size for the layer;
// widen the tables of each kind in blocks, their Src and Dst still
// offsets into srcs and ptrs.
type moeLayout struct {
	n            *ir.Node
	ptrs, srcs   []uint64
	scratch      []int
	scratchBytes int
	widen        []kernels.ExpertTable
}

// layoutMoE lays out MoE node n's tables from the uploaded weights (act
// the activation dtype).
func layoutMoE(n *ir.Node, weights map[*ir.Node]deviceTensor, act cu.DType) (moeLayout, error) {
	if err := moeShape(n).Check(); err != nil {
		return moeLayout{}, err
	}
	a := n.Attrs
	ly := moeLayout{n: n, ptrs: make([]uint64, 3*a.Experts+3), srcs: make([]uint64, 3*a.Experts+3), scratch: make([]int, 3*a.Experts+3)}
	for j := range ly.scratch {
		ly.scratch[j] = -1
	}
	// The table's kinds: entries [first, first+count) of it, one matrix of
	// the graph's inputs each.
	kinds := [][2]int{{0, a.Experts}, {a.Experts, a.Experts}, {2 * a.Experts, a.Experts}}
	if a.Shared {
		kinds = append(kinds, [2]int{3 * a.Experts, 1}, [2]int{3*a.Experts + 1, 1}, [2]int{3*a.Experts + 2, 1})
	}
	input := func(j int) *ir.Value { // the graph input of table entry j
		if j < 3*a.Experts {
			return n.Inputs[2+3*(j%a.Experts)+j/a.Experts] // expert j%E's gate, up or down
		}
		return n.Inputs[2+j]
	}
	for _, k := range kinds {
		var format tensor.DType
		blocks := 0
		for j := k[0]; j < k[0]+k[1]; j++ {
			v := input(j)
			w, ok := weights[v.Def]
			if !ok {
				return ly, fmt.Errorf("cuda: moe weight %q was not uploaded", v.Def.Attrs.Name)
			}
			ly.ptrs[j] = uint64(w.p)
			if w.dtype != devBlocks {
				continue
			}
			if blocks > 0 && w.blocks != format {
				return ly, fmt.Errorf("cuda: moe weight %q is %v, others of its kind %v", v.Def.Attrs.Name, w.blocks, format)
			}
			format = w.blocks
			blocks++
			ly.srcs[j], ly.scratch[j] = uint64(w.p), ly.scratchBytes
			ly.scratchBytes += (matrixSize(v)*act.Size() + 255) &^ 255
		}
		switch blocks {
		case 0:
		case k[1]:
			ly.widen = append(ly.widen, kernels.ExpertTable{Format: format, Matrices: k[1], Experts: k[1],
				N: matrixSize(input(k[0])), Routed: k[0] < 3*a.Experts,
				Src: cu.Ptr(8 * k[0]), Dst: cu.Ptr(8 * k[0])}) // offsets into the tables until they are placed
		default:
			return ly, fmt.Errorf("cuda: moe layer n%d: %d of the %d matrices of a kind in GGUF blocks", n.ID, blocks, k[1])
		}
	}
	return ly, nil
}

// uploadMoETables checks every MoE layer of the graph against what the
// kernels take and uploads its table of weight pointers (gate, up and down
// of every expert, then the shared expert's), at load: no step allocates
// device memory. The weights are uploaded: FP8 matrices widened to the
// activation dtype (weightDTypes), GGUF blocks kept. A kind of matrix in
// blocks (the experts' gate, up or down, each of the shared expert's)
// points the table into a scratch that every layer shares, where the step
// widens the matrices its rows were routed to (kernels.MoE.Widen) from a
// second table of the blocks' pointers, laid out as the first: memory
// for one layer's experts in the activation dtype instead of every
// layer's.
func (l *loaded) uploadMoETables() error {
	var layers []moeLayout
	scratchBytes := 0
	for _, n := range l.compiled.Graph.Nodes {
		if n.Op != ir.MoE {
			continue
		}
		ly, err := layoutMoE(n, l.weights, l.act)
		if err != nil {
			return err
		}
		scratchBytes = max(scratchBytes, ly.scratchBytes)
		layers = append(layers, ly)
	}
	var scratch cu.Ptr
	if scratchBytes > 0 {
		var err error
		if scratch, err = l.alloc(scratchBytes); err != nil {
			return fmt.Errorf("cuda: the scratch a mixture's experts are widened into (%d MiB): %w", scratchBytes>>20, err)
		}
		l.moeScratch, l.moeScratchBytes = scratch, scratchBytes
		l.b.stats.ExpertScratch += int64(scratchBytes)
	}
	for _, ly := range layers {
		for j, o := range ly.scratch {
			if o >= 0 {
				ly.ptrs[j] = uint64(scratch.Add(o))
			}
		}
		p, err := l.alloc(8 * len(ly.ptrs) * 2)
		if err != nil {
			return err
		}
		if err := l.dev.Upload(p, cu.AsBytes(append(slices.Clone(ly.ptrs), ly.srcs...))); err != nil {
			return err
		}
		l.moeTables[ly.n] = p
		src := p.Add(8 * len(ly.ptrs))
		for i := range ly.widen {
			t := &ly.widen[i]
			t.Src, t.Dst = src.Add(int(t.Src)), p.Add(int(t.Dst))
		}
		if len(ly.widen) > 0 {
			l.moeWiden[ly.n] = ly.widen
		}
	}
	return nil
}

// matrixSize is the elements of weight matrix v (a static shape).
func matrixSize(v *ir.Value) int { return int(v.Shape[0]) * int(v.Shape[1]) }

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
	widen := l.moeWiden[nd.n]
	for i, o := range nd.in[1:] {
		if o.dtype == devBlocks && widen != nil && moeMatrix(nd.n, i+1) {
			continue // widened into the scratch its table entry points to
		}
		if o.dtype != l.act || o.blocks != tensor.Invalid || o.scales != 0 {
			return m, fmt.Errorf("cuda: moe weight %s is %v (blocks %v): the expert kernels take %v matrices", o.v.Def.Attrs.Name, o.dtype, o.blocks, l.act)
		}
	}
	m.Widen = widen
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
