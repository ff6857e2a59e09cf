package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"kiln/tensor"
)

// tinyConfig is a small valid config for fixtures.
func tinyConfig(arch string) Config {
	c := Config{
		Arch: arch, HiddenSize: 64, IntermediateSize: 96, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
		HeadDim: 16, VocabSize: 40, MaxPositions: 128, RMSNormEps: 1e-5, RopeTheta: 10000,
		BOS: []int{1}, EOS: []int{2}, DType: tensor.F32,
	}
	if arch == "qwen2" {
		c.QKVBias = true
	}
	return c
}

// randTensors builds every tensor c implies, in canonical order, with
// deterministic pseudo-random values of dtype dt (norms and biases stay F32
// when dt is block-quantized).
func randTensors(c *Config, dt tensor.DType, seed int64) []*tensor.Tensor {
	rng := rand.New(rand.NewSource(seed))
	var out []*tensor.Tensor
	for _, e := range ExpectedTensors(c) {
		vals := make([]float32, e.Shape.Elements())
		for i := range vals {
			vals[i] = float32(rng.NormFloat64())
		}
		d := dt
		if len(e.Shape) == 1 && (dt == tensor.Q8_0 || dt == tensor.Q4_0) {
			d = tensor.F32
		}
		out = append(out, encodeTensor(e.Name, e.Shape, d, vals))
	}
	return out
}

// encodeTensor stores vals as dtype d (quantizing for Q8_0/Q4_0).
func encodeTensor(name string, shape tensor.Shape, d tensor.DType, vals []float32) *tensor.Tensor {
	t, err := tensor.Encode(name, shape, d, vals)
	if err != nil {
		panic(err)
	}
	return t
}

// hfConfigJSON renders c as a config.json.
func hfConfigJSON(c *Config, extra map[string]any) []byte {
	archs := map[string]string{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
	m := map[string]any{
		"architectures":           []string{archs[c.Arch]},
		"model_type":              c.Arch,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumLayers,
		"num_attention_heads":     c.NumHeads,
		"num_key_value_heads":     c.NumKVHeads,
		"vocab_size":              c.VocabSize,
		"max_position_embeddings": c.MaxPositions,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"tie_word_embeddings":     c.TiedEmbeddings,
		"bos_token_id":            c.BOS[0],
		"eos_token_id":            c.EOS[0],
		"torch_dtype":             "float32",
	}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func safetensorsBytes(t testing.TB, ts []*tensor.Tensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func ggufBytes(t testing.TB, md []KV, ts []*tensor.Tensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, md, ts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeHFDir writes config.json and the tensors (sharded into n files when
// n > 1) into a new directory.
func writeHFDir(t testing.TB, cfgJSON []byte, ts []*tensor.Tensor, n int) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.json"), cfgJSON)
	if n <= 1 {
		writeFile(t, filepath.Join(dir, "model.safetensors"), safetensorsBytes(t, ts))
		return dir
	}
	wm := map[string]string{}
	for s := 0; s < n; s++ {
		var part []*tensor.Tensor
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, n)
		for i := s; i < len(ts); i += n {
			part = append(part, ts[i])
			wm[ts[i].Name] = name
		}
		writeFile(t, filepath.Join(dir, name), safetensorsBytes(t, part))
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": wm})
	writeFile(t, filepath.Join(dir, "model.safetensors.index.json"), idx)
	return dir
}

// sameTensors fails unless got holds exactly want (by name, dtype, shape and
// bytes).
func sameTensors(t *testing.T, got map[string]*tensor.Tensor, want []*tensor.Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %d tensors, want %d", len(got), len(want))
	}
	for _, w := range want {
		g, ok := got[w.Name]
		if !ok {
			t.Errorf("missing %s", w.Name)
			continue
		}
		if g.DType != w.DType || !g.Shape.Equal(w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: got %v %v (%d bytes), want %v %v (%d bytes)", w.Name, g.DType, g.Shape, len(g.Data), w.DType, w.Shape, len(w.Data))
		}
	}
}
