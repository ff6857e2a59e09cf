// GGUF files (llama.cpp), versions 2 and 3, little-endian:
//
//	magic "GGUF", uint32 version, uint64 tensor_count, uint64 kv_count
//	kv_count × (string key, uint32 value type, value)
//	tensor_count × (string name, uint32 n_dims, n_dims × uint64 ne (ne[0]
//	    fastest), uint32 ggml type, uint64 offset into the data section)
//	padding to general.alignment (default 32), then the data section.
//
// Strings are a uint64 length and bytes; arrays are a uint32 element type, a
// uint64 count and the elements. Shapes are reversed into ours (outermost
// first). Tensors stay views of the file, the block-quantized types (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL: tensor/ggml.go) included:
// the CPU backend computes from their blocks, the GPU widens them at upload. Tensor names are mapped to the canonical
// Hugging Face names (token_embd.weight → model.embed_tokens.weight, ...).

package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"

	"kiln/tensor"
)

const ggufMagic = "GGUF"

// GGUF metadata value types.
const (
	ggufUint8 uint32 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

// ggml tensor types this loader reads, and names for the rest (for errors).
const (
	ggmlF32    uint32 = 0
	ggmlF16    uint32 = 1
	ggmlQ4_0   uint32 = 2
	ggmlQ4_1   uint32 = 3
	ggmlQ5_0   uint32 = 6
	ggmlQ5_1   uint32 = 7
	ggmlQ8_0   uint32 = 8
	ggmlQ2_K   uint32 = 10
	ggmlQ3_K   uint32 = 11
	ggmlQ4_K   uint32 = 12
	ggmlQ5_K   uint32 = 13
	ggmlQ6_K   uint32 = 14
	ggmlIQ4_NL uint32 = 20
	ggmlBF16   uint32 = 30
)

var ggmlTypeNames = map[uint32]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
	9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
	15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
	20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
	26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
	35: "TQ2_0", 39: "MXFP4",
}

func ggmlTypeName(t uint32) string {
	if n, ok := ggmlTypeNames[t]; ok {
		return n
	}
	return "type " + strconv.FormatUint(uint64(t), 10)
}

var ggmlToDType = map[uint32]tensor.DType{
	ggmlF32: tensor.F32, ggmlF16: tensor.F16, ggmlBF16: tensor.BF16,
	ggmlQ4_0: tensor.Q4_0, ggmlQ4_1: tensor.Q4_1, ggmlQ5_0: tensor.Q5_0, ggmlQ5_1: tensor.Q5_1, ggmlQ8_0: tensor.Q8_0,
	ggmlQ2_K: tensor.Q2_K, ggmlQ3_K: tensor.Q3_K, ggmlQ4_K: tensor.Q4_K, ggmlQ5_K: tensor.Q5_K, ggmlQ6_K: tensor.Q6_K,
	ggmlIQ4_NL: tensor.IQ4_NL,
}

// ggufMaxDims is GGML_MAX_DIMS.
const ggufMaxDims = 4

// ggufMaxArrayDepth bounds nested arrays (real files use none).
const ggufMaxArrayDepth = 2

// ggufTensorInfo is one tensor's entry in the file.
type ggufTensorInfo struct {
	name   string
	shape  tensor.Shape // outermost first
	typ    uint32
	offset uint64
}

// ggufFile is a parsed GGUF file; tensors slice the data it was parsed from.
type ggufFile struct {
	version  uint32
	kvKeys   []string // in file order
	metadata map[string]any
	infos    []ggufTensorInfo
	tensors  map[string]*tensor.Tensor // GGUF names, stored dtype
}

// ggufReader reads little-endian values from a byte slice, failing (never
// panicking) when the data runs out.
type ggufReader struct {
	data []byte
	pos  int
}

var errTruncated = errors.New("truncated")

func (r *ggufReader) remaining() int { return len(r.data) - r.pos }

func (r *ggufReader) bytes(n uint64) ([]byte, error) {
	if n > uint64(r.remaining()) {
		return nil, fmt.Errorf("at byte %d: %w: need %d bytes, %d left", r.pos, errTruncated, n, r.remaining())
	}
	b := r.data[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b, nil
}

func (r *ggufReader) u8() (uint8, error) {
	b, err := r.bytes(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *ggufReader) u16() (uint16, error) {
	b, err := r.bytes(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (r *ggufReader) u32() (uint32, error) {
	b, err := r.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *ggufReader) u64() (uint64, error) {
	b, err := r.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (r *ggufReader) str() (string, error) {
	n, err := r.u64()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(n)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// minValueSize is the least number of bytes a value of type t occupies, used
// to cap counts against the bytes left before allocating.
func minValueSize(t uint32) uint64 {
	switch t {
	case ggufUint8, ggufInt8, ggufBool:
		return 1
	case ggufUint16, ggufInt16:
		return 2
	case ggufUint32, ggufInt32, ggufFloat32:
		return 4
	case ggufUint64, ggufInt64, ggufFloat64, ggufString:
		return 8
	case ggufArray:
		return 12
	}
	return 1
}

func (r *ggufReader) value(t uint32, depth int) (any, error) {
	switch t {
	case ggufUint8:
		return r.u8()
	case ggufInt8:
		v, err := r.u8()
		return int8(v), err
	case ggufUint16:
		return r.u16()
	case ggufInt16:
		v, err := r.u16()
		return int16(v), err
	case ggufUint32:
		return r.u32()
	case ggufInt32:
		v, err := r.u32()
		return int32(v), err
	case ggufFloat32:
		v, err := r.u32()
		return math.Float32frombits(v), err
	case ggufBool:
		v, err := r.u8()
		if err == nil && v > 1 {
			return nil, fmt.Errorf("bool value %d", v)
		}
		return v == 1, err
	case ggufString:
		return r.str()
	case ggufUint64:
		return r.u64()
	case ggufInt64:
		v, err := r.u64()
		return int64(v), err
	case ggufFloat64:
		v, err := r.u64()
		return math.Float64frombits(v), err
	case ggufArray:
		return r.array(depth + 1)
	}
	return nil, fmt.Errorf("unknown value type %d", t)
}

func (r *ggufReader) array(depth int) (any, error) {
	if depth > ggufMaxArrayDepth {
		return nil, errors.New("arrays nested too deeply")
	}
	et, err := r.u32()
	if err != nil {
		return nil, err
	}
	n, err := r.u64()
	if err != nil {
		return nil, err
	}
	if et > ggufFloat64 {
		return nil, fmt.Errorf("unknown array element type %d", et)
	}
	if n > uint64(r.remaining())/minValueSize(et) {
		return nil, fmt.Errorf("array of %d elements does not fit in the %d bytes left", n, r.remaining())
	}
	count := int(n)
	// Fixed-size element types are decoded straight from the bytes.
	switch et {
	case ggufUint8, ggufInt8, ggufBool:
		b, _ := r.bytes(n)
		switch et {
		case ggufUint8:
			return append([]uint8(nil), b...), nil
		case ggufInt8:
			out := make([]int8, count)
			for i := range out {
				out[i] = int8(b[i])
			}
			return out, nil
		default:
			out := make([]bool, count)
			for i := range out {
				if b[i] > 1 {
					return nil, fmt.Errorf("bool value %d", b[i])
				}
				out[i] = b[i] == 1
			}
			return out, nil
		}
	case ggufUint16, ggufInt16:
		b, _ := r.bytes(2 * n)
		if et == ggufUint16 {
			out := make([]uint16, count)
			for i := range out {
				out[i] = binary.LittleEndian.Uint16(b[2*i:])
			}
			return out, nil
		}
		out := make([]int16, count)
		for i := range out {
			out[i] = int16(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return out, nil
	case ggufUint32, ggufInt32, ggufFloat32:
		b, _ := r.bytes(4 * n)
		switch et {
		case ggufUint32:
			out := make([]uint32, count)
			for i := range out {
				out[i] = binary.LittleEndian.Uint32(b[4*i:])
			}
			return out, nil
		case ggufInt32:
			out := make([]int32, count)
			for i := range out {
				out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
			}
			return out, nil
		default:
			out := make([]float32, count)
			for i := range out {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
			return out, nil
		}
	case ggufUint64, ggufInt64, ggufFloat64:
		b, _ := r.bytes(8 * n)
		switch et {
		case ggufUint64:
			out := make([]uint64, count)
			for i := range out {
				out[i] = binary.LittleEndian.Uint64(b[8*i:])
			}
			return out, nil
		case ggufInt64:
			out := make([]int64, count)
			for i := range out {
				out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
			}
			return out, nil
		default:
			out := make([]float64, count)
			for i := range out {
				out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			}
			return out, nil
		}
	case ggufString:
		out := make([]string, count)
		for i := range out {
			if out[i], err = r.str(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	out := make([]any, count) // arrays of arrays
	for i := range out {
		if out[i], err = r.value(et, depth); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseGGUF parses a whole GGUF file held in data. Tensors keep their GGUF
// names and stored dtypes and slice data without copying.
func parseGGUF(data []byte) (*ggufFile, error) {
	r := &ggufReader{data: data}
	magic, err := r.bytes(4)
	if err != nil || string(magic) != ggufMagic {
		return nil, errors.New("gguf: bad magic")
	}
	f := &ggufFile{metadata: map[string]any{}, tensors: map[string]*tensor.Tensor{}}
	if f.version, err = r.u32(); err != nil {
		return nil, fmt.Errorf("gguf: header: %w", err)
	}
	if f.version != 2 && f.version != 3 {
		if f.version&0xffff == 0 && f.version != 0 {
			return nil, fmt.Errorf("unsupported gguf version %d (big-endian file?)", f.version)
		}
		return nil, fmt.Errorf("unsupported gguf version %d", f.version)
	}
	nTensors, err := r.u64()
	if err != nil {
		return nil, fmt.Errorf("gguf: header: %w", err)
	}
	nKV, err := r.u64()
	if err != nil {
		return nil, fmt.Errorf("gguf: header: %w", err)
	}
	// A KV takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor info
	// at least 8 + 4 + 8 + 4 + 8.
	if nKV > uint64(r.remaining())/13 {
		return nil, fmt.Errorf("gguf: %d metadata entries cannot fit in a %d-byte file", nKV, len(data))
	}
	if nTensors > uint64(r.remaining())/32 {
		return nil, fmt.Errorf("gguf: %d tensors cannot fit in a %d-byte file", nTensors, len(data))
	}
	for i := uint64(0); i < nKV; i++ {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata entry %d: key: %w", i, err)
		}
		t, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %s: %w", key, err)
		}
		v, err := r.value(t, 0)
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %s: %w", key, err)
		}
		if _, dup := f.metadata[key]; dup {
			return nil, fmt.Errorf("gguf: duplicate metadata key %s", key)
		}
		f.metadata[key] = v
		f.kvKeys = append(f.kvKeys, key)
	}
	align := uint64(32)
	if v, ok := f.metadata["general.alignment"]; ok {
		a, ok := v.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("gguf: general.alignment %v must be a power of two uint32", v)
		}
		align = uint64(a)
	}
	f.infos = make([]ggufTensorInfo, 0, nTensors)
	for i := uint64(0); i < nTensors; i++ {
		name, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor info %d: name: %w", i, err)
		}
		nd, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %s: %w", name, err)
		}
		if nd > ggufMaxDims {
			return nil, fmt.Errorf("gguf: tensor %s has %d dimensions, at most %d allowed", name, nd, ggufMaxDims)
		}
		ne := make([]int64, nd)
		for j := range ne {
			d, err := r.u64()
			if err != nil {
				return nil, fmt.Errorf("gguf: tensor %s: %w", name, err)
			}
			if d > math.MaxInt32 {
				return nil, fmt.Errorf("gguf: tensor %s: dimension %d out of range", name, d)
			}
			ne[j] = int64(d)
		}
		typ, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %s: %w", name, err)
		}
		off, err := r.u64()
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %s: %w", name, err)
		}
		shape := make(tensor.Shape, nd)
		for j := range ne {
			shape[int(nd)-1-j] = int(ne[j])
		}
		f.infos = append(f.infos, ggufTensorInfo{name: name, shape: shape, typ: typ, offset: off})
	}
	// The data section starts at the next multiple of the alignment.
	start := (uint64(r.pos) + align - 1) / align * align
	if start > uint64(len(data)) {
		return nil, fmt.Errorf("gguf: data section at %d is past the end of the %d-byte file", start, len(data))
	}
	body := data[start:]
	type span struct {
		name       string
		begin, end uint64
	}
	for _, in := range f.infos {
		dt, ok := ggmlToDType[in.typ]
		if !ok {
			return nil, fmt.Errorf("unsupported tensor type %s for tensor %s", ggmlTypeName(in.typ), in.name)
		}
		if _, dup := f.tensors[in.name]; dup {
			return nil, fmt.Errorf("gguf: duplicate tensor %s", in.name)
		}
		dims := make([]int64, len(in.shape))
		for j, d := range in.shape {
			dims[j] = int64(d)
		}
		// At most as many elements as the data section's whole blocks hold.
		elems, ok := elementsCap(dims, (int64(len(body))/int64(dt.BlockBytes())+1)*int64(dt.BlockSize()))
		if !ok {
			return nil, fmt.Errorf("gguf: tensor %s: shape %v is larger than the file", in.name, in.shape)
		}
		if bs := dt.BlockSize(); bs > 1 && len(in.shape) > 0 && in.shape[len(in.shape)-1]%bs != 0 {
			return nil, fmt.Errorf("gguf: tensor %s: rows of %d are not whole %v blocks of %d", in.name, in.shape[len(in.shape)-1], dt, bs)
		}
		size, err := dt.Bytes(elems)
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %s: %w", in.name, err)
		}
		if in.offset%align != 0 {
			return nil, fmt.Errorf("gguf: tensor %s: offset %d is not a multiple of the alignment %d", in.name, in.offset, align)
		}
		if in.offset > uint64(len(body)) || uint64(size) > uint64(len(body))-in.offset {
			return nil, fmt.Errorf("gguf: tensor %s: %d bytes at offset %d run past the %d-byte data section", in.name, size, in.offset, len(body))
		}
		end := in.offset + uint64(size)
		f.tensors[in.name] = &tensor.Tensor{Name: in.name, DType: dt, Shape: in.shape, Data: body[in.offset:end:end]}
	}
	spans := make([]span, 0, len(f.infos))
	for _, in := range f.infos {
		t := f.tensors[in.name]
		spans = append(spans, span{in.name, in.offset, in.offset + uint64(len(t.Data))})
	}
	sortSpans(spans, func(s span) (uint64, uint64) { return s.begin, s.end })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, fmt.Errorf("gguf: tensors %s and %s overlap", spans[i-1].name, spans[i].name)
		}
	}
	return f, nil
}

// ggufNames maps GGUF tensor names to canonical ones.
var (
	ggufGlobalNames = map[string]string{
		"token_embd.weight":  EmbedName,
		"output_norm.weight": NormName,
		"output.weight":      HeadName,
	}
	ggufLayerNames = map[string]string{
		"attn_norm.weight":   "input_layernorm.weight",
		"attn_q.weight":      "self_attn.q_proj.weight",
		"attn_k.weight":      "self_attn.k_proj.weight",
		"attn_v.weight":      "self_attn.v_proj.weight",
		"attn_output.weight": "self_attn.o_proj.weight",
		"attn_q.bias":        "self_attn.q_proj.bias",
		"attn_k.bias":        "self_attn.k_proj.bias",
		"attn_v.bias":        "self_attn.v_proj.bias",
		"attn_output.bias":   "self_attn.o_proj.bias",
		"attn_qkv.weight":    "self_attn.qkv_proj.weight",
		"attn_q_norm.weight": "self_attn.q_norm.weight",
		"attn_k_norm.weight": "self_attn.k_norm.weight",
		"ffn_norm.weight":    "post_attention_layernorm.weight",
		"ffn_gate.weight":    "mlp.gate_proj.weight",
		"ffn_up.weight":      "mlp.up_proj.weight",
		"ffn_down.weight":    "mlp.down_proj.weight",
		// Qwen2-MoE's shared expert and its gate.
		"ffn_gate_shexp.weight":     "mlp.shared_expert.gate_proj.weight",
		"ffn_up_shexp.weight":       "mlp.shared_expert.up_proj.weight",
		"ffn_down_shexp.weight":     "mlp.shared_expert.down_proj.weight",
		"ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
	}
	// Gemma 2 and 3 norm around attention and the MLP (sandwichNorms):
	// llama.cpp's ffn_norm is then pre_feedforward_layernorm, and HF's
	// post_attention_layernorm follows attention.
	ggufSandwichNames = map[string]string{
		"post_attention_norm.weight": "post_attention_layernorm.weight",
		"ffn_norm.weight":            "pre_feedforward_layernorm.weight",
		"post_ffw_norm.weight":       "post_feedforward_layernorm.weight",
	}
	ggufLayerRe      = regexp.MustCompile(`^blk\.(\d{1,6})\.(.+)$`)
	canonicalLayerRe = regexp.MustCompile(`^model\.layers\.(\d{1,6})\.(.+)$`)
)

// sandwichNorms reports whether GGUF architecture arch norms after
// attention and the MLP too (Gemma 2 and 3).
func sandwichNorms(arch string) bool { return arch == "gemma2" || arch == "gemma3" }

// layerNames is the layer tensor names of GGUF architecture arch.
func layerNames(arch string) func(g string) (string, bool) {
	return func(g string) (string, bool) {
		if sandwichNorms(arch) {
			if s, ok := ggufSandwichNames[g]; ok {
				return s, true
			}
		}
		s, ok := ggufLayerNames[g]
		return s, ok
	}
}

// canonicalName maps a GGUF tensor name of architecture arch to the
// canonical name; unknown names are returned unchanged.
func canonicalName(g, arch string) string {
	if c, ok := ggufGlobalNames[g]; ok {
		return c
	}
	if m := ggufLayerRe.FindStringSubmatch(g); m != nil {
		if s, ok := layerNames(arch)(m[2]); ok {
			return "model.layers." + m[1] + "." + s
		}
	}
	return g
}

// ggufName maps a canonical name back to GGUF (the inverse of canonicalName).
func ggufName(c, arch string) string {
	for g, cn := range ggufGlobalNames {
		if cn == c {
			return g
		}
	}
	if m := canonicalLayerRe.FindStringSubmatch(c); m != nil {
		names := layerNames(arch)
		for _, table := range []map[string]string{ggufSandwichNames, ggufLayerNames} {
			for g := range table {
				if s, ok := names(g); ok && s == m[2] {
					return "blk." + m[1] + "." + g
				}
			}
		}
	}
	return c
}

// ggufGemma sets what Gemma adds to a Llama, from llama.cpp's gemma, gemma2
// and gemma3 metadata. The norm weights are stored as 1+w (llama.cpp's
// converter adds the 1), so NormOffset stays 0. The windowed layers
// alternate as llama.cpp has them (Gemma 2: every other from the first;
// Gemma 3: all but every sliding_window_pattern-th, 6 unless the file
// says), Gemma 3's windowed layers rotating by rope.freq_base_swa (10000
// unless the file says). The query scale is
// attention.query_pre_attn_scalar^-½ when kiln wrote the file, else
// llama.cpp's rule: 1/√(embedding/heads) for the 27B models (46 layers of
// Gemma 2, 62 of Gemma 3), 1/√head_dim for the others.
func ggufGemma(md map[string]any, arch string, c *Config) error {
	if arch != "gemma" && arch != "gemma2" && arch != "gemma3" {
		return nil
	}
	c.GELU = true
	c.EmbedScale = math.Sqrt(float64(c.HiddenSize))
	if arch == "gemma" {
		return nil
	}
	c.PostNorms = true
	for _, k := range []struct {
		key string
		dst *float64
	}{{".attn_logit_softcapping", &c.AttnSoftCap}, {".final_logit_softcapping", &c.FinalSoftCap}} {
		if v, ok, err := mdFloat(md, arch+k.key); err != nil {
			return err
		} else if ok {
			*k.dst = v
		}
	}
	if v, ok, err := mdFloat(md, arch+".attention.query_pre_attn_scalar"); err != nil {
		return err
	} else if ok && v > 0 {
		c.QueryScale = 1 / math.Sqrt(v)
	} else if (arch == "gemma2" && c.NumLayers == 46) || (arch == "gemma3" && c.NumLayers == 62) {
		c.QueryScale = 1 / math.Sqrt(float64(c.HiddenSize/c.NumHeads))
	}
	window := c.SlidingWindow
	c.SlidingWindow = 0
	pattern := 2
	if arch == "gemma3" { // (its q/k norms: QKNorm, set with the tensors)
		pattern, c.RopeLocalTheta = 6, 10000
		if v, ok, err := mdInt(md, arch+".attention.sliding_window_pattern"); err != nil {
			return err
		} else if ok {
			pattern = v
		}
		if v, ok, err := mdFloat(md, arch+".rope.freq_base_swa"); err != nil {
			return err
		} else if ok {
			c.RopeLocalTheta = v
		}
	}
	c.LayerWindows = make([]int, c.NumLayers)
	for l := range c.LayerWindows {
		if pattern > 0 && (l+1)%pattern != 0 {
			c.LayerWindows[l] = window
		}
	}
	return nil
}

// The tensors llama.cpp keeps longrope's factors in (phi3).
const (
	ropeFactorsShort = "rope_factors_short.weight"
	ropeFactorsLong  = "rope_factors_long.weight"
)

// LoadGGUF loads a GGUF file (architectures llama, with or without experts,
// qwen2, qwen3, qwen3moe, qwen2moe, olmoe, phi3, gemma, gemma2 and gemma3).
func LoadGGUF(path string) (*Model, error) {
	return loadMapped(path, ggufModel)
}

// ggufModel builds a Model from a GGUF file's bytes.
func ggufModel(data []byte) (*Model, error) {
	f, err := parseGGUF(data)
	if err != nil {
		return nil, err
	}
	md := f.metadata
	arch, _ := md["general.architecture"].(string)
	var c Config
	switch arch {
	case "llama":
		c.Arch, c.RopeStyle = "llama", RopeInterleaved
	case "qwen2", "qwen3", "phi3":
		c.Arch, c.RopeStyle = arch, RopeHalf
	case "qwen3moe":
		c.Arch, c.RopeStyle = "qwen3_moe", RopeHalf
	case "qwen2moe":
		c.Arch, c.RopeStyle = "qwen2_moe", RopeHalf
	case "olmoe":
		c.Arch, c.RopeStyle = "olmoe", RopeHalf
	case "gemma", "gemma2", "gemma3":
		c.Arch, c.RopeStyle = arch, RopeHalf
	case "":
		return nil, errors.New("gguf: general.architecture is missing or not a string")
	default:
		return nil, fmt.Errorf("unsupported architecture %q (supported: llama, qwen2, qwen3, qwen3moe, qwen2moe, olmoe, phi3, gemma, gemma2, gemma3)", arch)
	}
	req := func(key string, dst *int) error {
		v, ok, err := mdInt(md, arch+"."+key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("gguf: missing metadata %s.%s", arch, key)
		}
		*dst = v
		return nil
	}
	for _, k := range []struct {
		key string
		dst *int
	}{
		{"context_length", &c.MaxPositions},
		{"embedding_length", &c.HiddenSize},
		{"block_count", &c.NumLayers},
		{"feed_forward_length", &c.IntermediateSize},
		{"attention.head_count", &c.NumHeads},
	} {
		if err := req(k.key, k.dst); err != nil {
			return nil, err
		}
	}
	c.NumKVHeads = c.NumHeads
	if v, ok, err := mdInt(md, arch+".attention.head_count_kv"); err != nil {
		return nil, err
	} else if ok {
		c.NumKVHeads = v
	}
	if c.NumHeads <= 0 {
		return nil, fmt.Errorf("gguf: %s.attention.head_count is %d", arch, c.NumHeads)
	}
	c.HeadDim = c.HiddenSize / c.NumHeads
	if v, ok, err := mdInt(md, arch+".attention.key_length"); err != nil {
		return nil, err
	} else if ok {
		c.HeadDim = v
	} else if c.HiddenSize%c.NumHeads != 0 {
		return nil, fmt.Errorf("gguf: embedding length %d is not a multiple of %d heads", c.HiddenSize, c.NumHeads)
	}
	if v, ok, err := mdInt(md, arch+".attention.value_length"); err != nil {
		return nil, err
	} else if ok && v != c.HeadDim {
		return nil, fmt.Errorf("unsupported value head length %d differing from key length %d", v, c.HeadDim)
	}
	if v, ok, err := mdInt(md, arch+".rope.dimension_count"); err != nil {
		return nil, err
	} else if ok && v != c.HeadDim {
		return nil, fmt.Errorf("unsupported partial rotary embedding: rope dimension %d, head dim %d", v, c.HeadDim)
	}
	c.RMSNormEps = 1e-5
	if v, ok, err := mdFloat(md, arch+".attention.layer_norm_rms_epsilon"); err != nil {
		return nil, err
	} else if ok {
		c.RMSNormEps = v
	}
	c.RopeTheta = 10000
	if v, ok, err := mdFloat(md, arch+".rope.freq_base"); err != nil {
		return nil, err
	} else if ok {
		c.RopeTheta = v
	}
	if v, ok := md[arch+".rope.scaling.type"]; ok {
		s, _ := v.(string)
		switch s {
		case "none", "":
		case "linear":
			factor, ok, err := mdFloat(md, arch+".rope.scaling.factor")
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, fmt.Errorf("gguf: linear rope scaling without %s.rope.scaling.factor", arch)
			}
			c.RopeScaling = RopeScaling{Type: "linear", Factor: factor}
		default:
			return nil, fmt.Errorf("unsupported rope scaling type %q", s)
		}
	} else if factor, ok, err := mdFloat(md, arch+".rope.scale_linear"); err != nil {
		return nil, err
	} else if ok && factor != 1 {
		c.RopeScaling = RopeScaling{Type: "linear", Factor: factor}
	}
	// longrope (phi3): the original context and attention factor here, the
	// factors as tensors below. llama.cpp writes the original context for
	// every phi3 file, the factors only for long-context models: longrope
	// is on only with them.
	longOrig, _, err := mdInt(md, arch+".rope.scaling.original_context_length")
	if err != nil {
		return nil, err
	}
	longAttn, haveAttn, err := mdFloat(md, arch+".rope.scaling.attn_factor")
	if err != nil {
		return nil, err
	}
	var shortFactors, longFactors []float32
	if v, ok, err := mdInt(md, arch+".attention.sliding_window"); err != nil {
		return nil, err
	} else if ok {
		c.SlidingWindow = v
	}
	if err := ggufExperts(md, arch, &c); err != nil {
		return nil, err
	}
	if err := ggufGemma(md, arch, &c); err != nil {
		return nil, err
	}
	for _, k := range []struct {
		key string
		dst *[]int
	}{{"tokenizer.ggml.bos_token_id", &c.BOS}, {"tokenizer.ggml.eos_token_id", &c.EOS}} {
		if v, ok, err := mdInt(md, k.key); err != nil {
			return nil, err
		} else if ok {
			*k.dst = []int{v}
		}
	}

	m := &Model{Format: "gguf", Metadata: md, Tensors: make(map[string]*tensor.Tensor, len(f.tensors))}
	if s, ok := md["tokenizer.chat_template"].(string); ok {
		m.ChatTemplate = s
	}
	stored := map[tensor.DType]int64{}
	for _, in := range f.infos {
		t := f.tensors[in.name]
		stored[t.DType] += t.Shape.Elements()
		if in.name == "rope_freqs.weight" || in.name == ropeFactorsShort || in.name == ropeFactorsLong {
			vals, err := t.F32s()
			if err != nil {
				return nil, err
			}
			switch in.name {
			case ropeFactorsShort:
				shortFactors = vals
			case ropeFactorsLong:
				longFactors = vals
			default:
				c.RopeFreqFactors = vals
			}
			continue
		}
		name := canonicalName(in.name, arch)
		t = &tensor.Tensor{Name: name, DType: t.DType, Shape: t.Shape, Data: t.Data}
		if _, dup := m.Tensors[name]; dup {
			return nil, fmt.Errorf("gguf: two tensors map to %s", name)
		}
		m.Tensors[name] = t
	}
	if shortFactors != nil || longFactors != nil {
		if longOrig <= 0 {
			return nil, fmt.Errorf("gguf: longrope factors without %s.rope.scaling.original_context_length", arch)
		}
		if !haveAttn {
			longAttn = LongRopeAttentionFactor(c.MaxPositions, longOrig)
		}
		c.RopeScaling = RopeScaling{Type: "longrope", OriginalMaxPositions: longOrig, AttentionFactor: longAttn,
			ShortFactor: shortFactors, LongFactor: longFactors}
	}
	for dt, n := range stored {
		if c.DType == tensor.Invalid || n > stored[c.DType] || (n == stored[c.DType] && dt < c.DType) {
			c.DType = dt
		}
	}
	emb, ok := m.Tensors[EmbedName]
	if !ok {
		return nil, fmt.Errorf("missing tensor %s", EmbedName)
	}
	if len(emb.Shape) != 2 {
		return nil, fmt.Errorf("tensor %s has shape %v, want 2 dimensions", EmbedName, emb.Shape)
	}
	if v, ok, err := mdInt(md, arch+".vocab_size"); err != nil {
		return nil, err
	} else if ok {
		c.VocabSize = v
	} else {
		c.VocabSize = emb.Shape[0]
	}
	_, hasHead := m.Tensors[HeadName]
	c.TiedEmbeddings = !hasHead
	_, hasBias := m.Tensors[LayerName(0, "self_attn.q_proj.bias")]
	c.QKVBias = hasBias || arch == "qwen2"
	c.QKNorm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3"
	c.QKNormWhole = arch == "olmoe" // over all heads at once
	if c.NumExperts > 0 {
		if err := splitGGUFExperts(&c, m.Tensors); err != nil {
			return nil, fmt.Errorf("gguf: %w", err)
		}
	}
	if arch == "phi3" {
		// llama.cpp's phi3 stores the gate and up projections stacked as
		// ffn_up, and q, k, v as attn_qkv.
		for l := 0; l < c.NumLayers; l++ {
			up := LayerName(l, "mlp.up_proj.weight")
			if t, ok := m.Tensors[up]; ok {
				delete(m.Tensors, up)
				m.Tensors[LayerName(l, "mlp.gate_up_proj.weight")] = t
			}
		}
		if err := splitPhi3(&c, m.Tensors); err != nil {
			return nil, fmt.Errorf("gguf: %w", err)
		}
	}
	if c.RopeFreqFactors != nil && len(c.RopeFreqFactors) != c.HeadDim/2 {
		return nil, fmt.Errorf("gguf: rope_freqs.weight has %d factors, want head dim / 2 = %d", len(c.RopeFreqFactors), c.HeadDim/2)
	}
	if err := checkTensors(&c, m.Tensors); err != nil {
		return nil, err
	}
	m.Config = c
	return m, nil
}

// ggufExperts reads a mixture of experts' metadata, as llama.cpp writes
// it: ARCH.expert_count and expert_used_count (llama's are Mixtral's, its
// routing the softmax over the chosen experts), qwen3moe's and qwen2moe's
// experts' width (expert_feed_forward_length) and routing
// (expert_weights_norm), and qwen2moe's gated shared expert
// (expert_shared_feed_forward_length); olmoe's as qwen3moe's (its experts'
// width feed_forward_length unless expert_feed_forward_length says).
func ggufExperts(md map[string]any, arch string, c *Config) error {
	n, ok, err := mdInt(md, arch+".expert_count")
	if err != nil || !ok || n == 0 {
		return err
	}
	used, _, err := mdInt(md, arch+".expert_used_count")
	if err != nil {
		return err
	}
	if used < 1 || used > n {
		return fmt.Errorf("gguf: %d experts, %d a token", n, used)
	}
	c.NumExperts, c.ExpertsPerToken = n, used
	switch arch {
	case "llama":
		c.Arch, c.NormTopK = "mixtral", true
	case "qwen3moe", "qwen2moe", "olmoe":
		if _, ok := md[arch+".attention.clamp_kqv"]; ok {
			return fmt.Errorf("gguf: %s.attention.clamp_kqv (OLMoE's clip_qkv) is not supported", arch)
		}
		if v, ok, err := mdInt(md, arch+".expert_feed_forward_length"); err != nil {
			return err
		} else if ok {
			c.IntermediateSize = v
		}
		norm, _ := md[arch+".expert_weights_norm"].(bool)
		c.NormTopK = norm
		if arch == "qwen2moe" {
			// The shared expert, gated: its width is the key's, or its
			// matrices' (splitGGUFExperts).
			v, _, err := mdInt(md, arch+".expert_shared_feed_forward_length")
			if err != nil {
				return err
			}
			c.SharedExpertSize, c.SharedExpertGate = v, true
		}
	default:
		return fmt.Errorf("gguf: experts in a %s model are not supported", arch)
	}
	return nil
}

// splitGGUFExperts takes each layer's stacked experts (blk.N.ffn_gate_exps,
// ffn_up_exps, ffn_down_exps: [experts, rows, cols]) apart into the
// experts' matrices, views of their bytes, and names the router
// (ffn_gate_inp).
func splitGGUFExperts(c *Config, ts map[string]*tensor.Tensor) error {
	for l := 0; l < c.NumLayers; l++ {
		blk := func(s string) string { return fmt.Sprintf("blk.%d.%s.weight", l, s) }
		r, ok := ts[blk("ffn_gate_inp")]
		if !ok {
			return fmt.Errorf("missing tensor %s", blk("ffn_gate_inp"))
		}
		delete(ts, blk("ffn_gate_inp"))
		r.Name = c.MoERouter(l)
		ts[r.Name] = r
		for i, stack := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} {
			t, ok := ts[blk(stack)]
			if !ok {
				return fmt.Errorf("missing tensor %s (experts stored one by one are not supported)", blk(stack))
			}
			if len(t.Shape) != 3 || t.Shape[0] != c.NumExperts {
				return fmt.Errorf("tensor %s has shape %v, want [%d,...]", blk(stack), t.Shape, c.NumExperts)
			}
			// The stack's bytes are those of its experts' rows one after
			// another: a matrix of experts·rows rows, split as Phi-3's.
			names, rows := make([]string, c.NumExperts), make([]int, c.NumExperts)
			for e := range names {
				gate, up, down := c.MoEExpert(l, e)
				names[e], rows[e] = []string{gate, up, down}[i], t.Shape[1]
			}
			t.Shape = tensor.Shape{c.NumExperts * t.Shape[1], t.Shape[2]}
			if err := splitRows(ts, blk(stack), names, rows); err != nil {
				return err
			}
		}
		if c.SharedExpertGate {
			if err := ggufShared(c, ts, l); err != nil {
				return err
			}
		}
	}
	return nil
}

// ggufShared checks layer l's shared expert as llama.cpp's qwen2moe
// stores it (ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp, and the gate
// ffn_gate_inp_shexp, a vector or one row: made a row), taking its width
// from the matrices when the metadata does not say it.
func ggufShared(c *Config, ts map[string]*tensor.Tensor, l int) error {
	gate, _, _ := c.MoEShared(l)
	for _, n := range []string{gate, c.MoESharedGate(l)} {
		if _, ok := ts[n]; !ok {
			return fmt.Errorf("missing tensor %s (%s)", ggufName(n, "qwen2moe"), n)
		}
	}
	if g := ts[c.MoESharedGate(l)]; len(g.Shape) == 1 {
		g.Shape = tensor.Shape{1, g.Shape[0]}
	}
	if g := ts[gate]; c.SharedExpertSize == 0 && len(g.Shape) == 2 {
		c.SharedExpertSize = g.Shape[0]
	}
	return nil
}

// mdInt reads an integer metadata value of any integer type.
func mdInt(md map[string]any, key string) (int, bool, error) {
	v, ok := md[key]
	if !ok {
		return 0, false, nil
	}
	var n int64
	switch x := v.(type) {
	case uint8:
		n = int64(x)
	case int8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case int16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case int32:
		n = int64(x)
	case uint64:
		if x > math.MaxInt32 {
			return 0, false, fmt.Errorf("gguf: metadata %s = %d is out of range", key, x)
		}
		n = int64(x)
	case int64:
		n = x
	default:
		return 0, false, fmt.Errorf("gguf: metadata %s is %T, want an integer", key, v)
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, false, fmt.Errorf("gguf: metadata %s = %d is out of range", key, n)
	}
	return int(n), true, nil
}

// mdFloat reads a float (or integer) metadata value.
func mdFloat(md map[string]any, key string) (float64, bool, error) {
	v, ok := md[key]
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case float32:
		return float32To64(x), true, nil
	case float64:
		return x, true, nil
	}
	n, ok, err := mdInt(md, key)
	if err != nil {
		return 0, false, fmt.Errorf("gguf: metadata %s is %T, want a number", key, v)
	}
	return float64(n), ok, nil
}

// MetadataInt reads an integer GGUF metadata value, whatever its stored
// width (and a float64 holding an integer, as JSON-decoded metadata has).
func MetadataInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), x <= math.MaxInt64
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case float64:
		return int64(x), x == math.Trunc(x) && math.Abs(x) < 1<<53
	}
	return 0, false
}
