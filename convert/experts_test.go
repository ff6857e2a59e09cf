package convert

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// TestGGUFExperts: a mixture of experts (Mixtral's layout and routing, and
// Qwen3-MoE's with q/k norms and the softmax over every expert) written as
// GGUF (llama.cpp's stacked ffn_*_exps and ffn_gate_inp, the experts'
// metadata) loads back with the same config and matrices, and gives the
// same logits on the CPU as the model it was written from.
func TestGGUFExperts(t *testing.T) {
	for _, arch := range []string{"mixtral", "qwen3_moe"} {
		t.Run(arch, func(t *testing.T) {
			c := model.Config{Arch: arch, HiddenSize: 64, IntermediateSize: 32, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
				VocabSize: 96, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, RopeStyle: model.RopeHalf,
				NumExperts: 4, ExpertsPerToken: 2, NormTopK: arch == "mixtral", QKNorm: arch == "qwen3_moe", BOS: []int{1}, EOS: []int{2}}
			m := testmodel.Zeros(c)
			rng := rand.New(rand.NewPCG(7, uint64(len(arch))))
			for name, tt := range m.Tensors {
				v := make([]float32, tt.Shape.Elements())
				for i := range v {
					v[i] = float32(rng.NormFloat64() * 0.2)
					if len(tt.Shape) == 1 {
						v[i] += 1 // norm weights around 1
					}
				}
				m.Tensors[name] = tensor.FromF32(name, tt.Shape, v)
			}
			path := filepath.Join(t.TempDir(), "moe.gguf")
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
			defer g.Close()
			gc := g.Config
			if gc.Arch != arch || gc.NumExperts != 4 || gc.ExpertsPerToken != 2 || gc.NormTopK != c.NormTopK || gc.QKNorm != c.QKNorm || gc.IntermediateSize != 32 {
				t.Fatalf("config read back %+v", gc)
			}
			gate, _, down := c.MoEExpert(1, 3)
			for _, name := range []string{gate, down, c.MoERouter(0)} {
				want, _ := m.Tensors[name].F32s()
				got, err := g.Tensors[name].F32s()
				if err != nil || (arch == "qwen3_moe" && !slices.Equal(got, want)) {
					t.Fatalf("%s read back: %v", name, err)
				}
			}
			run := func(m *model.Model) []float32 {
				e, err := engine.New(m, &cpu.Backend{}, engine.Options{MaxSeqs: 1})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				l, err := e.Step([]engine.Item{{Seq: e.NewSequence(), Tokens: []int{1, 5, 9, 33, 60, 7}}})
				if err != nil {
					t.Fatal(err)
				}
				return slices.Clone(l)
			}
			want, got := run(m), run(g)
			for i := range want {
				if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
					t.Fatalf("logit %d: %g from the GGUF file, %g from the model", i, got[i], want[i])
				}
			}
		})
	}
}
