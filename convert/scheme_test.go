package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// TestMediumKQuants writes 8-layer models as q4_k_m and q5_k_m and checks
// each matrix's dtype against llama-quantize's Q4_K_M and Q5_K_M choices:
// the output matrix (the embedding, when tied) in Q6_K, the value and down
// projections of layers 0, 3, 6 and 7 (use_more_bits of 8 layers) in
// Q6_K, the rest in Q4_K (Q5_K), and general.file_type 15 (17:
// LLAMA_FTYPE_MOSTLY_Q4_K_M, Q5_K_M).
func TestMediumKQuants(t *testing.T) {
	for _, c := range []struct {
		name     string
		base     tensor.DType
		fileType uint32
	}{{"Q4_K_M", tensor.Q4_K, 15}, {"q5_k_m", tensor.Q5_K, 17}} {
		for _, tied := range []bool{false, true} {
			mediumKQuant(t, c.name, c.base, c.fileType, tied)
		}
	}
}

// mediumKQuant writes one model in scheme and checks it (TestMediumKQuants).
func mediumKQuant(t *testing.T, scheme string, base tensor.DType, fileType uint32, tied bool) {
	c := model.Config{Arch: "llama", HiddenSize: 256, IntermediateSize: 512, NumLayers: 8, NumHeads: 4,
		NumKVHeads: 2, HeadDim: 64, VocabSize: 256, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000,
		TiedEmbeddings: tied}
	s, err := ParseScheme(scheme)
	if err != nil {
		t.Fatal(err)
	}
	path, rep := writeScheme(t, testmodel.Zeros(c), s)
	m, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if ft, _ := m.Metadata["general.file_type"].(uint32); ft != fileType {
		t.Errorf("%s: general.file_type = %v, want %d", scheme, m.Metadata["general.file_type"], fileType)
	}
	want := map[string]tensor.DType{"model.embed_tokens.weight": base}
	if tied {
		want["model.embed_tokens.weight"] = tensor.Q6_K
	} else {
		want["lm_head.weight"] = tensor.Q6_K
	}
	for i := 0; i < 8; i++ {
		more := base
		if i == 0 || i == 3 || i == 6 || i == 7 {
			more = tensor.Q6_K
		}
		p := fmt.Sprintf("model.layers.%d.", i)
		for _, n := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj"} {
			want[p+n+".weight"] = base
		}
		want[p+"self_attn.v_proj.weight"] = more
		want[p+"mlp.down_proj.weight"] = more
	}
	for name, d := range want {
		x := m.Tensors[name]
		if x == nil {
			t.Fatalf("%s, tied %v: no %s in the file", scheme, tied, name)
		}
		if x.DType != d {
			t.Errorf("%s, tied %v: %s stored as %v, want %v", scheme, tied, name, x.DType, d)
		}
	}
	if n := rep.Matrices[tensor.Q6_K]; n != 9 {
		t.Errorf("%s, tied %v: %d matrices in Q6_K, want 9", scheme, tied, n)
	}
}

// writeScheme writes m in scheme s to a GGUF file of the test's and returns
// its path and GGUF's report.
func writeScheme(t *testing.T, m *model.Model, s Scheme) (string, Report) {
	t.Helper()
	path := filepath.Join(t.TempDir(), s.Name+".gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := GGUF(f, m, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, rep
}

// TestParseScheme: names are case-insensitive, unknown ones are refused
// with the list, and Pure finds the plain schemes only.
func TestParseScheme(t *testing.T) {
	if s, err := ParseScheme("Q8_0"); err != nil || s.Base != tensor.Q8_0 {
		t.Errorf("ParseScheme(Q8_0) = %v, %v", s, err)
	}
	if _, err := ParseScheme("q3_k_s"); err == nil {
		t.Error("ParseScheme(q3_k_s) succeeded")
	}
	if s, err := Pure(tensor.Q4_K); err != nil || s.Name != "q4_k" {
		t.Errorf("Pure(Q4_K) = %v, %v", s, err)
	}
	if s, err := Pure(tensor.Q5_K); err != nil || s.Name != "q5_k" {
		t.Errorf("Pure(Q5_K) = %v, %v", s, err)
	}
	if _, err := Pure(tensor.Q3_K); err == nil {
		t.Error("Pure(Q3_K) succeeded")
	}
}

// TestInterleaveFP8: Interleave moves an FP8 matrix's per-row scales with
// its rows (and keeps a per-tensor one), so that its values are those of
// the interleaved values.
func TestInterleaveFP8(t *testing.T) {
	const rows, k, headDim = 8, 3, 4
	codes := make([]byte, rows*k)
	for i := range codes {
		codes[i] = byte(0x28 + i)
	}
	for _, scales := range [][]float32{{1, 2, 3, 4, 5, 6, 7, 8}, {0.5}} {
		w := &tensor.Tensor{Name: "q", DType: tensor.F8_E4M3, Shape: tensor.Shape{rows, k}, Data: codes, Scales: scales}
		vals, err := w.F32s()
		if err != nil {
			t.Fatal(err)
		}
		want, err := Interleave(tensor.FromF32("q", w.Shape, vals), headDim).F32s()
		if err != nil {
			t.Fatal(err)
		}
		got, err := Interleave(w, headDim).F32s()
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%d scales: element %d = %v, want %v", len(scales), i, got[i], want[i])
			}
		}
	}
}

// TestPhi3StackOneType: under the medium K-quant schemes a Phi-3 layer's
// q, k and v projections take one type (the v projection's, which gets
// more bits in some layers), so that their attn_qkv stack is one type;
// other architectures keep the rule as it is.
func TestPhi3StackOneType(t *testing.T) {
	s, err := ParseScheme("q4_k_m")
	if err != nil {
		t.Fatal(err)
	}
	const layers = 32
	bumped := 0
	for l := range layers {
		name := func(p string) string { return fmt.Sprintf("model.layers.%d.self_attn.%s_proj.weight", l, p) }
		v := s.dtype(dtypeName("phi3", name("v")), layers, false)
		for _, p := range []string{"q", "k"} {
			if got := s.dtype(dtypeName("phi3", name(p)), layers, false); got != v {
				t.Fatalf("layer %d: %s_proj %v, v_proj %v", l, p, got, v)
			}
		}
		if v != s.Base {
			bumped++
			if got := s.dtype(dtypeName("llama", name("q")), layers, false); got != s.Base {
				t.Fatalf("llama layer %d: q_proj %v", l, got)
			}
		}
	}
	if bumped == 0 {
		t.Fatal("no layer's v projection got more bits: the test checks nothing")
	}
}
