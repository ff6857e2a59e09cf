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

// In a compiled Llama the output projection of every layer and the down
// projection of every layer but the last (whose sum the final norm takes
// apart from its rows' selection) are read by the AddRMSNorm right after
// them alone; the plans keep the products' inputs apart from the norms'
// outputs (checkPlan), so that a product may write the norm's sum itself.
func TestResidualReadersLlama(t *testing.T) {
	c := tinyConfig()
	comp := compileTiny(t, c, everything)
	g := comp.Graph
	readers := ResidualReaders(g)
	for prod, reader := range readers {
		if reader.Op != ir.AddRMSNorm {
			t.Errorf("residual reader %v", reader.Op)
		}
		for i, n := range g.Nodes {
			if n == prod && (i+1 >= len(g.Nodes) || g.Nodes[i+1] != reader) {
				t.Errorf("%v does not follow its product", reader.Op)
			}
		}
	}
	if len(readers) != 2*c.NumLayers-1 {
		t.Errorf("%d residual readers, want %d (%d layers)", len(readers), 2*c.NumLayers-1, c.NumLayers)
	}
	for _, b := range []Bucket{{1, 1}, {8, 8}, {64, 2}} {
		p, err := comp.Plan(b)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, g, p)
		for prod, reader := range readers {
			x, sum := p.Buffers[prod.Inputs[0]], p.Buffers[reader.Outputs[0]]
			if x.Offset < sum.Offset+sum.Bytes && sum.Offset < x.Offset+x.Bytes {
				t.Errorf("%+v: the sum of %v shares the memory of its product's input", b, reader.Op)
			}
		}
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
