// Hugging Face checkpoints: a directory holding config.json and either
// model.safetensors or shards listed by model.safetensors.index.json
// ({"weight_map": {tensor name: shard file}}). Tensor names are already the
// canonical Llama names. The chat template comes from chat_template.jinja or
// tokenizer_config.json's "chat_template" when present.

package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"kiln/tensor"
)

// hfConfig is the subset of config.json the loader reads. Pointer fields
// distinguish absent (or null) from zero.
type hfConfig struct {
	Architectures         []string        `json:"architectures"`
	ModelType             string          `json:"model_type"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	VocabSize             int             `json:"vocab_size"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	OriginalMaxPositions  *int            `json:"original_max_position_embeddings"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	RopeParameters        json.RawMessage `json:"rope_parameters"`
	SlidingWindow         *int            `json:"sliding_window"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
	MaxWindowLayers       *int            `json:"max_window_layers"`
	LayerTypes            []string        `json:"layer_types"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	AttentionBias         *bool           `json:"attention_bias"`
	BOSTokenID            json.RawMessage `json:"bos_token_id"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	TorchDType            string          `json:"torch_dtype"`
	DType                 string          `json:"dtype"`
	PartialRotaryFactor   *float64        `json:"partial_rotary_factor"`
	NumLocalExperts       int             `json:"num_local_experts"`
	NumExperts            int             `json:"num_experts"`
	NumExpertsPerTok      int             `json:"num_experts_per_tok"`
	MoEIntermediateSize   int             `json:"moe_intermediate_size"`
	SharedExpertSize      int             `json:"shared_expert_intermediate_size"`
	QKVBias               *bool           `json:"qkv_bias"`
	NormTopKProb          *bool           `json:"norm_topk_prob"`
	DecoderSparseStep     *int            `json:"decoder_sparse_step"`
	MLPOnlyLayers         []int           `json:"mlp_only_layers"`
	ClipQKV               *float64        `json:"clip_qkv"`
	HiddenActivation      string          `json:"hidden_activation"`
	HiddenAct             string          `json:"hidden_act"`
	QueryPreAttnScalar    *float64        `json:"query_pre_attn_scalar"`
	AttnLogitSoftcapping  *float64        `json:"attn_logit_softcapping"`
	FinalLogitSoftcapping *float64        `json:"final_logit_softcapping"`
	RopeLocalBaseFreq     *float64        `json:"rope_local_base_freq"`
	SlidingWindowPattern  *int            `json:"sliding_window_pattern"`
}

// hfRope is rope_scaling or (transformers 5) rope_parameters.
type hfRope struct {
	RopeType             string    `json:"rope_type"`
	Type                 string    `json:"type"`
	RopeTheta            *float64  `json:"rope_theta"`
	Factor               *float64  `json:"factor"`
	LowFreqFactor        *float64  `json:"low_freq_factor"`
	HighFreqFactor       *float64  `json:"high_freq_factor"`
	OriginalMaxPositions *int      `json:"original_max_position_embeddings"`
	ShortFactor          []float32 `json:"short_factor"`
	LongFactor           []float32 `json:"long_factor"`
	AttentionFactor      *float64  `json:"attention_factor"`
}

var hfArchitectures = map[string]string{
	"LlamaForCausalLM":    "llama",
	"MistralForCausalLM":  "mistral",
	"Qwen2ForCausalLM":    "qwen2",
	"Qwen3ForCausalLM":    "qwen3",
	"Phi3ForCausalLM":     "phi3",
	"MixtralForCausalLM":  "mixtral",
	"mixtral":             "mixtral",
	"Qwen3MoeForCausalLM": "qwen3_moe",
	"qwen3_moe":           "qwen3_moe",
	"Qwen2MoeForCausalLM": "qwen2_moe",
	"qwen2_moe":           "qwen2_moe",
	"llama":               "llama",
	"mistral":             "mistral",
	"qwen2":               "qwen2",
	"qwen3":               "qwen3",
	"phi3":                "phi3",
	"OlmoeForCausalLM":    "olmoe",
	"olmoe":               "olmoe",
	"GemmaForCausalLM":    "gemma",
	"gemma":               "gemma",
	"Gemma2ForCausalLM":   "gemma2",
	"gemma2":              "gemma2",
	"Gemma3ForCausalLM":   "gemma3",
	"gemma3_text":         "gemma3",
}

// supportedHF lists the Hugging Face architectures and model types kiln
// reads, for the error about any other.
func supportedHF() string {
	var names []string
	for n := range hfArchitectures {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// parseHFConfig turns config.json into a Config. It does not know the tensors,
// so TiedEmbeddings reflects only the file (see hfTied) and DType is unset.
func parseHFConfig(data []byte) (Config, *bool, error) {
	var hc hfConfig
	if err := json.Unmarshal(data, &hc); err != nil {
		return Config{}, nil, fmt.Errorf("config.json: %w", err)
	}
	var c Config
	var archName string
	switch {
	case len(hc.Architectures) > 0:
		archName = hc.Architectures[0]
	case hc.ModelType != "":
		archName = hc.ModelType
	default:
		return c, nil, errors.New("config.json: no architectures or model_type")
	}
	arch, ok := hfArchitectures[archName]
	if !ok {
		return c, nil, fmt.Errorf("unsupported architecture %q (supported: %s)", archName, supportedHF())
	}
	c.Arch = arch
	c.HiddenSize = hc.HiddenSize
	c.IntermediateSize = hc.IntermediateSize
	c.NumLayers = hc.NumHiddenLayers
	c.NumHeads = hc.NumAttentionHeads
	c.NumKVHeads = c.NumHeads
	if hc.NumKeyValueHeads != nil {
		c.NumKVHeads = *hc.NumKeyValueHeads
	}
	if hc.HeadDim != nil {
		c.HeadDim = *hc.HeadDim
	} else if c.NumHeads > 0 {
		if c.HiddenSize%c.NumHeads != 0 {
			return c, nil, fmt.Errorf("config.json: hidden_size %d is not a multiple of %d heads", c.HiddenSize, c.NumHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	c.VocabSize = hc.VocabSize
	c.MaxPositions = hc.MaxPositionEmbeddings
	c.RMSNormEps = 1e-6
	if hc.RMSNormEps != nil {
		c.RMSNormEps = *hc.RMSNormEps
	}
	c.RopeStyle = RopeHalf
	c.RopeTheta = 10000
	if hc.RopeTheta != nil {
		c.RopeTheta = *hc.RopeTheta
	}
	ropes := []json.RawMessage{hc.RopeScaling, hc.RopeParameters}
	// Gemma 3 under transformers 5: rope_parameters per layer type, the
	// global layers' (full_attention) and the windowed layers'
	// (sliding_attention, unscaled).
	var byType map[string]json.RawMessage
	if json.Unmarshal(hc.RopeParameters, &byType) == nil && byType["full_attention"] != nil {
		ropes = []json.RawMessage{hc.RopeScaling, byType["full_attention"]}
		if local := byType["sliding_attention"]; local != nil {
			var r hfRope
			if err := json.Unmarshal(local, &r); err != nil {
				return c, nil, fmt.Errorf("config.json: sliding_attention rope: %w", err)
			}
			if t := r.RopeType + r.Type; t != "" && t != "default" {
				return c, nil, fmt.Errorf("config.json: sliding_attention rope of type %q: only unscaled is supported", t)
			}
			if r.RopeTheta != nil {
				hc.RopeLocalBaseFreq = r.RopeTheta
			}
		}
	}
	for _, raw := range ropes {
		if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		var r hfRope
		if err := json.Unmarshal(raw, &r); err != nil {
			return c, nil, fmt.Errorf("config.json: rope scaling: %w", err)
		}
		if r.RopeTheta != nil {
			c.RopeTheta = *r.RopeTheta
		}
		typ := r.RopeType
		if typ == "" {
			typ = r.Type
		}
		switch typ {
		case "", "default":
		case "linear":
			c.RopeScaling = RopeScaling{Type: "linear", Factor: deref(r.Factor)}
		case "llama3":
			c.RopeScaling = RopeScaling{
				Type:                 "llama3",
				Factor:               deref(r.Factor),
				LowFreqFactor:        deref(r.LowFreqFactor),
				HighFreqFactor:       deref(r.HighFreqFactor),
				OriginalMaxPositions: derefInt(r.OriginalMaxPositions),
			}
		case "longrope", "su":
			// As transformers: the extension is max_position_embeddings over
			// the top-level original_max_position_embeddings (Phi-3), else
			// rope_scaling's factor over max_position_embeddings.
			orig := derefInt(r.OriginalMaxPositions)
			if hc.OriginalMaxPositions != nil {
				orig = *hc.OriginalMaxPositions
			}
			if orig <= 0 {
				orig = c.MaxPositions
			}
			af := LongRopeAttentionFactor(c.MaxPositions, orig)
			if hc.OriginalMaxPositions == nil && r.Factor != nil {
				af = LongRopeAttentionFactor(int(math.Round(*r.Factor*float64(c.MaxPositions))), c.MaxPositions)
			}
			if r.AttentionFactor != nil {
				af = *r.AttentionFactor
			}
			c.RopeScaling = RopeScaling{Type: "longrope", ShortFactor: r.ShortFactor, LongFactor: r.LongFactor,
				OriginalMaxPositions: orig, AttentionFactor: af}
		default:
			return c, nil, fmt.Errorf("unsupported rope scaling type %q", typ)
		}
	}
	if err := hfSlidingWindow(&c, &hc); err != nil {
		return c, nil, err
	}
	c.QKVBias = arch == "qwen2" || (hc.AttentionBias != nil && *hc.AttentionBias) ||
		arch == "qwen2_moe" && (hc.QKVBias == nil || *hc.QKVBias) // qkv_bias, true unless said

	c.QKNorm = arch == "qwen3" || arch == "qwen3_moe"
	// The experts' count: num_local_experts (Mixtral's name, and every
	// family's as transformers 5 writes it) or num_experts (the others'
	// on the Hub).
	experts := hc.NumExperts
	if hc.NumLocalExperts > 0 {
		experts = hc.NumLocalExperts
	}
	switch arch {
	case "mixtral":
		c.NumExperts, c.ExpertsPerToken, c.NormTopK = experts, hc.NumExpertsPerTok, true
	case "qwen3_moe", "qwen2_moe":
		// Every layer a mixture of experts of moe_intermediate_size; dense
		// layers among them (mlp_only_layers, decoder_sparse_step) are not
		// supported yet. Qwen2-MoE adds a shared expert, gated.
		if len(hc.MLPOnlyLayers) > 0 || (hc.DecoderSparseStep != nil && *hc.DecoderSparseStep != 1) {
			return c, nil, errors.New("config.json: dense layers among the experts' (mlp_only_layers, decoder_sparse_step) are not supported")
		}
		c.NumExperts, c.ExpertsPerToken, c.IntermediateSize = experts, hc.NumExpertsPerTok, hc.MoEIntermediateSize
		c.NormTopK = hc.NormTopKProb != nil && *hc.NormTopKProb
		if arch == "qwen2_moe" {
			if hc.SharedExpertSize <= 0 {
				return c, nil, fmt.Errorf("config.json: shared_expert_intermediate_size %d", hc.SharedExpertSize)
			}
			c.SharedExpertSize, c.SharedExpertGate = hc.SharedExpertSize, true
		}
	case "olmoe":
		// OLMoE: every layer 64 experts of intermediate_size, 8 a token,
		// weighted by their probabilities over every expert; q and k
		// RMS-normalized over all heads at once.
		if hc.ClipQKV != nil {
			return c, nil, fmt.Errorf("config.json: clip_qkv %g is not supported", *hc.ClipQKV)
		}
		c.NumExperts, c.ExpertsPerToken = experts, hc.NumExpertsPerTok
		c.NormTopK = hc.NormTopKProb != nil && *hc.NormTopKProb
		c.QKNormWhole = true
	}
	if (arch == "mixtral" || arch == "qwen3_moe" || arch == "qwen2_moe" || arch == "olmoe") && (c.NumExperts < 1 || c.ExpertsPerToken < 1 || c.ExpertsPerToken > c.NumExperts) {
		return c, nil, fmt.Errorf("config.json: %d experts, %d a token", c.NumExperts, c.ExpertsPerToken)
	}
	if arch == "gemma" || arch == "gemma2" || arch == "gemma3" {
		if err := hfGemma(&c, &hc); err != nil {
			return c, nil, err
		}
	}
	if f := hc.PartialRotaryFactor; f != nil && *f != 1 {
		return c, nil, fmt.Errorf("config.json: partial_rotary_factor %g: rotary embeddings of part of a head are not supported", *f)
	}
	var err error
	if c.BOS, err = tokenIDs(hc.BOSTokenID); err != nil {
		return c, nil, fmt.Errorf("config.json: bos_token_id: %w", err)
	}
	if c.EOS, err = tokenIDs(hc.EOSTokenID); err != nil {
		return c, nil, fmt.Errorf("config.json: eos_token_id: %w", err)
	}
	return c, hc.TieWordEmbeddings, nil
}

// hfGemma sets what Gemma adds to a Llama: the embeddings scaled by √hidden,
// norms of 1+w and GeGLU; Gemma 2 and 3 norms after attention and the MLP
// too,
// the query scale, soft-capping, windowed layers among global ones (Gemma
// 2 every other layer from the first, Gemma 3 all but every
// sliding_window_pattern-th; or as layer_types says) and, in Gemma 3, q/k
// norms and the windowed layers' own RoPE base.
func hfGemma(c *Config, hc *hfConfig) error {
	act := hc.HiddenActivation
	if act == "" {
		act = hc.HiddenAct
	}
	// Gemma 1's configs say "gelu", which transformers runs as
	// gelu_pytorch_tanh (the activation it was trained with).
	if act != "gelu_pytorch_tanh" && act != "gelu_tanh" && act != "" && !(c.Arch == "gemma" && act == "gelu") {
		return fmt.Errorf("config.json: hidden activation %q: only gelu_pytorch_tanh is supported", act)
	}
	c.GELU, c.NormOffset = true, 1
	c.EmbedScale = math.Sqrt(float64(c.HiddenSize))
	if c.Arch == "gemma" {
		return nil // no sandwich norms, soft-capping or windows
	}
	c.PostNorms = true
	if q := hc.QueryPreAttnScalar; q != nil {
		if *q <= 0 {
			return fmt.Errorf("config.json: query_pre_attn_scalar %g", *q)
		}
		c.QueryScale = 1 / math.Sqrt(*q)
	}
	if v := hc.AttnLogitSoftcapping; v != nil {
		c.AttnSoftCap = *v
	}
	if v := hc.FinalLogitSoftcapping; v != nil {
		c.FinalSoftCap = *v
	}
	window := 0
	if hc.SlidingWindow != nil {
		window = *hc.SlidingWindow
	}
	c.SlidingWindow = 0
	c.LayerWindows = make([]int, c.NumLayers)
	pattern := 2 // Gemma 2: windowed, global, windowed, ...
	if c.Arch == "gemma3" {
		pattern = 6
		if hc.SlidingWindowPattern != nil {
			pattern = *hc.SlidingWindowPattern
		}
		c.QKNorm = true
		c.RopeLocalTheta = 10000
		if hc.RopeLocalBaseFreq != nil {
			c.RopeLocalTheta = *hc.RopeLocalBaseFreq
		}
	}
	if hc.LayerTypes != nil && len(hc.LayerTypes) != c.NumLayers {
		return fmt.Errorf("config.json: %d layer_types for %d layers", len(hc.LayerTypes), c.NumLayers)
	}
	for l := range c.LayerWindows {
		sliding := pattern > 0 && (l+1)%pattern != 0
		if hc.LayerTypes != nil {
			sliding = hc.LayerTypes[l] == "sliding_attention"
		}
		if sliding {
			c.LayerWindows[l] = window
		}
	}
	return nil
}

// hfSlidingWindow sets c.SlidingWindow. Mistral applies sliding_window (an
// int or null) to every layer; Llama ignores it. Qwen2 applies it only when
// use_sliding_window is true, and then only to the layers from
// max_window_layers on (transformers 5 spells this out as layer_types); one
// window for all layers or none is supported, a mix is refused.
func hfSlidingWindow(c *Config, hc *hfConfig) error {
	if hc.SlidingWindow == nil {
		return nil
	}
	switch c.Arch {
	case "mistral", "phi3", "mixtral":
		c.SlidingWindow = *hc.SlidingWindow
	case "qwen2", "qwen3", "qwen3_moe", "qwen2_moe":
		if hc.UseSlidingWindow == nil || !*hc.UseSlidingWindow {
			return nil
		}
		sliding := 0
		if hc.LayerTypes != nil {
			for _, t := range hc.LayerTypes {
				if t == "sliding_attention" {
					sliding++
				}
			}
		} else {
			first := 28 // transformers' default max_window_layers
			if hc.MaxWindowLayers != nil {
				first = *hc.MaxWindowLayers
			}
			sliding = c.NumLayers - max(0, min(first, c.NumLayers))
		}
		switch sliding {
		case 0:
		case c.NumLayers:
			c.SlidingWindow = *hc.SlidingWindow
		default:
			return fmt.Errorf("unsupported sliding window on %d of %d layers", sliding, c.NumLayers)
		}
	}
	return nil
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// tokenIDs reads an int, a list of ints, or null.
func tokenIDs(raw json.RawMessage) ([]int, error) {
	s := bytes.TrimSpace(raw)
	if len(s) == 0 || string(s) == "null" {
		return nil, nil
	}
	if s[0] == '[' {
		var ids []int
		err := json.Unmarshal(s, &ids)
		return ids, err
	}
	var id int
	if err := json.Unmarshal(s, &id); err != nil {
		return nil, err
	}
	return []int{id}, nil
}

// LoadHF loads a Hugging Face checkpoint directory.
func LoadHF(dir string) (*Model, error) {
	m, err := loadHF(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return m, nil
}

// LoadHFFS loads a Hugging Face checkpoint from the root of fsys (e.g. files
// embedded in the binary), reading the weights into memory; name labels it.
func LoadHFFS(fsys fs.FS, name string) (*Model, error) {
	m, err := loadHFFrom(fsSource{fsys}, name)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	return m, nil
}

// hfSource gives the files of a checkpoint: small ones read, weight files
// memory-mapped where the source allows.
type hfSource interface {
	read(name string) ([]byte, error)
	mapped(name string) ([]byte, func() error, error)
}

type dirSource string

func (d dirSource) read(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}
func (d dirSource) mapped(name string) ([]byte, func() error, error) {
	return mapFile(filepath.Join(string(d), name))
}

type fsSource struct{ fsys fs.FS }

func (s fsSource) read(name string) ([]byte, error) { return fs.ReadFile(s.fsys, name) }
func (s fsSource) mapped(name string) ([]byte, func() error, error) {
	b, err := fs.ReadFile(s.fsys, name)
	return b, func() error { return nil }, err
}

func loadHF(dir string) (*Model, error) { return loadHFFrom(dirSource(dir), dir) }

func loadHFFrom(src hfSource, dir string) (m *Model, err error) {
	cfgData, err := src.read("config.json")
	if err != nil {
		return nil, err
	}
	cfg, tie, err := parseHFConfig(cfgData)
	if err != nil {
		return nil, err
	}
	m = &Model{Path: dir, Format: "safetensors", Tensors: map[string]*tensor.Tensor{}}
	defer func() {
		if err != nil {
			m.Close()
			m = nil
		}
	}()
	// Which files to map: a single model.safetensors or the index's shards.
	var shards []string
	var weightMap map[string]string
	idxData, ierr := src.read("model.safetensors.index.json")
	switch {
	case ierr == nil:
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(idxData, &idx); err != nil {
			return m, fmt.Errorf("model.safetensors.index.json: %w", err)
		}
		if len(idx.WeightMap) == 0 {
			return m, errors.New("model.safetensors.index.json: empty weight_map")
		}
		weightMap = idx.WeightMap
		seen := map[string]bool{}
		for _, f := range weightMap {
			if f != filepath.Base(f) || f == "." || f == ".." {
				return m, fmt.Errorf("model.safetensors.index.json: shard %q is not a file name in the directory", f)
			}
			if !seen[f] {
				seen[f] = true
				shards = append(shards, f)
			}
		}
		sort.Strings(shards)
	case errors.Is(ierr, fs.ErrNotExist):
		shards = []string{"model.safetensors"}
	default:
		return m, ierr
	}
	for _, shard := range shards {
		data, unmap, err := src.mapped(shard)
		if err != nil {
			return m, err
		}
		ts, _, err := parseSafetensors(data)
		if _, ok := src.(dirSource); ok && err == nil {
			unmap = markMapped(ts, data, unmap)
		}
		m.closers = append(m.closers, unmap)
		if err != nil {
			return m, fmt.Errorf("%s: %w", shard, err)
		}
		for name, t := range ts {
			if _, dup := m.Tensors[name]; dup {
				return m, fmt.Errorf("%s: tensor %s appears in more than one shard", shard, name)
			}
			if weightMap != nil && weightMap[name] != shard {
				return m, fmt.Errorf("%s: tensor %s is not mapped to this shard by the index", shard, name)
			}
			m.Tensors[name] = t
		}
	}
	for name, shard := range weightMap {
		if _, ok := m.Tensors[name]; !ok {
			return m, fmt.Errorf("%s: missing tensor %s listed in the index", shard, name)
		}
	}
	if err := scaleFP8(m.Tensors); err != nil {
		return m, err
	}
	if cfg.Arch == "phi3" {
		if err := splitPhi3(&cfg, m.Tensors); err != nil {
			return m, err
		}
	}
	if cfg.NumExperts > 0 {
		if err := splitFusedExperts(&cfg, m.Tensors); err != nil {
			return m, err
		}
	}
	if err := finishHFConfig(&cfg, tie, m.Tensors); err != nil {
		return m, err
	}
	m.Config = cfg
	m.ChatTemplate = readChatTemplate(src)
	return m, nil
}

// splitPhi3 takes Phi-3's fused projections apart into the canonical
// tensors, each a view of its rows (no copy): qkv_proj into the q, k and v
// projections, gate_up_proj into the gate and up projections (the gate
// first, as Phi3MLP chunks it).
func splitPhi3(c *Config, ts map[string]*tensor.Tensor) error {
	q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	for l := 0; l < c.NumLayers; l++ {
		p := func(s string) string { return LayerName(l, s) }
		if err := splitRows(ts, p("self_attn.qkv_proj.weight"),
			[]string{p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"), p("self_attn.v_proj.weight")}, []int{q, kv, kv}); err != nil {
			return err
		}
		if err := splitRows(ts, p("mlp.gate_up_proj.weight"),
			[]string{p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")}, []int{c.IntermediateSize, c.IntermediateSize}); err != nil {
			return err
		}
	}
	return nil
}

// splitFusedExperts takes apart the experts as transformers 5 holds them,
// stacked per layer (mlp.experts.gate_up_proj [experts, 2·rows, cols],
// each expert's gate rows then its up rows, and mlp.experts.down_proj
// [experts, cols, rows]), into each expert's matrices, views of their
// bytes; Mixtral's router, then mlp.gate, takes its Hub name. Experts
// stored one by one (the Hub's checkpoints) are left as they are.
func splitFusedExperts(c *Config, ts map[string]*tensor.Tensor) error {
	for l := 0; l < c.NumLayers; l++ {
		var prefix string
		for _, p := range []string{"mlp.experts.", "block_sparse_moe.experts."} {
			if _, ok := ts[LayerName(l, p+"gate_up_proj")]; ok {
				prefix = p
			}
		}
		if prefix == "" {
			continue
		}
		if r, router := LayerName(l, "mlp.gate.weight"), c.MoERouter(l); r != router {
			if t, ok := ts[r]; ok {
				if _, dup := ts[router]; dup {
					return fmt.Errorf("tensors %s and %s both hold layer %d's router", r, router, l)
				}
				delete(ts, r)
				t.Name = router
				ts[router] = t
			}
		}
		e := c.NumExperts
		var gateUp, down []string
		var gateUpRows, downRows []int
		for i := range e {
			g, u, d := c.MoEExpert(l, i)
			gateUp, down = append(gateUp, g, u), append(down, d)
			gateUpRows, downRows = append(gateUpRows, c.IntermediateSize, c.IntermediateSize), append(downRows, c.HiddenSize)
		}
		for _, s := range []struct {
			name  string
			names []string
			rows  []int
			cols  int
		}{
			{LayerName(l, prefix+"gate_up_proj"), gateUp, gateUpRows, c.HiddenSize},
			{LayerName(l, prefix+"down_proj"), down, downRows, c.IntermediateSize},
		} {
			t, ok := ts[s.name]
			if !ok {
				return fmt.Errorf("missing tensor %s", s.name)
			}
			if len(t.Shape) != 3 || t.Shape[0] != e || t.Shape[1] != s.rows[0]*len(s.rows)/e || t.Shape[2] != s.cols {
				return fmt.Errorf("tensor %s has shape %v, want [%d,%d,%d]", s.name, t.Shape, e, s.rows[0]*len(s.rows)/e, s.cols)
			}
			t.Shape = tensor.Shape{t.Shape[0] * t.Shape[1], t.Shape[2]}
			if err := splitRows(ts, s.name, s.names, s.rows); err != nil {
				return err
			}
		}
	}
	return nil
}

// splitRows replaces matrix name of ts by its consecutive blocks of rows,
// named names, views of its bytes.
func splitRows(ts map[string]*tensor.Tensor, name string, names []string, rows []int) error {
	t, ok := ts[name]
	if _, apart := ts[names[0]]; !ok && apart {
		return nil // stored apart already (checkTensors checks the parts)
	}
	if !ok {
		return fmt.Errorf("missing tensor %s", name)
	}
	total := 0
	for _, r := range rows {
		total += r
	}
	if len(t.Shape) != 2 || t.Shape[0] != total || len(t.Scales) > 0 {
		return fmt.Errorf("tensor %s has shape %v, want [%d,...] (unscaled)", name, t.Shape, total)
	}
	row, err := t.DType.Bytes(int64(t.Shape[1]))
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	if int64(len(t.Data)) != row*int64(total) {
		return fmt.Errorf("tensor %s: %d bytes for %v", name, len(t.Data), t.Shape)
	}
	off := int64(0)
	for i, n := range names {
		if _, dup := ts[n]; dup {
			return fmt.Errorf("tensor %s is both fused into %s and stored apart", n, name)
		}
		b := row * int64(rows[i])
		// Each view gives back the fused tensor's pages (read from the
		// file again if another view touches them).
		ts[n] = &tensor.Tensor{Name: n, DType: t.DType, Shape: tensor.Shape{rows[i], t.Shape[1]}, Data: t.Data[off : off+b], Release: t.Release}
		off += b
	}
	delete(ts, name)
	return nil
}

// finishHFConfig settles what needs the tensors (tying, DType, vocab size)
// and checks every expected tensor.
func finishHFConfig(cfg *Config, tie *bool, ts map[string]*tensor.Tensor) error {
	_, hasHead := ts[HeadName]
	switch {
	case tie != nil:
		cfg.TiedEmbeddings = *tie
	default:
		// transformers defaults tie_word_embeddings to false for llama,
		// mistral and qwen2; a file without the key and without lm_head can
		// only be tied.
		cfg.TiedEmbeddings = !hasHead
	}
	emb, ok := ts[EmbedName]
	if !ok {
		return fmt.Errorf("missing tensor %s", EmbedName)
	}
	cfg.DType = emb.DType
	if err := checkTensors(cfg, ts); err != nil {
		return err
	}
	// Norms and biases are used as float vectors; every tensor must be a
	// float type the backends read, or an FP8 matrix with its scales
	// (scaleFP8), which products read.
	for name, t := range ts {
		switch t.DType {
		case tensor.F32, tensor.F16, tensor.BF16:
		case tensor.F8_E4M3:
			if len(t.Scales) == 0 {
				return fmt.Errorf("tensor %s: F8_E4M3 without scales", name)
			}
		default:
			return fmt.Errorf("unsupported dtype %v for tensor %s", t.DType, name)
		}
	}
	return nil
}

// readChatTemplate returns chat_template.jinja, else tokenizer_config.json's
// chat_template (a string, or a list of {name, template} where "default" or
// the first wins), else "".
func readChatTemplate(src hfSource) string {
	if b, err := src.read("chat_template.jinja"); err == nil {
		return string(b)
	}
	b, err := src.read("tokenizer_config.json")
	if err != nil {
		return ""
	}
	var tc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if json.Unmarshal(b, &tc) != nil || len(tc.ChatTemplate) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(tc.ChatTemplate, &s) == nil {
		return s
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(tc.ChatTemplate, &list) != nil || len(list) == 0 {
		return ""
	}
	for _, e := range list {
		if strings.EqualFold(e.Name, "default") {
			return e.Template
		}
	}
	return list[0].Template
}
