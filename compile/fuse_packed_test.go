package compile

import (
	"testing"

	"kiln/ir"
)

// The packed fusions fire only when every output of the split goes to the
// op that replaces it.
func TestFusePacked(t *testing.T) {
	type graph struct {
		qkv, gu, pos, table *ir.Value
		split3, split2      *ir.Node
		att                 *ir.Node
	}
	for _, tc := range []struct {
		name        string
		target      Target
		interleaved bool
		extra       func(b *builder, gr *graph) []*ir.Value // more readers
		swiglu, qkv bool                                    // which fusions fire
	}{
		{"both fire", everything, false, nil, true, true},
		{"interleaved rope", everything, true, nil, true, true},
		{"target lacks both", targetWithout(ir.SwiGLUPacked, ir.RoPEQKVWrite), false, nil, false, false},
		{"gate read elsewhere", everything, false, func(b *builder, gr *graph) []*ir.Value {
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.split2.Outputs[0])}
		}, false, true},
		{"values read elsewhere", everything, false, func(b *builder, gr *graph) []*ir.Value {
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.split3.Outputs[2])}
		}, true, false},
		{"queries read unrotated", everything, false, func(b *builder, gr *graph) []*ir.Value {
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.split3.Outputs[0])}
		}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			gr := &graph{}
			gr.pos = b.Op(ir.Positions, ir.Attrs{})
			gr.table = b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 16, HeadDim: 4}})
			gr.qkv = b.act(16) // 2 query heads, 1 kv head of 4
			gr.split3 = b.Node(ir.Split, ir.Attrs{Sizes: []int{8, 4, 4}}, gr.qkv)
			q := b.Op(ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4, Interleaved: tc.interleaved}, gr.split3.Outputs[0], gr.pos, gr.table)
			w := b.Op(ir.RoPEKVWrite, ir.Attrs{Layer: 2, KVHeads: 1, HeadDim: 4, Interleaved: tc.interleaved},
				gr.split3.Outputs[1], gr.split3.Outputs[2], gr.pos, gr.table)
			gr.att = b.Node(ir.Attention, ir.Attrs{Layer: 2, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 0.5}, q, w)
			gr.gu = b.act(12)
			gr.split2 = b.Node(ir.Split, ir.Attrs{Sizes: []int{6, 6}}, gr.gu)
			act := b.Op(ir.SwiGLU, ir.Attrs{}, gr.split2.Outputs[0], gr.split2.Outputs[1])
			var extra []*ir.Value
			if tc.extra != nil {
				extra = tc.extra(b, gr)
			}
			g := b.outputs(append([]*ir.Value{gr.att.Out(), act}, extra...)...)
			run(t, g, "fuse-packed", fusePacked, tc.target)
			run(t, g, "deadcode", deadcode, tc.target)
			c := countOps(g)
			if got := c[ir.SwiGLUPacked] == 1; got != tc.swiglu || c[ir.SwiGLU] == 1 == tc.swiglu {
				t.Errorf("swiglu_packed %d, swiglu %d: want packed %v", c[ir.SwiGLUPacked], c[ir.SwiGLU], tc.swiglu)
			}
			if got := c[ir.RoPEQKVWrite] == 1; got != tc.qkv || c[ir.RoPEKVWrite] == 1 == tc.qkv {
				t.Errorf("rope_qkv_write %d, rope_kv_write %d: want packed %v", c[ir.RoPEQKVWrite], c[ir.RoPEKVWrite], tc.qkv)
			}
			if tc.qkv {
				f := only(t, g, ir.RoPEQKVWrite)
				a := f.Attrs
				if f.Inputs[0] != gr.qkv || f.Inputs[1] != gr.pos || f.Inputs[2] != gr.table ||
					a.Layer != 2 || a.Heads != 2 || a.KVHeads != 1 || a.HeadDim != 4 || a.Interleaved != tc.interleaved {
					t.Errorf("rope_qkv_write reads %v with %+v", f.Inputs, a)
				}
				if gr.att.Inputs[0] != f.Outputs[0] || gr.att.Inputs[1] != f.Outputs[1] {
					t.Errorf("attention reads %v, want the fused node's q and state", gr.att.Inputs)
				}
				if c[ir.RoPE] != 0 || (c[ir.Split] != 0) != !tc.swiglu {
					t.Errorf("left: rope %d, split %d", c[ir.RoPE], c[ir.Split])
				}
			}
			if tc.swiglu && only(t, g, ir.SwiGLUPacked).Inputs[0] != gr.gu {
				t.Errorf("swiglu_packed does not read the stacked product")
			}
		})
	}
}
