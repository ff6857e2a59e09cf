package ir_test

import (
	"fmt"
	"testing"

	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// zeros returns a zero-filled F32 tensor.
func zeros(name string, shape ...int) *tensor.Tensor {
	s := tensor.Shape(shape)
	return &tensor.Tensor{Name: name, DType: tensor.F32, Shape: s, Data: make([]byte, 4*s.Elements())}
}

// tinyLlama is a 2-layer Llama with zero-filled F32 weights.
func tinyLlama() *model.Model {
	return testmodel.Zeros(model.Config{
		Arch: "llama", HiddenSize: 8, IntermediateSize: 12, NumLayers: 2,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 4, VocabSize: 16, MaxPositions: 32,
		RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
	})
}

// builder adds nodes to a graph, failing the test on errors.
type builder struct {
	t testing.TB
	g *ir.Graph
}

func newBuilder(t testing.TB) *builder { return &builder{t: t, g: &ir.Graph{}} }

func (b *builder) node(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Node {
	b.t.Helper()
	n, err := b.g.Add(op, a, in...)
	if err != nil {
		b.t.Fatalf("Add(%v): %v", op, err)
	}
	return n
}

func (b *builder) op(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Value {
	b.t.Helper()
	return b.node(op, a, in...).Out()
}

func (b *builder) weight(name string, shape ...int) *ir.Value {
	b.t.Helper()
	return b.op(ir.Weight, ir.Attrs{Name: name, Tensor: zeros(name, shape...)})
}

func typed(v *ir.Value) string {
	if ir.IsState(v) {
		return "state"
	}
	return fmt.Sprintf("%v%v", v.DType, v.Shape)
}
