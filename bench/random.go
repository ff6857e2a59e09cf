package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"kiln/model"
	"kiln/tensor"
)

// Shape is a model shape for random-weight benchmark models.
type Shape struct {
	Name                                string
	Hidden, Layers, Heads, KVHeads, FFN int
	Vocab, Context                      int
	// HeadDim is the attention heads' width (0: Hidden / Heads).
	HeadDim int
	Tied    bool
	// Experts, when set, makes each MLP a mixture of that many experts of
	// width FFN, ExpertsPerToken a token (Mixtral's layout and routing).
	Experts, ExpertsPerToken int
	// RopeTheta is RoPE's base (0: 10000); RopeScaling, when set, goes
	// into config.json as rope_scaling (Llama 3.1's long context).
	RopeTheta   float64
	RopeScaling map[string]any
}

// Shapes are the benchmark shapes known by name.
var Shapes = map[string]Shape{
	// stories110M: llama2.c's largest TinyStories model.
	"stories110m": {Name: "stories110m", Hidden: 768, Layers: 12, Heads: 12, KVHeads: 12, FFN: 2048, Vocab: 32000, Context: 1024, Tied: true},
	// llama3-8b: Llama 3 8B's shape.
	"llama3-8b": {Name: "llama3-8b", Hidden: 4096, Layers: 32, Heads: 32, KVHeads: 8, FFN: 14336, Vocab: 128256, Context: 8192},
	// llama3-8b-tp2-rank, llama3-8b-tp4-rank: what one rank of llama3-8b
	// holds at tensor-parallel size 2 and 4 (the heads, KV heads, MLP
	// width and vocabulary divided), run on one GPU without the
	// collectives: the step a rank would take if its all-reduces cost
	// nothing (tools/gpu/tp2.sh).
	"llama3-8b-tp2-rank": {Name: "llama3-8b-tp2-rank", Hidden: 4096, Layers: 32, Heads: 16, KVHeads: 4, HeadDim: 128, FFN: 7168, Vocab: 64128, Context: 8192},
	"llama3-8b-tp4-rank": {Name: "llama3-8b-tp4-rank", Hidden: 4096, Layers: 32, Heads: 8, KVHeads: 2, HeadDim: 128, FFN: 3584, Vocab: 32064, Context: 8192},
	// llama3.2-1b: Llama 3.2 1B's shape (tied embeddings) with the 8B's
	// context: a draft model of the llama3-8b shape's vocabulary.
	"llama3.2-1b": {Name: "llama3.2-1b", Hidden: 2048, Layers: 16, Heads: 32, KVHeads: 8, FFN: 8192, Vocab: 128256, Context: 8192, Tied: true},
	// llama3.1-8b: Llama 3.1 8B's, its 131,072 positions by llama3 RoPE
	// scaling: long prefills (tools/gpu/long-bench.sh).
	"llama3.1-8b": {Name: "llama3.1-8b", Hidden: 4096, Layers: 32, Heads: 32, KVHeads: 8, FFN: 14336, Vocab: 128256, Context: 131072,
		RopeTheta: 500000, RopeScaling: map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
	// demo-110m: stories110M's shape with the demo model's 4,096-token
	// vocabulary, so that its GGUF files can carry the demo's tokenizer
	// (llama.cpp loads no model without one): the CPU comparison with
	// llama.cpp (tools/cpu/llama-peer.sh).
	"demo-110m": {Name: "demo-110m", Hidden: 768, Layers: 12, Heads: 12, KVHeads: 12, FFN: 2048, Vocab: 4096, Context: 1024, Tied: true},
	// moe-7b-a1b: OLMoE-1B-7B's proportions (64 experts of 1024, 8 a
	// token; 6.9B parameters, 1.3B active) in Mixtral's layout: MoE
	// decode against the bytes of the experts a step reads.
	"moe-7b-a1b": {Name: "moe-7b-a1b", Hidden: 2048, Layers: 16, Heads: 16, KVHeads: 16, FFN: 1024, Vocab: 50304, Context: 4096,
		Experts: 64, ExpertsPerToken: 8},
	// moe-demo: a mixture of experts (16 of 512, 2 a token; 113M
	// parameters, 23M read a token) with the demo's vocabulary, small
	// enough for the CPU's comparison with llama.cpp
	// (tools/cpu/llama-peer.sh, SHAPE=moe-demo). Untied, so that greedy
	// decoding wanders over the vocabulary and the experts (a tied random
	// model repeats its token, and its routing with it).
	"moe-demo": {Name: "moe-demo", Hidden: 512, Layers: 8, Heads: 8, KVHeads: 8, FFN: 512, Vocab: 4096, Context: 1024,
		Experts: 16, ExpertsPerToken: 2},
	// tiny: for tests.
	"tiny": {Name: "tiny", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 256, Context: 256},
}

// ShapeNames lists the known shapes.
func ShapeNames() string {
	var names []string
	for n := range Shapes {
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// WriteRandomModel writes a Hugging Face directory (config.json and
// model.safetensors) holding a Llama (or, with experts, Mixtral) model of
// shape s with random weights of
// dtype d (F32, F16 or BF16), scaled so activations stay well behaved.
func WriteRandomModel(dir string, s Shape, d tensor.DType, seed uint64) error {
	if d != tensor.F32 && d != tensor.F16 && d != tensor.BF16 {
		return fmt.Errorf("random model: dtype %v (want f32, f16 or bf16)", d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	headDim := s.HeadDim
	if headDim == 0 {
		headDim = s.Hidden / s.Heads
	}
	c := model.Config{
		Arch: "llama", HiddenSize: s.Hidden, IntermediateSize: s.FFN, NumLayers: s.Layers,
		NumHeads: s.Heads, NumKVHeads: s.KVHeads, HeadDim: headDim, VocabSize: s.Vocab,
		TiedEmbeddings: s.Tied,
	}
	if s.Experts > 0 {
		c.Arch, c.NumExperts, c.ExpertsPerToken, c.NormTopK = "mixtral", s.Experts, s.ExpertsPerToken, true
	}
	r := rand.New(rand.NewPCG(seed, 11))
	var tensors []*tensor.Tensor
	for _, e := range model.ExpectedTensors(&c) {
		// Embeddings N(0,1); norms near 1; projections scaled by their
		// fan-in so activations keep unit size.
		std := 1 / math.Sqrt(float64(e.Shape[len(e.Shape)-1]))
		switch {
		case e.Name == model.EmbedName:
			std = 1
		case len(e.Shape) == 1:
			std = -1
		}
		t, err := randomTensor(r, e.Name, d, std, e.Shape)
		if err != nil {
			return err
		}
		tensors = append(tensors, t)
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return err
	}
	if err := model.WriteSafetensors(f, tensors, map[string]string{"format": "pt"}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	dtypeName := map[tensor.DType]string{tensor.F32: "float32", tensor.F16: "float16", tensor.BF16: "bfloat16"}[d]
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": s.Hidden, "intermediate_size": s.FFN, "num_hidden_layers": s.Layers,
		"num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads, "head_dim": headDim, "vocab_size": s.Vocab,
		"max_position_embeddings": s.Context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"tie_word_embeddings": s.Tied, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtypeName,
	}
	if s.RopeTheta > 0 {
		cfg["rope_theta"] = s.RopeTheta
	}
	if s.RopeScaling != nil {
		cfg["rope_scaling"] = s.RopeScaling
	}
	if s.Experts > 0 {
		cfg["architectures"], cfg["model_type"] = []string{"MixtralForCausalLM"}, "mixtral"
		cfg["num_local_experts"], cfg["num_experts_per_tok"] = s.Experts, s.ExpertsPerToken
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
}

// randomTensor fills a tensor with N(0, std²) values, or 1 + N(0, 0.01) when
// std < 0 (norm weights). Chunks of a million values are drawn and encoded
// in parallel, each from its own generator seeded from r, so the result
// depends only on r.
func randomTensor(r *rand.Rand, name string, d tensor.DType, std float64, shape tensor.Shape) (*tensor.Tensor, error) {
	n := int(shape.Elements())
	size := d.BlockBytes() // f32, f16, bf16: blocks of one value
	data := make([]byte, n*size)
	const chunk = 1 << 20
	seed := r.Uint64()
	var wg sync.WaitGroup
	errs := make([]error, (n+chunk-1)/chunk)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for lo := 0; lo < n; lo += chunk {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			cr := rand.New(rand.NewPCG(seed, uint64(lo)))
			part := make([]float32, min(chunk, n-lo))
			for i := range part {
				if std < 0 {
					part[i] = 1 + float32(cr.NormFloat64()*0.1)
				} else {
					part[i] = float32(cr.NormFloat64() * std)
				}
			}
			t, err := tensor.Encode(name, tensor.Shape{len(part)}, d, part)
			if err != nil {
				errs[lo/chunk] = err
				return
			}
			copy(data[lo*size:], t.Data)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &tensor.Tensor{Name: name, DType: d, Shape: shape, Data: data}, nil
}
