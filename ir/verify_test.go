package ir_test

import (
	"strings"
	"testing"

	"kiln/ir"
	"kiln/tensor"
)

// small is a valid graph with handles on its nodes:
//
//	x = embed(emb, tokens); h = rmsnorm(x, nw)
//	a = matmul(h, w1); b = matmul(h, w2); s = add(a, b); out = select_rows(s)
type small struct {
	g                                  *ir.Graph
	tokens, emb, embed, nw, norm       *ir.Node
	w1, mm1, w2, mm2, add, sel, wOther *ir.Node
}

func newSmall(t *testing.T) *small {
	b := newBuilder(t)
	s := &small{g: b.G}
	s.tokens = b.Node(ir.Tokens, ir.Attrs{})
	s.emb = b.Node(ir.Weight, ir.Attrs{Name: "emb", Tensor: zeros("emb", 16, 8)})
	s.embed = b.Node(ir.Embed, ir.Attrs{}, s.emb.Out(), s.tokens.Out())
	s.nw = b.Node(ir.Weight, ir.Attrs{Name: "nw", Tensor: zeros("nw", 8)})
	s.norm = b.Node(ir.RMSNorm, ir.Attrs{Eps: 1e-5}, s.embed.Out(), s.nw.Out())
	s.wOther = b.Node(ir.Weight, ir.Attrs{Name: "w6", Tensor: zeros("w6", 12, 6)})
	s.w1 = b.Node(ir.Weight, ir.Attrs{Name: "w1", Tensor: zeros("w1", 12, 8)})
	s.mm1 = b.Node(ir.MatMul, ir.Attrs{}, s.norm.Out(), s.w1.Out())
	s.w2 = b.Node(ir.Weight, ir.Attrs{Name: "w2", Tensor: zeros("w2", 12, 8)})
	s.mm2 = b.Node(ir.MatMul, ir.Attrs{}, s.norm.Out(), s.w2.Out())
	s.add = b.Node(ir.Add, ir.Attrs{}, s.mm1.Out(), s.mm2.Out())
	s.sel = b.Node(ir.SelectRows, ir.Attrs{}, s.add.Out())
	s.g.Outputs = []*ir.Value{s.sel.Out()}
	return s
}

func TestVerifyAcceptsValidGraph(t *testing.T) {
	s := newSmall(t)
	if err := s.g.Verify(); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if got, want := typed(s.sel.Out()), "f32[R,12]"; got != want {
		t.Errorf("output %s, want %s", got, want)
	}
}

func TestVerifyAcceptsTinyLlama(t *testing.T) {
	g := buildTiny(t)
	if err := g.Verify(); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestVerifyRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(s *small)
		want    string
	}{
		{"use before definition", func(s *small) {
			// embed reads tokens, which now comes after it
			s.g.Nodes[0], s.g.Nodes[2] = s.g.Nodes[2], s.g.Nodes[0]
		}, "before it is produced"},
		{"reader before producer", func(s *small) {
			i, j := indexOf(s.g, s.mm2), indexOf(s.g, s.add)
			s.g.Nodes[i], s.g.Nodes[j] = s.g.Nodes[j], s.g.Nodes[i]
		}, "before it is produced"},
		{"input of removed node", func(s *small) { s.g.Remove(s.mm2) }, "before it is produced"},
		{"too many inputs", func(s *small) {
			s.add.Inputs = append(s.add.Inputs, s.mm1.Out())
		}, "takes 2 inputs, got 3"},
		{"too few inputs", func(s *small) { s.sel.Inputs = nil }, "takes 1 inputs, got 0"},
		{"matmul K mismatch", func(s *small) { s.mm2.Inputs[1] = s.wOther.Out() }, "does not fit"},
		{"add of different shapes", func(s *small) { s.add.Inputs[1] = s.norm.Out() }, "differ"},
		{"stale output shape", func(s *small) { s.mm1.Out().Shape = ir.Shape{ir.TokenDim, 7} }, "op gives"},
		{"stale output dtype", func(s *small) { s.mm1.Out().DType = tensor.F16 }, "op gives"},
		{"extra output", func(s *small) {
			s.mm1.Outputs = append(s.mm1.Outputs, &ir.Value{ID: 1000, Shape: ir.Shape{ir.TokenDim, 12}, DType: tensor.F32, Def: s.mm1, Index: 1})
		}, "has 2 outputs, want 1"},
		{"output Def corrupted", func(s *small) { s.mm1.Out().Def = s.mm2 }, "claims producer"},
		{"output Def nil", func(s *small) { s.mm1.Out().Def = nil }, "claims producer n-1"},
		{"output Index corrupted", func(s *small) { s.mm1.Out().Index = 1 }, "output 0 claims producer"},
		{"duplicate node IDs", func(s *small) { s.mm2.ID = s.mm1.ID }, "used twice"},
		{"node ID equals value ID", func(s *small) { s.mm2.ID = s.mm1.Out().ID }, "used twice"},
		{"duplicate value IDs", func(s *small) { s.mm2.Out().ID = s.mm1.Out().ID }, "used twice"},
		{"node appears twice", func(s *small) { s.g.Nodes = append(s.g.Nodes, s.mm1) }, "appears twice"},
		{"nil node", func(s *small) { s.g.Nodes = append(s.g.Nodes, nil) }, "is nil"},
		{"nil input", func(s *small) { s.add.Inputs[1] = nil }, "input 1 is nil"},
		{"nil output value", func(s *small) { s.mm1.Outputs[0] = nil }, "output 0 is nil"},
		{"no outputs", func(s *small) { s.g.Outputs = nil }, "no outputs"},
		{"output not produced", func(s *small) {
			s.g.Outputs = []*ir.Value{{ID: 999, Shape: ir.Shape{ir.RowDim, 12}, DType: tensor.F32}}
		}, "v999 is not produced"},
		{"output of removed node", func(s *small) { s.g.Remove(s.sel) }, "is not produced"},
		{"nil output", func(s *small) { s.g.Outputs = []*ir.Value{nil} }, "is not produced"},
		{"invalid op", func(s *small) { s.tokens.Op = ir.Invalid }, "unknown op"},
		{"missing tensor", func(s *small) { s.w1.Attrs.Tensor = nil }, `"w1" has no tensor`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSmall(t)
			tc.corrupt(s)
			err := s.g.Verify()
			if err == nil {
				t.Fatalf("Verify accepted the corrupted graph:\n%v", s.g)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verify error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func indexOf(g *ir.Graph, n *ir.Node) int {
	for i, x := range g.Nodes {
		if x == n {
			return i
		}
	}
	return -1
}
