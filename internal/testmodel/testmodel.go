// Package testmodel builds small in-memory models and graphs for tests of the
// packages that consume them (arch, ir, compile).
package testmodel

import (
	"math/rand/v2"
	"testing"

	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// ZeroTensor returns a zero-filled F32 tensor.
func ZeroTensor(name string, shape ...int) *tensor.Tensor {
	s := tensor.Shape(shape)
	return &tensor.Tensor{Name: name, DType: tensor.F32, Shape: s, Data: make([]byte, 4*s.Elements())}
}

// Zeros returns a model with config c whose every tensor is F32 zeros.
func Zeros(c model.Config) *model.Model {
	m := &model.Model{Path: "tiny", Format: "test", Config: c, Tensors: map[string]*tensor.Tensor{}}
	for _, e := range model.ExpectedTensors(&c) {
		m.Tensors[e.Name] = ZeroTensor(e.Name, e.Shape...)
	}
	return m
}

// Random returns a model with config c whose every tensor is F32, drawn
// from N(0, 0.5²) by a generator seeded with seed.
func Random(c model.Config, seed uint64) *model.Model {
	m := Zeros(c)
	r := rand.New(rand.NewPCG(seed, 1))
	for _, name := range m.Names() {
		t := m.Tensors[name]
		vals := make([]float32, t.Shape.Elements())
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * 0.5)
		}
		m.Tensors[name] = tensor.FromF32(name, t.Shape, vals)
	}
	return m
}

// Builder adds nodes to a graph, failing the test on errors.
type Builder struct {
	T testing.TB
	G *ir.Graph
}

// NewBuilder starts an empty graph.
func NewBuilder(t testing.TB) *Builder { return &Builder{T: t, G: &ir.Graph{}} }

// Node adds a node.
func (b *Builder) Node(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Node {
	b.T.Helper()
	n, err := b.G.Add(op, a, in...)
	if err != nil {
		b.T.Fatalf("Add(%v): %v", op, err)
	}
	return n
}

// Op adds a single-output node and returns its output.
func (b *Builder) Op(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Value {
	b.T.Helper()
	return b.Node(op, a, in...).Out()
}
