package model

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"kiln/internal/testshared"
	"kiln/tensor"
)

func TestLlama2CStories260K(t *testing.T) {
	legacy := testshared.Path(t, "models", "stories260K", "stories260K.bin")
	v1 := testshared.Path(t, "models", "stories260K", "stories260K_v1.bin")
	a, err := Load(legacy)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := LoadLlama2C(v1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want := Config{
		Arch: "llama", HiddenSize: 64, IntermediateSize: 172, NumLayers: 5, NumHeads: 8, NumKVHeads: 4,
		HeadDim: 8, VocabSize: 512, MaxPositions: 512, RMSNormEps: 1e-5, RopeTheta: 10000,
		RopeStyle: RopeInterleaved, TiedEmbeddings: true, BOS: []int{1}, EOS: []int{2, 1}, DType: tensor.F32,
	}
	for _, m := range []*Model{a, b} {
		if !configEqual(m.Config, want) {
			t.Errorf("%s: config %+v, want %+v", m.Path, m.Config, want)
		}
		if m.Format != "llama2c" {
			t.Errorf("format %q", m.Format)
		}
	}
	// 260,032 weight floats per SOURCE.md.
	if n := a.ParamCount(); n != 260032 {
		t.Errorf("param count %d, want 260032", n)
	}
	if len(a.Tensors) != 2+9*5 {
		t.Errorf("%d tensors", len(a.Tensors))
	}
	for name, ta := range a.Tensors {
		tb := b.Tensors[name]
		if tb == nil || !bytes.Equal(ta.Data, tb.Data) || !ta.Shape.Equal(tb.Shape) {
			t.Errorf("tensor %s differs between legacy and v1", name)
		}
	}
	if _, ok := a.Tensors[HeadName]; ok {
		t.Error("shared classifier produced lm_head")
	}
	// Tensors are views of one mapping: in the legacy layout the first
	// layer's attention norm starts where the embedding table ends.
	emb, norm := a.Tensors[EmbedName].Data, a.Tensors[LayerName(0, "input_layernorm.weight")].Data
	if uintptr(unsafe.Pointer(unsafe.SliceData(emb)))+uintptr(len(emb)) != uintptr(unsafe.Pointer(unsafe.SliceData(norm))) {
		t.Error("tensors are not contiguous views of the file")
	}
}

func configEqual(a, b Config) bool {
	for _, c := range []*Config{&a, &b} {
		if len(c.BOS) == 0 {
			c.BOS = nil
		}
		if len(c.EOS) == 0 {
			c.EOS = nil
		}
		if len(c.RopeFreqFactors) == 0 {
			c.RopeFreqFactors = nil
		}
	}
	return reflect.DeepEqual(a, b)
}

// llama2cBytes writes the tensors of c (canonical names) as a llama2.c
// checkpoint. legacy files get zero freq_cis tables.
func llama2cBytes(c *Config, ts map[string]*tensor.Tensor, v1 bool) []byte {
	var buf bytes.Buffer
	le := binary.LittleEndian
	vocab := int32(c.VocabSize)
	if !c.TiedEmbeddings && !v1 {
		vocab = -vocab
	}
	hdr := []int32{int32(c.HiddenSize), int32(c.IntermediateSize), int32(c.NumLayers), int32(c.NumHeads), int32(c.NumKVHeads), vocab, int32(c.MaxPositions)}
	if v1 {
		binary.Write(&buf, le, uint32(llama2cMagic))
		binary.Write(&buf, le, int32(1))
		binary.Write(&buf, le, hdr)
		shared := byte(0)
		if c.TiedEmbeddings {
			shared = 1
		}
		buf.WriteByte(shared)
		buf.Write(make([]byte, 256-buf.Len()))
	} else {
		binary.Write(&buf, le, hdr)
	}
	layers := func(suffix string) {
		for l := 0; l < c.NumLayers; l++ {
			buf.Write(ts[LayerName(l, suffix)].Data)
		}
	}
	if v1 {
		layers("input_layernorm.weight")
		layers("post_attention_layernorm.weight")
		buf.Write(ts[NormName].Data)
		buf.Write(ts[EmbedName].Data)
	} else {
		buf.Write(ts[EmbedName].Data)
		layers("input_layernorm.weight")
	}
	for _, s := range []string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"} {
		layers(s)
	}
	if !v1 {
		layers("post_attention_layernorm.weight")
	}
	layers("mlp.gate_proj.weight")
	layers("mlp.down_proj.weight")
	layers("mlp.up_proj.weight")
	if !v1 {
		buf.Write(ts[NormName].Data)
		buf.Write(make([]byte, 4*c.MaxPositions*c.HeadDim)) // freq_cis real+imag
	}
	if !c.TiedEmbeddings {
		buf.Write(ts[HeadName].Data)
	}
	return buf.Bytes()
}

func tinyLlama2C(tied bool) (Config, []*tensor.Tensor) {
	c := tinyConfig("llama")
	c.HiddenSize, c.IntermediateSize, c.NumHeads, c.NumKVHeads, c.HeadDim = 8, 12, 2, 1, 4
	c.VocabSize, c.MaxPositions, c.NumLayers = 6, 4, 1
	c.RopeStyle = RopeInterleaved
	c.TiedEmbeddings = tied
	c.EOS = []int{2, 1}
	return c, randTensors(&c, tensor.F32, 7)
}

func byName(ts []*tensor.Tensor) map[string]*tensor.Tensor {
	m := map[string]*tensor.Tensor{}
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

func TestLlama2CSynthetic(t *testing.T) {
	for _, tied := range []bool{true, false} {
		for _, v1 := range []bool{false, true} {
			c, ts := tinyLlama2C(tied)
			data := llama2cBytes(&c, byName(ts), v1)
			path := filepath.Join(t.TempDir(), "m.bin")
			writeFile(t, path, data)
			m, err := Load(path)
			if err != nil {
				t.Fatalf("tied=%v v1=%v: %v", tied, v1, err)
			}
			if !configEqual(m.Config, c) {
				t.Errorf("tied=%v v1=%v: config %+v, want %+v", tied, v1, m.Config, c)
			}
			sameTensors(t, m.Tensors, ts)
			if err := m.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

func TestLlama2CMalformed(t *testing.T) {
	c, ts := tinyLlama2C(true)
	legacy := llama2cBytes(&c, byName(ts), false)
	v1 := llama2cBytes(&c, byName(ts), true)
	set := func(b []byte, off int, v int32) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[off:], uint32(v))
		return b
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"short legacy", legacy[:20], "shorter than"},
		{"truncated legacy", legacy[:len(legacy)-4], "implies"},
		{"trailing legacy", append(bytes.Clone(legacy), 0, 0, 0, 0), "implies"},
		{"zero dim", set(legacy, 0, 0), "dim is 0"},
		{"negative layers", set(legacy, 8, -3), "n_layers is -3"},
		{"huge dim", set(legacy, 0, 1<<30), "heads"},
		{"huge layers", set(legacy, 8, 1<<30), "implies more"},
		{"huge vocab", set(legacy, 20, 1<<31-1), "implies more"},
		{"min vocab", set(legacy, 20, -1<<31), "out of range"},
		{"heads not dividing dim", set(legacy, 12, 3), "multiple"},
		{"kv heads not dividing heads", set(legacy, 16, 3), ""},
		{"short v1", v1[:100], "shorter than"},
		{"truncated v1", v1[:len(v1)-1], "implies"},
		{"v1 version 2", set(v1, 4, 2), "unsupported llama2.c version 2"},
		{"v1 bad shared byte", func() []byte { b := bytes.Clone(v1); b[36] = 7; return b }(), "shared_classifier"},
		{"v1 unshared but no wcls", func() []byte { b := bytes.Clone(v1); b[36] = 0; return b }(), "implies"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := llama2cModel(tc.data)
			if err == nil {
				t.Fatalf("no error; config %+v", m.Config)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func FuzzLlama2C(f *testing.F) {
	for _, tied := range []bool{true, false} {
		for _, v1 := range []bool{false, true} {
			c, ts := tinyLlama2C(tied)
			f.Add(llama2cBytes(&c, byName(ts), v1))
		}
	}
	f.Add([]byte("ak42"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := llama2cModel(data)
		if err != nil {
			return
		}
		for _, tt := range m.Tensors {
			if err := tt.Validate(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
