package ir_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/arch"
	"kiln/ir"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func buildTiny(t *testing.T) *ir.Graph {
	t.Helper()
	g, err := arch.Build(tinyLlama(), arch.Options{})
	if err != nil {
		t.Fatalf("arch.Build: %v", err)
	}
	return g
}

func TestPrintGolden(t *testing.T) {
	got := buildTiny(t).String()
	// Building twice prints the same text: IDs are deterministic.
	if again := buildTiny(t).String(); again != got {
		t.Fatalf("printing is not deterministic")
	}
	path := filepath.Join("testdata", "llama_tiny.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ir -update to create it)", err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) || i < len(wl); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("graph differs from %s at line %d:\ngot  %q\nwant %q\n(run go test ./ir -update if the change is intended)", path, i+1, g, w)
			}
		}
	}
}

func TestPrintNodes(t *testing.T) {
	b, v := newVals(t)
	nw := b.weight("norm.weight", 8)
	for _, tc := range []struct {
		op    ir.Op
		attrs ir.Attrs
		in    []*ir.Value
		want  string
	}{
		{ir.RMSNorm, ir.Attrs{Eps: 1e-5}, []*ir.Value{v.x8, nw}, "= rmsnorm v%d, v%d {eps=1e-05} : f32[T,8]"},
		{ir.AddRMSNorm, ir.Attrs{Eps: 1e-6}, []*ir.Value{v.x8, v.y8, nw}, "= add_rmsnorm v%d, v%d, v%d {eps=1e-06} : f32[T,8], f32[T,8]"},
		{ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4, Interleaved: true}, []*ir.Value{v.x8, v.pos, v.table4}, "{heads=2 head_dim=4 interleaved=true} : f32[T,8]"},
		{ir.KVWrite, ir.Attrs{Layer: 3, KVHeads: 1, HeadDim: 4}, []*ir.Value{v.x4, v.x4}, "= kv_write v%d, v%d {layer=3 kv_heads=1 head_dim=4} : state"},
		{ir.RoPEKVWrite, ir.Attrs{Layer: 1, KVHeads: 1, HeadDim: 4}, []*ir.Value{v.x4, v.x4, v.pos, v.table4}, "{layer=1 kv_heads=1 head_dim=4 interleaved=false} : state"},
		{ir.Attention, ir.Attrs{Layer: 2, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 0.5}, []*ir.Value{v.x8, v.state}, "{layer=2 heads=2 kv_heads=1 head_dim=4 scale=0.5} : f32[T,8]"},
		{ir.Attention, ir.Attrs{Layer: 2, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 0.5, Window: 7}, []*ir.Value{v.x8, v.state}, "scale=0.5 window=7} : f32[T,8]"},
		{ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 500000, MaxPositions: 64, HeadDim: 4, Scaling: "llama3", Factor: 8, FreqFactors: []float32{1, 1}}}, nil, "= rope_table {theta=500000 max_pos=64 head_dim=4 scaling=llama3 factor=8 freq_factors=2} : f32[64,4]"},
		{ir.Split, ir.Attrs{Sizes: []int{8, 4}}, []*ir.Value{v.x12}, "= split v%d {sizes=[8 4]} : f32[T,8], f32[T,4]"},
		{ir.Const, ir.Attrs{Name: "a constant", Tensor: zeros("c", 2, 3)}, nil, "= const {a constant} : f32[2,3]"},
		{ir.SelectRows, ir.Attrs{}, []*ir.Value{v.x8}, "= select_rows v%d : f32[R,8]"},
	} {
		n := b.Node(tc.op, tc.attrs, tc.in...)
		want := tc.want
		for _, in := range tc.in {
			want = strings.Replace(want, "v%d", in.String(), 1)
		}
		if got := n.String(); !strings.Contains(got, want) {
			t.Errorf("%v prints %q, want it to contain %q", tc.op, got, want)
		}
		if !strings.HasPrefix(n.String(), n.Outputs[0].String()) {
			t.Errorf("%v prints %q, not starting with its output", tc.op, n.String())
		}
	}
	b.G.Outputs = []*ir.Value{v.x8, v.r8}
	if s := b.G.String(); !strings.HasSuffix(s, "return "+v.x8.String()+", "+v.r8.String()+"\n") {
		t.Errorf("graph ends %q", s[strings.LastIndex(s[:len(s)-1], "\n")+1:])
	}
}
