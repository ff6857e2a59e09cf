package ir_test

import (
	"slices"
	"testing"

	"kiln/ir"
)

func TestDimString(t *testing.T) {
	for _, tc := range []struct {
		d    ir.Dim
		want string
	}{{ir.TokenDim, "T"}, {ir.RowDim, "R"}, {0, "0"}, {1, "1"}, {4096, "4096"}} {
		if got := tc.d.String(); got != tc.want {
			t.Errorf("Dim(%d).String() = %q, want %q", int(tc.d), got, tc.want)
		}
	}
	if got := (ir.Shape{ir.TokenDim, 64}).String(); got != "[T,64]" {
		t.Errorf("shape prints %q", got)
	}
	if got := (ir.Shape{}).String(); got != "[]" {
		t.Errorf("scalar shape prints %q", got)
	}
}

func TestShapeElements(t *testing.T) {
	for _, tc := range []struct {
		s    ir.Shape
		b    ir.Bindings
		want int
	}{
		{ir.Shape{}, ir.Bindings{Tokens: 4, Rows: 2}, 1},
		{ir.Shape{3, 5}, ir.Bindings{Tokens: 4, Rows: 2}, 15},
		{ir.Shape{ir.TokenDim}, ir.Bindings{Tokens: 4, Rows: 2}, 4},
		{ir.Shape{ir.TokenDim, 8}, ir.Bindings{Tokens: 16, Rows: 1}, 128},
		{ir.Shape{ir.RowDim, 32}, ir.Bindings{Tokens: 16, Rows: 3}, 96},
		{ir.Shape{ir.TokenDim, ir.RowDim, 2}, ir.Bindings{Tokens: 5, Rows: 3}, 30},
		{ir.Shape{ir.TokenDim, 8}, ir.Bindings{}, 0},
		{ir.Shape{0, 8}, ir.Bindings{Tokens: 1, Rows: 1}, 0},
	} {
		if got := tc.s.Elements(tc.b); got != tc.want {
			t.Errorf("%v.Elements(%+v) = %d, want %d", tc.s, tc.b, got, tc.want)
		}
	}
}

func TestShapeEqualAndLast(t *testing.T) {
	a := ir.Shape{ir.TokenDim, 8}
	for _, tc := range []struct {
		b    ir.Shape
		want bool
	}{{ir.Shape{ir.TokenDim, 8}, true}, {ir.Shape{ir.RowDim, 8}, false}, {ir.Shape{ir.TokenDim}, false}, {ir.Shape{ir.TokenDim, 8, 1}, false}, {ir.Shape{8, 8}, false}} {
		if got := a.Equal(tc.b); got != tc.want {
			t.Errorf("%v.Equal(%v) = %v", a, tc.b, got)
		}
	}
	if (ir.Shape{}).Equal(nil) != true {
		t.Errorf("empty shapes differ")
	}
	for _, tc := range []struct {
		s    ir.Shape
		want int
	}{{nil, 0}, {ir.Shape{ir.TokenDim}, 0}, {ir.Shape{ir.TokenDim, 12}, 12}, {ir.Shape{4, ir.RowDim}, 0}} {
		if got := tc.s.Last(); got != tc.want {
			t.Errorf("%v.Last() = %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestGraphEditing(t *testing.T) {
	s := newSmall(t)
	g := s.g
	uses := g.Uses()
	if got := uses[s.norm.Out()]; !slices.Equal(got, []*ir.Node{s.mm1, s.mm2}) {
		t.Errorf("uses of the norm: %v", got)
	}
	if len(uses[s.sel.Out()]) != 0 {
		t.Errorf("output has readers")
	}

	// Weights lists weight and constant nodes in order.
	if got := g.Weights(); !slices.Equal(got, []*ir.Node{s.emb, s.nw, s.wOther, s.w1, s.w2}) {
		t.Errorf("Weights() = %v", got)
	}

	// ReplaceUses redirects readers and graph outputs.
	g.ReplaceUses(s.mm2.Out(), s.mm1.Out())
	if s.add.Inputs[1] != s.mm1.Out() {
		t.Errorf("add still reads mm2")
	}
	g.ReplaceUses(s.sel.Out(), s.mm1.Out())
	if g.Outputs[0] != s.mm1.Out() {
		t.Errorf("graph output not redirected")
	}
	g.Outputs[0] = s.sel.Out()

	// Remove the now unread mm2; InsertBefore puts it back before the add.
	g.Remove(s.mm2)
	if indexOf(g, s.mm2) >= 0 {
		t.Errorf("mm2 still in the graph")
	}
	g.InsertBefore(s.add, s.mm2)
	if indexOf(g, s.mm2) != indexOf(g, s.add)-1 {
		t.Errorf("mm2 not placed before the add")
	}
	if err := g.Verify(); err != nil {
		t.Errorf("Verify: %v", err)
	}

	mustPanic(t, "Remove of a missing node", func() { g.Remove(&ir.Node{}) })
	mustPanic(t, "InsertBefore a missing node", func() { g.InsertBefore(&ir.Node{}, s.mm2) })
	mustPanic(t, "Out of a multi-output node", func() {
		(&ir.Node{Op: ir.Split, Outputs: []*ir.Value{{}, {}}}).Out()
	})
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestIsState(t *testing.T) {
	_, v := newVals(t)
	if !ir.IsState(v.state) || ir.IsState(v.x8) || ir.IsState(v.tokens) {
		t.Errorf("IsState wrong")
	}
	if v.state.Shape != nil {
		t.Errorf("state has shape %v", v.state.Shape)
	}
}
