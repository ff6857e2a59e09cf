package engine_test

import (
	"slices"
	"strings"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/hffixture"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// cpuGroup is a tensor-parallel group of n CPU backends in this process.
func cpuGroup(n int, reference bool) *backend.Group {
	return cpu.NewGroup(n, cpu.Backend{Threads: n, Reference: reference})
}

// TestTensorParallelFixtures: the transformers fixtures sharded over 2 and 4
// CPU ranks (a fake communicator in one process: cpu.LocalGroup) give
// transformers' logits within 1e-4 at every prompt position, and the same
// greedy ids, as one rank does; models whose heads do not divide, and
// OLMoE's norms over all heads, are refused.
func TestTensorParallelFixtures(t *testing.T) {
	for dir, f := range hffixture.Load(t, "../testdata/hf") {
		for _, ranks := range []int{2, 4} {
			t.Run(f.Variant+"/tp"+string(rune('0'+ranks)), func(t *testing.T) {
				m, err := model.Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				c := m.Config
				e, err := engine.New(m, cpuGroup(ranks, false), engine.Options{Buckets: []int{1, 4, 16}, Compile: compileVerify})
				if c.NumKVHeads%ranks != 0 || c.NumHeads%ranks != 0 || c.IntermediateSize%ranks != 0 {
					if err == nil || !strings.Contains(err.Error(), "do not divide among") {
						t.Fatalf("%d heads, %d KV heads over %d ranks: %v", c.NumHeads, c.NumKVHeads, ranks, err)
					}
					return
				}
				if c.QKNormWhole {
					if err == nil || !strings.Contains(err.Error(), "normalized over all heads at once") {
						t.Fatalf("OLMoE's whole-width q/k norms over %d ranks: %v", ranks, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if got := relErrInf(f.Prefill(t, e), f.Logits); got > 1e-4 {
					t.Errorf("logits: ‖out−ref‖∞/‖ref‖∞ = %.3g > 1e-4", got)
				}
				f.CheckGreedy(t, e)
			})
		}
	}
}

// TestTensorParallelShapes: models the fixtures do not cover (a mixture of
// experts, a vocabulary that does not divide, tied embeddings, q/k norms)
// give one rank's logits on 2 ranks, within 1e-5, through prefill and
// batched decode with shared prefixes.
func TestTensorParallelShapes(t *testing.T) {
	base := model.Config{
		Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 2,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 4, VocabSize: 32, MaxPositions: 64,
		RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
	}
	for _, tc := range []struct {
		name string
		edit func(c *model.Config)
	}{
		{"llama", func(*model.Config) {}},
		{"odd vocabulary, tied", func(c *model.Config) { c.VocabSize, c.TiedEmbeddings = 31, true }},
		{"qwen3 norms and bias", func(c *model.Config) { c.Arch, c.QKNorm, c.QKVBias = "qwen3", true, true }},
		{"mixtral", func(c *model.Config) { c.Arch, c.NumExperts, c.ExpertsPerToken, c.NormTopK = "mixtral", 4, 2, true }},
		{"qwen3 moe", func(c *model.Config) { c.Arch, c.NumExperts, c.ExpertsPerToken, c.QKNorm = "qwen3_moe", 4, 2, true }},
		{"qwen2 moe, shared expert", func(c *model.Config) {
			c.Arch, c.NumExperts, c.ExpertsPerToken, c.QKVBias, c.SharedExpertSize, c.SharedExpertGate = "qwen2_moe", 4, 2, true, 20, true
		}},
		{"gemma 2", func(c *model.Config) { gemma2(c) }},
		{"gemma 3", func(c *model.Config) { gemma3(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			m := testmodel.Random(c, 11)
			run := func(b backend.Backend) [][]float32 {
				e, err := engine.New(m, b, engine.Options{MaxSeqs: 3, Buckets: []int{1, 4, 16}, Compile: compileVerify})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				var out [][]float32
				a := e.NewSequence()
				l, err := e.Prefill(a, []int{1, 5, 9, 2, 30, 7}, true)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, l)
				b2, c2 := e.Fork(a), e.Fork(a)
				for i := range 3 {
					l, err := e.Step([]engine.Item{{Seq: a, Tokens: []int{3 + i}}, {Seq: b2, Tokens: []int{11}}, {Seq: c2, Tokens: []int{20 - i}}})
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, slices.Clone(l))
				}
				return out
			}
			want := run(&cpu.Backend{Threads: 1})
			got := run(cpuGroup(2, false))
			for i := range want {
				if d := relErrInf(got[i], want[i]); d > 1e-5 {
					t.Errorf("step %d: ‖tp2−tp1‖∞/‖tp1‖∞ = %.3g > 1e-5", i, d)
				}
			}
		})
	}
}

// TestTensorParallelAbort: a rank whose step fails aborts the group's
// collectives, so that the step returns an error instead of hanging.
func TestTensorParallelAbort(t *testing.T) {
	c := model.Config{
		Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 1,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 4, VocabSize: 32, MaxPositions: 64,
		RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
	}
	g := cpuGroup(2, false)
	e, err := engine.New(testmodel.Random(c, 1), g, engine.Options{Buckets: []int{1, 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g.Ranks[1].(*cpu.Backend).Comm.Abort(errTest)
	s := e.NewSequence()
	if _, err := e.Prefill(s, []int{1, 2}, false); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("step after an abort: %v", err)
	}
}

var errTest = errString("injected failure")

type errString string

func (e errString) Error() string { return string(e) }

// gemma2 makes c a Gemma 2 of windowed and global layers with soft-capping.
func gemma2(c *model.Config) {
	c.Arch, c.EmbedScale, c.NormOffset, c.PostNorms, c.GELU, c.QueryScale = "gemma2", 4, 1, true, true, 0.4
	c.AttnSoftCap, c.FinalSoftCap, c.LayerWindows = 4, 2, []int{3, 0}
	c.TiedEmbeddings = true
}

// gemma3 makes c a Gemma 3: q/k norms, a windowed layer of its own RoPE
// base, a global one of linear scaling.
func gemma3(c *model.Config) {
	c.Arch, c.EmbedScale, c.NormOffset, c.PostNorms, c.GELU, c.QKNorm = "gemma3", 4, 1, true, true, true
	c.LayerWindows, c.RopeLocalTheta, c.RopeScaling = []int{3, 0}, 500, model.RopeScaling{Type: "linear", Factor: 4}
}

// TestGemmaKernels: Gemma 2 and 3 (random weights) give the reference
// kernels' logits on the fast kernels within 1e-4, prompt whole and in
// chunks of 1 to 4 tokens past the windows.
func TestGemmaKernels(t *testing.T) {
	for name, edit := range map[string]func(*model.Config){"gemma2": gemma2, "gemma3": gemma3} {
		t.Run(name, func(t *testing.T) {
			c := model.Config{Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 4,
				VocabSize: 32, MaxPositions: 64, RMSNormEps: 1e-6, RopeTheta: 10000, DType: tensor.F32}
			edit(&c)
			m := testmodel.Random(c, 5)
			prompt := []int{1, 5, 9, 2, 30, 7, 11, 3, 8, 14, 21}
			run := func(ref bool, buckets []int) []float32 {
				e, err := engine.New(m, &cpu.Backend{Reference: ref}, engine.Options{Buckets: buckets, Compile: compileVerify})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				s := e.NewSequence()
				l, err := e.Prefill(s, prompt, true)
				if err != nil {
					t.Fatal(err)
				}
				return slices.Clone(l)
			}
			want := run(true, nil)
			for _, buckets := range [][]int{nil, {1, 2, 4}} {
				if d := relErrInf(run(false, buckets), want); d > 1e-4 {
					t.Errorf("buckets %v: ‖fast−ref‖∞/‖ref‖∞ = %.3g > 1e-4", buckets, d)
				}
			}
		})
	}
}

// TestOLMoE: OLMoE's q and k normalized over all heads at once, and its
// experts (here 4, 2 a token) weighted over every expert: the fast
// kernels give the reference's logits within 1e-4, and tensor parallelism
// refuses to split the whole-width norms by heads.
func TestOLMoE(t *testing.T) {
	c := model.Config{Arch: "olmoe", HiddenSize: 16, IntermediateSize: 8, NumLayers: 2, NumHeads: 4, NumKVHeads: 4, HeadDim: 4,
		VocabSize: 32, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32,
		NumExperts: 4, ExpertsPerToken: 2, QKNormWhole: true}
	m := testmodel.Random(c, 3)
	run := func(b backend.Backend) []float32 {
		e, err := engine.New(m, b, engine.Options{Compile: compileVerify})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		l, err := e.Prefill(e.NewSequence(), []int{1, 5, 9, 2, 30, 7, 11}, true)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}
	if d := relErrInf(run(&cpu.Backend{}), run(&cpu.Backend{Reference: true})); d > 1e-4 {
		t.Errorf("‖fast−ref‖∞/‖ref‖∞ = %.3g > 1e-4", d)
	}
	if _, err := engine.New(m, cpuGroup(2, false), engine.Options{}); err == nil || !strings.Contains(err.Error(), "normalized over all heads at once") {
		t.Errorf("olmoe over 2 ranks: %v", err)
	}
}

// TestTensorParallelSharedMemory: CPU ranks share the host's memory, so a
// group sized by KVCacheFraction takes about what one rank would (each rank
// holding its half of the heads), not a fraction of the memory each.
func TestTensorParallelSharedMemory(t *testing.T) {
	c := model.Config{Arch: "llama", HiddenSize: 16, IntermediateSize: 24, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 4,
		VocabSize: 32, MaxPositions: 1 << 20, RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32}
	m := testmodel.Random(c, 2)
	blocks := func(b backend.Backend) (int, int64) {
		e, err := engine.New(m, b, engine.Options{KVCacheFraction: 1e-3})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		return e.KVSpec().Blocks, e.KVSpec().Bytes()
	}
	one, oneBytes := blocks(&cpu.Backend{})
	two, rankBytes := blocks(cpuGroup(2, false))
	t.Logf("one rank: %d blocks (%d bytes); two ranks: %d blocks of %d bytes each", one, oneBytes, two, rankBytes)
	if r := float64(2*rankBytes) / float64(oneBytes); r > 1.2 || r < 0.8 {
		t.Errorf("two ranks hold %.2f× one rank's cache bytes, want about 1", r)
	}
}
