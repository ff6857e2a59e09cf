package model

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"kiln/tensor"
)

// ggufFixture builds a GGUF file for c with tensors of dtype dt, returning
// the bytes and the tensors as they should load (quantized ones dequantized).
func ggufFixture(t testing.TB, c *Config, dt tensor.DType, extra []KV, extraTensors ...*tensor.Tensor) ([]byte, []*tensor.Tensor) {
	t.Helper()
	ts := randTensors(c, dt, 3)
	md := append(GGUFMetadata(c), extra...)
	return ggufBytes(t, md, append(ts, extraTensors...)), ts // quantized tensors are kept as they are
}

func TestGGUFRoundTrip(t *testing.T) {
	freqs := []float32{1, 1, 2, 4, 8, 8, 8, 8}
	tests := []struct {
		name   string
		arch   string
		dt     tensor.DType
		tied   bool
		edit   func(c *Config)
		extra  []KV
		extraT []*tensor.Tensor
	}{
		{name: "llama f32", arch: "llama", dt: tensor.F32},
		{name: "llama f16 tied", arch: "llama", dt: tensor.F16, tied: true},
		{name: "llama bf16", arch: "llama", dt: tensor.BF16},
		{name: "llama q8_0", arch: "llama", dt: tensor.Q8_0},
		{name: "llama q4_0 tied", arch: "llama", dt: tensor.Q4_0, tied: true},
		{name: "qwen2 f32", arch: "qwen2", dt: tensor.F32, tied: true},
		{name: "qwen2 q8_0", arch: "qwen2", dt: tensor.Q8_0},
		{name: "mistral sliding linear", arch: "mistral", dt: tensor.F16, edit: func(c *Config) {
			c.SlidingWindow = 4096
			c.RopeScaling = RopeScaling{Type: "linear", Factor: 4}
		}},
		{name: "llama3 rope_freqs", arch: "llama", dt: tensor.F32, edit: func(c *Config) { c.RopeTheta = 500000; c.RopeFreqFactors = freqs },
			extraT: []*tensor.Tensor{tensor.FromF32("rope_freqs.weight", tensor.Shape{8}, freqs)}},
		{name: "alignment 64", arch: "llama", dt: tensor.F32, extra: []KV{{"general.alignment", uint32(64)}}},
		{name: "explicit head dim", arch: "llama", dt: tensor.F32, edit: func(c *Config) { c.HeadDim = 32 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig(tc.arch)
			c.TiedEmbeddings = tc.tied
			c.DType = tc.dt
			if tc.edit != nil {
				tc.edit(&c)
			}
			data, want := ggufFixture(t, &c, tc.dt, append(tc.extra, KV{"tokenizer.chat_template", "{{ x }}"}), tc.extraT...)
			path := filepath.Join(t.TempDir(), "m.gguf")
			writeFile(t, path, data)
			m, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			wantCfg := c
			if wantCfg.Arch == "mistral" {
				wantCfg.Arch = "llama"
			}
			wantCfg.RopeStyle = RopeHalf
			if wantCfg.Arch == "llama" {
				wantCfg.RopeStyle = RopeInterleaved
			}
			if !configEqual(m.Config, wantCfg) {
				t.Errorf("config\n got %+v\nwant %+v", m.Config, wantCfg)
			}
			if m.Format != "gguf" || m.ChatTemplate != "{{ x }}" || m.Metadata["general.architecture"] != wantCfg.Arch {
				t.Errorf("format %q template %q metadata %v", m.Format, m.ChatTemplate, m.Metadata)
			}
			sameTensors(t, m.Tensors, want)
		})
	}
}

func TestGGUFQuantizedValues(t *testing.T) {
	// Dequantized values are close to the originals.
	vals := make([]float32, 64)
	for i := range vals {
		vals[i] = float32(i-32) / 8
	}
	for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_0} {
		q := encodeTensor("x", tensor.Shape{2, 32}, dt, vals)
		f, err := parseGGUF(ggufBytes(t, nil, []*tensor.Tensor{q}))
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.tensors["x"].F32s()
		if err != nil {
			t.Fatal(err)
		}
		tol := float32(0.02)
		if dt == tensor.Q4_0 {
			tol = 0.3
		}
		for i := range vals {
			if d := got[i] - vals[i]; d > tol || d < -tol {
				t.Fatalf("%v: element %d = %g, want %g", dt, i, got[i], vals[i])
			}
		}
	}
}

func TestGGUFMetadataTypes(t *testing.T) {
	md := []KV{
		{"u8", uint8(200)}, {"i8", int8(-5)}, {"u16", uint16(60000)}, {"i16", int16(-300)},
		{"u32", uint32(4e9)}, {"i32", int32(-7)}, {"f32", float32(0.5)}, {"b", true},
		{"s", "héllo"}, {"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", 2.25},
		{"au8", []uint8{1, 2}}, {"ai8", []int8{-1}}, {"au16", []uint16{9}}, {"ai16", []int16{-9}},
		{"au32", []uint32{1, 2, 3}}, {"ai32", []int32{-1, 5}}, {"af32", []float32{0.25, -1}},
		{"ab", []bool{true, false}}, {"as", []string{"a", "", "ccc"}}, {"au64", []uint64{1}},
		{"ai64", []int64{-2}}, {"af64", []float64{1.5}}, {"empty", []string{}},
	}
	data := ggufBytes(t, md, nil)
	for _, version := range []uint32{3, 2} {
		binary.LittleEndian.PutUint32(data[4:], version)
		f, err := parseGGUF(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range md {
			if got := f.metadata[kv.Key]; !reflect.DeepEqual(got, kv.Value) {
				t.Errorf("v%d %s = %#v, want %#v", version, kv.Key, got, kv.Value)
			}
		}
		if len(f.kvKeys) != len(md) {
			t.Errorf("%d keys", len(f.kvKeys))
		}
	}
}

// patchTensorType rewrites the ggml type of the named tensor info.
func patchTensorType(t testing.TB, data []byte, name string, typ uint32) []byte {
	t.Helper()
	data = bytes.Clone(data)
	key := append(binary.LittleEndian.AppendUint64(nil, uint64(len(name))), name...)
	i := bytes.Index(data, key)
	if i < 0 {
		t.Fatalf("tensor %s not found", name)
	}
	p := i + len(key)
	nd := int(binary.LittleEndian.Uint32(data[p:]))
	binary.LittleEndian.PutUint32(data[p+4+8*nd:], typ)
	return data
}

func TestGGUFErrors(t *testing.T) {
	c := tinyConfig("llama")
	good, _ := ggufFixture(t, &c, tensor.F32, nil)
	withMD := func(edit func(md []KV) []KV) []byte {
		md := edit(GGUFMetadata(&c))
		return ggufBytes(t, md, randTensors(&c, tensor.F32, 3))
	}
	setKV := func(key string, v any) []byte {
		return withMD(func(md []KV) []KV {
			for i := range md {
				if md[i].Key == key {
					md[i].Value = v
					return md
				}
			}
			return append(md, KV{key, v})
		})
	}
	dropKV := func(key string) []byte {
		return withMD(func(md []KV) []KV {
			var out []KV
			for _, kv := range md {
				if kv.Key != key {
					out = append(out, kv)
				}
			}
			return out
		})
	}
	set32 := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	set64 := func(off int, v uint64) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	q0 := "blk.0.attn_q.weight"
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "bad magic"},
		{"wrong magic", append([]byte("GGUX"), good[4:]...), "bad magic"},
		{"version 1", set32(4, 1), "unsupported gguf version 1"},
		{"big-endian", set32(4, 3<<24), "big-endian"},
		{"huge tensor count", set64(8, 1<<60), "cannot fit"},
		{"huge kv count", set64(16, 1<<60), "cannot fit"},
		{"truncated data", good[:len(good)-100], "run past"},
		{"unsupported arch", setKV("general.architecture", "gptneox"), `unsupported architecture "gptneox" (supported: llama, qwen2, qwen3, qwen3moe, qwen2moe, olmoe, phi3, gemma, gemma2, gemma3)`},
		{"no arch", dropKV("general.architecture"), "general.architecture"},
		{"unsupported rope scaling", setKV("llama.rope.scaling.type", "yarn"), `unsupported rope scaling type "yarn"`},
		{"partial rotary", setKV("llama.rope.dimension_count", uint32(8)), "partial rotary"},
		{"missing block count", dropKV("llama.block_count"), "missing metadata llama.block_count"},
		{"string block count", setKV("llama.block_count", "two"), "want an integer"},
		{"huge block count", setKV("llama.block_count", uint32(1<<30)), "layers"},
		{"bad alignment", func() []byte {
			b := setKV("general.alignment", uint32(4))
			key := []byte("general.alignment")
			i := bytes.Index(b, key) + len(key) + 4
			binary.LittleEndian.PutUint32(b[i:], 3)
			return b
		}(), "alignment"},
		{"q4_k rows", patchTensorType(t, good, q0, 12), "tensor " + q0 + ": rows of 64 are not whole q4_k blocks of 256"},
		{"iq2_xxs", patchTensorType(t, good, q0, 16), "unsupported tensor type IQ2_XXS for tensor " + q0},
		{"unknown type", patchTensorType(t, good, q0, 99), "unsupported tensor type type 99 for tensor " + q0},
		{"wrong vocab", setKV("llama.vocab_size", uint32(41)), "tensor model.embed_tokens.weight has shape [40,64], want [41,64]"},
		{"wrong kv heads", setKV("llama.attention.head_count_kv", uint32(4)), "self_attn.k_proj.weight has shape"},
		{"missing tensor", ggufBytes(t, GGUFMetadata(&c), randTensors(&c, tensor.F32, 3)[1:]), "missing tensor model.embed_tokens.weight"},
		{"duplicate tensor", ggufBytes(t, nil, []*tensor.Tensor{tensor.FromF32("a", tensor.Shape{1}, []float32{1}), tensor.FromF32("a", tensor.Shape{1}, []float32{1})}), "duplicate tensor a"},
		{"duplicate key", ggufBytes(t, []KV{{"k", uint8(1)}, {"k", uint8(2)}}, nil), "duplicate metadata key k"},
		{"olmoe clip_qkv", func() []byte {
			oc := c
			oc.Arch, oc.NumExperts, oc.ExpertsPerToken, oc.QKNormWhole = "olmoe", 2, 1, true
			md := append(GGUFMetadata(&oc), KV{"olmoe.attention.clamp_kqv", float32(8)})
			return ggufBytes(t, md, randTensors(&c, tensor.F32, 3))
		}(), "olmoe.attention.clamp_kqv (OLMoE's clip_qkv) is not supported"},
		{"bad rope_freqs", ggufBytes(t, GGUFMetadata(&c), append(randTensors(&c, tensor.F32, 3), tensor.FromF32("rope_freqs.weight", tensor.Shape{3}, []float32{1, 2, 3}))), "rope_freqs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ggufModel(tc.data)
			if err == nil {
				t.Fatalf("no error: %+v", m.Config)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// TestGGUFHandBuilt covers structural corruption the writer cannot produce.
func TestGGUFHandBuilt(t *testing.T) {
	le := binary.LittleEndian
	hdr := func(nt, nkv uint64) []byte {
		b := append([]byte("GGUF"), le.AppendUint32(nil, 3)...)
		return le.AppendUint64(le.AppendUint64(b, nt), nkv)
	}
	str := func(b []byte, s string) []byte { return append(le.AppendUint64(b, uint64(len(s))), s...) }
	pad := func(b []byte, n int) []byte { return append(b, make([]byte, n)...) }
	info := func(b []byte, name string, ne []uint64, typ uint32, off uint64) []byte {
		b = le.AppendUint32(str(b, name), uint32(len(ne)))
		for _, d := range ne {
			b = le.AppendUint64(b, d)
		}
		return le.AppendUint64(le.AppendUint32(b, typ), off)
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"huge key length", pad(le.AppendUint64(hdr(0, 1), 1<<62), 32), "truncated"},
		{"unknown value type", pad(le.AppendUint32(str(hdr(0, 1), "k"), 13), 8), "unknown value type 13"},
		{"huge array", pad(le.AppendUint64(le.AppendUint32(le.AppendUint32(str(hdr(0, 1), "k"), ggufArray), ggufUint32), 1<<40), 32), "does not fit"},
		{"huge string array", pad(le.AppendUint64(le.AppendUint32(le.AppendUint32(str(hdr(0, 1), "k"), ggufArray), ggufString), 1<<20), 64), "does not fit"},
		{"bad array element type", pad(le.AppendUint64(le.AppendUint32(le.AppendUint32(str(hdr(0, 1), "k"), ggufArray), 77), 1), 32), "unknown array element type"},
		{"deep arrays", pad(func() []byte {
			b := le.AppendUint32(str(hdr(0, 1), "k"), ggufArray)
			for i := 0; i < 5; i++ {
				b = le.AppendUint64(le.AppendUint32(b, ggufArray), 1)
			}
			return b
		}(), 64), "nested too deeply"},
		{"bad bool", pad(append(le.AppendUint32(str(hdr(0, 1), "k"), ggufBool), 2), 32), "bool value 2"},
		{"too many dims", pad(info(hdr(1, 0), "t", []uint64{1, 1, 1, 1, 1}, 0, 0), 64), "dimensions"},
		{"huge dim", pad(info(hdr(1, 0), "t", []uint64{1 << 40}, 0, 0), 64), "out of range"},
		{"overflowing shape", pad(info(hdr(1, 0), "t", []uint64{1 << 30, 1 << 30, 1 << 30, 1 << 30}, 0, 0), 64), "larger than the file"},
		{"misaligned offset", pad(info(hdr(1, 0), "t", []uint64{1}, 0, 4), 64), "not a multiple of the alignment"},
		{"offset past end", pad(info(hdr(1, 0), "t", []uint64{1}, 0, 1<<40), 64), "run past"},
		{"overlap", pad(info(info(hdr(2, 0), "a", []uint64{16}, 0, 0), "b", []uint64{16}, 0, 32), 128), "overlap"},
		{"quantized rows", pad(info(hdr(1, 0), "t", []uint64{16, 2}, uint32(ggmlQ8_0), 0), 128), "whole q8_0 blocks"},
		{"data section past end", info(hdr(1, 0), "t", []uint64{0}, 0, 0), "past the end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseGGUF(tc.data)
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

// TestGGUFEveryTruncation checks that every prefix of a valid file fails
// cleanly.
func TestGGUFEveryTruncation(t *testing.T) {
	c := tinyConfig("qwen2")
	c.NumLayers, c.HiddenSize, c.IntermediateSize, c.HeadDim, c.VocabSize = 1, 32, 32, 8, 4
	data, _ := ggufFixture(t, &c, tensor.Q8_0, []KV{{"tokenizer.ggml.tokens", []string{"a", "b", "c", "d"}}})
	if _, err := ggufModel(data); err != nil {
		t.Fatal(err)
	}
	// Only the trailing padding after the last tensor may be cut.
	for n := 0; n < len(data)-31; n++ {
		if _, err := ggufModel(data[:n]); err == nil {
			t.Fatalf("prefix of %d of %d bytes loaded", n, len(data))
		}
	}
}

func FuzzGGUF(f *testing.F) {
	c := tinyConfig("llama")
	c.NumLayers, c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumHeads, c.NumKVHeads, c.VocabSize = 1, 32, 32, 8, 4, 2, 4
	small, _ := ggufFixture(f, &c, tensor.F16, []KV{{"tokenizer.ggml.tokens", []string{"a", "b", "c", "d"}}, {"x", []int32{1, 2}}})
	f.Add(small)
	qc := c
	qc.Arch, qc.QKVBias, qc.TiedEmbeddings = "qwen2", true, true
	q, _ := ggufFixture(f, &qc, tensor.Q4_0, nil)
	f.Add(q)
	f.Add(ggufBytes(f, []KV{{"general.alignment", uint32(8)}}, []*tensor.Tensor{tensor.FromF32("t", tensor.Shape{2}, []float32{1, 2})}))
	// Blocks of the k-quants and of 32 (zeros: the parser, not the values).
	var blocks []*tensor.Tensor
	for _, dt := range []tensor.DType{tensor.Q4_K, tensor.Q6_K, tensor.Q5_1} {
		n, _ := dt.Bytes(256)
		blocks = append(blocks, &tensor.Tensor{Name: "t" + dt.String(), DType: dt, Shape: tensor.Shape{256}, Data: make([]byte, n)})
	}
	f.Add(ggufBytes(f, nil, blocks))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ggufModel(data)
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

// TestGGUFBlockTypes reads a tensor of every GGML block type the loader
// takes, from its ggml type id (random bytes: whatever they hold, the
// tensor read must be the same blocks, and decode as tensor.ToF32 decodes
// them, NaNs included; TestGGMLDequantize checks that against ggml).
func TestGGUFBlockTypes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for g, dt := range ggmlToDType {
		if !dt.Quantized() {
			continue
		}
		if dtypeToGGML[dt] != g {
			t.Errorf("%v is written as ggml type %d, read from %d", dt, dtypeToGGML[dt], g)
		}
		shape := tensor.Shape{3, 2 * 256}
		size, err := dt.Bytes(shape.Elements())
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		raw := &tensor.Tensor{Name: "x", DType: dt, Shape: shape, Data: data}
		f, err := parseGGUF(ggufBytes(t, nil, []*tensor.Tensor{raw}))
		if err != nil {
			t.Fatalf("%v (ggml type %d): %v", dt, g, err)
		}
		got := f.tensors["x"]
		if got.DType != dt || !slices.Equal(got.Shape, shape) || !bytes.Equal(got.Data, data) {
			t.Fatalf("%v: read back as %v %v", dt, got.DType, got.Shape)
		}
		want, err := raw.F32s()
		if err != nil {
			t.Fatal(err)
		}
		vals, err := got.F32s()
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(vals[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%v: element %d = %g, want %g", dt, i, vals[i], want[i])
			}
		}
	}
}
