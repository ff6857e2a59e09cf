package compile

import (
	"testing"

	"kiln/ir"
)

// In a compiled Llama every layer's stacked gate/up and Q/K/V products have
// their epilogue readers, right after them in the node order; the plans
// keep the products' inputs apart from the readers' outputs (checkPlan).
func TestEpilogueReadersLlama(t *testing.T) {
	c := tinyConfig()
	comp := compileTiny(t, c, everything)
	g := comp.Graph
	fused := EpilogueReaders(g)
	count := map[ir.Op]int{}
	for prod, reader := range fused {
		count[reader.Op]++
		for i, n := range g.Nodes {
			if n == prod && (i+1 >= len(g.Nodes) || g.Nodes[i+1] != reader) {
				t.Errorf("%v does not follow its product", reader.Op)
			}
		}
	}
	if count[ir.SwiGLUPacked] != c.NumLayers || count[ir.RoPEQKVWrite] != c.NumLayers || len(fused) != 2*c.NumLayers {
		t.Errorf("epilogue readers %v, want swiglu_packed and rope_qkv_write once a layer (%d layers)", count, c.NumLayers)
	}
	for _, b := range []Bucket{{1, 1}, {8, 8}, {64, 2}} {
		p, err := comp.Plan(b)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, g, p)
	}
}

// A product read by anything besides the one op, read as another input, or
// a graph output has no epilogue reader.
func TestEpilogueReadersOnlySoleReader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(b *builder, gu *ir.Value) []*ir.Value
		fused bool
	}{
		{"sole reader", func(b *builder, gu *ir.Value) []*ir.Value {
			return []*ir.Value{b.Op(ir.SwiGLUPacked, ir.Attrs{}, gu)}
		}, true},
		{"read elsewhere too", func(b *builder, gu *ir.Value) []*ir.Value {
			return []*ir.Value{b.Op(ir.SwiGLUPacked, ir.Attrs{}, gu), b.Op(ir.SelectRows, ir.Attrs{}, gu)}
		}, false},
		{"graph output", func(b *builder, gu *ir.Value) []*ir.Value {
			return []*ir.Value{b.Op(ir.SwiGLUPacked, ir.Attrs{}, gu), gu}
		}, false},
		{"not an epilogue op", func(b *builder, gu *ir.Value) []*ir.Value {
			return []*ir.Value{b.Op(ir.SiLU, ir.Attrs{}, gu)}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			x := b.act(8)
			gu := b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("w", 0, 12, 8))
			g := b.outputs(tc.build(b, gu)...)
			if got := len(EpilogueReaders(g)) == 1; got != tc.fused {
				t.Errorf("fused %v, want %v", got, tc.fused)
			}
		})
	}
}
