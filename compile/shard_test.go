package compile

import (
	"bytes"
	"strings"
	"testing"

	"kiln/arch"
	"kiln/ir"
	"kiln/model"
)

// TestShardPlan: each rank's graph holds its heads' rows of Q/K/V, its
// columns of the output and down projections, its MLP rows and its
// vocabulary rows, with one AllReduce after each row-parallel product and
// the embedding and an AllGather of the logits.
func TestShardPlan(t *testing.T) {
	c := tinyConfig()
	c.NumHeads, c.NumKVHeads, c.HiddenSize, c.VocabSize = 4, 2, 16, 16
	c.QKVBias = true
	m := randomModel(c, 3)
	weight := func(g *ir.Graph, name string) *ir.Node {
		for _, n := range g.Weights() {
			if n.Attrs.Name == name {
				return n
			}
		}
		t.Fatalf("no weight %s", name)
		return nil
	}
	for rank := range 2 {
		g, err := arch.Build(m, arch.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := shard(g, Shard{Rank: rank, Ranks: 2}); err != nil {
			t.Fatal(err)
		}
		if err := g.Verify(); err != nil {
			t.Fatal(err)
		}
		want := map[string][2]int{
			"model.layers.0.self_attn.q_proj.weight": {8, 16}, "model.layers.0.self_attn.k_proj.weight": {4, 16},
			"model.layers.1.self_attn.v_proj.weight": {4, 16}, "model.layers.1.self_attn.o_proj.weight": {16, 8},
			"model.layers.0.mlp.gate_proj.weight": {6, 16}, "model.layers.0.mlp.up_proj.weight": {6, 16},
			"model.layers.1.mlp.down_proj.weight": {16, 6}, model.EmbedName: {8, 16}, model.HeadName: {8, 16},
		}
		for name, shape := range want {
			if s := weight(g, name).Attrs.Tensor.Shape; s[0] != shape[0] || s[1] != shape[1] {
				t.Errorf("rank %d: %s is %v, want %v", rank, name, s, shape)
			}
		}
		if s := weight(g, "model.layers.0.self_attn.k_proj.bias").Attrs.Tensor.Shape; s[0] != 4 {
			t.Errorf("rank %d: k bias %v, want [4]", rank, s)
		}
		// The rows are the rank's: Q's rows 8·rank on (heads 2·rank, 2·rank+1).
		q := m.Tensors["model.layers.0.self_attn.q_proj.weight"]
		row := len(q.Data) / 16
		if !bytes.Equal(weight(g, "model.layers.0.self_attn.q_proj.weight").Attrs.Tensor.Data, q.Data[8*rank*row:8*(rank+1)*row]) {
			t.Errorf("rank %d: q rows are not the rank's", rank)
		}
		o := weight(g, "model.layers.0.self_attn.o_proj.weight").Attrs.Tensor
		full, _ := m.Tensors["model.layers.0.self_attn.o_proj.weight"].F32s()
		got, _ := o.F32s()
		if got[1*8+3] != full[1*16+8*rank+3] {
			t.Errorf("rank %d: o_proj columns are not the rank's", rank)
		}
		counts := map[ir.Op]int{}
		for _, n := range g.Nodes {
			counts[n.Op]++
			switch n.Op {
			case ir.Attention:
				if n.Attrs.Heads != 2 || n.Attrs.KVHeads != 1 {
					t.Errorf("rank %d: attention of %d heads over %d", rank, n.Attrs.Heads, n.Attrs.KVHeads)
				}
			case ir.Embed:
				if n.Attrs.VocabStart != 8*rank || n.Attrs.Ranks != 2 {
					t.Errorf("rank %d: embedding shard at %d of %d ranks", rank, n.Attrs.VocabStart, n.Attrs.Ranks)
				}
			}
		}
		if counts[ir.AllReduce] != 2*c.NumLayers+1 || counts[ir.AllGather] != 1 {
			t.Errorf("rank %d: %d all-reduces, %d all-gathers", rank, counts[ir.AllReduce], counts[ir.AllGather])
		}
		if out := g.Outputs[0]; out.Def.Op != ir.AllGather || out.Shape.Last() != 16 {
			t.Errorf("rank %d: output %v of %v", rank, out.Def.Op, out.Shape)
		}
	}
}

// TestShardWholeVocabulary: a vocabulary that does not divide leaves the
// embedding and head whole on every rank (no gather), tied or not.
func TestShardWholeVocabulary(t *testing.T) {
	for _, tied := range []bool{false, true} {
		c := tinyConfig()
		c.NumHeads, c.NumKVHeads, c.HiddenSize, c.VocabSize, c.TiedEmbeddings = 4, 2, 16, 15, tied
		g, err := arch.Build(randomModel(c, 1), arch.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := shard(g, Shard{Rank: 1, Ranks: 2}); err != nil {
			t.Fatal(err)
		}
		for _, n := range g.Nodes {
			if n.Op == ir.AllGather || n.Op == ir.Embed && n.Attrs.Ranks != 0 {
				t.Errorf("tied %v: %v sharded over a vocabulary of 15", tied, n.Op)
			}
		}
		if v := g.Outputs[0]; v.Shape.Last() != 15 {
			t.Errorf("tied %v: logits %v", tied, v.Shape)
		}
	}
}

func TestShardErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(c *model.Config)
		ranks int
		want  string
	}{
		{"kv heads", func(c *model.Config) {}, 2, "2 heads and 1 KV heads do not divide among 2 ranks"},
		{"heads", func(c *model.Config) { c.NumHeads, c.NumKVHeads, c.HiddenSize = 3, 3, 12 }, 2, "3 heads and 3 KV heads do not divide among 2 ranks"},
		{"mlp", func(c *model.Config) { c.NumHeads, c.NumKVHeads, c.IntermediateSize = 2, 2, 9 }, 2, "9 MLP rows do not divide among 2 ranks"},
		{"moe", func(c *model.Config) {
			c.Arch, c.NumHeads, c.NumKVHeads, c.NumExperts, c.ExpertsPerToken, c.IntermediateSize = "mixtral", 2, 2, 2, 1, 9
		}, 2, "9 expert rows do not divide among 2 ranks"},
		{"shared expert", func(c *model.Config) {
			c.Arch, c.NumHeads, c.NumKVHeads, c.NumExperts, c.ExpertsPerToken, c.SharedExpertSize = "qwen2_moe", 2, 2, 2, 1, 9
		}, 2, "9 shared expert rows do not divide among 2 ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig()
			tc.edit(&c)
			g, err := arch.Build(tinyModel(c), arch.Options{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = Compile(g, everything, Options{Shard: Shard{Rank: 0, Ranks: tc.ranks}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
