// llama2.c checkpoints (Karpathy's run.c), all fp32 little-endian:
//
// Legacy: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len), then tok_emb[V,dim], rms_att[L,dim], wq[L,dim,dim],
// wk[L,kv_dim,dim], wv[L,kv_dim,dim], wo[L,dim,dim], rms_ffn[L,dim],
// w1[L,hid,dim], w2[L,dim,hid], w3[L,hid,dim], rms_final[dim],
// freq_cis_real[seq,hs/2], freq_cis_imag[seq,hs/2] (unused), and wcls[V,dim]
// only when vocab_size is negative (an unshared classifier; |vocab_size| is
// the vocabulary).
//
// Version 1: a 256-byte header (uint32 magic 0x616b3432 "ak42", int32
// version 1, the same 7 int32, uint8 shared_classifier, zero padding), then
// all rms_att, all rms_ffn, rms_final, tok_emb, wq, wk, wv, wo, w1, w2, w3,
// and wcls when the classifier is not shared.
//
// w1 is the gate projection, w3 the up projection and w2 the down
// projection. RoPE rotates interleaved pairs. Tensors are views of the file.

package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"kiln/tensor"
)

const (
	llama2cMagic     = 0x616b3432 // "ak42" as a little-endian uint32
	llama2cV1Header  = 256
	llama2cOldHeader = 7 * 4
)

// LoadLlama2C loads a llama2.c checkpoint (legacy or version 1).
func LoadLlama2C(path string) (*Model, error) {
	return loadMapped(path, llama2cModel)
}

// llama2cModel builds a Model from a llama2.c checkpoint's bytes.
func llama2cModel(data []byte) (*Model, error) {
	m, err := parseLlama2C(data)
	if err != nil && !(len(data) >= 4 && binary.LittleEndian.Uint32(data) == llama2cMagic) {
		// The legacy format has no magic: say what else the file could
		// have been.
		return nil, fmt.Errorf("not a GGUF file or llama2.c checkpoint: %w", err)
	}
	return m, err
}

func parseLlama2C(data []byte) (*Model, error) {
	var hdr [7]int32
	shared := true
	var pos int64
	v1 := len(data) >= 8 && binary.LittleEndian.Uint32(data) == llama2cMagic
	if v1 {
		if v := int32(binary.LittleEndian.Uint32(data[4:])); v != 1 {
			return nil, fmt.Errorf("unsupported llama2.c version %d", v)
		}
		if len(data) < llama2cV1Header {
			return nil, fmt.Errorf("llama2.c: file of %d bytes is shorter than the %d-byte header", len(data), llama2cV1Header)
		}
		for i := range hdr {
			hdr[i] = int32(binary.LittleEndian.Uint32(data[8+4*i:]))
		}
		switch data[36] {
		case 0:
			shared = false
		case 1:
		default:
			return nil, fmt.Errorf("llama2.c: shared_classifier byte is %d", data[36])
		}
		pos = llama2cV1Header
	} else {
		if len(data) < llama2cOldHeader {
			return nil, fmt.Errorf("llama2.c: file of %d bytes is shorter than the %d-byte header", len(data), llama2cOldHeader)
		}
		for i := range hdr {
			hdr[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
		}
		if hdr[5] < 0 {
			shared = false
			if hdr[5] == math.MinInt32 {
				return nil, errors.New("llama2.c: vocab size out of range")
			}
			hdr[5] = -hdr[5]
		}
		pos = llama2cOldHeader
	}
	dim, hid, layers, heads, kvHeads, vocab, seq := int64(hdr[0]), int64(hdr[1]), int64(hdr[2]), int64(hdr[3]), int64(hdr[4]), int64(hdr[5]), int64(hdr[6])
	for _, f := range []struct {
		name string
		v    int64
	}{{"dim", dim}, {"hidden_dim", hid}, {"n_layers", layers}, {"n_heads", heads}, {"n_kv_heads", kvHeads}, {"vocab_size", vocab}, {"seq_len", seq}} {
		if f.v <= 0 {
			return nil, fmt.Errorf("llama2.c: %s is %d", f.name, f.v)
		}
	}
	if dim%heads != 0 {
		return nil, fmt.Errorf("llama2.c: dim %d is not a multiple of %d heads", dim, heads)
	}
	hs := dim / heads
	kvDim := hs * kvHeads // ≤ 2^62: no overflow
	c := Config{
		Arch: "llama", HiddenSize: int(dim), IntermediateSize: int(hid), NumLayers: int(layers),
		NumHeads: int(heads), NumKVHeads: int(kvHeads), HeadDim: int(hs), VocabSize: int(vocab),
		MaxPositions: int(seq), RMSNormEps: 1e-5, RopeTheta: 10000, RopeStyle: RopeInterleaved,
		TiedEmbeddings: shared, BOS: []int{1}, DType: tensor.F32,
		// llama2.c's run.c ends generation at BOS (1), which separates
		// documents in its training data, as well as at EOS (2).
		EOS: []int{2, 1},
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("llama2.c: %w", err)
	}

	// Compute the expected file size with overflow checks before slicing.
	limit := int64(len(data))
	total := pos
	add := func(dims ...int64) bool {
		n, ok := elementsCap(dims, limit)
		if !ok {
			return false
		}
		if n, ok = mulCap(n, 4, limit); !ok {
			return false
		}
		total += n
		return total <= limit
	}
	sizes := [][]int64{
		{vocab, dim}, {layers, dim}, {layers, dim, dim}, {layers, kvDim, dim}, {layers, kvDim, dim},
		{layers, dim, dim}, {layers, dim}, {layers, hid, dim}, {layers, dim, hid}, {layers, hid, dim}, {dim},
	}
	if !v1 {
		sizes = append(sizes, []int64{seq, hs / 2}, []int64{seq, hs / 2})
	}
	if !shared {
		sizes = append(sizes, []int64{vocab, dim})
	}
	ok := true
	for _, s := range sizes {
		ok = ok && add(s...)
	}
	if !ok || total != limit {
		if ok {
			return nil, fmt.Errorf("llama2.c: header (dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, seq %d) implies %d bytes, file has %d", dim, hid, layers, heads, kvHeads, vocab, seq, total, limit)
		}
		return nil, fmt.Errorf("llama2.c: header (dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, seq %d) implies more than the file's %d bytes", dim, hid, layers, heads, kvHeads, vocab, seq, limit)
	}

	m := &Model{Format: "llama2c", Config: c, Tensors: map[string]*tensor.Tensor{}}
	// next slices the following count floats of the file.
	next := func(count int64) []byte {
		b := data[pos : pos+4*count : pos+4*count]
		pos += 4 * count
		return b
	}
	// perLayer slices L consecutive [shape] tensors named by suffix.
	perLayer := func(suffix string, shape ...int) {
		n := tensor.Shape(shape).Elements()
		for l := 0; l < c.NumLayers; l++ {
			name := LayerName(l, suffix)
			m.Tensors[name] = &tensor.Tensor{Name: name, DType: tensor.F32, Shape: tensor.Shape(shape), Data: next(n)}
		}
	}
	single := func(name string, shape ...int) {
		m.Tensors[name] = &tensor.Tensor{Name: name, DType: tensor.F32, Shape: tensor.Shape(shape), Data: next(tensor.Shape(shape).Elements())}
	}
	d, h, v, kv := c.HiddenSize, c.IntermediateSize, c.VocabSize, int(kvDim)
	if v1 {
		perLayer("input_layernorm.weight", d)
		perLayer("post_attention_layernorm.weight", d)
		single(NormName, d)
		single(EmbedName, v, d)
	} else {
		single(EmbedName, v, d)
		perLayer("input_layernorm.weight", d)
	}
	perLayer("self_attn.q_proj.weight", d, d)
	perLayer("self_attn.k_proj.weight", kv, d)
	perLayer("self_attn.v_proj.weight", kv, d)
	perLayer("self_attn.o_proj.weight", d, d)
	if !v1 {
		perLayer("post_attention_layernorm.weight", d)
	}
	perLayer("mlp.gate_proj.weight", h, d) // w1
	perLayer("mlp.down_proj.weight", d, h) // w2
	perLayer("mlp.up_proj.weight", h, d)   // w3
	if !v1 {
		single(NormName, d)
		next(2 * seq * (hs / 2)) // freq_cis_real, freq_cis_imag
	}
	if !shared {
		single(HeadName, v, d)
	}
	if err := checkTensors(&m.Config, m.Tensors); err != nil {
		return nil, fmt.Errorf("llama2.c: %w", err)
	}
	return m, nil
}
