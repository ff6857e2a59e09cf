package compile

import (
	"fmt"
	"strings"
	"testing"

	"kiln/arch"
	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// fakeTarget supports a configurable set of ops.
type fakeTarget struct {
	name string
	ops  map[ir.Op]bool
}

func (t fakeTarget) Name() string           { return t.name }
func (t fakeTarget) Supports(op ir.Op) bool { return t.ops[op] }

// targetWithout supports every op except those listed.
func targetWithout(missing ...ir.Op) fakeTarget {
	t := fakeTarget{name: "fake", ops: map[ir.Op]bool{}}
	for _, op := range ir.AllOps() {
		t.ops[op] = true
	}
	for _, op := range missing {
		delete(t.ops, op)
	}
	return t
}

var everything = targetWithout()

// seq returns an F32 tensor whose elements are start, start+1, ...
func seq(name string, start float32, shape ...int) *tensor.Tensor {
	s := tensor.Shape(shape)
	vals := make([]float32, s.Elements())
	for i := range vals {
		vals[i] = start + float32(i)
	}
	return tensor.FromF32(name, s, vals)
}

// builder adds nodes to a graph, failing the test on errors.
type builder struct{ *testmodel.Builder }

func newBuilder(t testing.TB) *builder { return &builder{testmodel.NewBuilder(t)} }

// weight adds an F32 weight filled with start, start+1, ...
func (b *builder) weight(name string, start float32, shape ...int) *ir.Value {
	b.T.Helper()
	return b.Op(ir.Weight, ir.Attrs{Name: name, Tensor: seq(name, start, shape...)})
}

// act returns an f32[T,d] activation (an embedding lookup).
func (b *builder) act(d int) *ir.Value {
	b.T.Helper()
	return b.Op(ir.Embed, ir.Attrs{}, b.weight(fmt.Sprintf("emb%d_%d", d, len(b.G.Nodes)), 0, 16, d), b.Op(ir.Tokens, ir.Attrs{}))
}

func (b *builder) outputs(vs ...*ir.Value) *ir.Graph {
	vs = append([]*ir.Value(nil), vs...) // passes rewrite g.Outputs in place
	b.T.Helper()
	b.G.Outputs = vs
	if err := b.G.Verify(); err != nil {
		b.T.Fatalf("test graph does not verify: %v\n%v", err, b.G)
	}
	return b.G
}

// run applies a pass and checks that the graph still verifies.
func run(t *testing.T, g *ir.Graph, name string, pass func(*ir.Graph, Target) error, tgt Target) {
	t.Helper()
	if err := pass(g, tgt); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := g.Verify(); err != nil {
		t.Fatalf("graph does not verify after %s: %v\n%v", name, err, g)
	}
}

func countOps(g *ir.Graph) map[ir.Op]int {
	c := map[ir.Op]int{}
	for _, n := range g.Nodes {
		c[n.Op]++
	}
	return c
}

func nodesOf(g *ir.Graph, op ir.Op) []*ir.Node {
	var ns []*ir.Node
	for _, n := range g.Nodes {
		if n.Op == op {
			ns = append(ns, n)
		}
	}
	return ns
}

func only(t *testing.T, g *ir.Graph, op ir.Op) *ir.Node {
	t.Helper()
	ns := nodesOf(g, op)
	if len(ns) != 1 {
		t.Fatalf("%d %v nodes, want 1:\n%v", len(ns), op, g)
	}
	return ns[0]
}

func indexOf(g *ir.Graph, n *ir.Node) int {
	for i, x := range g.Nodes {
		if x == n {
			return i
		}
	}
	return -1
}

func inGraph(g *ir.Graph, n *ir.Node) bool { return indexOf(g, n) >= 0 }

func f32s(t *testing.T, tt *tensor.Tensor) []float32 {
	t.Helper()
	v, err := tt.F32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// tinyConfig is a 2-layer Llama: hidden 8, 2 heads over 1 kv head of 4, ffn 12.
func tinyConfig() model.Config {
	return model.Config{
		Arch: "llama", HiddenSize: 8, IntermediateSize: 12, NumLayers: 2,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 4, VocabSize: 16, MaxPositions: 32,
		RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
	}
}

// tinyModel returns a model of c with zero-filled F32 tensors of the
// canonical names.
func tinyModel(c model.Config) *model.Model { return testmodel.Zeros(c) }

func buildTiny(t testing.TB, c model.Config) *ir.Graph {
	t.Helper()
	g, err := arch.Build(tinyModel(c), arch.Options{})
	if err != nil {
		t.Fatalf("arch.Build: %v", err)
	}
	return g
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}
