package ir_test

import (
	"fmt"
	"testing"

	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

var zeros = testmodel.ZeroTensor

// tinyLlama is a 2-layer Llama with zero-filled F32 weights.
func tinyLlama() *model.Model {
	return testmodel.Zeros(model.Config{
		Arch: "llama", HiddenSize: 8, IntermediateSize: 12, NumLayers: 2,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 4, VocabSize: 16, MaxPositions: 32,
		RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
	})
}

// builder adds nodes to a graph, failing the test on errors.
type builder struct{ *testmodel.Builder }

func newBuilder(t testing.TB) *builder { return &builder{testmodel.NewBuilder(t)} }

func (b *builder) weight(name string, shape ...int) *ir.Value {
	b.T.Helper()
	return b.Op(ir.Weight, ir.Attrs{Name: name, Tensor: zeros(name, shape...)})
}

func typed(v *ir.Value) string {
	if ir.IsState(v) {
		return "state"
	}
	return fmt.Sprintf("%v%v", v.DType, v.Shape)
}
