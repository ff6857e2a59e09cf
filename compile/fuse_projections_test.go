package compile

import (
	"slices"
	"testing"

	"kiln/ir"
	"kiln/tensor"
)

// projections builds x·Wqᵀ, x·Wkᵀ, x·Wvᵀ (Wq [8,8] of 0..63, Wk [4,8] of
// 100..131, Wv [4,8] of 200..231), each with a bias (1000.., 2000.., 3000..)
// where bias says so, and returns the graph with the projections as outputs.
type projGraph struct {
	g        *ir.Graph
	x        *ir.Value
	w, bias  [3]*ir.Value // bias[i] nil when projection i has none
	mm, outs [3]*ir.Value // matmul outputs; projection outputs (after bias)
}

func projections(t *testing.T, bias [3]bool) *projGraph {
	b := newBuilder(t)
	p := &projGraph{x: b.act(8)}
	rows := [3]int{8, 4, 4}
	for i := range 3 {
		p.w[i] = b.weight("w"+string(rune('q'+i)), float32(100*i), rows[i], 8)
		p.mm[i] = b.Op(ir.MatMul, ir.Attrs{}, p.x, p.w[i])
		p.outs[i] = p.mm[i]
		if bias[i] {
			p.bias[i] = b.weight("b"+string(rune('q'+i)), float32(1000*(i+1)), rows[i])
			p.outs[i] = b.Op(ir.AddBias, ir.Attrs{}, p.mm[i], p.bias[i])
		}
	}
	p.g = b.outputs(p.outs[:]...)
	return p
}

func TestFuseQKV(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bias    [3]bool
		stacked bool // biases stacked
	}{
		{"no biases", [3]bool{}, false},
		{"every projection biased", [3]bool{true, true, true}, true},
		{"only q and k biased", [3]bool{true, true, false}, false},
		{"only v biased", [3]bool{false, false, true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := projections(t, tc.bias)
			g := p.g
			run(t, g, "fuse-qkv", fuseQKV, everything)

			split := only(t, g, ir.Split)
			if !slices.Equal(split.Attrs.Sizes, []int{8, 4, 4}) {
				t.Errorf("split sizes %v, want [8 4 4]", split.Attrs.Sizes)
			}
			mms := nodesOf(g, ir.MatMul)
			var mm *ir.Node
			for _, n := range mms {
				if n.Inputs[1].Def.Op == ir.ConcatRows {
					mm = n
				}
			}
			if mm == nil || mm.Inputs[0] != p.x {
				t.Fatalf("no matmul of x by stacked weights:\n%v", g)
			}
			cat := mm.Inputs[1].Def
			if !slices.Equal(cat.Inputs, p.w[:]) {
				t.Errorf("stacked weights %v, want %v", cat.Inputs, p.w)
			}
			if got := cat.Out().Shape; !got.Equal(ir.Shape{16, 8}) {
				t.Errorf("stacked shape %v, want [16,8]", got)
			}
			concats := nodesOf(g, ir.ConcatRows)
			if tc.stacked {
				ab := split.Inputs[0].Def
				if ab.Op != ir.AddBias || ab.Inputs[0] != mm.Out() || ab.Inputs[1].Def.Op != ir.ConcatRows {
					t.Fatalf("split reads %v, want add_bias(matmul, concat_rows)", ab)
				}
				bcat := ab.Inputs[1].Def
				if !slices.Equal(bcat.Inputs, p.bias[:]) || !bcat.Out().Shape.Equal(ir.Shape{16}) {
					t.Errorf("stacked biases %v %v", bcat.Inputs, bcat.Out().Shape)
				}
				if len(concats) != 2 {
					t.Errorf("%d concat_rows, want 2", len(concats))
				}
				for i := range 3 {
					if g.Outputs[i] != split.Outputs[i] {
						t.Errorf("output %d is %v, want split output %d", i, g.Outputs[i], i)
					}
				}
			} else {
				if split.Inputs[0] != mm.Out() {
					t.Errorf("split reads %v, want the matmul", split.Inputs[0])
				}
				if len(concats) != 1 {
					t.Errorf("%d concat_rows, want 1 (no bias stacking)", len(concats))
				}
				// Each projection's own bias (if any) now adds to its slice.
				for i := range 3 {
					want := split.Outputs[i]
					if p.bias[i] != nil {
						ab := p.outs[i].Def
						if ab.Inputs[0] != split.Outputs[i] {
							t.Errorf("bias %d adds to %v, want split output %d", i, ab.Inputs[0], i)
						}
						want = p.outs[i]
					}
					if g.Outputs[i] != want {
						t.Errorf("output %d is %v, want %v", i, g.Outputs[i], want)
					}
				}
			}
			if idx := indexOf(g, cat); idx > indexOf(g, mm) || idx > indexOf(g, p.mm[0].Def) {
				t.Errorf("stacked nodes are not placed before the first projection")
			}

			// Folding turns each stack into a constant of concatenated rows.
			run(t, g, "fold-constants", foldConstants, everything)
			if countOps(g)[ir.ConcatRows] != 0 {
				t.Fatalf("concat_rows survived folding")
			}
			c := mm.Inputs[1].Def
			if c.Op != ir.Const || !c.Out().Shape.Equal(ir.Shape{16, 8}) || c.Attrs.Tensor.DType != tensor.F32 {
				t.Fatalf("stacked weights fold to %v", c)
			}
			var want []float32
			for i := range 3 {
				want = append(want, f32s(t, p.w[i].Def.Attrs.Tensor)...)
			}
			if got := f32s(t, c.Attrs.Tensor); !slices.Equal(got, want) {
				t.Errorf("stacked weights hold %v, want %v", got, want)
			}
			if tc.stacked {
				bc := split.Inputs[0].Def.Inputs[1].Def
				want = want[:0]
				for i := range 3 {
					want = append(want, f32s(t, p.bias[i].Def.Attrs.Tensor)...)
				}
				if got := f32s(t, bc.Attrs.Tensor); bc.Op != ir.Const || !slices.Equal(got, want) {
					t.Errorf("stacked biases fold to %v holding %v, want %v", bc, got, want)
				}
			}

			run(t, g, "deadcode", deadcode, everything)
			for i := range 3 {
				if inGraph(g, p.mm[i].Def) || inGraph(g, p.w[i].Def) {
					t.Errorf("projection %d or its weight survived deadcode", i)
				}
				if tc.stacked && inGraph(g, p.outs[i].Def) {
					t.Errorf("bias add %d survived deadcode", i)
				}
			}
			if n := countOps(g)[ir.MatMul]; n != 1 {
				t.Errorf("%d matmuls, want 1", n)
			}
		})
	}
}

func TestFuseQKVDoesNotFire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target Target
		build  func(b *builder, x *ir.Value) []*ir.Value
	}{
		{"target lacks split", targetWithout(ir.Split), func(b *builder, x *ir.Value) []*ir.Value {
			return []*ir.Value{
				b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("a", 0, 4, 8)),
				b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("b", 0, 4, 8)),
			}
		}},
		{"single projection", everything, func(b *builder, x *ir.Value) []*ir.Value {
			return []*ir.Value{b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("a", 0, 4, 8))}
		}},
		{"projections of different inputs", everything, func(b *builder, x *ir.Value) []*ir.Value {
			y := b.act(8)
			return []*ir.Value{
				b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("a", 0, 4, 8)),
				b.Op(ir.MatMul, ir.Attrs{}, y, b.weight("b", 0, 4, 8)),
			}
		}},
		{"second factor not constant", everything, func(b *builder, x *ir.Value) []*ir.Value {
			table := b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 4, HeadDim: 8}})
			return []*ir.Value{
				b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("a", 0, 4, 8)),
				b.Op(ir.MatMul, ir.Attrs{}, x, table),
			}
		}},
		{"weights of different dtypes", everything, func(b *builder, x *ir.Value) []*ir.Value {
			h := &tensor.Tensor{Name: "h", DType: tensor.F16, Shape: tensor.Shape{4, 8}, Data: make([]byte, 4*8*2)}
			return []*ir.Value{
				b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("a", 0, 4, 8)),
				b.Op(ir.MatMul, ir.Attrs{}, x, b.Op(ir.Weight, ir.Attrs{Name: "h", Tensor: h})),
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			x := b.act(8)
			g := b.outputs(tc.build(b, x)...)
			mms := nodesOf(g, ir.MatMul)
			run(t, g, "fuse-qkv", fuseQKV, tc.target)
			c := countOps(g)
			if c[ir.Split] != 0 || c[ir.ConcatRows] != 0 || !slices.Equal(nodesOf(g, ir.MatMul), mms) {
				t.Errorf("fusion fired:\n%v", g)
			}
		})
	}
}

// Only the projections whose weights share the first one's dtype are stacked.
func TestFuseQKVMixedDTypes(t *testing.T) {
	b := newBuilder(t)
	x := b.act(8)
	q := b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("q", 0, 8, 8))
	h := &tensor.Tensor{Name: "k", DType: tensor.F16, Shape: tensor.Shape{4, 8}, Data: make([]byte, 4*8*2)}
	kmm := b.Node(ir.MatMul, ir.Attrs{}, x, b.Op(ir.Weight, ir.Attrs{Name: "k", Tensor: h}))
	v := b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("v", 0, 4, 8))
	g := b.outputs(q, kmm.Out(), v)
	run(t, g, "fuse-qkv", fuseQKV, everything)
	split := only(t, g, ir.Split)
	if !slices.Equal(split.Attrs.Sizes, []int{8, 4}) {
		t.Errorf("split sizes %v, want [8 4]", split.Attrs.Sizes)
	}
	if g.Outputs[0] != split.Outputs[0] || g.Outputs[1] != kmm.Out() || g.Outputs[2] != split.Outputs[1] {
		t.Errorf("outputs %v", g.Outputs)
	}
}

// A projection read by something besides its bias add disables bias stacking.
func TestFuseQKVBiasWithOtherReader(t *testing.T) {
	b := newBuilder(t)
	x := b.act(8)
	var outs []*ir.Value
	var mms []*ir.Value
	for i := range 2 {
		mm := b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("w", float32(i), 4, 8))
		mms = append(mms, mm)
		outs = append(outs, b.Op(ir.AddBias, ir.Attrs{}, mm, b.weight("b", 0, 4)))
	}
	outs = append(outs, b.Op(ir.SiLU, ir.Attrs{}, mms[0]))
	g := b.outputs(outs...)
	run(t, g, "fuse-qkv", fuseQKV, everything)
	if n := countOps(g)[ir.ConcatRows]; n != 1 {
		t.Errorf("%d concat_rows, want 1 (weights only)", n)
	}
	split := only(t, g, ir.Split)
	if outs[0].Def.Inputs[0] != split.Outputs[0] || outs[2].Def.Inputs[0] != split.Outputs[0] {
		t.Errorf("readers of the first projection not redirected:\n%v", g)
	}
}

func TestFuseQKVLlama(t *testing.T) {
	for _, bias := range []bool{false, true} {
		c := tinyConfig()
		c.QKVBias = bias
		g := buildTiny(t, c)
		run(t, g, "fuse-qkv", fuseQKV, everything)
		var sizes [][]int
		for _, s := range nodesOf(g, ir.Split) {
			sizes = append(sizes, s.Attrs.Sizes)
		}
		want := [][]int{{8, 4, 4}, {12, 12}, {8, 4, 4}, {12, 12}}
		if !slices.EqualFunc(sizes, want, slices.Equal) {
			t.Errorf("bias %v: split sizes %v, want %v", bias, sizes, want)
		}
		n := countOps(g)
		wantCat := 4
		if bias {
			wantCat = 6
		}
		if n[ir.ConcatRows] != wantCat {
			t.Errorf("bias %v: %d concat_rows, want %d", bias, n[ir.ConcatRows], wantCat)
		}
		run(t, g, "fold-constants", foldConstants, everything)
		run(t, g, "deadcode", deadcode, everything)
		n = countOps(g)
		// Per layer: qkv, o, gate/up, down; then the head.
		if n[ir.MatMul] != 4*c.NumLayers+1 || n[ir.ConcatRows] != 0 {
			t.Errorf("bias %v: %d matmuls, %d concat_rows", bias, n[ir.MatMul], n[ir.ConcatRows])
		}
		if bias && n[ir.AddBias] != c.NumLayers {
			t.Errorf("%d add_bias, want one per layer", n[ir.AddBias])
		}
	}
}

func TestHoistSources(t *testing.T) {
	b := newBuilder(t)
	x := b.act(8)               // weight, tokens, embed
	w := b.weight("w", 0, 4, 8) // weight
	y := b.Op(ir.MatMul, ir.Attrs{}, x, w)
	pos := b.Op(ir.Positions, ir.Attrs{})
	g := b.outputs(y, pos)
	orig := slices.Clone(g.Nodes)
	hoistSources(g)
	want := []*ir.Node{orig[0], orig[1], orig[3], orig[5], orig[2], orig[4]}
	if !slices.Equal(g.Nodes, want) {
		t.Errorf("hoisted order %v, want %v", g.Nodes, want)
	}
	if err := g.Verify(); err != nil {
		t.Error(err)
	}
}
