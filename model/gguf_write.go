// Writing GGUF v3 files: the inverse of gguf.go, used by tests to build
// fixtures and by tools converting checkpoints. Canonical tensor names are
// mapped back to GGUF names (model.embed_tokens.weight → token_embd.weight,
// ...) and shapes are written innermost first.

package model

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"

	"kiln/tensor"
)

// KV is one GGUF metadata entry. Value must be one of uint8, int8, uint16,
// int16, uint32, int32, uint64, int64, float32, float64, bool, string, or a
// slice of one of those.
type KV struct {
	Key   string
	Value any
}

var dtypeToGGML = func() map[tensor.DType]uint32 {
	m := map[tensor.DType]uint32{}
	for g, d := range ggmlToDType {
		m[d] = g
	}
	return m
}()

// GGUFMetadata returns the metadata a GGUF file needs to describe c
// (general.architecture and the {arch}.* hyperparameters, BOS/EOS). Arch
// "mistral" is written as "llama", as llama.cpp does.
func GGUFMetadata(c *Config) []KV {
	arch := GGUFArch(c.Arch)
	md := []KV{
		{"general.architecture", arch},
		{arch + ".context_length", uint32(c.MaxPositions)},
		{arch + ".embedding_length", uint32(c.HiddenSize)},
		{arch + ".block_count", uint32(c.NumLayers)},
		{arch + ".feed_forward_length", uint32(c.IntermediateSize)},
		{arch + ".attention.head_count", uint32(c.NumHeads)},
		{arch + ".attention.head_count_kv", uint32(c.NumKVHeads)},
		{arch + ".attention.layer_norm_rms_epsilon", float32(c.RMSNormEps)},
		{arch + ".rope.freq_base", float32(c.RopeTheta)},
		{arch + ".rope.dimension_count", uint32(c.HeadDim)},
		{arch + ".vocab_size", uint32(c.VocabSize)},
	}
	if c.NumHeads > 0 && c.HeadDim != c.HiddenSize/c.NumHeads {
		md = append(md, KV{arch + ".attention.key_length", uint32(c.HeadDim)}, KV{arch + ".attention.value_length", uint32(c.HeadDim)})
	}
	if c.SlidingWindow > 0 {
		md = append(md, KV{arch + ".attention.sliding_window", uint32(c.SlidingWindow)})
	}
	if c.NumExperts > 0 {
		md = append(md, KV{arch + ".expert_count", uint32(c.NumExperts)}, KV{arch + ".expert_used_count", uint32(c.ExpertsPerToken)})
		if arch == "qwen3moe" || arch == "qwen2moe" || arch == "olmoe" {
			md = append(md, KV{arch + ".expert_feed_forward_length", uint32(c.IntermediateSize)}, KV{arch + ".expert_weights_norm", c.NormTopK})
		}
		if c.SharedExpertSize > 0 {
			md = append(md, KV{arch + ".expert_shared_feed_forward_length", uint32(c.SharedExpertSize)})
		}
	}
	md = append(md, gemmaMetadata(c, arch)...)
	if c.RopeScaling.Type == "linear" {
		md = append(md, KV{arch + ".rope.scaling.type", "linear"}, KV{arch + ".rope.scaling.factor", float32(c.RopeScaling.Factor)})
	}
	if r := c.RopeScaling; r.Type == "longrope" {
		// As llama.cpp's phi3: the factors as rope_factors_short/long
		// tensors (LongRopeFactors), the rest here.
		md = append(md, KV{arch + ".rope.scaling.original_context_length", uint32(r.OriginalMaxPositions)},
			KV{arch + ".rope.scaling.attn_factor", float32(r.AttentionFactor)})
	}
	if len(c.BOS) > 0 {
		md = append(md, KV{"tokenizer.ggml.bos_token_id", uint32(c.BOS[0])})
	}
	if len(c.EOS) > 0 {
		md = append(md, KV{"tokenizer.ggml.eos_token_id", uint32(c.EOS[0])})
	}
	return md
}

// gemmaMetadata is what Gemma 2 and 3 add (llama.cpp's keys, and kiln's
// attention.query_pre_attn_scalar, sliding_window_pattern and
// rope.freq_base_swa, which llama.cpp does without); the window is the
// windowed layers' (GemmaLayout checks they follow a pattern GGUF can
// say).
func gemmaMetadata(c *Config, arch string) []KV {
	if arch != "gemma2" && arch != "gemma3" {
		return nil
	}
	var md []KV
	if c.AttnSoftCap > 0 {
		md = append(md, KV{arch + ".attn_logit_softcapping", float32(c.AttnSoftCap)})
	}
	if c.FinalSoftCap > 0 {
		md = append(md, KV{arch + ".final_logit_softcapping", float32(c.FinalSoftCap)})
	}
	if c.QueryScale > 0 {
		md = append(md, KV{arch + ".attention.query_pre_attn_scalar", float32(1 / (c.QueryScale * c.QueryScale))})
	}
	window, pattern := 0, 0
	for l, w := range c.LayerWindows {
		window = max(window, w)
		if w == 0 && pattern == 0 {
			pattern = l + 1
		}
	}
	if window > 0 {
		md = append(md, KV{arch + ".attention.sliding_window", uint32(window)})
	}
	if arch == "gemma3" {
		md = append(md, KV{arch + ".attention.sliding_window_pattern", uint32(pattern)},
			KV{arch + ".rope.freq_base_swa", float32(c.RopeLocalTheta)})
	}
	return md
}

// GemmaLayout reports whether c's windowed layers follow the pattern a
// Gemma GGUF file can say (one window; Gemma 2 every other layer from the
// first, Gemma 3 all but every n-th), so that a file written from it reads
// back the same.
func GemmaLayout(c *Config) error {
	if c.Arch != "gemma2" && c.Arch != "gemma3" {
		return nil
	}
	pattern, window := 0, 0
	for l, w := range c.LayerWindows {
		window = max(window, w)
		if w == 0 && pattern == 0 {
			pattern = l + 1
		}
	}
	if c.Arch == "gemma2" && pattern != 2 && len(c.LayerWindows) > 1 {
		return fmt.Errorf("gemma2: windowed layers %v do not alternate from the first as GGUF has them", c.LayerWindows)
	}
	for l, w := range c.LayerWindows {
		if want := window; pattern > 0 && (l+1)%pattern == 0 {
			want = 0
			if w != want {
				return fmt.Errorf("%s: layer windows %v do not follow one pattern of %d", c.Arch, c.LayerWindows, pattern)
			}
		} else if w != window {
			return fmt.Errorf("%s: layer windows %v do not follow one pattern of %d", c.Arch, c.LayerWindows, pattern)
		}
	}
	return nil
}

// LongRopeFactors are the rope_factors_short.weight and
// rope_factors_long.weight tensors llama.cpp keeps longrope's factors in,
// or nil.
func LongRopeFactors(c *Config) []*tensor.Tensor {
	r := c.RopeScaling
	if r.Type != "longrope" {
		return nil
	}
	return []*tensor.Tensor{
		tensor.FromF32(ropeFactorsShort, tensor.Shape{len(r.ShortFactor)}, r.ShortFactor),
		tensor.FromF32(ropeFactorsLong, tensor.Shape{len(r.LongFactor)}, r.LongFactor),
	}
}

// WriteGGUF writes a GGUF v3 file holding md and tensors (F32, F16, BF16 or
// a GGML block type, their data as it is) in the order given. Canonical names are written as GGUF
// names; other names (rope_freqs.weight, ...) as they are. The data
// alignment is md's general.alignment (a uint32) when present, else 32.
func WriteGGUF(w io.Writer, md []KV, tensors []*tensor.Tensor) error {
	align := uint64(32)
	arch := "" // names the layers' norms (sandwichNorms)
	for _, kv := range md {
		if kv.Key == "general.architecture" {
			arch, _ = kv.Value.(string)
		}
		if kv.Key == "general.alignment" {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return fmt.Errorf("write gguf: general.alignment %v must be a power of two uint32", kv.Value)
			}
			align = uint64(a)
		}
	}
	cw := &countWriter{w: w}
	cw.raw([]byte(ggufMagic))
	cw.u32(3)
	cw.u64(uint64(len(tensors)))
	cw.u64(uint64(len(md)))
	for _, kv := range md {
		cw.str(kv.Key)
		if err := cw.value(kv.Value, true); err != nil {
			return fmt.Errorf("write gguf: metadata %s: %w", kv.Key, err)
		}
	}
	var off uint64
	offsets := make([]uint64, len(tensors))
	for i, t := range tensors {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("write gguf: %w", err)
		}
		typ, ok := dtypeToGGML[t.DType]
		if !ok {
			return fmt.Errorf("write gguf: unsupported dtype %v for tensor %s", t.DType, t.Name)
		}
		if len(t.Shape) > ggufMaxDims {
			return fmt.Errorf("write gguf: tensor %s has %d dimensions", t.Name, len(t.Shape))
		}
		cw.str(ggufName(t.Name, arch))
		cw.u32(uint32(len(t.Shape)))
		for j := len(t.Shape) - 1; j >= 0; j-- {
			cw.u64(uint64(t.Shape[j]))
		}
		cw.u32(typ)
		cw.u64(off)
		offsets[i] = off
		off = (off + uint64(len(t.Data)) + align - 1) / align * align
	}
	cw.pad(align)
	start := cw.n
	for i, t := range tensors {
		cw.raw(make([]byte, start+offsets[i]-cw.n))
		cw.raw(t.Data)
	}
	cw.pad(align)
	return cw.err
}

// countWriter writes little-endian values, remembering the first error and
// the byte count.
type countWriter struct {
	w   io.Writer
	n   uint64
	err error
}

func (c *countWriter) raw(b []byte) {
	if c.err != nil || len(b) == 0 {
		return
	}
	n, err := c.w.Write(b)
	c.n += uint64(n)
	c.err = err
}

func (c *countWriter) pad(align uint64) {
	if r := c.n % align; r != 0 {
		c.raw(make([]byte, align-r))
	}
}

func (c *countWriter) u32(v uint32) { c.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (c *countWriter) u64(v uint64) { c.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (c *countWriter) str(s string) { c.u64(uint64(len(s))); c.raw([]byte(s)) }

// value writes v, preceded by its type when typed is set (array elements are
// not individually typed).
func (c *countWriter) value(v any, typed bool) error {
	var t uint32
	var b []byte
	le := binary.LittleEndian
	switch x := v.(type) {
	case uint8:
		t, b = ggufUint8, []byte{x}
	case int8:
		t, b = ggufInt8, []byte{byte(x)}
	case uint16:
		t, b = ggufUint16, le.AppendUint16(nil, x)
	case int16:
		t, b = ggufInt16, le.AppendUint16(nil, uint16(x))
	case uint32:
		t, b = ggufUint32, le.AppendUint32(nil, x)
	case int32:
		t, b = ggufInt32, le.AppendUint32(nil, uint32(x))
	case float32:
		t, b = ggufFloat32, le.AppendUint32(nil, math.Float32bits(x))
	case bool:
		t, b = ggufBool, []byte{0}
		if x {
			b[0] = 1
		}
	case string:
		t, b = ggufString, append(le.AppendUint64(nil, uint64(len(x))), x...)
	case uint64:
		t, b = ggufUint64, le.AppendUint64(nil, x)
	case int64:
		t, b = ggufInt64, le.AppendUint64(nil, uint64(x))
	case float64:
		t, b = ggufFloat64, le.AppendUint64(nil, math.Float64bits(x))
	case []uint8:
		return writeArray(c, typed, ggufUint8, x)
	case []int8:
		return writeArray(c, typed, ggufInt8, x)
	case []uint16:
		return writeArray(c, typed, ggufUint16, x)
	case []int16:
		return writeArray(c, typed, ggufInt16, x)
	case []uint32:
		return writeArray(c, typed, ggufUint32, x)
	case []int32:
		return writeArray(c, typed, ggufInt32, x)
	case []float32:
		return writeArray(c, typed, ggufFloat32, x)
	case []bool:
		return writeArray(c, typed, ggufBool, x)
	case []string:
		return writeArray(c, typed, ggufString, x)
	case []uint64:
		return writeArray(c, typed, ggufUint64, x)
	case []int64:
		return writeArray(c, typed, ggufInt64, x)
	case []float64:
		return writeArray(c, typed, ggufFloat64, x)
	default:
		return fmt.Errorf("unsupported value type %T", v)
	}
	if typed {
		c.u32(t)
	}
	c.raw(b)
	return nil
}

func writeArray[E any](c *countWriter, typed bool, et uint32, xs []E) error {
	if typed {
		c.u32(ggufArray)
	}
	c.u32(et)
	c.u64(uint64(len(xs)))
	for _, x := range xs {
		if err := c.value(x, false); err != nil {
			return err
		}
	}
	return nil
}

// float32To64 widens a float32 metadata value to the float64 with the same
// shortest decimal form, so 1e-5 written as float32 reads back as 1e-5.
func float32To64(f float32) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	if err != nil {
		return float64(f)
	}
	return v
}

// GGUFArch is llama.cpp's name of architecture arch: Mistral and Mixtral
// are llama (Mixtral with experts), Qwen3-MoE qwen3moe, Qwen2-MoE qwen2moe.
func GGUFArch(arch string) string {
	switch arch {
	case "mistral", "mixtral":
		return "llama"
	case "qwen3_moe":
		return "qwen3moe"
	case "qwen2_moe":
		return "qwen2moe"
	}
	return arch
}
