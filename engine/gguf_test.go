package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/backend/cpu"
	"kiln/compile"
	"kiln/engine"
	"kiln/internal/hffixture"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// toInterleaved reorders the rows of a q/k projection (or bias) from Hugging
// Face's half-split RoPE layout to the interleaved layout GGUF llama models
// use, as llama.cpp's converter does: within each head, row 2i takes row i and
// row 2i+1 takes row i+headDim/2.
func toInterleaved(t *tensor.Tensor, headDim int) *tensor.Tensor {
	rowBytes := len(t.Data) / t.Shape[0]
	out := &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: make([]byte, len(t.Data))}
	half := headDim / 2
	for r := 0; r < t.Shape[0]; r++ {
		head, i := r/headDim, r%headDim
		src := head*headDim + i/2
		if i%2 == 1 {
			src += half
		}
		copy(out.Data[r*rowBytes:(r+1)*rowBytes], t.Data[src*rowBytes:(src+1)*rowBytes])
	}
	return out
}

// writeGGUF converts an HF model to a GGUF file the way llama.cpp would, with
// 2-D weights stored as quant (F32 keeps the checkpoint's dtype); with
// dequantized, the quantized values are stored back as F32.
func writeGGUF(t *testing.T, m *model.Model, quant tensor.DType, dequantized bool) string {
	t.Helper()
	c := m.Config
	md := model.GGUFMetadata(&c)
	var ts []*tensor.Tensor
	for _, name := range m.Names() {
		x := m.Tensors[name]
		if c.Arch != "qwen2" && (strings.Contains(name, "self_attn.q_proj.") || strings.Contains(name, "self_attn.k_proj.")) {
			x = toInterleaved(x, c.HeadDim)
		}
		if quant != tensor.F32 && len(x.Shape) == 2 {
			vals, err := x.F32s()
			if err != nil {
				t.Fatal(err)
			}
			data, err := tensor.Quantize(quant, vals)
			if err != nil {
				t.Fatal(err)
			}
			x = &tensor.Tensor{Name: x.Name, DType: quant, Shape: x.Shape, Data: data}
			if dequantized {
				if vals, err = x.F32s(); err != nil {
					t.Fatal(err)
				}
				x = tensor.FromF32(x.Name, x.Shape, vals)
			}
		}
		ts = append(ts, x)
	}
	if c.RopeScaling.Type == "llama3" {
		// llama.cpp stores llama3 scaling as per-pair frequency factors.
		r := ir.RopeParams{Theta: c.RopeTheta, HeadDim: c.HeadDim}
		plain := compile.RopeFrequencies(r)
		r.Scaling, r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalMaxPositions = "llama3", c.RopeScaling.Factor, c.RopeScaling.LowFreqFactor, c.RopeScaling.HighFreqFactor, c.RopeScaling.OriginalMaxPositions
		scaled := compile.RopeFrequencies(r)
		f := make([]float32, len(plain))
		for i := range f {
			f[i] = float32(plain[i] / scaled[i])
		}
		ts = append(ts, tensor.FromF32("rope_freqs.weight", tensor.Shape{len(f)}, f))
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.WriteGGUF(out, md, ts); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGGUFMatchesHF converts every HF fixture to GGUF (q/k rows permuted to
// the interleaved layout, llama3 scaling as rope_freqs) and checks the same
// logits and greedy ids as transformers.
func TestGGUFMatchesHF(t *testing.T) {
	for dir, f := range hffixture.Load(t, "../testdata/hf") {
		t.Run(f.Variant, func(t *testing.T) {
			hf, err := model.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer hf.Close()
			m, err := model.Load(writeGGUF(t, hf, tensor.F32, false))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			e, err := engine.New(m, &cpu.Backend{}, engine.Options{Compile: compileVerify})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			logits, err := e.Prefill(e.NewSequence(), f.InputIDs, true)
			if err != nil {
				t.Fatal(err)
			}
			if got := relErrInf(logits, f.Logits); got > 1e-4 {
				t.Errorf("logits: ‖out−ref‖∞/‖ref‖∞ = %.3g > 1e-4", got)
			}
		})
	}
}

// TestGGUFQuantized checks the Q8_0 and Q4_0 paths: a quantized GGUF gives the
// logits of an F32 model holding the dequantized weights, and stays near the
// unquantized reference.
func TestGGUFQuantized(t *testing.T) {
	dir := "../testdata/hf/llama-gqa"
	f := hffixture.Load(t, "../testdata/hf")[dir]
	hf, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	for _, q := range []struct {
		d   tensor.DType
		tol float64 // against transformers' unquantized logits
	}{{tensor.Q8_0, 2e-2}, {tensor.Q4_0, 3e-1}} {
		t.Run(q.d.String(), func(t *testing.T) {
			run := func(dequantized bool) []float32 {
				m, err := model.Load(writeGGUF(t, hf, q.d, dequantized))
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				// The blocks are kept as they are: the products read them.
				if w := m.Tensors["model.layers.0.self_attn.q_proj.weight"]; !dequantized && w.DType != q.d {
					t.Fatalf("q_proj loaded as %v, want %v", w.DType, q.d)
				}
				e, err := engine.New(m, &cpu.Backend{}, engine.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				logits, err := e.Prefill(e.NewSequence(), f.InputIDs, true)
				if err != nil {
					t.Fatal(err)
				}
				return logits
			}
			logits := run(false)
			if d := relErrInf(logits, run(true)); d > 1e-6 {
				t.Errorf("%v model and its dequantized F32 copy differ: %.3g", q.d, d)
			}
			got := relErrInf(logits, f.Logits)
			t.Logf("%v: ‖out−ref‖∞/‖ref‖∞ = %.3g", q.d, got)
			if got > q.tol {
				t.Errorf("%v logits: ‖out−ref‖∞/‖ref‖∞ = %.3g > %g", q.d, got, q.tol)
			}
			if got < 1e-6 {
				t.Errorf("%v logits equal the unquantized ones: the weights were not quantized", q.d)
			}
		})
	}
}
