package cuda

import (
	"testing"

	"kiln/arch"
	"kiln/backend/cuda/cu"
	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// TestLayoutMoE: a mixture's tables (layoutMoE) with its experts' gate
// and down matrices and the shared expert's up matrix in GGUF blocks, the
// rest in bf16: each table entry holds its own expert's matrix (the
// kernels' table by kind, then expert), the blocks' entries a scratch
// offset of their own, apart, and the blocks' pointers beside them; a
// widening table for each kind in blocks, routed for the experts', not for
// the shared expert's. A kind partly in blocks, or in two formats, is
// refused. No GPU needed.
func TestLayoutMoE(t *testing.T) {
	c := model.Config{Arch: "qwen2_moe", HiddenSize: 64, IntermediateSize: 32, NumLayers: 1, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
		VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, NumExperts: 4, ExpertsPerToken: 2,
		QKVBias: true, SharedExpertSize: 48, SharedExpertGate: true}
	g, err := arch.Build(testmodel.Zeros(c), arch.Options{ContextLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	var n *ir.Node
	for _, x := range g.Nodes {
		if x.Op == ir.MoE {
			n = x
		}
	}
	if n == nil {
		t.Fatal("no MoE node")
	}
	E := c.NumExperts
	// inBlocks: the experts' gate (kind 0) and down (2), the shared up (4).
	inBlocks := func(j int) bool { return j < 3*E && j/E != 1 || j == 3*E+1 }
	// The tensor each table entry must hold, by its name: the experts'
	// gates, then their ups, then their downs, then the shared expert's.
	names := make([]string, 3*E+3)
	for e := range E {
		names[e], names[E+e], names[2*E+e] = c.MoEExpert(0, e)
	}
	names[3*E], names[3*E+1], names[3*E+2] = c.MoEShared(0)
	defs := map[string]*ir.Value{}
	for _, v := range n.Inputs {
		defs[v.Def.Attrs.Name] = v
	}
	input := func(j int) *ir.Value {
		v, ok := defs[names[j]]
		if !ok {
			t.Fatalf("%s is not an input of the mixture", names[j])
		}
		return v
	}
	entry := func(j int) *ir.Node { return input(j).Def }
	weights := func(format func(j int) tensor.DType) map[*ir.Node]deviceTensor {
		w := map[*ir.Node]deviceTensor{}
		for j := 0; j < 3*E+3; j++ {
			d := deviceTensor{p: cu.Ptr(1<<32 + j<<20), dtype: cu.BF16}
			if inBlocks(j) {
				d.dtype, d.blocks = devBlocks, format(j)
			}
			w[entry(j)] = d
		}
		return w
	}
	ws := weights(func(int) tensor.DType { return tensor.Q8_0 })
	ly, err := layoutMoE(n, ws, cu.BF16)
	if err != nil {
		t.Fatal(err)
	}
	end := 0
	for j := 0; j < 3*E+3; j++ {
		w := ws[entry(j)]
		if ly.ptrs[j] != uint64(w.p) {
			t.Errorf("entry %d holds %#x, want its matrix's %#x", j, ly.ptrs[j], w.p)
		}
		switch {
		case inBlocks(j):
			if ly.srcs[j] != uint64(w.p) || ly.scratch[j] != end {
				t.Errorf("entry %d in blocks: source %#x, scratch at %d; want %#x at %d", j, ly.srcs[j], ly.scratch[j], w.p, end)
			}
			end += (matrixSize(input(j))*2 + 255) &^ 255
		case ly.srcs[j] != 0 || ly.scratch[j] != -1:
			t.Errorf("entry %d not in blocks: source %#x, scratch %d", j, ly.srcs[j], ly.scratch[j])
		}
	}
	if ly.scratchBytes != end {
		t.Errorf("scratch of %d bytes, want %d", ly.scratchBytes, end)
	}
	want := []struct {
		first, matrices int
		routed          bool
		n               int
	}{{0, E, true, 32 * 64}, {2 * E, E, true, 64 * 32}, {3*E + 1, 1, false, 48 * 64}}
	if len(ly.widen) != len(want) {
		t.Fatalf("%d widening tables, want %d", len(ly.widen), len(want))
	}
	for i, w := range want {
		got := ly.widen[i]
		if got.Src != cu.Ptr(8*w.first) || got.Dst != cu.Ptr(8*w.first) || got.Matrices != w.matrices || got.Experts != w.matrices ||
			got.Routed != w.routed || got.N != w.n || got.Format != tensor.Q8_0 {
			t.Errorf("widening table %d: %+v, want entries from %d, %d matrices, routed %v, %d values", i, got, w.first, w.matrices, w.routed, w.n)
		}
	}
	mixed := weights(func(j int) tensor.DType {
		if j == 1 {
			return tensor.Q4_K
		}
		return tensor.Q8_0
	})
	if _, err := layoutMoE(n, mixed, cu.BF16); err == nil {
		t.Errorf("a kind in two formats: no refusal")
	}
	partly := weights(func(int) tensor.DType { return tensor.Q8_0 })
	partly[entry(E)] = deviceTensor{p: 1 << 40, dtype: devBlocks, blocks: tensor.Q8_0} // one of the experts' up matrices
	if _, err := layoutMoE(n, partly, cu.BF16); err == nil {
		t.Errorf("a kind partly in blocks: no refusal")
	}
}
