package convert

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"kiln/model"
	"kiln/tensor"
)

// TestFP8 writes the demo model as an FP8 checkpoint and checks the file
// (the layers' matrices F8_E4M3 with [N,1] float32 scales, the embedding in
// its dtype, compressed-tensors' quantization_config, the tokenizer
// copied), that every matrix loads back within E4M3's rounding of its
// source (half a step: 2⁻⁴ of the value, 2⁻¹⁰ of the row's scale among
// the subnormals, plus bf16's 2⁻⁹), and that an existing OUT is refused.
func TestFP8(t *testing.T) {
	src, err := model.Load(demoDir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dir := filepath.Join(t.TempDir(), "fp8")
	rep, err := FP8(dir, src, demoDir)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Matrices[tensor.F8_E4M3] != 7*src.Config.NumLayers || !rep.Vocabulary {
		t.Errorf("report %+v: want %d FP8 matrices and the vocabulary", rep, 7*src.Config.NumLayers)
	}
	// The file as written.
	raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var header map[string]struct {
		DType string `json:"dtype"`
		Shape []int  `json:"shape"`
	}
	n := binary.LittleEndian.Uint64(raw)
	if err := json.Unmarshal(raw[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	q := header["model.layers.0.self_attn.q_proj.weight"]
	s := header["model.layers.0.self_attn.q_proj.weight_scale"]
	e := header[model.EmbedName]
	if q.DType != "F8_E4M3" || s.DType != "F32" || len(s.Shape) != 2 || s.Shape[0] != q.Shape[0] || s.Shape[1] != 1 || e.DType != "BF16" {
		t.Errorf("q_proj %+v, its scale %+v, embedding %+v", q, s, e)
	}
	var cfg struct {
		Q struct {
			Method string `json:"quant_method"`
			Format string `json:"format"`
		} `json:"quantization_config"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil || json.Unmarshal(b, &cfg) != nil || cfg.Q.Method != "compressed-tensors" || cfg.Q.Format != "float-quantized" {
		t.Errorf("config.json: %v %+v", err, cfg)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Error(err)
	}
	// Loaded back, widened.
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for name, x := range src.Tensors {
		got, want := mustF32s(t, m.Tensors[name]), mustF32s(t, x)
		if !fp8Linear(name, x) {
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s changed: [%d] %v, was %v", name, i, got[i], want[i])
				}
			}
			continue
		}
		k := x.Shape[1]
		for r := 0; r < x.Shape[0]; r++ {
			var amax float64
			for _, v := range want[r*k : (r+1)*k] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			scale := amax / tensor.E4M3Max
			for c := r * k; c < (r+1)*k; c++ {
				w := math.Abs(float64(want[c]))
				if d := math.Abs(float64(got[c] - want[c])); d > (0.0625+0.004)*w+scale/1024*1.01 {
					t.Fatalf("%s[%d]: %v, source %v (row scale %g)", name, c, got[c], want[c], scale)
				}
			}
		}
	}
	if _, err := FP8(dir, src, demoDir); err == nil {
		t.Error("FP8 over an existing directory succeeded")
	}
}

func mustF32s(t *testing.T, x *tensor.Tensor) []float32 {
	t.Helper()
	if x == nil {
		t.Fatal("missing tensor")
	}
	v, err := x.F32s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}
