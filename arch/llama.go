// Package arch builds the ir.Graph of one model step from a model's config
// and tensors, one file per model family.
//
// Invariant: the builder only describes the computation; it never runs it,
// and it emits only unfused ops (the compiler fuses).
package arch

import (
	"fmt"
	"math"

	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// Options shape the built graph.
type Options struct {
	// ContextLen is the longest sequence the graph will serve (sizes the RoPE
	// table); 0 means the model's own context length.
	ContextLen int
}

// Build returns the graph for m's architecture.
func Build(m *model.Model, opts Options) (*ir.Graph, error) {
	switch m.Config.Arch {
	case "llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gemma", "gemma2", "gemma3":
		return buildLlama(m, opts)
	}
	return nil, fmt.Errorf("unsupported architecture %q (supported: llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, qwen2_moe, olmoe, gemma, gemma2, gemma3)", m.Config.Arch)
}

// builder accumulates nodes and stops at the first error.
type builder struct {
	g       *ir.Graph
	m       *model.Model
	weights map[string]*ir.Value // one Weight node per tensor
	norms   map[string]*ir.Value // norm weights plus Config.NormOffset, one Const each
	err     error
}

func (b *builder) node(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Node {
	if b.err != nil {
		return nil
	}
	for _, v := range in {
		if v == nil {
			return nil
		}
	}
	n, err := b.g.Add(op, a, in...)
	if err != nil {
		b.err = err
		return nil
	}
	return n
}

func (b *builder) op(op ir.Op, a ir.Attrs, in ...*ir.Value) *ir.Value {
	n := b.node(op, a, in...)
	if n == nil {
		return nil
	}
	return n.Out()
}

func (b *builder) weight(name string) *ir.Value {
	if b.err != nil {
		return nil
	}
	if w, ok := b.weights[name]; ok {
		return w
	}
	t, err := b.m.Tensor(name)
	if err != nil {
		b.err = err
		return nil
	}
	w := b.op(ir.Weight, ir.Attrs{Name: name, Tensor: t})
	b.weights[name] = w
	return w
}

// norm is RMSNorm(x) by the norm weight name (plus the config's
// NormOffset: Gemma's 1+w, added once at build time); headDim > 0 norms
// each head.
func (b *builder) norm(x *ir.Value, name string, headDim int) *ir.Value {
	eps := float32(b.m.Config.RMSNormEps)
	off := b.m.Config.NormOffset
	if off == 0 {
		return b.op(ir.RMSNorm, ir.Attrs{Eps: eps, HeadDim: headDim}, x, b.weight(name))
	}
	w, ok := b.norms[name]
	if !ok && b.err == nil {
		t, err := b.m.Tensor(name)
		if err != nil {
			b.err = err
			return nil
		}
		vals, err := t.F32s()
		if err != nil {
			b.err = err
			return nil
		}
		for i := range vals {
			vals[i] += off
		}
		w = b.op(ir.Const, ir.Attrs{Name: fmt.Sprintf("%s+%g", name, off), Tensor: tensor.FromF32(name, t.Shape, vals)})
		b.norms[name] = w
	}
	return b.op(ir.RMSNorm, ir.Attrs{Eps: eps, HeadDim: headDim}, x, w)
}

// linear is x·Wᵀ (+ bias).
func (b *builder) linear(x *ir.Value, prefix string, bias bool) *ir.Value {
	y := b.op(ir.MatMul, ir.Attrs{}, x, b.weight(prefix+".weight"))
	if bias {
		y = b.op(ir.AddBias, ir.Attrs{}, y, b.weight(prefix+".bias"))
	}
	return y
}

// buildLlama covers Llama 1/2/3, Mistral (sliding window), Qwen2 (q/k/v
// bias), Qwen3 (q and k RMS-normalized per head before RoPE), Phi-3 (its
// fused projections split at load), Mixtral and Qwen3-MoE (a mixture of
// experts for the MLP; OLMoE's too, its q and k normalized over all heads;
// Qwen2-MoE's with a gated shared expert),
// Gemma 2 and 3 (scaled embeddings, norms of 1+w
// around attention and the MLP, GeGLU, soft-capping, windowed layers among
// global ones, Gemma 3's q/k norms and local RoPE base): pre-norm decoder
// blocks of RMSNorm, rotary attention with grouped KV heads, and a gated
// MLP.
func buildLlama(m *model.Model, opts Options) (*ir.Graph, error) {
	c := m.Config
	if err := c.Validate(); err != nil {
		return nil, err
	}
	ctx := opts.ContextLen
	if ctx <= 0 || ctx > c.MaxPositions {
		ctx = c.MaxPositions
	}
	b := &builder{g: &ir.Graph{}, m: m, weights: map[string]*ir.Value{}, norms: map[string]*ir.Value{}}
	tokens := b.op(ir.Tokens, ir.Attrs{})
	pos := b.op(ir.Positions, ir.Attrs{})
	rope := ir.RopeParams{
		Theta: c.RopeTheta, MaxPositions: ctx, HeadDim: c.HeadDim,
		Scaling: c.RopeScaling.Type, Factor: c.RopeScaling.Factor,
		LowFreqFactor: c.RopeScaling.LowFreqFactor, HighFreqFactor: c.RopeScaling.HighFreqFactor,
		OriginalMaxPositions: c.RopeScaling.OriginalMaxPositions,
		FreqFactors:          c.RopeFreqFactors,
		ShortFactor:          c.RopeScaling.ShortFactor, LongFactor: c.RopeScaling.LongFactor,
		AttentionFactor: c.RopeScaling.AttentionFactor,
	}
	table := b.op(ir.RopeTable, ir.Attrs{Rope: rope})
	localTable := table // the windowed layers' (Gemma 3: a base of their own, unscaled)
	if c.RopeLocalTheta > 0 {
		localTable = b.op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: c.RopeLocalTheta, MaxPositions: ctx, HeadDim: c.HeadDim}})
	}
	scale := float32(1 / math.Sqrt(float64(c.HeadDim)))
	if c.QueryScale > 0 {
		scale = float32(c.QueryScale)
	}
	x := b.op(ir.Embed, ir.Attrs{Scale: float32(c.EmbedScale)}, b.weight(model.EmbedName), tokens)
	interleaved := c.RopeStyle == model.RopeInterleaved
	for l := 0; l < c.NumLayers; l++ {
		p := func(s string) string { return model.LayerName(l, s) }
		window, tab := c.SlidingWindow, table
		if c.LayerWindows != nil {
			window = c.LayerWindows[l]
		}
		if window > 0 {
			tab = localTable
		}
		h := b.norm(x, p("input_layernorm.weight"), 0)
		q := b.linear(h, p("self_attn.q_proj"), c.QKVBias)
		k := b.linear(h, p("self_attn.k_proj"), c.QKVBias)
		v := b.linear(h, p("self_attn.v_proj"), c.QKVBias)
		if c.QKNorm || c.QKNormWhole {
			hd := c.HeadDim
			if c.QKNormWhole {
				hd = 0 // over every head at once (OLMoE)
			}
			q = b.norm(q, p("self_attn.q_norm.weight"), hd)
			k = b.norm(k, p("self_attn.k_norm.weight"), hd)
		}
		q = b.op(ir.RoPE, ir.Attrs{Heads: c.NumHeads, HeadDim: c.HeadDim, Interleaved: interleaved}, q, pos, tab)
		k = b.op(ir.RoPE, ir.Attrs{Heads: c.NumKVHeads, HeadDim: c.HeadDim, Interleaved: interleaved}, k, pos, tab)
		state := b.op(ir.KVWrite, ir.Attrs{Layer: l, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim}, k, v)
		att := b.op(ir.Attention, ir.Attrs{
			Layer: l, Heads: c.NumHeads, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim,
			Window: window, Scale: scale, Cap: float32(c.AttnSoftCap),
		}, q, state)
		o := b.linear(att, p("self_attn.o_proj"), false)
		preMLP := p("post_attention_layernorm.weight")
		if c.PostNorms {
			o = b.norm(o, p("post_attention_layernorm.weight"), 0)
			preMLP = p("pre_feedforward_layernorm.weight")
		}
		x = b.op(ir.Add, ir.Attrs{}, x, o)
		h = b.norm(x, preMLP, 0)
		var mlp *ir.Value
		if c.NumExperts > 0 {
			in := []*ir.Value{h, b.weight(c.MoERouter(l))}
			for e := 0; e < c.NumExperts; e++ {
				gate, up, down := c.MoEExpert(l, e)
				in = append(in, b.weight(gate), b.weight(up), b.weight(down))
			}
			moe := ir.Attrs{Experts: c.NumExperts, TopK: c.ExpertsPerToken, NormTopK: c.NormTopK}
			if c.SharedExpertSize > 0 {
				gate, up, down := c.MoEShared(l)
				in = append(in, b.weight(gate), b.weight(up), b.weight(down))
				moe.Shared = true
				if c.SharedExpertGate {
					in = append(in, b.weight(c.MoESharedGate(l)))
					moe.SharedGate = true
				}
			}
			mlp = b.op(ir.MoE, moe, in...)
		} else {
			gate := b.linear(h, p("mlp.gate_proj"), false)
			up := b.linear(h, p("mlp.up_proj"), false)
			act := ir.SiLU
			if c.GELU {
				act = ir.GELUTanh
			}
			mlp = b.linear(b.op(ir.Mul, ir.Attrs{}, b.op(act, ir.Attrs{}, gate), up), p("mlp.down_proj"), false)
		}
		if c.PostNorms {
			mlp = b.norm(mlp, p("post_feedforward_layernorm.weight"), 0)
		}
		x = b.op(ir.Add, ir.Attrs{}, x, mlp)
	}
	x = b.op(ir.SelectRows, ir.Attrs{}, x)
	x = b.norm(x, model.NormName, 0)
	head := model.HeadName
	if c.TiedEmbeddings {
		head = model.EmbedName
	}
	logits := b.op(ir.MatMul, ir.Attrs{}, x, b.weight(head))
	if c.FinalSoftCap > 0 {
		logits = b.op(ir.SoftCap, ir.Attrs{Cap: float32(c.FinalSoftCap)}, logits)
	}
	if b.err != nil {
		return nil, fmt.Errorf("build %s graph: %w", c.Arch, b.err)
	}
	b.g.Outputs = []*ir.Value{logits}
	return b.g, b.g.Verify()
}
