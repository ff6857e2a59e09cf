package compile

import (
	"testing"

	"kiln/ir"
)

func TestFuseSwiGLU(t *testing.T) {
	type graph struct {
		g                   *ir.Graph
		gate, up, silu, mul *ir.Value
	}
	// mlp builds gate/up projections of x and combines them with build.
	mlp := func(t *testing.T, build func(b *builder, gr *graph) []*ir.Value) *graph {
		b := newBuilder(t)
		x := b.act(8)
		gr := &graph{}
		gr.gate = b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("gate", 0, 12, 8))
		gr.up = b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("up", 0, 12, 8))
		outs := build(b, gr)
		gr.g = b.outputs(outs...)
		return gr
	}
	for _, tc := range []struct {
		name   string
		target Target
		build  func(b *builder, gr *graph) []*ir.Value
		fires  bool
	}{
		{"mul(silu(gate), up)", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.up)
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.mul)}
		}, true},
		{"mul(up, silu(gate))", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.up, gr.silu)
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.mul)}
		}, true},
		{"product is a graph output", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.up)
			return []*ir.Value{gr.mul}
		}, true},
		{"target lacks swiglu", targetWithout(ir.SwiGLU), func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.up)
			return []*ir.Value{gr.mul}
		}, false},
		{"silu used twice", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.up)
			return []*ir.Value{b.Op(ir.Add, ir.Attrs{}, gr.mul, gr.silu)}
		}, false},
		{"silu is a graph output", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.up)
			return []*ir.Value{gr.mul, gr.silu}
		}, false},
		{"square of one silu", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.silu, gr.silu)
			return []*ir.Value{gr.mul}
		}, false},
		{"mul without silu", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.mul = b.Op(ir.Mul, ir.Attrs{}, gr.gate, gr.up)
			return []*ir.Value{gr.mul}
		}, false},
		{"silu without mul", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.silu = b.Op(ir.SiLU, ir.Attrs{}, gr.gate)
			return []*ir.Value{b.Op(ir.Add, ir.Attrs{}, gr.silu, gr.up)}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gr := mlp(t, tc.build)
			before := gr.g.String()
			run(t, gr.g, "fuse-swiglu", fuseSwiGLU, tc.target)
			if !tc.fires {
				if after := gr.g.String(); after != before {
					t.Fatalf("fusion fired:\n%v", after)
				}
				return
			}
			sw := only(t, gr.g, ir.SwiGLU)
			if sw.Inputs[0] != gr.gate || sw.Inputs[1] != gr.up {
				t.Errorf("swiglu reads %v, want gate %v and up %v", sw.Inputs, gr.gate, gr.up)
			}
			if n := gr.g.Uses()[gr.mul]; len(n) != 0 {
				t.Errorf("the mul still has readers %v", n)
			}
			for _, o := range gr.g.Outputs {
				if o == gr.mul {
					t.Errorf("graph output still the mul")
				}
			}
			if indexOf(gr.g, sw) > indexOf(gr.g, gr.mul.Def) {
				t.Errorf("swiglu placed after the mul")
			}
			run(t, gr.g, "deadcode", deadcode, tc.target)
			c := countOps(gr.g)
			if c[ir.SiLU] != 0 || c[ir.Mul] != 0 || c[ir.SwiGLU] != 1 {
				t.Errorf("after deadcode: %v", gr.g)
			}
		})
	}
}

func TestFuseSwiGLUTwoLayers(t *testing.T) {
	g := buildTiny(t, tinyConfig())
	run(t, g, "fuse-swiglu", fuseSwiGLU, everything)
	run(t, g, "deadcode", deadcode, everything)
	c := countOps(g)
	if c[ir.SwiGLU] != 2 || c[ir.SiLU] != 0 || c[ir.Mul] != 0 {
		t.Errorf("swiglu %d, silu %d, mul %d; want 2, 0, 0", c[ir.SwiGLU], c[ir.SiLU], c[ir.Mul])
	}
}
