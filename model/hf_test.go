package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"kiln/internal/testshared"
	"kiln/tensor"
)

func TestLoadHF(t *testing.T) {
	type tc struct {
		name   string
		arch   string
		dt     tensor.DType
		tied   bool
		shards int
		extra  map[string]any
		edit   func(c *Config) // expected config changes
	}
	tests := []tc{
		{name: "llama f32", arch: "llama", dt: tensor.F32},
		{name: "llama bf16 tied", arch: "llama", dt: tensor.BF16, tied: true},
		{name: "mistral f16 sharded", arch: "mistral", dt: tensor.F16, shards: 3,
			extra: map[string]any{"sliding_window": 4096}, edit: func(c *Config) { c.SlidingWindow = 4096 }},
		{name: "mistral null window", arch: "mistral", dt: tensor.F32, extra: map[string]any{"sliding_window": json.RawMessage("null")}},
		{name: "qwen2 tied bias", arch: "qwen2", dt: tensor.BF16, tied: true,
			extra: map[string]any{"sliding_window": 32768, "use_sliding_window": false, "eos_token_id": []int{2, 7}},
			edit:  func(c *Config) { c.EOS = []int{2, 7} }},
		{name: "qwen2 sliding", arch: "qwen2", dt: tensor.F32,
			extra: map[string]any{"sliding_window": 64, "use_sliding_window": true, "max_window_layers": 0}, edit: func(c *Config) { c.SlidingWindow = 64 }},
		{name: "qwen2 sliding past max_window_layers", arch: "qwen2", dt: tensor.F32,
			extra: map[string]any{"sliding_window": 64, "use_sliding_window": true, "max_window_layers": 28}},
		{name: "qwen2 sliding layer_types", arch: "qwen2", dt: tensor.F32,
			extra: map[string]any{"sliding_window": 64, "use_sliding_window": true, "layer_types": []string{"sliding_attention", "sliding_attention"}},
			edit:  func(c *Config) { c.SlidingWindow = 64 }},
		{name: "llama ignores sliding_window", arch: "llama", dt: tensor.F32, extra: map[string]any{"sliding_window": 64}},
		{name: "llama attention_bias", arch: "llama", dt: tensor.F32,
			extra: map[string]any{"attention_bias": true}, edit: func(c *Config) { c.QKVBias = true }},
		{name: "llama3 rope_scaling", arch: "llama", dt: tensor.F32,
			extra: map[string]any{"rope_theta": 500000.0, "rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0,
				"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
			edit: func(c *Config) {
				c.RopeTheta = 500000
				c.RopeScaling = RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
			}},
		{name: "rope_parameters (transformers 5)", arch: "llama", dt: tensor.F32,
			extra: map[string]any{"rope_theta": nil, "rope_parameters": map[string]any{"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
			edit:  func(c *Config) { c.RopeTheta = 1e6; c.RopeScaling = RopeScaling{Type: "linear", Factor: 2} }},
		{name: "rope_scaling type key default", arch: "llama", dt: tensor.F32,
			extra: map[string]any{"rope_scaling": map[string]any{"type": "default"}}},
		{name: "explicit head_dim", arch: "llama", dt: tensor.F32, extra: map[string]any{"head_dim": 16}},
		{name: "tie key absent, no lm_head", arch: "llama", dt: tensor.F32, tied: true, extra: map[string]any{"tie_word_embeddings": nil}},
		{name: "tie key absent, lm_head", arch: "qwen2", dt: tensor.F32, extra: map[string]any{"tie_word_embeddings": nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tinyConfig(tt.arch)
			c.TiedEmbeddings = tt.tied
			c.QKVBias = tt.arch == "qwen2"
			if tt.extra["attention_bias"] == true {
				c.QKVBias = true
			}
			c.DType = tt.dt
			ts := randTensors(&c, tt.dt, 1)
			dir := writeHFDir(t, hfConfigJSON(&c, tt.extra), ts, tt.shards)
			if tt.edit != nil {
				tt.edit(&c)
			}
			m, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if !configEqual(m.Config, c) {
				t.Errorf("config\n got %+v\nwant %+v", m.Config, c)
			}
			if m.Format != "safetensors" || m.Path != dir {
				t.Errorf("format %q path %q", m.Format, m.Path)
			}
			sameTensors(t, m.Tensors, ts)
		})
	}
}

func TestHFTiedHeadPresent(t *testing.T) {
	// Tied models sometimes store lm_head anyway; it is kept.
	c := tinyConfig("llama")
	c.TiedEmbeddings = false
	ts := randTensors(&c, tensor.F32, 1)
	c.TiedEmbeddings = true
	m, err := LoadHF(writeHFDir(t, hfConfigJSON(&c, nil), ts, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.Config.TiedEmbeddings || m.Tensors[HeadName] == nil {
		t.Errorf("tied %v, head %v", m.Config.TiedEmbeddings, m.Tensors[HeadName] != nil)
	}
}

func TestHFChatTemplate(t *testing.T) {
	c := tinyConfig("llama")
	ts := randTensors(&c, tensor.F32, 1)
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"none", nil, ""},
		{"tokenizer_config string", map[string]string{"tokenizer_config.json": `{"chat_template": "{{ a }}"}`}, "{{ a }}"},
		{"tokenizer_config list", map[string]string{"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}`}, "D"},
		{"jinja wins", map[string]string{"tokenizer_config.json": `{"chat_template": "X"}`, "chat_template.jinja": "J"}, "J"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeHFDir(t, hfConfigJSON(&c, nil), ts, 1)
			for f, s := range tc.files {
				writeFile(t, filepath.Join(dir, f), []byte(s))
			}
			m, err := LoadHF(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.ChatTemplate != tc.want {
				t.Errorf("chat template %q, want %q", m.ChatTemplate, tc.want)
			}
		})
	}
}

func TestHFErrors(t *testing.T) {
	c := tinyConfig("llama")
	good := randTensors(&c, tensor.F32, 1)
	without := func(name string) []*tensor.Tensor {
		var out []*tensor.Tensor
		for _, t := range good {
			if t.Name != name {
				out = append(out, t)
			}
		}
		return out
	}
	replace := func(t0 *tensor.Tensor) []*tensor.Tensor {
		out := without(t0.Name)
		return append(out, t0)
	}
	q0 := LayerName(0, "self_attn.q_proj.weight")
	tests := []struct {
		name  string
		extra map[string]any
		ts    []*tensor.Tensor
		want  string
	}{
		{"unsupported architecture", map[string]any{"architectures": []string{"GPTNeoXForCausalLM"}}, good, `unsupported architecture "GPTNeoXForCausalLM" (supported: Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, OlmoeForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, gemma, gemma2, gemma3_text, llama, mistral, mixtral, olmoe, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe)`},
		{"unsupported model_type", map[string]any{"architectures": nil, "model_type": "gpt_neox"}, good, `unsupported architecture "gpt_neox"`},
		{"longrope of the wrong length", map[string]any{"rope_scaling": map[string]any{"rope_type": "longrope", "short_factor": []float64{1}}}, good, "longrope scaling of 1 short and 0 long factors (head dim 16)"},
		{"partial rotary", map[string]any{"partial_rotary_factor": 0.5}, good, "partial_rotary_factor 0.5"},
		{"yarn", map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4.0}}, good, `unsupported rope scaling type "yarn"`},
		{"dynamic", map[string]any{"rope_parameters": map[string]any{"type": "dynamic", "factor": 4.0}}, good, `unsupported rope scaling type "dynamic"`},
		{"bad llama3", map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0}}, good, "llama3 rope scaling"},
		{"missing tensor", nil, without(LayerName(1, "mlp.down_proj.weight")), "missing tensor model.layers.1.mlp.down_proj.weight"},
		{"missing head", nil, without(HeadName), "missing tensor lm_head.weight"},
		{"wrong shape", nil, replace(tensor.FromF32(q0, tensor.Shape{64, 32}, make([]float32, 64*32))), "tensor " + q0 + " has shape [64,32], want [64,64]"},
		{"unsupported dtype", nil, good, "unsupported dtype I8 for tensor extra.weight"},
		{"bad config json", map[string]any{"hidden_size": "big"}, good, "config.json"},
		{"qwen2-style mixed sliding window", map[string]any{"architectures": []string{"Qwen2ForCausalLM"}, "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 1}, good, "unsupported sliding window on 1 of 2 layers"},
		{"heads not dividing hidden", map[string]any{"num_attention_heads": 5, "num_key_value_heads": 5}, good, "multiple"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeHFDir(t, hfConfigJSON(&c, tc.extra), tc.ts, 1)
			if tc.name == "unsupported dtype" {
				// Append an I8 tensor by rewriting the header.
				p := filepath.Join(dir, "model.safetensors")
				writeFile(t, p, addRawSafetensor(t, mustRead(t, p), "extra.weight", "I8", []int{4}, []byte{1, 2, 3, 4}))
			}
			m, err := Load(dir)
			if err == nil {
				m.Close()
				t.Fatal("no error")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q does not mention %q on one line", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "load "+dir+": ") {
				t.Errorf("error %q lacks the load prefix", err)
			}
		})
	}
}

func TestHFShardErrors(t *testing.T) {
	c := tinyConfig("llama")
	ts := randTensors(&c, tensor.F32, 1)
	for _, tc := range []struct {
		name string
		edit func(dir string, wm map[string]string)
		want string
	}{
		{"missing shard", func(dir string, wm map[string]string) {
			os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
		}, "no such file"},
		{"index lists absent tensor", func(dir string, wm map[string]string) { wm["ghost.weight"] = "model-00001-of-00002.safetensors" }, "missing tensor ghost.weight"},
		{"index points elsewhere", func(dir string, wm map[string]string) { wm[EmbedName] = "model-00002-of-00002.safetensors" }, "not mapped to this shard"},
		{"path escape", func(dir string, wm map[string]string) { wm[EmbedName] = "../x.safetensors" }, "not a file name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeHFDir(t, hfConfigJSON(&c, nil), ts, 2)
			ip := filepath.Join(dir, "model.safetensors.index.json")
			var idx struct {
				WeightMap map[string]string `json:"weight_map"`
			}
			json.Unmarshal(mustRead(t, ip), &idx)
			tc.edit(dir, idx.WeightMap)
			b, _ := json.Marshal(idx)
			writeFile(t, ip, b)
			_, err := LoadHF(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// addRawSafetensor appends a tensor of any dtype string to a safetensors file.
func addRawSafetensor(t testing.TB, file []byte, name, dtype string, shape []int, data []byte) []byte {
	t.Helper()
	n := binary.LittleEndian.Uint64(file)
	var h map[string]json.RawMessage
	if err := json.Unmarshal(file[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	body := file[8+n:]
	e, _ := json.Marshal(map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{len(body), len(body) + len(data)}})
	h[name] = e
	return rawSafetensors(h, append(bytes.Clone(body), data...))
}

func rawSafetensors(header any, body []byte) []byte {
	js, _ := json.Marshal(header)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	return append(append(out, js...), body...)
}

func TestSafetensorsMalformed(t *testing.T) {
	ent := func(dtype string, shape []int, b, e int) map[string]any {
		return map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{b, e}}
	}
	body := make([]byte, 64)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"header length past end", binary.LittleEndian.AppendUint64(nil, 100), "exceeds"},
		{"header length huge", binary.LittleEndian.AppendUint64(nil, 1<<63), "exceeds"},
		{"not json", append(binary.LittleEndian.AppendUint64(nil, 3), "abc"...), "header"},
		{"json array", append(binary.LittleEndian.AppendUint64(nil, 2), "[]"...), "header"},
		{"json null", append(binary.LittleEndian.AppendUint64(nil, 4), "null"...), "not a JSON object"},
		{"trailing garbage", append(binary.LittleEndian.AppendUint64(nil, 5), "{} xx"...), "after the JSON"},
		{"unsupported dtype", rawSafetensors(map[string]any{"w": ent("I8", []int{4}, 0, 4)}, body), "unsupported dtype I8 for tensor w"},
		{"unknown dtype", rawSafetensors(map[string]any{"w": ent("Q99", []int{4}, 0, 4)}, body), "unsupported dtype Q99 for tensor w"},
		{"offset past end", rawSafetensors(map[string]any{"w": ent("F32", []int{32}, 0, 128)}, body), "outside"},
		{"reversed offsets", rawSafetensors(map[string]any{"w": ent("F32", []int{1}, 8, 4)}, body), "outside"},
		{"negative offset", rawSafetensors(map[string]any{"w": ent("F32", []int{1}, -4, 0)}, body), "outside"},
		{"size mismatch", rawSafetensors(map[string]any{"w": ent("F32", []int{3}, 0, 16)}, body), "needs 12 bytes"},
		{"negative dim", rawSafetensors(map[string]any{"w": ent("F32", []int{-1, -4}, 0, 16)}, body), "bad dimension"},
		{"overflowing shape", rawSafetensors(map[string]any{"w": ent("F32", []int{1 << 30, 1 << 30, 1 << 30, 1 << 30}, 0, 16)}, body), "larger than the file"},
		{"overlap", rawSafetensors(map[string]any{"a": ent("F32", []int{4}, 0, 16), "b": ent("F32", []int{4}, 8, 24)}, body), "overlap"},
		{"missing offsets", rawSafetensors(map[string]any{"w": map[string]any{"dtype": "F32", "shape": []int{1}}}, body), "data_offsets"},
		{"missing shape", rawSafetensors(map[string]any{"w": map[string]any{"dtype": "F32", "data_offsets": []int{0, 4}}}, body), "no shape"},
		{"fractional offset", rawSafetensors(map[string]any{"w": map[string]any{"dtype": "F32", "shape": []int{1}, "data_offsets": []float64{0, 4.5}}}, body), "data_offsets"},
		{"bad metadata", rawSafetensors(map[string]any{"__metadata__": map[string]any{"a": 1}}, body), "__metadata__"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseSafetensors(tc.data)
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	ts := []*tensor.Tensor{
		encodeTensor("a", tensor.Shape{2, 3}, tensor.F32, []float32{1, 2, 3, 4, 5, 6}),
		encodeTensor("b", tensor.Shape{4}, tensor.BF16, []float32{1, -2, 0.5, 3}),
		encodeTensor("c", tensor.Shape{}, tensor.F16, []float32{7}),
		encodeTensor("empty", tensor.Shape{0, 5}, tensor.F32, nil),
	}
	got, meta, err := parseSafetensors(safetensorsBytes(t, ts))
	if err != nil {
		t.Fatal(err)
	}
	if meta["format"] != "pt" {
		t.Errorf("metadata %v", meta)
	}
	sameTensors(t, got, ts)
}

func TestParseHFConfigDefaults(t *testing.T) {
	cfg, tie, err := parseHFConfig([]byte(`{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
		"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 32,
		"bos_token_id": null, "eos_token_id": [5, 6], "head_dim": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if tie != nil || cfg.NumKVHeads != 4 || cfg.HeadDim != 16 || cfg.RopeTheta != 10000 || cfg.RopeStyle != RopeHalf ||
		cfg.BOS != nil || len(cfg.EOS) != 2 || cfg.QKVBias || cfg.RMSNormEps != 1e-6 {
		t.Errorf("defaults: %+v tie %v", cfg, tie)
	}
}

func FuzzSafetensorsHeader(f *testing.F) {
	c := tinyConfig("llama")
	c.NumLayers = 1
	f.Add(safetensorsBytes(f, randTensors(&c, tensor.BF16, 1)[:3]))
	f.Add(safetensorsBytes(f, []*tensor.Tensor{encodeTensor("x", tensor.Shape{2}, tensor.F16, []float32{1, 2})}))
	f.Add(rawSafetensors(map[string]any{"w": map[string]any{"dtype": "F32", "shape": []int{1}, "data_offsets": []int{0, 4}}}, make([]byte, 4)))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, _, err := parseSafetensors(data)
		if err != nil {
			return
		}
		for _, tt := range ts {
			if err := tt.Validate(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzHFConfig: config.json of any content gives a config or an error,
// never a panic; a config it gives validates, and its tensors can be
// listed (ExpectedTensors) without a panic. Seeds: the families kiln reads,
// with their scalings, windows, experts and Gemma's fields.
func FuzzHFConfig(f *testing.F) {
	base := `"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40, "max_position_embeddings": 128`
	for _, seed := range []string{
		`{"architectures": ["LlamaForCausalLM"], ` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 32}}`,
		`{"model_type": "mistral", ` + base + `, "sliding_window": 16}`,
		`{"model_type": "qwen2", ` + base + `, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 1, "layer_types": ["full_attention", "sliding_attention"]}`,
		`{"model_type": "phi3", ` + base + `, "rope_scaling": {"type": "longrope", "short_factor": [1,1,1,1,1,1,1,1], "long_factor": [2,2,2,2,2,2,2,2], "original_max_position_embeddings": 32}}`,
		`{"model_type": "mixtral", ` + base + `, "num_local_experts": 4, "num_experts_per_tok": 2}`,
		`{"model_type": "qwen2_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}`,
		`{"model_type": "olmoe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": null}`,
		`{"model_type": "gemma3_text", ` + base + `, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"], "rope_local_base_freq": 10000, "hidden_activation": "gelu_pytorch_tanh"}`,
		`{"model_type": "gemma2", ` + base + `, "attn_logit_softcapping": 50, "final_logit_softcapping": 30, "sliding_window": 8}`,
		`{"model_type": "qwen3", ` + base + `, "head_dim": 32, "rope_parameters": {"rope_type": "linear", "factor": 2, "rope_theta": 1e6}, "eos_token_id": [1, 2]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _, err := parseHFConfig(data)
		if err != nil {
			return
		}
		if c.Validate() != nil {
			return // checkTensors refuses it at load
		}
		if c.NumLayers > 64 || c.NumExperts > 64 || c.HiddenSize > 4096 {
			return // listing would only take long
		}
		ExpectedTensors(&c)
	})
}

func TestHFChatTemplateShared(t *testing.T) {
	for _, tc := range []struct{ dir, want string }{
		{"qwen2.5-instruct", "<|im_start|>"},
		{"smollm3", "reasoning_mode"},
	} {
		dir := testshared.Path(t, "tokenizers", tc.dir)
		if got := readChatTemplate(dirSource(dir)); !strings.Contains(got, tc.want) {
			t.Errorf("%s: chat template %.80q lacks %q", tc.dir, got, tc.want)
		}
	}
}

// TestHFFixtures loads the repository's transformers-made checkpoints
// (testdata/hf) and checks the configs they were made with.
func TestHFFixtures(t *testing.T) {
	root := filepath.Join("..", "testdata", "hf")
	if _, err := os.Stat(root); err != nil {
		t.Skip("no testdata/hf")
	}
	checks := map[string]func(c Config) bool{
		"llama-bf16":        func(c Config) bool { return c.DType == tensor.BF16 },
		"llama-f16":         func(c Config) bool { return c.DType == tensor.F16 },
		"llama-mha-tied":    func(c Config) bool { return c.TiedEmbeddings && c.NumKVHeads == c.NumHeads },
		"llama-mqa":         func(c Config) bool { return c.NumKVHeads == 1 },
		"llama-linear-rope": func(c Config) bool { return c.RopeScaling.Type == "linear" && c.RopeScaling.Factor > 1 },
		"llama3-rope": func(c Config) bool {
			return reflect.DeepEqual(c.RopeScaling, RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}) && c.RopeTheta == 500000
		},
		"mistral-swa": func(c Config) bool { return c.Arch == "mistral" && c.SlidingWindow == 8 },
		"qwen2-bias": func(c Config) bool {
			return c.Arch == "qwen2" && c.QKVBias && c.SlidingWindow == 0 && c.RMSNormEps == 1e-6
		},
		"llama-sharded": func(c Config) bool { return c.RopeTheta == 10000 },
		"qwen3-qknorm": func(c Config) bool {
			return c.Arch == "qwen3" && c.QKNorm && !c.QKVBias && c.HeadDim == 32 && c.NumHeads*c.HeadDim != c.HiddenSize
		},
		"llama-odd": func(c Config) bool {
			return c.HiddenSize == 96 && c.NumHeads == 6 && c.VocabSize == 301 && c.NumLayers == 3
		},
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		n++
		t.Run(e.Name(), func(t *testing.T) {
			m, err := Load(filepath.Join(root, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c := m.Config
			if c.RopeStyle != RopeHalf || len(c.BOS) != 1 || len(c.EOS) != 1 {
				t.Errorf("config %+v", c)
			}
			if check, ok := checks[e.Name()]; ok && !check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
	if n == 0 {
		t.Skip("no fixtures")
	}
}

// TestLoadHFFS loads a checkpoint from an fs.FS (as the embedded demo model
// is) and finds the same tensors as from its directory.
func TestLoadHFFS(t *testing.T) {
	dir := "../testdata/hf/llama-sharded"
	want, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	got, err := LoadHFFS(os.DirFS(dir), "llama-sharded")
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !configEqual(got.Config, want.Config) || len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("config %+v with %d tensors, want %+v with %d", got.Config, len(got.Tensors), want.Config, len(want.Tensors))
	}
	for name, w := range want.Tensors {
		g := got.Tensors[name]
		if g == nil || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("tensor %s differs", name)
		}
	}
	if _, err := LoadHFFS(os.DirFS(t.TempDir()), "empty"); err == nil {
		t.Error("an empty FS loaded")
	}
}

// TestSplitRows: a fused matrix is replaced by views of its blocks of
// rows (the same bytes, no copy); a missing tensor, a wrong row count and
// a part also stored apart are errors that name the tensor.
func TestSplitRows(t *testing.T) {
	vals := make([]float32, 6*2)
	for i := range vals {
		vals[i] = float32(i)
	}
	fused := func() map[string]*tensor.Tensor {
		return map[string]*tensor.Tensor{"f": tensor.FromF32("f", tensor.Shape{6, 2}, vals)}
	}
	ts := fused()
	data := ts["f"].Data
	if err := splitRows(ts, "f", []string{"a", "b"}, []int{4, 2}); err != nil {
		t.Fatal(err)
	}
	if _, ok := ts["f"]; ok || !ts["a"].Shape.Equal(tensor.Shape{4, 2}) || !ts["b"].Shape.Equal(tensor.Shape{2, 2}) {
		t.Fatalf("after the split: %v", ts)
	}
	if &ts["b"].Data[0] != &data[4*2*4] {
		t.Error("the second part is not a view of the fused bytes")
	}
	b, err := ts["b"].F32s()
	if err != nil || b[0] != 8 || b[3] != 11 {
		t.Errorf("the second part holds %v, %v", b, err)
	}
	apart := fused()
	apart["a"] = tensor.FromF32("a", tensor.Shape{4, 2}, vals[:8])
	delete(apart, "f")
	if err := splitRows(apart, "f", []string{"a", "b"}, []int{4, 2}); err != nil || len(apart) != 1 {
		t.Errorf("parts stored apart: %v, %d tensors", err, len(apart))
	}
	for _, c := range []struct {
		name  string
		names []string
		rows  []int
		extra string
	}{
		{"missing", []string{"a", "b"}, []int{4, 2}, ""},
		{"f", []string{"a", "b"}, []int{4, 3}, ""},
		{"f", []string{"a", "b"}, []int{4, 2}, "a"},
	} {
		ts := fused()
		if c.extra != "" {
			ts[c.extra] = tensor.FromF32(c.extra, tensor.Shape{4, 2}, vals[:8])
		}
		if err := splitRows(ts, c.name, c.names, c.rows); err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s %v %v (extra %q): error %v", c.name, c.names, c.rows, c.extra, err)
		}
	}
}

// TestParseMoEConfigs: Mixtral's, Qwen3-MoE's, OLMoE's and Qwen2-MoE's
// configs give the experts, the experts a token, their width and routing;
// Qwen3-MoE's q/k norms, OLMoE's whole-width ones, Qwen2-MoE's q/k/v bias
// and gated shared expert;
// dense layers among the experts and impossible counts are refused.
func TestParseMoEConfigs(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 128`
	for _, c := range []struct {
		json    string
		want    func(c Config) bool
		wantErr string
	}{
		{`{"architectures": ["MixtralForCausalLM"], ` + base + `, "num_local_experts": 8, "num_experts_per_tok": 2}`,
			func(c Config) bool {
				return c.Arch == "mixtral" && c.NumExperts == 8 && c.ExpertsPerToken == 2 && c.NormTopK && c.IntermediateSize == 160 && !c.QKNorm
			}, ""},
		{`{"architectures": ["Qwen3MoeForCausalLM"], ` + base + `, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 48, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []}`,
			func(c Config) bool {
				return c.Arch == "qwen3_moe" && c.NumExperts == 16 && c.ExpertsPerToken == 4 && c.NormTopK && c.IntermediateSize == 48 && c.QKNorm
			}, ""},
		{`{"model_type": "qwen3_moe", ` + base + `, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 48}`,
			func(c Config) bool { return !c.NormTopK }, ""},
		// transformers 5 writes every family's count as num_local_experts.
		{`{"model_type": "qwen3_moe", ` + base + `, "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48}`,
			func(c Config) bool { return c.NumExperts == 4 && c.ExpertsPerToken == 2 }, ""},
		{`{"model_type": "olmoe", ` + base + `, "num_local_experts": 6, "num_experts_per_tok": 2}`,
			func(c Config) bool { return c.NumExperts == 6 }, ""},
		{`{"model_type": "qwen3_moe", ` + base + `, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 48, "mlp_only_layers": [0]}`,
			nil, "mlp_only_layers"},
		{`{"model_type": "mixtral", ` + base + `, "num_local_experts": 2, "num_experts_per_tok": 3}`, nil, "2 experts, 3 a token"},
		{`{"architectures": ["OlmoeForCausalLM"], ` + base + `, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": false, "clip_qkv": null}`,
			func(c Config) bool {
				return c.Arch == "olmoe" && c.NumExperts == 64 && c.ExpertsPerToken == 8 && !c.NormTopK && c.QKNormWhole && !c.QKNorm && c.IntermediateSize == 160
			}, ""},
		{`{"model_type": "olmoe", ` + base + `, "num_experts": 8, "num_experts_per_tok": 2, "clip_qkv": 8.0}`, nil, "clip_qkv 8"},
		{`{"architectures": ["Qwen2MoeForCausalLM"], ` + base + `, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128, "norm_topk_prob": false}`,
			func(c Config) bool {
				return c.Arch == "qwen2_moe" && c.NumExperts == 60 && c.ExpertsPerToken == 4 && !c.NormTopK && c.IntermediateSize == 32 &&
					c.SharedExpertSize == 128 && c.SharedExpertGate && c.QKVBias && !c.QKNorm
			}, ""},
		{`{"model_type": "qwen2_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "qkv_bias": false}`,
			func(c Config) bool { return !c.QKVBias && c.SharedExpertSize == 64 }, ""},
		{`{"model_type": "qwen2_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}`, nil, "shared_expert_intermediate_size 0"},
	} {
		cfg, _, err := parseHFConfig([]byte(c.json))
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: error %v, want %q", c.json, err, c.wantErr)
			}
			continue
		}
		if err != nil || !c.want(cfg) {
			t.Errorf("%s: %+v, %v", c.json, cfg, err)
		}
	}
}

// TestParseLongRope: Phi-3's long-context configs give longrope's short and
// long factors, the original context (top-level, as Phi-3 keeps it, or in
// rope_scaling) and the attention factor transformers derives from the
// extension (or the one given).
func TestParseLongRope(t *testing.T) {
	base := `"architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 320`
	factors := `"short_factor": [1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5], "long_factor": [2, 3, 4, 5, 6, 7, 8, 9]`
	for _, c := range []struct {
		json       string
		orig       int
		attnFactor float64
	}{
		{`{` + base + `, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope", ` + factors + `}}`,
			4096, math.Sqrt(1 + math.Log(32)/math.Log(4096))},
		{`{` + base + `, "max_position_embeddings": 128, "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 32, ` + factors + `, "attention_factor": 1.25}}`,
			32, 1.25},
		{`{` + base + `, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rope_scaling": {"type": "su", ` + factors + `}}`,
			4096, 1},
	} {
		cfg, _, err := parseHFConfig([]byte(c.json))
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		r := cfg.RopeScaling
		if r.Type != "longrope" || r.OriginalMaxPositions != c.orig || math.Abs(r.AttentionFactor-c.attnFactor) > 1e-12 || r.ShortFactor[1] != 1.5 || r.LongFactor[7] != 9 {
			t.Errorf("%s: %+v, want original %d, attention factor %g", c.json, r, c.orig, c.attnFactor)
		}
	}
}

// TestParseGemmaConfigs: Gemma 2's and 3's configs (transformers 4's and
// 5's spellings) give the embedding scale, norms of 1+w, sandwich norms,
// GeGLU, the query scale, soft-capping, each layer's window and Gemma 3's
// q/k norms and local RoPE base; Gemma 1's only what it has.
func TestParseGemmaConfigs(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 320, "max_position_embeddings": 512`
	for _, c := range []struct {
		json string
		want func(c Config) bool
	}{
		{`{"architectures": ["Gemma2ForCausalLM"], ` + base + `, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 144, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 16, "rope_theta": 10000}`,
			func(c Config) bool {
				return c.Arch == "gemma2" && c.EmbedScale == 8 && c.NormOffset == 1 && c.PostNorms && c.GELU && math.Abs(c.QueryScale-1.0/12) < 1e-15 &&
					c.AttnSoftCap == 50 && c.FinalSoftCap == 30 && slices.Equal(c.LayerWindows, []int{16, 0, 16, 0, 16, 0}) && !c.QKNorm && c.SlidingWindow == 0
			}},
		{`{"model_type": "gemma3_text", ` + base + `, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 32, "sliding_window_pattern": 3, "rope_theta": 1000000, "rope_local_base_freq": 10000, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}`,
			func(c Config) bool {
				return c.Arch == "gemma3" && c.QKNorm && c.RopeLocalTheta == 10000 && c.RopeTheta == 1e6 && c.RopeScaling.Type == "linear" && c.RopeScaling.Factor == 8 &&
					slices.Equal(c.LayerWindows, []int{32, 32, 0, 32, 32, 0}) && c.QueryScale == 1.0/16 && c.AttnSoftCap == 0 && c.FinalSoftCap == 0
			}},
		{`{"architectures": ["Gemma3ForCausalLM"], ` + base + `, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"], "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}}`,
			func(c Config) bool {
				return c.RopeLocalTheta == 5000 && c.RopeTheta == 1e6 && c.RopeScaling.Type == "" && slices.Equal(c.LayerWindows, []int{8, 0, 8, 8, 8, 0})
			}},
		{`{"architectures": ["GemmaForCausalLM"], ` + base + `, "hidden_act": "gelu"}`,
			func(c Config) bool {
				return c.Arch == "gemma" && c.GELU && c.NormOffset == 1 && c.EmbedScale == 8 && !c.PostNorms && c.LayerWindows == nil
			}},
	} {
		cfg, _, err := parseHFConfig([]byte(c.json))
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil || !c.want(cfg) {
			t.Errorf("%s: %+v, %v", c.json, cfg, err)
		}
	}
	if _, _, err := parseHFConfig([]byte(`{"architectures": ["Gemma2ForCausalLM"], ` + base + `, "hidden_activation": "relu"}`)); err == nil || !strings.Contains(err.Error(), `hidden activation "relu"`) {
		t.Errorf("a relu Gemma: %v", err)
	}
}

// TestHFFusedExperts: experts as transformers 5 holds them, stacked per
// layer (mlp.experts.gate_up_proj [experts, 2·rows, cols] and down_proj
// [experts, cols, rows]; Mixtral's router as mlp.gate), load as the same
// matrices as the Hub's experts stored one by one.
func TestHFFusedExperts(t *testing.T) {
	for _, arch := range []string{"mixtral", "qwen3_moe"} {
		t.Run(arch, func(t *testing.T) {
			c := tinyConfig(arch)
			c.NumExperts, c.ExpertsPerToken, c.NormTopK, c.QKNorm = 4, 2, arch == "mixtral", arch == "qwen3_moe"
			extra := map[string]any{"architectures": []string{"MixtralForCausalLM"}, "num_local_experts": 4, "num_experts_per_tok": 2}
			if arch == "qwen3_moe" {
				extra = map[string]any{"architectures": []string{"Qwen3MoeForCausalLM"}, "num_experts": 4, "num_experts_per_tok": 2,
					"moe_intermediate_size": c.IntermediateSize, "head_dim": c.HeadDim}
			}
			want := randTensors(&c, tensor.F32, 11)
			byName := map[string]*tensor.Tensor{}
			for _, w := range want {
				byName[w.Name] = w
			}
			fused := map[string]bool{}
			var ts []*tensor.Tensor
			for l := 0; l < c.NumLayers; l++ {
				var gateUp, down []byte
				for e := 0; e < c.NumExperts; e++ {
					g, u, d := c.MoEExpert(l, e)
					gateUp = append(append(gateUp, byName[g].Data...), byName[u].Data...)
					down = append(down, byName[d].Data...)
					fused[g], fused[u], fused[d] = true, true, true
				}
				ts = append(ts,
					&tensor.Tensor{Name: LayerName(l, "mlp.experts.gate_up_proj"), DType: tensor.F32, Shape: tensor.Shape{c.NumExperts, 2 * c.IntermediateSize, c.HiddenSize}, Data: gateUp},
					&tensor.Tensor{Name: LayerName(l, "mlp.experts.down_proj"), DType: tensor.F32, Shape: tensor.Shape{c.NumExperts, c.HiddenSize, c.IntermediateSize}, Data: down})
				if r := byName[c.MoERouter(l)]; arch == "mixtral" {
					fused[r.Name] = true
					ts = append(ts, &tensor.Tensor{Name: LayerName(l, "mlp.gate.weight"), DType: r.DType, Shape: r.Shape, Data: r.Data})
				}
			}
			for _, w := range want {
				if !fused[w.Name] {
					ts = append(ts, w)
				}
			}
			m, err := LoadHF(writeHFDir(t, hfConfigJSON(&c, extra), ts, 2))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			sameTensors(t, m.Tensors, want)
		})
	}
	// A stack of the wrong shape is an error naming it.
	c := tinyConfig("qwen3_moe")
	c.NumExperts, c.ExpertsPerToken, c.QKNorm = 2, 1, true
	var ts []*tensor.Tensor
	for _, w := range randTensors(&c, tensor.F32, 3) {
		if !strings.Contains(w.Name, "experts.") {
			ts = append(ts, w)
		}
	}
	for l := 0; l < c.NumLayers; l++ {
		ts = append(ts, encodeTensor(LayerName(l, "mlp.experts.gate_up_proj"), tensor.Shape{2, c.IntermediateSize, c.HiddenSize}, tensor.F32, make([]float32, 2*c.IntermediateSize*c.HiddenSize)),
			encodeTensor(LayerName(l, "mlp.experts.down_proj"), tensor.Shape{2, c.HiddenSize, c.IntermediateSize}, tensor.F32, make([]float32, 2*c.IntermediateSize*c.HiddenSize)))
	}
	extra := map[string]any{"architectures": []string{"Qwen3MoeForCausalLM"}, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": c.IntermediateSize, "head_dim": c.HeadDim}
	if _, err := LoadHF(writeHFDir(t, hfConfigJSON(&c, extra), ts, 1)); err == nil || !strings.Contains(err.Error(), "mlp.experts.gate_up_proj has shape [2,96,64], want [2,192,64]") {
		t.Errorf("a stack of half the rows: %v", err)
	}
}
