package compile

import (
	"testing"

	"kiln/ir"
)

func TestFuseRoPEKVWrite(t *testing.T) {
	type graph struct {
		k, v, pos, table *ir.Value
		rope, write, att *ir.Node
	}
	kvAttrs := ir.Attrs{Layer: 3, KVHeads: 1, HeadDim: 4}
	for _, tc := range []struct {
		name        string
		target      Target
		interleaved bool
		build       func(b *builder, gr *graph) []*ir.Value
		fires       bool
	}{
		{"roped keys written", everything, false, nil, true},
		{"interleaved rope", everything, true, nil, true},
		{"target lacks rope_kv_write", targetWithout(ir.RoPEKVWrite), false, nil, false},
		{"rotated keys read elsewhere", everything, false, func(b *builder, gr *graph) []*ir.Value {
			return []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, gr.rope.Out())}
		}, false},
		{"rotated keys are a graph output", everything, false, func(b *builder, gr *graph) []*ir.Value {
			return []*ir.Value{gr.rope.Out()}
		}, false},
		{"keys written unrotated", everything, false, func(b *builder, gr *graph) []*ir.Value {
			gr.rope = nil
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			gr := &graph{}
			gr.pos = b.Op(ir.Positions, ir.Attrs{})
			gr.table = b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 16, HeadDim: 4}})
			gr.k, gr.v = b.act(4), b.act(4)
			q := b.Op(ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4, Interleaved: tc.interleaved}, b.act(8), gr.pos, gr.table)
			gr.rope = b.Node(ir.RoPE, ir.Attrs{Heads: 1, HeadDim: 4, Interleaved: tc.interleaved}, gr.k, gr.pos, gr.table)
			var extra []*ir.Value
			if tc.build != nil {
				extra = tc.build(b, gr)
			}
			keys := gr.k
			if gr.rope != nil {
				keys = gr.rope.Out()
			}
			gr.write = b.Node(ir.KVWrite, kvAttrs, keys, gr.v)
			gr.att = b.Node(ir.Attention, ir.Attrs{Layer: 3, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 0.5}, q, gr.write.Out())
			g := b.outputs(append([]*ir.Value{gr.att.Out()}, extra...)...)
			before := g.String()
			writeAt := indexOf(g, gr.write)

			run(t, g, "fuse-rope-kv-write", fuseRoPEKVWrite, tc.target)
			if !tc.fires {
				if after := g.String(); after != before {
					t.Fatalf("fusion fired:\n%v", after)
				}
				return
			}
			f := only(t, g, ir.RoPEKVWrite)
			if f.Inputs[0] != gr.k || f.Inputs[1] != gr.v || f.Inputs[2] != gr.pos || f.Inputs[3] != gr.table {
				t.Errorf("fused reads %v, want k, v, pos, table = %v %v %v %v", f.Inputs, gr.k, gr.v, gr.pos, gr.table)
			}
			a := f.Attrs
			if a.Layer != 3 || a.KVHeads != 1 || a.HeadDim != 4 || a.Interleaved != tc.interleaved {
				t.Errorf("fused attrs %+v", a)
			}
			if inGraph(g, gr.write) {
				t.Errorf("the replaced kv_write is still in the graph")
			}
			if indexOf(g, f) != writeAt {
				t.Errorf("fused node at %d, want the write's place %d", indexOf(g, f), writeAt)
			}
			if gr.att.Inputs[1] != f.Out() {
				t.Errorf("attention reads %v, want the fused state", gr.att.Inputs[1])
			}
			run(t, g, "deadcode", deadcode, tc.target)
			if c := countOps(g); c[ir.RoPE] != 1 || c[ir.KVWrite] != 0 || c[ir.RoPEKVWrite] != 1 {
				t.Errorf("after deadcode, rope %d (want 1: the queries'), kv_write %d, rope_kv_write %d", c[ir.RoPE], c[ir.KVWrite], c[ir.RoPEKVWrite])
			}
		})
	}
}

// A RoPE whose head split differs from the cache's cannot become one
// RoPEKVWrite (the fused op rotates by the cache's head dim); the rule must
// leave such a graph alone rather than fail.
func TestFuseRoPEKVWriteHeadMismatch(t *testing.T) {
	b := newBuilder(t)
	pos := b.Op(ir.Positions, ir.Attrs{})
	table := b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 16, HeadDim: 4}})
	k := b.Op(ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, b.act(8), pos, table)
	w := b.Op(ir.KVWrite, ir.Attrs{KVHeads: 1, HeadDim: 8}, k, b.act(8))
	att := b.Op(ir.Attention, ir.Attrs{Heads: 1, KVHeads: 1, HeadDim: 8, Scale: 1}, b.act(8), w)
	g := b.outputs(att)
	before := g.String()
	run(t, g, "fuse-rope-kv-write", fuseRoPEKVWrite, everything)
	if g.String() != before {
		t.Errorf("fusion fired:\n%v", g)
	}
}

func TestFuseRoPEKVWriteLlama(t *testing.T) {
	c := tinyConfig()
	g := buildTiny(t, c)
	run(t, g, "fuse-rope-kv-write", fuseRoPEKVWrite, everything)
	run(t, g, "deadcode", deadcode, everything)
	n := countOps(g)
	if n[ir.RoPEKVWrite] != c.NumLayers || n[ir.KVWrite] != 0 || n[ir.RoPE] != c.NumLayers {
		t.Errorf("rope_kv_write %d, kv_write %d, rope %d", n[ir.RoPEKVWrite], n[ir.KVWrite], n[ir.RoPE])
	}
	for i, f := range nodesOf(g, ir.RoPEKVWrite) {
		if f.Attrs.Layer != i {
			t.Errorf("write %d has layer %d", i, f.Attrs.Layer)
		}
	}
	for _, r := range nodesOf(g, ir.RoPE) {
		if r.Attrs.Heads != c.NumHeads {
			t.Errorf("a rope of %d heads (keys) survived", r.Attrs.Heads)
		}
	}
}
