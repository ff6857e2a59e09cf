package convert

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// TestGGUFExperts: a mixture of experts (Mixtral's layout and routing,
// Qwen3-MoE's with q/k norms and the softmax over every expert, Qwen2-MoE's
// with q/k/v biases and a gated shared expert, OLMoE's with q and k
// normalized over all heads) written as
// GGUF (llama.cpp's stacked ffn_*_exps and ffn_gate_inp, the experts'
// metadata) loads back with the same config and matrices, and gives the
// same logits on the CPU as the model it was written from.
func TestGGUFExperts(t *testing.T) {
	for _, arch := range []string{"mixtral", "qwen3_moe", "qwen2_moe", "olmoe"} {
		t.Run(arch, func(t *testing.T) {
			c := model.Config{Arch: arch, HiddenSize: 64, IntermediateSize: 32, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
				VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, RopeStyle: model.RopeHalf,
				NumExperts: 4, ExpertsPerToken: 2, NormTopK: arch == "mixtral", QKNorm: arch == "qwen3_moe", BOS: []int{1}, EOS: []int{2}}
			if arch == "qwen2_moe" {
				c.QKVBias, c.SharedExpertSize, c.SharedExpertGate = true, 48, true
			}
			if arch == "olmoe" {
				c.QKNormWhole = true
			}
			m := randomModel(c, uint64(len(arch)))
			g := ggufRoundTrip(t, m)
			gc := g.Config
			if gc.Arch != arch || gc.NumExperts != 4 || gc.ExpertsPerToken != 2 || gc.NormTopK != c.NormTopK || gc.QKNorm != c.QKNorm || gc.IntermediateSize != 32 ||
				gc.SharedExpertSize != c.SharedExpertSize || gc.SharedExpertGate != c.SharedExpertGate || gc.QKVBias != c.QKVBias ||
				gc.QKNormWhole != c.QKNormWhole {
				t.Fatalf("config read back %+v", gc)
			}
			gate, _, down := c.MoEExpert(1, 3)
			names := []string{gate, down, c.MoERouter(0)}
			if c.SharedExpertSize > 0 {
				sg, _, sd := c.MoEShared(1)
				names = append(names, sg, sd, c.MoESharedGate(0))
			}
			for _, name := range names {
				want, _ := m.Tensors[name].F32s()
				got, err := g.Tensors[name].F32s()
				if err != nil || (arch != "mixtral" && !slices.Equal(got, want)) {
					t.Fatalf("%s read back: %v", name, err)
				}
			}
			sameLogits(t, m, g)
		})
	}
}

// TestGGUFLongRope: a Phi-3 of longrope scaling written as GGUF (llama.cpp's
// rope_factors_short/long tensors, the original context and attention
// factor) loads back with the same scaling and gives the same logits on the
// CPU, over a prompt that runs past the original context (both factors).
func TestGGUFLongRope(t *testing.T) {
	c := model.Config{Arch: "phi3", HiddenSize: 64, IntermediateSize: 32, NumLayers: 2, NumHeads: 4, NumKVHeads: 4, HeadDim: 16,
		VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, RopeStyle: model.RopeHalf, BOS: []int{1}, EOS: []int{2},
		RopeScaling: model.RopeScaling{Type: "longrope", OriginalMaxPositions: 8, AttentionFactor: 1.19,
			ShortFactor: []float32{1, 1.1, 1.2, 1.3, 1.5, 2, 3, 4}, LongFactor: []float32{2, 3, 4, 5, 6, 7, 8, 9}}}
	m := randomModel(c, 3)
	g := ggufRoundTrip(t, m)
	if !reflect.DeepEqual(g.Config.RopeScaling, c.RopeScaling) {
		t.Fatalf("rope scaling read back %+v, want %+v", g.Config.RopeScaling, c.RopeScaling)
	}
	sameLogits(t, m, g)
}

// randomModel is a model of c with weights from seed (norm weights around 1).
func randomModel(c model.Config, seed uint64) *model.Model {
	m := testmodel.Zeros(c)
	rng := rand.New(rand.NewPCG(7, seed))
	for name, tt := range m.Tensors {
		v := make([]float32, tt.Shape.Elements())
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.2)
			if len(tt.Shape) == 1 {
				v[i] += 1
			}
		}
		m.Tensors[name] = tensor.FromF32(name, tt.Shape, v)
	}
	return m
}

// ggufRoundTrip writes m as an f32 GGUF file and loads it back (closed when
// the test ends).
func ggufRoundTrip(t *testing.T, m *model.Model) *model.Model {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScheme("f32")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GGUF(f, m, s, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// sameLogits requires a and b to give the same logits (within 1e-4) at every
// position of a 12-token prompt on the CPU.
func sameLogits(t *testing.T, a, b *model.Model) {
	t.Helper()
	run := func(m *model.Model) []float32 {
		e, err := engine.New(m, &cpu.Backend{}, engine.Options{MaxSeqs: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		l, err := e.Step([]engine.Item{{Seq: e.NewSequence(), Tokens: []int{1, 5, 9, 33, 60, 7, 11, 13, 17, 19, 23, 29}, AllRows: true}})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}
	want, got := run(a), run(b)
	for i := range want {
		if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
			t.Fatalf("logit %d: %g from the GGUF file, %g from the model", i, got[i], want[i])
		}
	}
}

// TestGGUFGemma: Gemma 2 and 3 written as GGUF (llama.cpp's gemma2/gemma3
// names, the sandwich norms' names, norms stored as 1+w, the soft caps, the
// window and pattern, kiln's query scale and local RoPE base) load back as
// the same model: the same logits on the CPU over a prompt past the
// windows.
func TestGGUFGemma(t *testing.T) {
	for _, arch := range []string{"gemma2", "gemma3"} {
		t.Run(arch, func(t *testing.T) {
			c := model.Config{Arch: arch, HiddenSize: 64, IntermediateSize: 32, NumLayers: 4, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
				VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-6, RopeTheta: 10000, RopeStyle: model.RopeHalf, BOS: []int{1}, EOS: []int{2},
				TiedEmbeddings: true, EmbedScale: 8, NormOffset: 1, PostNorms: true, GELU: true, QueryScale: 0.2}
			if arch == "gemma2" {
				c.AttnSoftCap, c.FinalSoftCap, c.LayerWindows = 3, 5, []int{5, 0, 5, 0}
			} else {
				c.QKNorm, c.LayerWindows, c.RopeLocalTheta, c.RopeTheta = true, []int{5, 5, 0, 5}, 777, 1e6
				c.RopeScaling = model.RopeScaling{Type: "linear", Factor: 2}
			}
			m := randomModel(c, 9)
			g := ggufRoundTrip(t, m)
			gc := g.Config
			if gc.NormOffset != 0 || !gc.PostNorms || !gc.GELU || gc.EmbedScale != 8 || !slices.Equal(gc.LayerWindows, c.LayerWindows) ||
				gc.AttnSoftCap != c.AttnSoftCap || gc.FinalSoftCap != c.FinalSoftCap || gc.QKNorm != c.QKNorm || gc.RopeLocalTheta != c.RopeLocalTheta ||
				math.Abs(gc.QueryScale-0.2) > 1e-6 {
				t.Fatalf("config read back %+v", gc)
			}
			sameLogits(t, m, g)
		})
	}
	c := model.Config{Arch: "gemma2", NumLayers: 3, LayerWindows: []int{0, 4, 4}}
	if err := model.GemmaLayout(&c); err == nil {
		t.Errorf("windows %v accepted for GGUF", c.LayerWindows)
	}
}

// TestGGUFPhi3OriginalContext: llama.cpp writes phi3's original context for
// every file and longrope's factors only for long-context models: a file
// with the one and not the others loads without longrope (the same logits
// as its source).
func TestGGUFPhi3OriginalContext(t *testing.T) {
	c := model.Config{Arch: "phi3", HiddenSize: 64, IntermediateSize: 32, NumLayers: 2, NumHeads: 4, NumKVHeads: 4, HeadDim: 16,
		VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, RopeStyle: model.RopeHalf, BOS: []int{1}, EOS: []int{2}}
	m := randomModel(c, 4)
	md := append(model.GGUFMetadata(&m.Config), model.KV{Key: "phi3.rope.scaling.original_context_length", Value: uint32(32)})
	var ts []*tensor.Tensor
	for _, name := range m.Names() {
		ts = append(ts, m.Tensors[name])
	}
	ts, err := fusePhi3(ts, c.NumLayers)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "phi3.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.WriteGGUF(f, md, ts); err != nil {
		t.Fatal(err)
	}
	f.Close()
	g, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Config.RopeScaling.Type != "" {
		t.Fatalf("rope scaling %+v from the original context alone", g.Config.RopeScaling)
	}
	sameLogits(t, m, g)
}
