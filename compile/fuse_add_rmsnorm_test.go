package compile

import (
	"testing"

	"kiln/ir"
)

func TestFuseAddRMSNorm(t *testing.T) {
	type graph struct {
		g          *ir.Graph
		x, r, w    *ir.Value
		sum, norm  *ir.Value
		sumReaders []*ir.Node // nodes other than the norm reading the sum
	}
	for _, tc := range []struct {
		name   string
		target Target
		build  func(b *builder, gr *graph) []*ir.Value
		fires  bool
		atNorm bool // the fused node must stand where the norm stood
	}{
		{"residual block", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.w = b.weight("w", 1, 8)
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, gr.sum, gr.w)
			h := b.Op(ir.MatMul, ir.Attrs{}, gr.norm, b.weight("p", 0, 8, 8))
			next := b.Node(ir.Add, ir.Attrs{}, gr.sum, h)
			gr.sumReaders = []*ir.Node{next}
			return []*ir.Value{next.Out()}
		}, true, false},
		{"norm weight defined after the add", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			gr.w = b.weight("w", 1, 8)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, gr.sum, gr.w)
			next := b.Node(ir.Add, ir.Attrs{}, gr.sum, gr.norm)
			gr.sumReaders = []*ir.Node{next}
			return []*ir.Value{next.Out()}
		}, true, true},
		{"sum read between add and late-defined weight", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			early := b.Node(ir.SiLU, ir.Attrs{}, gr.sum)
			gr.w = b.weight("w", 1, 8)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, gr.sum, gr.w)
			return []*ir.Value{b.Op(ir.Add, ir.Attrs{}, early.Out(), gr.norm)}
		}, false, false},
		{"sum is a graph output", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.w = b.weight("w", 1, 8)
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, gr.sum, gr.w)
			return []*ir.Value{gr.norm, gr.sum}
		}, true, false},
		{"target lacks add_rmsnorm", targetWithout(ir.AddRMSNorm), func(b *builder, gr *graph) []*ir.Value {
			gr.w = b.weight("w", 1, 8)
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, gr.sum, gr.w)
			return []*ir.Value{gr.norm}
		}, false, false},
		{"norm of a non-add", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.w = b.weight("w", 1, 8)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, b.Op(ir.Mul, ir.Attrs{}, gr.x, gr.r), gr.w)
			return []*ir.Value{gr.norm}
		}, false, false},
		{"norm of selected rows of an add", everything, func(b *builder, gr *graph) []*ir.Value {
			gr.w = b.weight("w", 1, 8)
			gr.sum = b.Op(ir.Add, ir.Attrs{}, gr.x, gr.r)
			gr.norm = b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-6}, b.Op(ir.SelectRows, ir.Attrs{}, gr.sum), gr.w)
			return []*ir.Value{gr.norm}
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			gr := &graph{}
			gr.x, gr.r = b.act(8), b.act(8)
			g := b.outputs(tc.build(b, gr)...)
			gr.g = g
			before := g.String()
			addNode, normNode := gr.sum, gr.norm.Def
			var addAt, normAt int
			if addNode != nil {
				addAt = indexOf(g, addNode.Def)
			}
			normAt = indexOf(g, normNode)
			run(t, g, "fuse-add-rmsnorm", fuseAddRMSNorm, tc.target)
			if !tc.fires {
				if after := g.String(); after != before {
					t.Fatalf("fusion fired:\n%v", after)
				}
				return
			}
			f := only(t, g, ir.AddRMSNorm)
			if f.Inputs[0] != gr.x || f.Inputs[1] != gr.r || f.Inputs[2] != gr.w {
				t.Errorf("fused reads %v, want %v %v %v", f.Inputs, gr.x, gr.r, gr.w)
			}
			if f.Attrs.Eps != 1e-6 {
				t.Errorf("eps %g, want 1e-6", f.Attrs.Eps)
			}
			want := addAt
			if tc.atNorm {
				want = normAt
			}
			if got := indexOf(g, f); got != want {
				t.Errorf("fused node at %d, want %d", got, want)
			}
			uses := g.Uses()
			if len(uses[gr.sum]) != 0 || len(uses[gr.norm]) != 0 {
				t.Errorf("sum or norm still read: %v %v", uses[gr.sum], uses[gr.norm])
			}
			for _, r := range gr.sumReaders {
				if r.Inputs[0] != f.Outputs[0] {
					t.Errorf("%v reads %v, want the fused sum %v", r.Op, r.Inputs[0], f.Outputs[0])
				}
			}
			for _, o := range g.Outputs {
				if o == gr.sum || o == gr.norm {
					t.Errorf("graph output %v not redirected", o)
				}
			}
			run(t, g, "deadcode", deadcode, tc.target)
			if c := countOps(g); c[ir.RMSNorm] != 0 || c[ir.AddRMSNorm] != 1 {
				t.Errorf("after deadcode:\n%v", g)
			}
		})
	}
}

// Two norms of one sum: the first fuses, the second then reads the fused
// sum and stays a plain norm.
func TestFuseAddRMSNormTwoNorms(t *testing.T) {
	b := newBuilder(t)
	x, r := b.act(8), b.act(8)
	w1, w2 := b.weight("w1", 1, 8), b.weight("w2", 2, 8)
	sum := b.Op(ir.Add, ir.Attrs{}, x, r)
	n1 := b.Op(ir.RMSNorm, ir.Attrs{Eps: 1e-5}, sum, w1)
	n2 := b.Node(ir.RMSNorm, ir.Attrs{Eps: 1e-5}, sum, w2)
	g := b.outputs(n1, n2.Out())
	run(t, g, "fuse-add-rmsnorm", fuseAddRMSNorm, everything)
	f := only(t, g, ir.AddRMSNorm)
	if f.Inputs[2] != w1 || n2.Inputs[0] != f.Outputs[0] || g.Outputs[0] != f.Outputs[1] {
		t.Errorf("unexpected rewrite:\n%v", g)
	}
}

func TestFuseAddRMSNormLlama(t *testing.T) {
	c := tinyConfig()
	for _, layers := range []int{1, 2, 3} {
		c.NumLayers = layers
		g := buildTiny(t, c)
		run(t, g, "fuse-add-rmsnorm", fuseAddRMSNorm, everything)
		run(t, g, "deadcode", deadcode, everything)
		n := countOps(g)
		// Every norm but the first layer's input norm (of the embedding) and
		// the final norm (of the selected rows) follows a residual add; the
		// last layer's MLP add feeds the row selection and stays.
		if n[ir.AddRMSNorm] != 2*layers-1 || n[ir.RMSNorm] != 2 || n[ir.Add] != 1 {
			t.Errorf("%d layers: add_rmsnorm %d, rmsnorm %d, add %d; want %d, 2, 1", layers, n[ir.AddRMSNorm], n[ir.RMSNorm], n[ir.Add], 2*layers-1)
		}
	}
}
