package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"kiln/model"
	"kiln/tensor"
)

// FP8 writes m, a Hugging Face checkpoint loaded from the directory src, as
// a new checkpoint directory dir in compressed-tensors' FP8 format (vLLM's
// "FP8 dynamic": what llm-compressor's FP8_DYNAMIC recipe writes): every
// linear layer's weight X.weight as F8_E4M3 with one float32 scale a row,
// X.weight_scale [N,1] = max|row|/448, so the row's largest value maps to
// E4M3's largest; the embedding, the output matrix (lm_head, as the recipe
// ignores it), norms and biases in their own dtype. config.json is src's
// with a quantization_config saying so (activations dynamic, per token, as
// vLLM then runs them); the tokenizer files are copied. dir is written
// under a temporary name and renamed at the end, so a failure leaves
// nothing half-written.
func FP8(dir string, m *model.Model, src string) (rep Report, err error) {
	rep = Report{Matrices: map[tensor.DType]int{}}
	if m.Format != "safetensors" {
		return rep, fmt.Errorf("convert: fp8 writes a Hugging Face checkpoint: MODEL must be one (it is %s), whose config.json it extends", m.Format)
	}
	cfgData, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return rep, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		return rep, fmt.Errorf("%s: %w", filepath.Join(src, "config.json"), err)
	}
	if _, err := os.Stat(dir); err == nil {
		return rep, fmt.Errorf("convert: %s exists", dir)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp*")
	if err != nil {
		return rep, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	var ts []*tensor.Tensor
	for _, name := range m.Names() {
		x := m.Tensors[name]
		if !fp8Linear(name, x) {
			if len(x.Shape) == 2 {
				rep.Kept++
			} else {
				rep.Vectors++
			}
			rep.Bytes += int64(len(x.Data))
			ts = append(ts, x)
			continue
		}
		w, scale, err := quantizeFP8Rows(x)
		if err != nil {
			return rep, err
		}
		rep.Matrices[tensor.F8_E4M3]++
		rep.Bytes += int64(len(w.Data) + len(scale.Data))
		ts = append(ts, w, scale)
	}
	cfg["quantization_config"] = fp8Config
	if err := writeJSON(filepath.Join(tmp, "config.json"), cfg); err != nil {
		return rep, err
	}
	f, err := os.Create(filepath.Join(tmp, "model.safetensors"))
	if err != nil {
		return rep, err
	}
	err = model.WriteSafetensors(f, ts, map[string]string{"format": "pt"})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
		"generation_config.json", "chat_template.jinja", "tokenizer.model"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, name), b, 0o644)
		}
		if err != nil {
			return rep, err
		}
		rep.Vocabulary = rep.Vocabulary || name == "tokenizer.json" || name == "tokenizer.model"
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return rep, err
	}
	return rep, os.Rename(tmp, dir)
}

// fp8Linear reports whether tensor name is a linear layer's weight that FP8
// stores in E4M3: a matrix X.weight of the layers, not the embedding or the
// output matrix.
func fp8Linear(name string, x *tensor.Tensor) bool {
	return len(x.Shape) == 2 && strings.HasPrefix(name, "model.layers.") && strings.HasSuffix(name, ".weight")
}

// quantizeFP8Rows returns x in E4M3 with one scale a row, max|row|/448 (1
// for a row of zeros).
func quantizeFP8Rows(x *tensor.Tensor) (w, scale *tensor.Tensor, err error) {
	vals, err := x.F32s()
	if err != nil {
		return nil, nil, err
	}
	n, k := x.Shape[0], x.Shape[1]
	q := make([]byte, n*k)
	scales := make([]float32, n)
	for r := 0; r < n; r++ {
		row := vals[r*k : (r+1)*k]
		var amax float32
		for _, v := range row {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if amax != amax || amax > math.MaxFloat32 {
			return nil, nil, fmt.Errorf("convert: tensor %s row %d is not finite", x.Name, r)
		}
		s := amax / tensor.E4M3Max
		if s == 0 {
			s = 1
		}
		scales[r] = s
		for c, v := range row {
			q[r*k+c] = tensor.F32ToE4M3(v / s)
		}
	}
	w = &tensor.Tensor{Name: x.Name, DType: tensor.F8_E4M3, Shape: x.Shape, Data: q}
	scale = tensor.FromF32(x.Name+"_scale", tensor.Shape{n, 1}, scales)
	return w, scale, nil
}

// fp8Config is compressed-tensors' quantization_config for FP8 weights with
// a scale a channel and activations quantized dynamically a token.
var fp8Config = map[string]any{
	"quant_method":        "compressed-tensors",
	"format":              "float-quantized",
	"quantization_status": "compressed",
	"ignore":              []string{"lm_head"},
	"config_groups": map[string]any{
		"group_0": map[string]any{
			"targets": []string{"Linear"},
			"weights": map[string]any{
				"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false,
			},
			"input_activations": map[string]any{
				"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true, "dynamic": true,
			},
		},
	},
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
