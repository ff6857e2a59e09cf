package cuda

import (
	"testing"

	"kiln/arch"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
)

// TestFindNormFolds: on Llama's graph compiled for the GPU (the real
// passes, and the memory plans of decode and prefill buckets), the norms
// fold two a layer: the first layer's plain RMSNorm of the embeddings and
// each later layer's input AddRMSNorm after the down projection, before
// Q/K/V and RoPE with the cache writes; each post-attention AddRMSNorm
// after the output projection, before gate/up and SwiGLU. The final norm
// (its product the LM head) does not, nor anything in f16. No GPU needed.
func TestFindNormFolds(t *testing.T) {
	c, g := smallLlama(t)
	comp, err := compile.Compile(g, &Backend{}, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dts := weightDTypes(comp.Graph, cu.BF16, false, false, false)
	for _, bk := range []compile.Bucket{{Tokens: 1, Rows: 1}, {Tokens: 64, Rows: 64}, {Tokens: 512, Rows: 8}} {
		p, err := comp.Plan(bk)
		if err != nil {
			t.Fatal(err)
		}
		nodes := boundNodes(t, p, dts)
		folds := findNormFolds(nodes, p, cu.BF16, false)
		plain, ropes, swiglus := 0, 0, 0
		for _, f := range folds {
			switch {
			case f.m == nil && f.n.n.Op == ir.RMSNorm:
				plain++
			case f.m == nil || f.m.n.Op != ir.MatMul || f.n.n.Op != ir.AddRMSNorm:
				t.Errorf("%+v: a chain of %v after %v", bk, f.n.n.Op, f.m)
			}
			switch f.e.n.Op {
			case ir.RoPEQKVWrite:
				ropes++
			case ir.SwiGLUPacked:
				swiglus++
			}
			if f.p.n.Op != ir.MatMul || f.p.n.Inputs[0] != f.n.n.Outputs[len(f.n.n.Outputs)-1] {
				t.Errorf("%+v: the product after a folded norm reads %v", bk, f.p.n.Inputs[0])
			}
		}
		if plain != 1 || ropes != c.NumLayers || swiglus != c.NumLayers || len(folds) != 2*c.NumLayers {
			t.Errorf("%+v: %d folds (%d plain, %d before RoPE, %d before SwiGLU), want %d (1, %d, %d)", bk, len(folds), plain, ropes, swiglus,
				2*c.NumLayers, c.NumLayers, c.NumLayers)
		}
		if f := findNormFolds(nodes, p, cu.F16, false); len(f) != 0 {
			t.Errorf("%+v: %d folds in f16", bk, len(f))
		}
	}
}

// boundNodes binds the nodes of plan p as Executable does, with made-up
// device addresses: weights of dtypes dts apart from one another,
// activations (bf16) at their buffers' offsets.
func boundNodes(t *testing.T, p *compile.Plan, dts map[*ir.Node]cu.DType) []node {
	nodes, err := bindNodes(p.Graph, func(v *ir.Value) (operand, error) {
		o := operand{v: v, dtype: cu.BF16, cols: v.Shape.Last()}
		switch {
		case ir.IsState(v):
		case v.Def.Op == ir.Weight || v.Def.Op == ir.Const:
			o.dtype, o.p = dts[v.Def], cu.Ptr(1<<40+uint64(v.Def.ID)<<24)
		default:
			if b, ok := p.Buffers[v]; ok {
				o.p = cu.Ptr(1<<32 + b.Offset)
			}
		}
		return o, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// TestMarkPeerNorms: on a rank's graph of Llama sharded over two (the real
// passes and the plans of decode and prefill buckets), with peer memory,
// the all-reduce after each attention and MLP but the last layer's MLP
// (the final RMSNorm, no add, follows it) runs the AddRMSNorm after it in
// its kernel, and the embedding's (a plain RMSNorm follows) does not: two
// a layer, less one; without peer memory, none. No GPU needed.
func TestMarkPeerNorms(t *testing.T) {
	c, plans, dts := shardedLlamaPlans(t)
	for _, p := range plans {
		bk := p.Bucket
		for _, peers := range []bool{true, false} {
			l := &loaded{b: &Backend{}, act: cu.BF16}
			if peers {
				l.b.Peers = &kernels.PeerGroup{}
			}
			nodes := boundNodes(t, p, dts)
			l.markPeerNorms(nodes, p)
			reduces, marked := 0, 0
			for i := range nodes {
				nd := &nodes[i]
				if nd.n.Op == ir.AllReduce {
					reduces++
				}
				if nd.peerNorm == nil {
					continue
				}
				marked++
				if nn := nd.peerNorm.norm; nd.n.Op != ir.AllReduce || nn != &nodes[i+1] || nn.n.Op != ir.AddRMSNorm {
					t.Errorf("%+v: %v marked with %v", bk, nd.n.Op, nn.n.Op)
				}
			}
			want := 0
			if peers {
				want = 2*c.NumLayers - 1
			}
			if reduces != 2*c.NumLayers+1 || marked != want {
				t.Errorf("%+v, peers %v: %d of %d all-reduces run the norm after them, want %d of %d", bk, peers, marked, reduces, want, 2*c.NumLayers+1)
			}
		}
	}
}

// TestFindNormFoldsPeers: on a rank's graph of Llama sharded over two (the
// real passes, decode and prefill buckets), with all-reduces that add the
// residual (peerAdd), the norms fold as at TP=1: the first layer's plain
// RMSNorm (after the embedding's all-reduce), and the AddRMSNorms after an
// all-reduce (m) before Q/K/V or gate/up, two a layer less one, the sum on
// r or apart from it, and on the partials or apart from them unless the
// chain says sync (this plan puts a sum partly over the partials); the
// final norm (before the LM head) does not. Without peerAdd only the plain
// RMSNorm folds. No GPU needed.
func TestFindNormFoldsPeers(t *testing.T) {
	c, plans, dts := shardedLlamaPlans(t)
	for _, p := range plans {
		bk := p.Bucket
		for _, peerAdd := range []bool{true, false} {
			nodes := boundNodes(t, p, dts)
			folds := findNormFolds(nodes, p, cu.BF16, peerAdd)
			plain, reduces := 0, 0
			for _, f := range folds {
				switch {
				case f.m == nil && f.n.n.Op == ir.RMSNorm:
					plain++
				case f.m != nil && f.m.n.Op == ir.AllReduce && f.n.n.Op == ir.AddRMSNorm:
					reduces++
					sum := p.Buffers[f.n.n.Outputs[0]]
					for i, v := range []*ir.Value{f.m.n.Inputs[0], f.resid.v} {
						b := p.Buffers[v]
						partly := b != sum && b.Offset < sum.Offset+sum.Bytes && sum.Offset < b.Offset+b.Bytes
						if i == 0 && partly != f.sync || i == 1 && partly {
							t.Errorf("%+v: a folded all-reduce's sum %+v over %+v (the partials: %v), sync %v", bk, sum, b, i == 0, f.sync)
						}
					}
				default:
					t.Errorf("%+v: a chain of %v after %v", bk, f.n.n.Op, f.m)
				}
			}
			want := 0
			if peerAdd {
				want = 2*c.NumLayers - 1
			}
			if plain != 1 || reduces != want {
				t.Errorf("%+v, peerAdd %v: %d plain and %d after an all-reduce, want 1 and %d", bk, peerAdd, plain, reduces, want)
			}
		}
	}
}

// shardedLlamaPlans is smallLlama compiled as rank 1 of 2 (a communicator,
// never used, makes the backend take the collectives) and planned for a
// decode and a prefill bucket, with its weights' dtypes for boundNodes.
func shardedLlamaPlans(t *testing.T) (model.Config, []*compile.Plan, map[*ir.Node]cu.DType) {
	t.Helper()
	c, g := smallLlama(t)
	comp, err := compile.Compile(g, &Backend{Comm: &cu.Comm{}}, compile.Options{Shard: compile.Shard{Rank: 1, Ranks: 2}})
	if err != nil {
		t.Fatal(err)
	}
	var plans []*compile.Plan
	for _, bk := range []compile.Bucket{{Tokens: 1, Rows: 1}, {Tokens: 512, Rows: 8}} {
		p, err := comp.Plan(bk)
		if err != nil {
			t.Fatal(err)
		}
		plans = append(plans, p)
	}
	return c, plans, weightDTypes(comp.Graph, cu.BF16, false, false, false)
}

// smallLlama is a Llama of 3 layers (zero weights) and its graph.
func smallLlama(t *testing.T) (model.Config, *ir.Graph) {
	t.Helper()
	c := model.Config{Arch: "llama", HiddenSize: 256, IntermediateSize: 512, NumLayers: 3, NumHeads: 4, NumKVHeads: 2, HeadDim: 64,
		VocabSize: 500, MaxPositions: 512, RMSNormEps: 1e-5, RopeTheta: 10000}
	g, err := arch.Build(testmodel.Zeros(c), arch.Options{ContextLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}
