// Package model reads model files (Hugging Face safetensors directories, GGUF,
// llama2.c checkpoints) into one form: a Config describing the architecture
// and a set of named tensors.
//
// Invariants: tensor names are canonical Hugging Face Llama names whatever the
// file format (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
// ..., model.norm.weight, lm_head.weight); matrices are [out, in] row-major;
// every tensor has been validated against its shape and dtype; Data may point
// into a memory mapping that stays valid until Close.
package model

import (
	"fmt"
	"math"
	"sort"

	"kiln/tensor"
)

// RopeStyle says which pairs of a head's dimensions RoPE rotates together.
type RopeStyle uint8

const (
	// RopeHalf rotates dimension i with i+headDim/2 (Hugging Face rotate_half).
	RopeHalf RopeStyle = iota
	// RopeInterleaved rotates dimension 2i with 2i+1 (llama2.c, GGUF llama).
	RopeInterleaved
)

func (s RopeStyle) String() string {
	if s == RopeInterleaved {
		return "interleaved"
	}
	return "half"
}

// RopeScaling is Hugging Face's rope_scaling. Type is "" (none), "linear" or
// "llama3"; anything else is refused when the config is read.
type RopeScaling struct {
	Type                          string
	Factor                        float64
	LowFreqFactor, HighFreqFactor float64 // llama3
	OriginalMaxPositions          int     // llama3, longrope
	// ShortFactor and LongFactor (longrope: Phi-3's long-context models)
	// divide each pair's frequency: the short ones when the context asked
	// for is within OriginalMaxPositions, the long ones at every position
	// when it passes it (ir.RopeParams); AttentionFactor scales cos and sin.
	ShortFactor, LongFactor []float32
	AttentionFactor         float64
}

// Config is everything the architecture builder needs about a model.
type Config struct {
	Arch             string // "llama", "mistral" or "qwen2"
	HiddenSize       int
	IntermediateSize int
	NumLayers        int
	NumHeads         int
	NumKVHeads       int
	HeadDim          int
	VocabSize        int
	MaxPositions     int // context length
	RMSNormEps       float64
	RopeTheta        float64
	RopeStyle        RopeStyle
	RopeScaling      RopeScaling
	SlidingWindow    int  // 0: full attention
	TiedEmbeddings   bool // lm_head shares model.embed_tokens.weight
	QKVBias          bool // q/k/v projections carry a bias (Qwen2)
	QKNorm           bool // q and k are RMS-normalized per head before RoPE (Qwen3: q_norm, k_norm)
	QKNormWhole      bool // q and k are RMS-normalized over all their heads at once before RoPE (OLMoE)
	// NumExperts, when set, makes each layer's MLP a mixture of that many
	// SwiGLU experts of IntermediateSize, ExpertsPerToken of them a token
	// (Mixtral's block_sparse_moe, Qwen3-MoE's mlp.experts), weighted by
	// the softmax of the chosen experts' router logits when NormTopK
	// (Mixtral; Qwen3-MoE's norm_topk_prob), else by the probabilities of
	// the softmax over every expert.
	NumExperts, ExpertsPerToken int
	NormTopK                    bool
	// SharedExpertSize, when set, adds a shared expert to each mixture: a
	// SwiGLU MLP of that width every token goes through (Qwen2-MoE's
	// mlp.shared_expert), its output scaled by sigmoid(x·w) when
	// SharedExpertGate (mlp.shared_expert_gate).
	SharedExpertSize int
	SharedExpertGate bool
	// Gemma 2 and 3. EmbedScale, when set, multiplies the embeddings
	// (√HiddenSize). NormOffset is added to every RMSNorm weight (1 for
	// Gemma's checkpoints, which keep w of its (1+w)·x̂; 0 for GGUF files,
	// which store 1+w). PostNorms: sandwich norms, the attention's and the
	// MLP's outputs normalized (post_attention_layernorm,
	// post_feedforward_layernorm) and the MLP's input by
	// pre_feedforward_layernorm. GELU: the MLP's gate goes through GELU's
	// tanh form instead of SiLU (GeGLU). QueryScale, when set, is the
	// attention's score scale (query_pre_attn_scalar^-½; else 1/√HeadDim).
	// AttnSoftCap and FinalSoftCap, when set, soft-cap attention scores and
	// logits (cap·tanh(x/cap)). LayerWindows, when set, is each layer's
	// sliding window (0: global), in place of SlidingWindow; the windowed
	// layers rotate by base RopeLocalTheta, unscaled, when it is set
	// (Gemma 3).
	EmbedScale                float64
	NormOffset                float32
	PostNorms, GELU           bool
	QueryScale                float64
	AttnSoftCap, FinalSoftCap float64
	LayerWindows              []int
	RopeLocalTheta            float64
	// RopeFreqFactors, when set, divides each RoPE frequency (one factor per
	// pair of dimensions); GGUF stores llama3 scaling this way (rope_freqs).
	RopeFreqFactors []float32
	BOS, EOS        []int
	// DType is the dtype most weights are stored in (for reporting).
	DType tensor.DType
}

// Validate checks that the config is internally consistent.
func (c *Config) Validate() error {
	switch {
	case c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.NumLayers <= 0 || c.VocabSize <= 0:
		return fmt.Errorf("config: hidden %d, intermediate %d, layers %d, vocab %d must be positive", c.HiddenSize, c.IntermediateSize, c.NumLayers, c.VocabSize)
	case c.NumHeads <= 0 || c.NumKVHeads <= 0 || c.HeadDim <= 0:
		return fmt.Errorf("config: heads %d, kv heads %d, head dim %d must be positive", c.NumHeads, c.NumKVHeads, c.HeadDim)
	case c.NumHeads%c.NumKVHeads != 0:
		return fmt.Errorf("config: %d heads is not a multiple of %d kv heads", c.NumHeads, c.NumKVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("config: head dim %d is odd; RoPE needs pairs", c.HeadDim)
	case c.MaxPositions <= 0:
		return fmt.Errorf("config: context length %d must be positive", c.MaxPositions)
	case c.RopeTheta <= 0:
		return fmt.Errorf("config: rope theta %g must be positive", c.RopeTheta)
	case c.SlidingWindow < 0:
		return fmt.Errorf("config: sliding window %d is negative", c.SlidingWindow)
	case c.LayerWindows != nil && len(c.LayerWindows) != c.NumLayers:
		return fmt.Errorf("config: %d layer windows for %d layers", len(c.LayerWindows), c.NumLayers)
	case c.EmbedScale < 0 || c.QueryScale < 0 || c.AttnSoftCap < 0 || c.FinalSoftCap < 0 || c.RopeLocalTheta < 0:
		return fmt.Errorf("config: negative embedding scale, query scale, soft cap or local rope base")
	}
	for _, w := range c.LayerWindows {
		if w < 0 {
			return fmt.Errorf("config: layer window %d is negative", w)
		}
	}
	switch c.RopeScaling.Type {
	case "":
	case "linear":
		if c.RopeScaling.Factor <= 0 {
			return fmt.Errorf("config: linear rope scaling factor %g must be positive", c.RopeScaling.Factor)
		}
	case "llama3":
		s := c.RopeScaling
		if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMaxPositions <= 0 {
			return fmt.Errorf("config: llama3 rope scaling %+v is inconsistent", s)
		}
	case "longrope":
		s := c.RopeScaling
		if len(s.ShortFactor) != c.HeadDim/2 || len(s.LongFactor) != c.HeadDim/2 || s.OriginalMaxPositions <= 0 || s.AttentionFactor <= 0 {
			return fmt.Errorf("config: longrope scaling of %d short and %d long factors (head dim %d), original context %d, attention factor %g",
				len(s.ShortFactor), len(s.LongFactor), c.HeadDim, s.OriginalMaxPositions, s.AttentionFactor)
		}
	default:
		return fmt.Errorf("unsupported rope scaling type %q", c.RopeScaling.Type)
	}
	return nil
}

// LongRopeAttentionFactor is longrope's default scale of cos and sin for a
// model of maxPos positions trained on original:
// √(1 + ln(maxPos/original)/ln(original)), or 1 when not extended
// (transformers' _compute_longrope_parameters).
func LongRopeAttentionFactor(maxPos, original int) float64 {
	factor := float64(maxPos) / float64(original)
	if factor <= 1 {
		return 1
	}
	return math.Sqrt(1 + math.Log(factor)/math.Log(float64(original)))
}

// Model is a loaded model: its config, its tensors, and where its tokenizer
// can be found.
type Model struct {
	Path    string
	Format  string // "safetensors", "gguf" or "llama2c"
	Config  Config
	Tensors map[string]*tensor.Tensor
	// Metadata holds a GGUF file's key/value metadata (nil for other formats);
	// the tokenizer package reads tokenizer.ggml.* from it.
	Metadata map[string]any
	// ChatTemplate is the model's chat template when the file carries one.
	ChatTemplate string
	closers      []func() error
}

// Tensor returns the named tensor or an error naming it.
func (m *Model) Tensor(name string) (*tensor.Tensor, error) {
	t, ok := m.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("model %s: missing tensor %s", m.Path, name)
	}
	return t, nil
}

// Names returns the tensor names in sorted order.
func (m *Model) Names() []string {
	names := make([]string, 0, len(m.Tensors))
	for n := range m.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ParamCount is the number of weight elements.
func (m *Model) ParamCount() int64 {
	var n int64
	for _, t := range m.Tensors {
		n += t.Shape.Elements()
	}
	return n
}

// ParamBytes is the number of bytes the weights occupy as stored.
func (m *Model) ParamBytes() int64 {
	var n int64
	for _, t := range m.Tensors {
		n += int64(len(t.Data))
	}
	return n
}

// Close releases memory mappings; tensors must not be used afterwards.
func (m *Model) Close() error {
	var first error
	for _, c := range m.closers {
		if err := c(); err != nil && first == nil {
			first = err
		}
	}
	m.closers = nil
	return first
}

// Canonical tensor names.
const (
	EmbedName = "model.embed_tokens.weight"
	NormName  = "model.norm.weight"
	HeadName  = "lm_head.weight"
)

// LayerName returns the canonical name of a per-layer tensor, e.g.
// LayerName(3, "self_attn.q_proj.weight").
func LayerName(layer int, suffix string) string {
	return fmt.Sprintf("model.layers.%d.%s", layer, suffix)
}
