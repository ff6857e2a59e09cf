// Package convert writes a loaded model as a GGUF file, as llama.cpp's
// converter (convert_hf_to_gguf.py) and quantizer (llama-quantize) would:
// the architecture's metadata from the model's Config, the vocabulary and
// chat template of the source (a GGUF file's, or a
// byte-level BPE tokenizer's), Q/K projection rows of Llama-family
// models in GGUF's interleaved RoPE layout, llama3 rope scaling as
// per-pair frequency factors, and every matrix whose rows are whole blocks
// stored in the dtype asked for (norms and biases in F32). `kiln quantize` is its command.
package convert

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"kiln/compile"
	"kiln/ir"
	"kiln/model"
	"kiln/tensor"
)

// Report says what GGUF wrote.
type Report struct {
	Matrices   map[tensor.DType]int // matrices stored in each dtype the scheme asked for
	Kept       int                  // matrices kept in their own dtype: rows not whole blocks of the scheme's
	Vectors    int                  // norms, biases: in F32
	Bytes      int64                // tensor data written
	Vocabulary bool                 // the file carries a vocabulary (from a GGUF source)
}

// GGUF writes m to w with its matrices in the dtypes of scheme s, and
// vocab's entries (tokenizer.Tokenizer.GGUFMetadata) when the source is not
// a GGUF file, whose own vocabulary travels with it.
func GGUF(w io.Writer, m *model.Model, s Scheme, vocab map[string]any) (Report, error) {
	rep := Report{Matrices: map[tensor.DType]int{}}
	if s.Base == tensor.Invalid {
		return rep, fmt.Errorf("convert: no scheme given (want one of %s)", strings.Join(SchemeNames(), ", "))
	}
	c := m.Config
	if err := model.GemmaLayout(&c); err != nil {
		return rep, fmt.Errorf("convert: %w", err)
	}
	md := model.GGUFMetadata(&c)
	if s.fileType != 0 {
		md = append(md, model.KV{Key: "general.file_type", Value: s.fileType})
	}
	have := map[string]bool{}
	for _, kv := range md {
		have[kv.Key] = true
	}
	// A GGUF source's vocabulary and chat template travel with it.
	src := vocab
	if m.Metadata != nil {
		src = m.Metadata
	}
	var keys []string
	for k := range src {
		if strings.HasPrefix(k, "tokenizer.") && !have[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		md = append(md, model.KV{Key: k, Value: src[k]})
		have[k] = true
		rep.Vocabulary = rep.Vocabulary || k == "tokenizer.ggml.tokens"
	}
	if m.ChatTemplate != "" && !have["tokenizer.chat_template"] {
		md = append(md, model.KV{Key: "tokenizer.chat_template", Value: m.ChatTemplate})
	}
	// GGUF's llama models rotate interleaved pairs; a Hugging Face
	// checkpoint's Q/K rows are in the half-split layout (qwen2 stays so).
	arch := md[0].Value.(string)
	permute := arch == "llama" && c.RopeStyle != model.RopeInterleaved
	var ts []*tensor.Tensor
	for _, name := range m.Names() {
		x := m.Tensors[name]
		if permute && (strings.Contains(name, "self_attn.q_proj.") || strings.Contains(name, "self_attn.k_proj.")) {
			x = Interleave(x, c.HeadDim)
		}
		to := s.dtype(dtypeName(c.Arch, name), c.NumLayers, m.Tensors["lm_head.weight"] == nil)
		if len(x.Shape) == 2 && x.DType != to && x.Shape[1]%to.BlockSize() == 0 {
			vals, err := x.F32s()
			if err != nil {
				return rep, err
			}
			if x, err = tensor.Encode(x.Name, x.Shape, to, vals); err != nil {
				return rep, err
			}
			rep.Matrices[to]++
		} else if len(x.Shape) == 2 && x.DType == to {
			rep.Matrices[to]++
		} else if len(x.Shape) == 2 {
			if x.DType == tensor.F8_E4M3 { // GGUF has no FP8: kept as bf16
				vals, err := x.F32s()
				if err != nil {
					return rep, err
				}
				if x, err = tensor.Encode(x.Name, x.Shape, tensor.BF16, vals); err != nil {
					return rep, err
				}
			}
			rep.Kept++
		} else {
			// Norms and biases in F32, as llama.cpp's converter writes
			// them (its kernels take no other type there); Gemma's norms
			// as 1+w, as llama.cpp's converter stores them.
			if off := c.NormOffset; off != 0 && strings.HasSuffix(name, "norm.weight") {
				vals, err := x.F32s()
				if err != nil {
					return rep, err
				}
				for i := range vals {
					vals[i] += off
				}
				x = tensor.FromF32(x.Name, x.Shape, vals)
			} else if x.DType != tensor.F32 {
				vals, err := x.F32s()
				if err != nil {
					return rep, err
				}
				x = tensor.FromF32(x.Name, x.Shape, vals)
			}
			rep.Vectors++
		}
		rep.Bytes += int64(len(x.Data))
		ts = append(ts, x)
	}
	if f := ropeFreqs(c); f != nil {
		ts = append(ts, f)
	}
	ts = append(ts, model.LongRopeFactors(&c)...)
	if c.Arch == "phi3" {
		var err error
		if ts, err = fusePhi3(ts, c.NumLayers); err != nil {
			return rep, err
		}
	}
	if c.NumExperts > 0 {
		var err error
		if ts, err = stackExperts(ts, &c); err != nil {
			return rep, err
		}
	}
	return rep, model.WriteGGUF(w, md, ts)
}

// stackExperts stacks each layer's experts' matrices into llama.cpp's
// ffn_gate_exps, ffn_up_exps and ffn_down_exps ([experts, rows, cols]) and
// names the router ffn_gate_inp, as a GGUF file of experts holds them.
func stackExperts(ts []*tensor.Tensor, c *model.Config) ([]*tensor.Tensor, error) {
	byName := map[string]*tensor.Tensor{}
	for _, t := range ts {
		byName[t.Name] = t
	}
	done := map[string]bool{}
	var out []*tensor.Tensor
	for l := 0; l < c.NumLayers; l++ {
		r, ok := byName[c.MoERouter(l)]
		if !ok {
			return nil, fmt.Errorf("experts: missing tensor %s", c.MoERouter(l))
		}
		done[r.Name] = true
		out = append(out, &tensor.Tensor{Name: fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l), DType: r.DType, Shape: r.Shape, Data: r.Data})
		for i, stack := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} {
			var data []byte
			var first *tensor.Tensor
			for e := 0; e < c.NumExperts; e++ {
				gate, up, down := c.MoEExpert(l, e)
				t, ok := byName[[]string{gate, up, down}[i]]
				if !ok || len(t.Scales) > 0 {
					return nil, fmt.Errorf("experts: tensor %s missing or scaled", []string{gate, up, down}[i])
				}
				if first == nil {
					first = t
				}
				if t.DType != first.DType || !t.Shape.Equal(first.Shape) {
					return nil, fmt.Errorf("experts: %s is %v %v, expert 0's %v %v", t.Name, t.DType, t.Shape, first.DType, first.Shape)
				}
				done[t.Name] = true
				data = append(data, t.Data...)
			}
			out = append(out, &tensor.Tensor{Name: fmt.Sprintf("blk.%d.%s.weight", l, stack), DType: first.DType,
				Shape: tensor.Shape{c.NumExperts, first.Shape[0], first.Shape[1]}, Data: data})
		}
	}
	for _, t := range ts {
		if !done[t.Name] {
			out = append(out, t)
		}
	}
	return out, nil
}

// dtypeName is the name whose type a tensor takes: a Phi-3 layer's q and k
// projections take their v projection's, as llama-quantize types the
// attn_qkv they are stacked into (fusePhi3) by the attn_v rule, so that
// the stack is one type.
func dtypeName(arch, name string) string {
	if arch != "phi3" {
		return name
	}
	for _, p := range []string{".self_attn.q_proj.weight", ".self_attn.k_proj.weight"} {
		if layer, ok := strings.CutSuffix(name, p); ok {
			return layer + ".self_attn.v_proj.weight"
		}
	}
	return name
}

// fusePhi3 stacks each layer's q, k and v projections into llama.cpp's
// attn_qkv and its gate and up projections into ffn_up (gate rows first),
// as a Phi-3 GGUF holds them; kiln's loader takes them apart again.
func fusePhi3(ts []*tensor.Tensor, layers int) ([]*tensor.Tensor, error) {
	byName := map[string]*tensor.Tensor{}
	for _, t := range ts {
		byName[t.Name] = t
	}
	fused := map[string]bool{}
	var out []*tensor.Tensor
	for l := 0; l < layers; l++ {
		for _, f := range []struct {
			gguf  string
			parts []string
		}{
			{"attn_qkv.weight", []string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
			{"ffn_up.weight", []string{"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
		} {
			var parts []*tensor.Tensor
			for _, p := range f.parts {
				t, ok := byName[model.LayerName(l, p)]
				if !ok || len(t.Scales) > 0 {
					return nil, fmt.Errorf("phi3: tensor %s missing or scaled", model.LayerName(l, p))
				}
				parts = append(parts, t)
				fused[t.Name] = true
			}
			st := &tensor.Tensor{Name: fmt.Sprintf("blk.%d.%s", l, f.gguf), DType: parts[0].DType, Parts: parts}
			rows := 0
			for _, p := range parts {
				rows += p.Shape[0]
			}
			st.Shape = tensor.Shape{rows, parts[0].Shape[1]}
			if err := st.Validate(); err != nil {
				return nil, fmt.Errorf("phi3: %w", err)
			}
			st.Join()
			out = append(out, st)
		}
	}
	for _, t := range ts {
		if !fused[t.Name] {
			out = append(out, t)
		}
	}
	return out, nil
}

// Interleave reorders the rows of a Q or K projection (or bias) from the
// half-split RoPE layout to the interleaved one, as llama.cpp's converter
// does: within each head, row 2i takes row i and row 2i+1 row i+headDim/2.
func Interleave(t *tensor.Tensor, headDim int) *tensor.Tensor {
	rowBytes := len(t.Data) / t.Shape[0]
	out := &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: make([]byte, len(t.Data)), Scales: t.Scales}
	if len(t.Scales) > 1 { // an FP8 matrix's scales follow their rows
		out.Scales = make([]float32, len(t.Scales))
	}
	half := headDim / 2
	for r := 0; r < t.Shape[0]; r++ {
		head, i := r/headDim, r%headDim
		src := head*headDim + i/2
		if i%2 == 1 {
			src += half
		}
		copy(out.Data[r*rowBytes:(r+1)*rowBytes], t.Data[src*rowBytes:(src+1)*rowBytes])
		if len(t.Scales) > 1 {
			out.Scales[r] = t.Scales[src]
		}
	}
	return out
}

// ropeFreqs is the rope_freqs.weight tensor llama.cpp stores for llama3
// rope scaling (the plain frequencies over the scaled ones, a pair each),
// or the source's own factors; nil when there are none.
func ropeFreqs(c model.Config) *tensor.Tensor {
	f := c.RopeFreqFactors
	if f == nil && c.RopeScaling.Type == "llama3" {
		r := ir.RopeParams{Theta: c.RopeTheta, HeadDim: c.HeadDim}
		plain := compile.RopeFrequencies(r)
		r.Scaling, r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalMaxPositions = "llama3", c.RopeScaling.Factor, c.RopeScaling.LowFreqFactor, c.RopeScaling.HighFreqFactor, c.RopeScaling.OriginalMaxPositions
		scaled := compile.RopeFrequencies(r)
		f = make([]float32, len(plain))
		for i := range f {
			f[i] = float32(plain[i] / scaled[i])
		}
	}
	if f == nil {
		return nil
	}
	return tensor.FromF32("rope_freqs.weight", tensor.Shape{len(f)}, f)
}
