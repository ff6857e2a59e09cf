package arch

import (
	"strings"
	"testing"

	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

func tinyModel(c model.Config) *model.Model { return testmodel.Zeros(c) }

var tinyConfig = model.Config{
	Arch: "llama", HiddenSize: 8, IntermediateSize: 12, NumLayers: 2, NumHeads: 2, NumKVHeads: 1, HeadDim: 4,
	VocabSize: 16, MaxPositions: 32, RMSNormEps: 1e-5, RopeTheta: 10000,
}

func count(g *ir.Graph, op ir.Op) int {
	n := 0
	for _, x := range g.Nodes {
		if x.Op == op {
			n++
		}
	}
	return n
}

func TestBuildVariants(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(c *model.Config)
		check  func(t *testing.T, g *ir.Graph)
		weight int // distinct weight nodes
	}{
		{"llama", func(c *model.Config) {}, nil, 1 + 9*2 + 1 + 1},
		{"tied", func(c *model.Config) { c.TiedEmbeddings = true }, nil, 1 + 9*2 + 1},
		{"qwen2 bias", func(c *model.Config) { c.Arch, c.QKVBias = "qwen2", true }, func(t *testing.T, g *ir.Graph) {
			if n := count(g, ir.AddBias); n != 6 {
				t.Errorf("%d bias adds, want 6", n)
			}
		}, 1 + 12*2 + 1 + 1},
		{"mistral window", func(c *model.Config) { c.Arch, c.SlidingWindow = "mistral", 4 }, func(t *testing.T, g *ir.Graph) {
			for _, n := range g.Nodes {
				if n.Op == ir.Attention && n.Attrs.Window != 4 {
					t.Errorf("attention window %d, want 4", n.Attrs.Window)
				}
			}
		}, 1 + 9*2 + 1 + 1},
		{"qwen3 q/k norms", func(c *model.Config) { c.Arch, c.QKNorm = "qwen3", true }, func(t *testing.T, g *ir.Graph) {
			heads := 0
			for _, n := range g.Nodes {
				if n.Op == ir.RMSNorm && n.Attrs.HeadDim > 0 {
					heads++
				}
			}
			if heads != 4 {
				t.Errorf("%d norms of heads, want 4", heads)
			}
		}, 1 + 11*2 + 1 + 1},
		{"mixtral experts", func(c *model.Config) { c.Arch, c.NumExperts, c.ExpertsPerToken, c.NormTopK = "mixtral", 3, 2, true }, func(t *testing.T, g *ir.Graph) {
			for _, n := range g.Nodes {
				if n.Op == ir.MoE && (n.Attrs.Experts != 3 || n.Attrs.TopK != 2 || !n.Attrs.NormTopK || len(n.Inputs) != 2+3*3) {
					t.Errorf("moe %+v with %d inputs", n.Attrs, len(n.Inputs))
				}
			}
			if n := count(g, ir.MoE); n != 2 {
				t.Errorf("%d moe nodes, want 2", n)
			}
		}, 1 + (6+1+3*3)*2 + 1 + 1},
		{"qwen3-moe experts", func(c *model.Config) { c.Arch, c.NumExperts, c.ExpertsPerToken, c.QKNorm = "qwen3_moe", 4, 1, true }, func(t *testing.T, g *ir.Graph) {
			for _, n := range g.Nodes {
				if n.Op == ir.MoE && (n.Attrs.Experts != 4 || n.Attrs.TopK != 1 || n.Attrs.NormTopK) {
					t.Errorf("moe %+v", n.Attrs)
				}
			}
		}, 1 + (6+2+1+3*4)*2 + 1 + 1},
		{"qwen2-moe shared expert", func(c *model.Config) {
			c.Arch, c.NumExperts, c.ExpertsPerToken, c.SharedExpertSize, c.SharedExpertGate = "qwen2_moe", 4, 2, 24, true
		}, func(t *testing.T, g *ir.Graph) {
			for _, n := range g.Nodes {
				if n.Op == ir.MoE && (!n.Attrs.Shared || !n.Attrs.SharedGate || len(n.Inputs) != 2+3*4+3+1 ||
					!n.Inputs[2+3*4].Shape.Equal(ir.Shape{24, 8}) || !n.Inputs[2+3*4+3].Shape.Equal(ir.Shape{1, 8})) {
					t.Errorf("moe %+v with %d inputs", n.Attrs, len(n.Inputs))
				}
			}
		}, 1 + (6+1+3*4+4)*2 + 1 + 1},
		{"interleaved rope", func(c *model.Config) { c.RopeStyle = model.RopeInterleaved }, func(t *testing.T, g *ir.Graph) {
			for _, n := range g.Nodes {
				if n.Op == ir.RoPE && !n.Attrs.Interleaved {
					t.Error("rope not interleaved")
				}
			}
		}, 1 + 9*2 + 1 + 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig
			c.edit(&cfg)
			g, err := Build(tinyModel(cfg), Options{ContextLen: 16})
			if err != nil {
				t.Fatal(err)
			}
			if n := count(g, ir.Weight); n != c.weight {
				t.Errorf("%d weight nodes, want %d", n, c.weight)
			}
			if n := count(g, ir.Attention); n != cfg.NumLayers {
				t.Errorf("%d attention nodes, want %d", n, cfg.NumLayers)
			}
			for _, n := range g.Nodes {
				if n.Op == ir.RopeTable && n.Attrs.Rope.MaxPositions != 16 {
					t.Errorf("rope table for %d positions, want the context 16", n.Attrs.Rope.MaxPositions)
				}
			}
			if c.check != nil {
				c.check(t, g)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	unsupported := tinyConfig
	unsupported.Arch = "gpt2"
	if _, err := Build(tinyModel(tinyConfig), Options{}); err != nil {
		t.Fatal(err)
	}
	m := tinyModel(tinyConfig)
	m.Config = unsupported
	if _, err := Build(m, Options{}); err == nil || !strings.Contains(err.Error(), `unsupported architecture "gpt2"`) {
		t.Errorf("gpt2: %v", err)
	}
	m = tinyModel(tinyConfig)
	delete(m.Tensors, model.LayerName(1, "mlp.up_proj.weight"))
	if _, err := Build(m, Options{}); err == nil || !strings.Contains(err.Error(), "mlp.up_proj") {
		t.Errorf("missing tensor: %v", err)
	}
	m = tinyModel(tinyConfig)
	m.Tensors[model.LayerName(0, "self_attn.k_proj.weight")].Shape = tensor.Shape{8, 4}
	if _, err := Build(m, Options{}); err == nil {
		t.Error("a k projection of the wrong shape was accepted")
	}
}
