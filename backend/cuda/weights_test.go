package cuda

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"kiln/arch"
	"kiln/backend/cuda/cu"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// TestScaleRows: the upload's scaling of FP8 matrices (the host side of
// widening them, no GPU needed) gives each decoded element its row's
// scale from any starting element, per row and per tensor, and leaves
// other tensors alone.
func TestScaleRows(t *testing.T) {
	const n, k = 4, 3
	codes := make([]byte, n*k)
	for i := range codes {
		codes[i] = byte(0x30 + i)
	}
	for _, scales := range [][]float32{{0.5, 2, 3, 0.25}, {4}} {
		w := &tensor.Tensor{Name: "w", DType: tensor.F8_E4M3, Shape: tensor.Shape{n, k}, Data: codes, Scales: scales}
		want, err := w.F32s()
		if err != nil {
			t.Fatal(err)
		}
		for first := 0; first < n*k; first += 5 {
			f := make([]float32, min(7, n*k-first))
			if err := tensor.ToF32(w.DType, codes[first:first+len(f)], f); err != nil {
				t.Fatal(err)
			}
			scaleRows(w, first, f)
			for i, v := range f {
				if v != want[first+i] {
					t.Fatalf("%d scales, from %d: element %d = %v, want %v", len(scales), first, first+i, v, want[first+i])
				}
			}
		}
	}
	plain := tensor.FromF32("p", tensor.Shape{2, 2}, []float32{1, 2, 3, 4})
	f := []float32{1, 2, 3, 4}
	scaleRows(plain, 0, f)
	if f[3] != 4 {
		t.Errorf("a float32 tensor was scaled: %v", f)
	}
}

// TestCopyParallel: the upload's copy on every CPU copies what copy does,
// for sizes below, at and across its parts' bounds, into a longer or a
// shorter destination.
func TestCopyParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, copyPart - 1, copyPart, 2*copyPart + 7, 5*copyPart + 3} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		for _, extra := range []int{0, 5, -1} {
			if n+extra < 0 {
				continue
			}
			dst, want := make([]byte, n+extra), make([]byte, n+extra)
			for i := range dst {
				dst[i] = 0xA5
				want[i] = 0xA5
			}
			copy(want, src)
			copyParallel(dst, src)
			if !bytes.Equal(dst, want) {
				t.Fatalf("%d bytes into %d: the copies differ", n, n+extra)
			}
		}
	}
}

// TestWeightDTypesLogits: an FP8 LM head stays in f32-output form (the
// activation dtype, widened) whether the logits come straight from it or
// through a soft cap (Gemma 2) — products into the f32 logits do not run
// in FP8 — while another FP8 matrix stays E4M3; a mixture's matrices take
// the activation dtype.
func TestWeightDTypesLogits(t *testing.T) {
	for _, softCap := range []float64{0, 30} {
		c := model.Config{Arch: "llama", HiddenSize: 32, IntermediateSize: 32, NumLayers: 1, NumHeads: 2, NumKVHeads: 2, HeadDim: 16,
			VocabSize: 64, MaxPositions: 32, RMSNormEps: 1e-5, RopeTheta: 10000, FinalSoftCap: softCap}
		m := testmodel.Zeros(c)
		for _, name := range []string{model.HeadName, model.LayerName(0, "mlp.down_proj.weight")} {
			x := m.Tensors[name]
			m.Tensors[name] = &tensor.Tensor{Name: name, DType: tensor.F8_E4M3, Shape: x.Shape, Data: make([]byte, x.Shape.Elements())}
		}
		g, err := arch.Build(m, arch.Options{ContextLen: 32})
		if err != nil {
			t.Fatal(err)
		}
		want := weightDTypes(g, cu.BF16, true, false, false)
		checkExperts(t, softCap)
		for n, dt := range want {
			switch n.Attrs.Name {
			case model.HeadName:
				if dt != cu.BF16 {
					t.Errorf("soft cap %g: the head is %v, want bf16", softCap, dt)
				}
			case model.LayerName(0, "mlp.down_proj.weight"):
				if dt != cu.F8E4M3 {
					t.Errorf("soft cap %g: down_proj is %v, want e4m3", softCap, dt)
				}
			}
		}
	}
}

// checkExperts: a mixture's FP8 matrices take the activation dtype (the
// expert kernels read no other).
func checkExperts(t *testing.T, softCap float64) {
	c := model.Config{Arch: "mixtral", HiddenSize: 32, IntermediateSize: 32, NumLayers: 1, NumHeads: 2, NumKVHeads: 2, HeadDim: 16,
		VocabSize: 64, MaxPositions: 32, RMSNormEps: 1e-5, RopeTheta: 10000, FinalSoftCap: softCap, NumExperts: 2, ExpertsPerToken: 1}
	m := testmodel.Zeros(c)
	gate, _, _ := c.MoEExpert(0, 1)
	x := m.Tensors[gate]
	m.Tensors[gate] = &tensor.Tensor{Name: gate, DType: tensor.F8_E4M3, Shape: x.Shape, Data: make([]byte, x.Shape.Elements())}
	g, err := arch.Build(m, arch.Options{ContextLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	for n, dt := range weightDTypes(g, cu.BF16, true, false, false) {
		if n.Attrs.Name == gate && dt != cu.BF16 {
			t.Errorf("an FP8 expert's gate is %v, want bf16", dt)
		}
	}
	// A Q8_0 expert's up matrix stays in its blocks where blocks and
	// experts' blocks are kept (widened a step at a time, moe.go), the
	// router in bf16.
	_, up, _ := c.MoEExpert(0, 0)
	x = m.Tensors[up]
	nb, err := tensor.Q8_0.Bytes(x.Shape.Elements())
	if err != nil {
		t.Fatal(err)
	}
	m.Tensors[up] = &tensor.Tensor{Name: up, DType: tensor.Q8_0, Shape: x.Shape, Data: make([]byte, nb)}
	if g, err = arch.Build(m, arch.Options{ContextLen: 32}); err != nil {
		t.Fatal(err)
	}
	for _, blocks := range []bool{true, false} {
		want := map[string]cu.DType{up: cu.BF16, c.MoERouter(0): cu.BF16}
		if blocks {
			want[up] = devBlocks
		}
		seen := 0
		for n, dt := range weightDTypes(g, cu.BF16, false, blocks, true) {
			if w, ok := want[n.Attrs.Name]; ok {
				seen++
				if dt != w {
					t.Errorf("blocks %v: %s is %v, want %v", blocks, n.Attrs.Name, dt, w)
				}
			}
		}
		if seen != len(want) {
			t.Errorf("blocks %v: %d of %v in the graph", blocks, seen, want)
		}
		for n, dt := range weightDTypes(g, cu.BF16, false, blocks, false) { // without Backend.ExpertBlocks
			if n.Attrs.Name == up && dt != cu.BF16 {
				t.Errorf("blocks %v: widened, the expert's up matrix is %v", blocks, dt)
			}
		}
	}
}
