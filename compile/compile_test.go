package compile

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kiln/ir"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestPassNames(t *testing.T) {
	want := []string{"fuse-qkv", "fuse-swiglu", "fuse-add-rmsnorm", "fuse-rope-kv-write", "fuse-packed", "fuse-matmul-bias", "fold-constants", "deadcode"}
	if got := PassNames(); !slices.Equal(got, want) {
		t.Errorf("PassNames() = %v, want %v", got, want)
	}
	names := PassNames()
	for _, c := range passOrder {
		if a, b := slices.Index(names, c[0]), slices.Index(names, c[1]); a < 0 || b < 0 || a >= b {
			t.Errorf("constraint %s before %s violated by %v", c[0], c[1], names)
		}
	}
	for _, p := range passes {
		wantReq := p.name == "fold-constants" || p.name == "deadcode"
		if p.required != wantReq {
			t.Errorf("pass %s required = %v", p.name, p.required)
		}
	}
}

func TestCheckPassOrder(t *testing.T) {
	if err := checkPassOrder(passes, passOrder[:]); err != nil {
		t.Fatalf("the pass list violates its own order: %v", err)
	}
	reversed := slices.Clone(passes)
	slices.Reverse(reversed)
	without := slices.DeleteFunc(slices.Clone(passes), func(p pass) bool { return p.name == "deadcode" })
	for _, tc := range []struct {
		name  string
		ps    []pass
		order [][2]string
		want  string
	}{
		{"reversed", reversed, passOrder[:], "must come before"},
		{"unknown pass", passes, [][2]string{{"fuse-qkv", "no-such-pass"}}, "unknown pass"},
		{"missing pass", without, passOrder[:], "unknown pass"},
		{"self constraint", passes, [][2]string{{"deadcode", "deadcode"}}, "deadcode must come before deadcode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, checkPassOrder(tc.ps, tc.order), tc.want)
		})
	}
}

func TestCompileAfter(t *testing.T) {
	g := buildTiny(t, tinyConfig())
	var names []string
	_, err := Compile(g, everything, Options{Verify: true, After: func(pass string, got *ir.Graph) {
		names = append(names, pass)
		if got != g {
			t.Errorf("After(%s) got another graph", pass)
		}
		if err := got.Verify(); err != nil {
			t.Errorf("After(%s): graph does not verify: %v", pass, err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]string{"input"}, PassNames()...); !slices.Equal(names, want) {
		t.Errorf("After called with %v, want %v", names, want)
	}
}

// TestCompileKVBlockSize: the compiled program carries the KV cache's
// block size it was compiled for (0: any), and a negative one is refused.
func TestCompileKVBlockSize(t *testing.T) {
	for _, bs := range []int{0, 16, 24} {
		c, err := Compile(buildTiny(t, tinyConfig()), everything, Options{KVBlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		if c.KVBlockSize != bs {
			t.Errorf("KVBlockSize %d compiled as %d", bs, c.KVBlockSize)
		}
	}
	if _, err := Compile(buildTiny(t, tinyConfig()), everything, Options{KVBlockSize: -1}); err == nil {
		t.Error("a KV-cache block size of -1 was accepted")
	}
}

func TestCompileDisable(t *testing.T) {
	for _, tc := range []struct {
		disable []string
		skipped []string
		present []ir.Op // ops the compiled graph keeps because a pass was skipped
		absent  []ir.Op
	}{
		{nil, nil, nil, []ir.Op{ir.SiLU, ir.Mul, ir.KVWrite, ir.RopeTable, ir.ConcatRows}},
		{[]string{"fuse-qkv"}, []string{"fuse-qkv"}, nil, []ir.Op{ir.Split}},
		{[]string{"fuse-swiglu"}, []string{"fuse-swiglu"}, []ir.Op{ir.SiLU, ir.Mul}, []ir.Op{ir.SwiGLU}},
		{[]string{"fuse-add-rmsnorm"}, []string{"fuse-add-rmsnorm"}, []ir.Op{ir.Add, ir.RMSNorm}, []ir.Op{ir.AddRMSNorm}},
		{[]string{"fuse-rope-kv-write"}, []string{"fuse-rope-kv-write"}, []ir.Op{ir.KVWrite}, []ir.Op{ir.RoPEKVWrite}},
		// Required passes run whatever Disable says.
		{[]string{"fold-constants"}, nil, nil, []ir.Op{ir.RopeTable, ir.ConcatRows}},
		{[]string{"deadcode"}, nil, nil, []ir.Op{ir.SiLU, ir.Mul, ir.KVWrite}},
		{[]string{"no-such-pass"}, nil, nil, nil},
		{PassNames(), []string{"fuse-qkv", "fuse-swiglu", "fuse-add-rmsnorm", "fuse-rope-kv-write", "fuse-packed", "fuse-matmul-bias"},
			[]ir.Op{ir.SiLU, ir.Mul, ir.KVWrite, ir.Add}, []ir.Op{ir.Split, ir.SwiGLU, ir.AddRMSNorm, ir.RoPEKVWrite, ir.RopeTable, ir.ConcatRows}},
	} {
		t.Run(strings.Join(tc.disable, ","), func(t *testing.T) {
			var ran []string
			comp, err := Compile(buildTiny(t, tinyConfig()), everything, Options{
				Disable: tc.disable, Verify: true,
				After: func(pass string, _ *ir.Graph) { ran = append(ran, pass) },
			})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"input"}
			for _, p := range PassNames() {
				if !slices.Contains(tc.skipped, p) {
					want = append(want, p)
				}
			}
			if !slices.Equal(ran, want) {
				t.Errorf("passes run: %v, want %v", ran[1:], want[1:])
			}
			n := countOps(comp.Graph)
			for _, op := range tc.present {
				if n[op] == 0 {
					t.Errorf("no %v left", op)
				}
			}
			for _, op := range tc.absent {
				if n[op] != 0 {
					t.Errorf("%d %v left", n[op], op)
				}
			}
		})
	}
}

func TestCompileMissingOps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing []ir.Op
		want    []string // "" entries: compiles
	}{
		{"attention", []ir.Op{ir.Attention}, []string{"backend fake does not implement attention"}},
		{"attention and embed", []ir.Op{ir.Attention, ir.Embed}, []string{"embed", "attention"}},
		{"const", []ir.Op{ir.Const}, []string{"const"}},
		{"rope", []ir.Op{ir.RoPE, ir.RoPEQKVWrite}, []string{"rope"}}, // queries are still rotated by RoPE
		{"rope when packed", []ir.Op{ir.RoPE}, nil},                   // ... unless rope_qkv_write takes them
		{"kv write without fusion", []ir.Op{ir.KVWrite, ir.RoPEKVWrite}, []string{"kv_write"}},
		{"fused ops", []ir.Op{ir.AddRMSNorm, ir.SwiGLU, ir.RoPEKVWrite, ir.Split, ir.ConcatRows, ir.SwiGLUPacked, ir.RoPEQKVWrite}, nil},
		{"folded ops", []ir.Op{ir.RopeTable, ir.ConcatRows}, nil},
		{"kv write when fused", []ir.Op{ir.KVWrite}, nil},
		{"silu and mul when fused", []ir.Op{ir.SiLU, ir.Mul}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comp, err := Compile(buildTiny(t, tinyConfig()), targetWithout(tc.missing...), Options{Verify: true})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Compile: %v", err)
				}
				for _, n := range comp.Graph.Nodes {
					if slices.Contains(tc.missing, n.Op) {
						t.Errorf("compiled graph holds unsupported %v", n.Op)
					}
				}
				return
			}
			wantErr(t, err, tc.want...)
			// Each missing op is named once.
			for _, w := range tc.want {
				if strings.Count(err.Error(), w) != 1 {
					t.Errorf("error %q names %q %d times", err, w, strings.Count(err.Error(), w))
				}
			}
		})
	}
}

func TestCompileRejectsInvalidInput(t *testing.T) {
	g := buildTiny(t, tinyConfig())
	g.Outputs = nil
	called := false
	_, err := Compile(g, everything, Options{After: func(string, *ir.Graph) { called = true }})
	wantErr(t, err, "input graph", "no outputs")
	if called {
		t.Errorf("After called for an invalid input")
	}
}

// A fault injected after pass P (through After) is caught by the Verify that
// follows the next pass, when Options.Verify is set.
func TestCompileVerifiesAfterEveryPass(t *testing.T) {
	stages := append([]string{"input"}, PassNames()...)
	for i, stage := range stages[:len(stages)-1] {
		next := stages[i+1]
		for _, verify := range []bool{true, false} {
			g := buildTiny(t, tinyConfig())
			tokens := g.Nodes[0]
			if tokens.Op != ir.Tokens {
				t.Fatalf("first node is %v", tokens.Op)
			}
			corrupt := func(pass string, g *ir.Graph) {
				if pass == stage {
					g.Outputs[0].ID = tokens.ID // the logits now share the tokens node's id
				}
			}
			_, err := Compile(g, everything, Options{Verify: verify, After: corrupt})
			if !verify {
				if err != nil {
					t.Errorf("fault after %s without Verify: %v", stage, err)
				}
				continue
			}
			wantErr(t, err, "after pass "+next+":", "used twice")
		}
	}
}

// The whole pipeline on the tiny Llama, with every op supported.
func TestCompileTinyLlama(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bias   bool
		tied   bool
		packed bool // the target reads stacked products (no splits)
	}{
		{"llama", false, false, false}, {"qkv bias", true, false, false}, {"tied embeddings", false, true, false},
		{"llama packed", false, false, true}, {"qkv bias packed", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig()
			c.QKVBias, c.TiedEmbeddings = tc.bias, tc.tied
			target := targetWithout(ir.SwiGLUPacked, ir.RoPEQKVWrite)
			if tc.packed {
				target = everything
			}
			comp := compileTiny(t, c, target)
			g := comp.Graph
			if err := g.Verify(); err != nil {
				t.Fatal(err)
			}
			L := c.NumLayers
			weights := 1 + 4*L + 1 // embedding; per layer the two norms, o and down; final norm
			if !tc.tied {
				weights++ // lm_head
			}
			consts := 1 + 2*L // rope table; stacked qkv and gate/up weights
			bias := 0
			if tc.bias {
				consts += L // stacked qkv biases
				bias = L
			}
			want := map[ir.Op]int{
				ir.Tokens: 1, ir.Positions: 1, ir.Embed: 1, ir.SelectRows: 1,
				ir.Weight: weights, ir.Const: consts,
				// Each layer's two norms follow a residual add, except the
				// first layer's input norm (of the embedding); the final norm
				// reads the selected rows, and the last add feeds them.
				ir.AddRMSNorm: 2*L - 1, ir.RMSNorm: 2, ir.Add: 1,
				ir.SwiGLU:      L,
				ir.RoPEKVWrite: L, ir.RoPE: L, ir.Attention: L,
				ir.Split:      2 * L,          // qkv, gate/up
				ir.MatMul:     4*L + 1 - bias, // qkv, o, gate/up, down; head
				ir.MatMulBias: bias,           // qkv with its stacked bias
				ir.SiLU:       0, ir.Mul: 0,   // fused into SwiGLU
				ir.KVWrite: 0, ir.RopeTable: 0, ir.ConcatRows: 0,
			}
			if tc.packed {
				// The splits' readers take the stacked products apart.
				want[ir.SwiGLU], want[ir.RoPEKVWrite], want[ir.RoPE], want[ir.Split] = 0, 0, 0, 0
				want[ir.SwiGLUPacked], want[ir.RoPEQKVWrite] = L, L
			}
			got := countOps(g)
			for _, op := range ir.AllOps() {
				if got[op] != want[op] {
					t.Errorf("%d %v nodes, want %d", got[op], op, want[op])
				}
			}
			for _, r := range nodesOf(g, ir.RoPE) {
				if r.Attrs.Heads != c.NumHeads || r.Inputs[0].Def.Op != ir.Split || r.Inputs[0].Index != 0 {
					t.Errorf("rope of %d heads on %v: not the queries", r.Attrs.Heads, r.Inputs[0])
				}
			}
			for _, w := range nodesOf(g, ir.RoPEKVWrite) {
				k, v := w.Inputs[0], w.Inputs[1]
				if k.Def != v.Def || k.Def.Op != ir.Split || k.Index != 1 || v.Index != 2 {
					t.Errorf("rope_kv_write reads %v, %v: want the qkv split's k and v", k, v)
				}
			}
			for _, n := range nodesOf(g, ir.RoPEQKVWrite) {
				if n.Attrs.Heads != c.NumHeads || n.Attrs.KVHeads != c.NumKVHeads || n.Inputs[0].Shape.Last() != (c.NumHeads+2*c.NumKVHeads)*c.HeadDim {
					t.Errorf("rope_qkv_write %v of %v: not the stacked q, k and v", n.Attrs, n.Inputs[0])
				}
			}
			for _, n := range g.Nodes {
				if n.Op == ir.Split && len(n.Outputs) == 2 {
					if uses := g.Uses(); len(uses[n.Outputs[0]]) != 1 || uses[n.Outputs[0]][0].Op != ir.SwiGLU {
						t.Errorf("gate/up split not read by a swiglu")
					}
				}
			}
			for _, b := range []Bucket{{1, 1}, {8, 2}} {
				p, err := comp.Plan(b)
				if err != nil {
					t.Fatal(err)
				}
				checkPlan(t, g, p)
			}
		})
	}
}

func TestCompileGolden(t *testing.T) {
	c := tinyConfig()
	c.QKVBias = true
	got := compileTiny(t, c, everything).Graph.String()
	path := filepath.Join("testdata", "llama_tiny_compiled.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./compile -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("compiled graph differs from %s (run go test ./compile -update if intended):\n%s", path, got)
	}
}
