package compile

import (
	"testing"

	"kiln/ir"
)

// The bias joins the product only when the product has no other reader.
func TestFuseMatMulBias(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target Target
		extra  bool // the product is read elsewhere too
		fires  bool
	}{
		{"fires", everything, false, true},
		{"target lacks matmul_bias", targetWithout(ir.MatMulBias), false, false},
		{"product read elsewhere", everything, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder(t)
			x := b.act(8)
			w := b.weight("w", 0, 12, 8)
			bias := b.weight("b", 1, 12)
			mm := b.Node(ir.MatMul, ir.Attrs{}, x, w)
			add := b.Node(ir.AddBias, ir.Attrs{}, mm.Out(), bias)
			outs := []*ir.Value{add.Out()}
			if tc.extra {
				outs = append(outs, b.Op(ir.SelectRows, ir.Attrs{}, mm.Out()))
			}
			g := b.outputs(outs...)
			run(t, g, "fuse-matmul-bias", fuseMatMulBias, tc.target)
			run(t, g, "deadcode", deadcode, tc.target)
			c := countOps(g)
			if (c[ir.MatMulBias] == 1) != tc.fires || (c[ir.AddBias] == 1) == tc.fires {
				t.Fatalf("matmul_bias %d, add_bias %d, want fused %v:\n%v", c[ir.MatMulBias], c[ir.AddBias], tc.fires, g)
			}
			if tc.fires {
				f := only(t, g, ir.MatMulBias)
				if f.Inputs[0] != x || f.Inputs[1] != w || f.Inputs[2] != bias || g.Outputs[0] != f.Out() {
					t.Errorf("matmul_bias reads %v, output %v", f.Inputs, g.Outputs[0])
				}
			}
		})
	}
}
