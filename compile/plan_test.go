package compile

import (
	"math/rand/v2"
	"testing"

	"kiln/ir"
	"kiln/model"
)

func compileTiny(t *testing.T, c model.Config, tgt Target) *Compiled {
	t.Helper()
	comp, err := Compile(buildTiny(t, c), tgt, Options{Verify: true})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return comp
}

// checkPlan verifies a plan's invariants against liveness computed here.
func checkPlan(t *testing.T, g *ir.Graph, p *Plan) {
	t.Helper()
	type span struct{ def, last int }
	live := map[*ir.Value]*span{}
	var vals []*ir.Value
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if s, ok := live[in]; ok {
				s.last = i
			}
		}
		for _, o := range n.Outputs {
			if ir.IsState(o) || n.Op == ir.Weight || n.Op == ir.Const {
				if _, ok := p.Buffers[o]; ok {
					t.Errorf("%v (%v) has a buffer", o, n.Op)
				}
				continue
			}
			live[o] = &span{i, i}
			vals = append(vals, o)
		}
	}
	for _, o := range g.Outputs {
		if s, ok := live[o]; ok {
			s.last = len(g.Nodes)
		}
	}
	// A product's inputs live through the op its epilogue may compute,
	// and through the norm whose residual add it may compute.
	index := map[*ir.Node]int{}
	for i, n := range g.Nodes {
		index[n] = i
	}
	for _, readers := range liveThrough(g) {
		for prod, reader := range readers {
			for _, in := range prod.Inputs {
				if s, ok := live[in]; ok {
					s.last = max(s.last, index[reader])
				}
			}
		}
	}
	if len(p.Buffers) != len(vals) {
		t.Errorf("%d buffers for %d activations", len(p.Buffers), len(vals))
	}
	sum := 0
	for _, v := range vals {
		buf, ok := p.Buffers[v]
		if !ok {
			t.Errorf("%v (%v) has no buffer", v, v.Def.Op)
			continue
		}
		sum += buf.Bytes
		need := v.Shape.Elements(p.Bindings) * 4
		if buf.Offset%Align != 0 || buf.Bytes%Align != 0 || buf.Bytes < need || buf.Bytes >= need+Align {
			t.Errorf("%v: buffer %+v for %d bytes (align %d)", v, buf, need, Align)
		}
		if buf.Offset < 0 || buf.Offset+buf.Bytes > p.ArenaBytes {
			t.Errorf("%v: buffer %+v outside the arena of %d", v, buf, p.ArenaBytes)
		}
	}
	if sum != p.UnsharedBytes {
		t.Errorf("UnsharedBytes %d, buffers sum to %d", p.UnsharedBytes, sum)
	}
	if p.ArenaBytes > p.UnsharedBytes {
		t.Errorf("arena %d larger than unshared %d", p.ArenaBytes, p.UnsharedBytes)
	}
	// Buffers that overlap in memory must not be live at once (closed
	// intervals: a value is live from its producer to its last reader).
	for i, a := range vals {
		for _, c := range vals[i+1:] {
			ba, bc := p.Buffers[a], p.Buffers[c]
			if ba.Offset >= bc.Offset+bc.Bytes || bc.Offset >= ba.Offset+ba.Bytes {
				continue
			}
			sa, sc := live[a], live[c]
			if sa.def <= sc.last && sc.def <= sa.last {
				t.Errorf("%v %+v live %v and %v %+v live %v overlap", a, ba, *sa, c, bc, *sc)
			}
		}
	}
	// In particular, no node writes over its inputs, nor an epilogue's op
	// or a residual's norm over its product's.
	overlap := func(x, y Buffer) bool { return x.Offset < y.Offset+y.Bytes && y.Offset < x.Offset+x.Bytes }
	for _, readers := range liveThrough(g) {
		for prod, reader := range readers {
			for _, o := range reader.Outputs {
				for _, in := range prod.Inputs {
					bo, ok1 := p.Buffers[o]
					bi, ok2 := p.Buffers[in]
					if ok1 && ok2 && overlap(bo, bi) {
						t.Errorf("%v output %v %+v overlaps input %v %+v of the product it reads", reader.Op, o, bo, in, bi)
					}
				}
			}
		}
	}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			bo, ok := p.Buffers[o]
			if !ok {
				continue
			}
			for _, in := range n.Inputs {
				if bi, ok := p.Buffers[in]; ok && bo.Offset < bi.Offset+bi.Bytes && bi.Offset < bo.Offset+bo.Bytes {
					t.Errorf("%v output %v %+v overlaps input %v %+v", n.Op, o, bo, in, bi)
				}
			}
		}
	}
}

func TestPlanMemory(t *testing.T) {
	for _, layers := range []int{1, 2, 4} {
		c := tinyConfig()
		c.NumLayers = layers
		for _, tgt := range []Target{everything, targetWithout(ir.AddRMSNorm, ir.SwiGLU, ir.RoPEKVWrite, ir.Split, ir.ConcatRows)} {
			comp := compileTiny(t, c, tgt)
			var prev *Plan
			for _, b := range []Bucket{{1, 1}, {2, 1}, {4, 3}, {16, 16}, {32, 1}, {512, 8}} {
				p, err := comp.Plan(b)
				if err != nil {
					t.Fatalf("Plan(%+v): %v", b, err)
				}
				if p.Bucket != b || p.Bindings != (ir.Bindings{Tokens: b.Tokens, Rows: b.Rows}) || p.Graph != comp.Graph {
					t.Errorf("plan for %+v has bucket %+v, bindings %+v", b, p.Bucket, p.Bindings)
				}
				checkPlan(t, comp.Graph, p)
				if layers > 1 && p.ArenaBytes >= p.UnsharedBytes {
					t.Errorf("%d layers, bucket %+v: no reuse (arena %d, unshared %d)", layers, b, p.ArenaBytes, p.UnsharedBytes)
				}
				if prev != nil && b.Tokens > prev.Bucket.Tokens && p.ArenaBytes < prev.ArenaBytes {
					t.Errorf("arena shrank from %d to %d for a larger bucket", prev.ArenaBytes, p.ArenaBytes)
				}
				prev = p
			}
		}
	}
}

func TestPlanScalesWithBucket(t *testing.T) {
	comp := compileTiny(t, tinyConfig(), everything)
	g := comp.Graph
	small, err := comp.Plan(Bucket{Tokens: 16, Rows: 2})
	if err != nil {
		t.Fatal(err)
	}
	large, err := comp.Plan(Bucket{Tokens: 64, Rows: 8})
	if err != nil {
		t.Fatal(err)
	}
	logits := g.Outputs[0]
	if got := large.Buffers[logits].Bytes; got != 8*16*4 {
		t.Errorf("logits buffer %d bytes for 8 rows of 16, want %d", got, 8*16*4)
	}
	for v, sb := range small.Buffers {
		lb := large.Buffers[v]
		factor := 4 // T-shaped values grow with tokens, R-shaped with rows: both x4
		if lb.Bytes != sb.Bytes*factor {
			t.Errorf("%v%v: %d bytes at 16 tokens, %d at 64", v, v.Shape, sb.Bytes, lb.Bytes)
		}
	}
	if large.ArenaBytes != 4*small.ArenaBytes {
		// Every size scales by 4 and best fit decides the same way.
		t.Errorf("arena %d at 16 tokens, %d at 64", small.ArenaBytes, large.ArenaBytes)
	}
}

func TestPlanCachedAndBadBuckets(t *testing.T) {
	comp := compileTiny(t, tinyConfig(), everything)
	p1, err := comp.Plan(Bucket{Tokens: 8, Rows: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p2, _ := comp.Plan(Bucket{Tokens: 8, Rows: 1}); p2 != p1 {
		t.Errorf("plan not reused")
	}
	if p3, _ := comp.Plan(Bucket{Tokens: 8, Rows: 2}); p3 == p1 {
		t.Errorf("different bucket got the same plan")
	}
	for _, b := range []Bucket{{0, 0}, {0, 1}, {4, 0}, {4, 5}, {-1, 1}} {
		if _, err := comp.Plan(b); err == nil {
			t.Errorf("Plan(%+v) accepted", b)
		}
	}
}

// A value nothing reads is freed right after its producer; a graph output is
// never freed.
func TestPlanUnreadAndOutputs(t *testing.T) {
	b := newBuilder(t)
	x := b.act(16)
	split := b.Node(ir.Split, ir.Attrs{Sizes: []int{8, 8}}, x) // second half unread
	y := b.Op(ir.SiLU, ir.Attrs{}, split.Outputs[0])
	z := b.Op(ir.SiLU, ir.Attrs{}, y)
	g := b.outputs(y, z)
	p, err := planMemory(g, Bucket{Tokens: 4, Rows: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, g, p)
	// The split's outputs are placed while x is still live, so x and both
	// halves are in the arena together.
	if p.ArenaBytes < 256+128+128 {
		t.Errorf("arena %d smaller than x and both halves", p.ArenaBytes)
	}
	// The unread half is free once the split has run: the first silu,
	// the same size, takes its place (best fit).
	if p.Buffers[y] != p.Buffers[split.Outputs[1]] {
		t.Errorf("silu output %+v, unread half %+v: want the same place", p.Buffers[y], p.Buffers[split.Outputs[1]])
	}
	if p.Buffers[y] == p.Buffers[z] {
		t.Errorf("output y shares z's buffer")
	}
}

func TestFreeList(t *testing.T) {
	var f freeList
	f.give(128, 64)
	f.give(0, 64)
	f.give(64, 64)
	if len(f) != 1 || f[0] != (Buffer{0, 192}) {
		t.Fatalf("coalesced list %v, want [{0 192}]", f)
	}

	f = freeList{{0, 128}, {256, 64}, {512, 256}}
	end := 1024
	if off := f.take(64, &end); off != 256 {
		t.Errorf("best fit took %d, want 256 (the exact fit)", off)
	}
	if off := f.take(100, &end); off != 0 || f[0] != (Buffer{100, 28}) {
		t.Errorf("took %d, list %v; want 0 from the 128-byte interval", off, f)
	}
	if off := f.take(2048, &end); off != 1024 || end != 3072 {
		t.Errorf("growing took %d (end %d), want 1024 (end 3072)", off, end)
	}

	// A free interval at the end of the arena is extended.
	f = freeList{{0, 64}, {192, 64}}
	end = 256
	if off := f.take(128, &end); off != 192 || end != 320 || len(f) != 1 {
		t.Errorf("tail extension took %d (end %d, list %v), want 192 (end 320)", off, end, f)
	}
}

// Random graphs of elementwise ops, projections, splits and row selections:
// the plan invariants hold for each.
func TestPlanRandomGraphs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		b := newBuilder(t)
		widths := []int{4, 8, 12}
		var pool []*ir.Value
		pool = append(pool, b.act(8), b.act(4))
		pick := func(pred func(*ir.Value) bool) *ir.Value {
			var c []*ir.Value
			for _, v := range pool {
				if pred(v) {
					c = append(c, v)
				}
			}
			if len(c) == 0 {
				return nil
			}
			return c[r.IntN(len(c))]
		}
		all := func(*ir.Value) bool { return true }
		for range 5 + r.IntN(40) {
			x := pick(all)
			var out []*ir.Value
			switch r.IntN(6) {
			case 0:
				out = []*ir.Value{b.Op(ir.SiLU, ir.Attrs{}, x)}
			case 1, 2:
				if y := pick(func(v *ir.Value) bool { return v.Shape.Equal(x.Shape) }); y != nil {
					op := ir.Add
					if r.IntN(2) == 0 {
						op = ir.Mul
					}
					out = []*ir.Value{b.Op(op, ir.Attrs{}, x, y)}
				}
			case 3:
				n := widths[r.IntN(len(widths))]
				out = []*ir.Value{b.Op(ir.MatMul, ir.Attrs{}, x, b.weight("w", 0, n, x.Shape.Last()))}
			case 4:
				if d := x.Shape.Last(); d >= 8 {
					out = b.Node(ir.Split, ir.Attrs{Sizes: []int{4, d - 4}}, x).Outputs
				}
			case 5:
				if x.Shape[0] == ir.TokenDim {
					out = []*ir.Value{b.Op(ir.SelectRows, ir.Attrs{}, x)}
				}
			}
			pool = append(pool, out...)
		}
		var outs []*ir.Value
		for _, v := range pool {
			if r.IntN(5) == 0 {
				outs = append(outs, v)
			}
		}
		if len(outs) == 0 {
			outs = pool[len(pool)-1:]
		}
		g := b.outputs(outs...)
		for _, bk := range []Bucket{{1, 1}, {3, 2}, {16, 5}} {
			p, err := planMemory(g, bk)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, g, p)
			if t.Failed() {
				t.Fatalf("graph %d, bucket %+v:\n%v", iter, bk, g)
			}
		}
	}
}
