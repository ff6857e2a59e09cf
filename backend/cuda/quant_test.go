package cuda_test

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/backend/cuda"
	"kiln/bench"
	"kiln/convert"
	"kiln/engine"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
	"kiln/tune"
)

// quantSteps runs the steps TestFP8Weights and TestGGUFBlocks compare on
// engine e: prompts of
// 3, 2 and 3 tokens in one step and 6 decode steps of those 3 sequences
// (steps 0 to 6: at most 8 rows, the GEMV alone); then prompts of 70 and
// 130 tokens (200 rows), prompts of 5 tokens for 7 more sequences and 6
// decode steps of all 12 (12 rows, captured into graphs from their second
// step): products through cuBLASLt.
func quantSteps(t *testing.T, e *engine.Engine, vocab int) [][]float32 {
	t.Helper()
	var out [][]float32
	step := func(items []engine.Item) {
		l, err := e.Step(items)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, slices.Clone(l))
	}
	prompts := func(lens ...int) []engine.Item {
		var items []engine.Item
		for i, n := range lens {
			toks := make([]int, n)
			for j := range toks {
				toks[j] = (j*7 + i*13 + len(out)) % vocab
			}
			items = append(items, engine.Item{Seq: e.NewSequence(), Tokens: toks})
		}
		return items
	}
	decode := func(items []engine.Item, n int) {
		for s := 0; s < n; s++ {
			for i := range items {
				items[i].Tokens = []int{(s*31 + i*5) % vocab}
			}
			step(items)
		}
	}
	items := prompts(3, 2, 3)
	step(items)
	decode(items, 6)
	long := prompts(70, 130)
	step(long)
	more := prompts(5, 5, 5, 5, 5, 5, 5)
	step(more)
	decode(append(append(items, long...), more...), 6)
	return out
}

// compareSteps requires each step's logits got to be within bound(step)
// of want (‖Δ‖₂/‖ref‖₂), logging each with what bound names.
func compareSteps(t *testing.T, got, want [][]float32, bound func(step int) (float64, string)) {
	t.Helper()
	for i := range want {
		b, what := bound(i)
		e := relL2(got[i], want[i])
		t.Logf("step %d (%s): ‖Δ‖₂/‖ref‖₂ %.3g (bound %.0e)", i, what, e, b)
		if e > b || math.IsNaN(e) {
			t.Errorf("step %d (%s): ‖Δ‖₂/‖ref‖₂ = %.3g > %.0e", i, what, e, b)
		}
	}
}

// fp8Backend is a bf16 backend on a device with FP8 (compute capability
// 8.9+), or skips.
func fp8Backend(t *testing.T) *cuda.Backend {
	t.Helper()
	b := backendOf(t, "bf16")
	if !b.Device.FP8() {
		t.Skipf("%s has no FP8 (compute capability %d.%d)", b.Device.Name, b.Device.Major, b.Device.Minor)
	}
	return b
}

// perTensorFP8 recodes m's FP8 matrices from scales a row to one scale a
// matrix (the largest row scale; each code re-rounded to E4M3), as
// per-tensor FP8 checkpoints are.
func perTensorFP8(m *model.Model) {
	for _, w := range m.Tensors {
		if w.DType != tensor.F8_E4M3 || len(w.Scales) <= 1 {
			continue
		}
		s := slices.Max(w.Scales)
		k := w.Shape[1]
		data := make([]byte, len(w.Data))
		for i, c := range w.Data {
			data[i] = tensor.F32ToE4M3(tensor.E4M3ToF32(c) * w.Scales[i/k] / s)
		}
		w.Data, w.Scales = data, []float32{s}
	}
}

// TestFP8Weights runs an FP8 checkpoint (kiln quantize --to fp8 of a random
// bf16 model: scales a row) with its matrices kept in E4M3 on the device
// against the same checkpoint widened to bf16 as it is uploaded
// (Backend.NoFP8), over quantSteps, and the same with one scale a matrix.
// Where only the FP8 GEMV has run (steps of at most 8 rows) only the
// weights are FP8, as in the widened run: the logits must agree within
// bf16's rounding (‖Δ‖₂/‖ref‖₂ ≤ 2e-2, as the transformers fixtures' bf16
// bound). Once cuBLASLt runs (prefills of 200 and 35 rows, decode of 12)
// the activations are rounded to E4M3 as well (3 significant bits; 0.04
// to 0.05 measured on an H200): within 1e-1. Those steps must have taken
// the fused paths: the readers applying the products' scales, the norms
// and SwiGLU writing the products' inputs in FP8 form.
func TestFP8Weights(t *testing.T) {
	fp8Backend(t)
	s := bench.Shape{Name: "fp8", Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, FFN: 768, Vocab: 1000, Context: 512}
	src := randomModel(t, s, tensor.BF16, 11)
	dir := filepath.Join(t.TempDir(), "fp8")
	m, err := model.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	_, err = convert.FP8(dir, m, src)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, perTensor := range []bool{false, true} {
		name := "scales a row"
		if perTensor {
			name = "one scale a matrix"
		}
		t.Run(name, func(t *testing.T) {
			run := func(bk *cuda.Backend) [][]float32 {
				m, err := model.Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if perTensor {
					perTensorFP8(m)
				}
				e, err := engine.New(m, backend.Backend(bk), engine.Options{MaxSeqs: 12})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				return quantSteps(t, e, s.Vocab)
			}
			native := backendOf(t, "bf16")
			before := native.Stats()
			got := run(native)
			after := native.Stats()
			if n := after.FP8Matrices - before.FP8Matrices; n == 0 {
				t.Fatalf("no matrix was kept in E4M3")
			}
			// Beyond the GEMV's rows the products' readers applied their
			// scales and the norms and SwiGLU wrote the products' inputs
			// in FP8 form.
			if after.FP8Scaled == before.FP8Scaled || after.FP8Written == before.FP8Written {
				t.Errorf("FP8 products with their scales in the reader: %d, activations written in FP8 form: %d; want some of each",
					after.FP8Scaled-before.FP8Scaled, after.FP8Written-before.FP8Written)
			}
			wide := backendOf(t, "bf16")
			wide.NoFP8 = true
			want := run(wide)
			compareSteps(t, got, want, func(i int) (float64, string) {
				if i <= 6 {
					return 2e-2, "FP8 GEMV"
				}
				return 1e-1, "FP8 products"
			})
		})
	}
}

// TestGGUFBlocks runs GGUF files (kiln quantize of a random bf16 model to
// Q8_0 and to Q4_K_M: Q4_K, with the output matrix and some value and down
// projections in Q6_K) with their matrices kept in blocks on the device
// against the same files widened to bf16 as they are uploaded
// (Backend.WidenBlocks), over quantSteps (keptAgainstWidened's bounds).
func TestGGUFBlocks(t *testing.T) {
	s := bench.Shape{Name: "gguf", Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, FFN: 768, Vocab: 1000, Context: 512}
	backendOf(t, "bf16")
	src := randomModel(t, s, tensor.BF16, 13)
	for _, scheme := range []string{"q8_0", "q4_k_m"} {
		t.Run(scheme, func(t *testing.T) {
			m, err := model.Load(src)
			if err != nil {
				t.Fatal(err)
			}
			path := writeGGUF(t, m, scheme)
			m.Close()
			keptAgainstWidened(t, path, s.Vocab, scheme)
		})
	}
}

// TestGGUFExperts runs mixtures of experts written as GGUF (Mixtral's
// routing; Qwen2-MoE's gated shared expert), their experts' matrices and
// the rest in Q8_0 or Q4_K_M, over quantSteps with the experts kept in
// their blocks on the device (widened a step at a time into one layer's
// scratch, for the experts the step routed rows to) and widened at upload,
// every other choice the same (tune.Defaults, no timing): the experts
// widened on the device are bit for bit the uploaded ones, so the logits
// are too, with the scratch set to NaN before each layer (a step reads only
// the experts it widened). A comparison with the choices timed, as
// TestGGUFBlocks makes for dense models, does not hold here: these random
// mixtures' routers flip near-tied experts at bf16's rounding (0.05 to
// 0.43 between runs on the H200, 2026-11-27), while TestMoEMatchesCPU
// checks the experts' products themselves against the CPU.
func TestGGUFExperts(t *testing.T) {
	backendOf(t, "bf16")
	for _, arch := range []string{"mixtral", "qwen2_moe"} {
		c := model.Config{Arch: arch, HiddenSize: 256, IntermediateSize: 256, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 64,
			VocabSize: 1000, MaxPositions: 512, RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.BF16,
			NumExperts: 8, ExpertsPerToken: 2, NormTopK: arch == "mixtral"}
		experts := 3 * c.NumExperts
		if arch == "qwen2_moe" {
			c.QKVBias, c.SharedExpertSize, c.SharedExpertGate = true, 256, true
			experts += 3
		}
		for _, scheme := range []string{"q8_0", "q4_k_m"} {
			t.Run(arch+"-"+scheme, func(t *testing.T) {
				path := writeGGUF(t, testmodel.Random(c, 21), scheme)
				same := func(kept bool) ([][]float32, cuda.Stats) {
					b := backendOf(t, "bf16")
					b.ExpertBlocks, b.Tune = kept, tune.Defaults
					if kept {
						cuda.PoisonExpertScratch(b)
					}
					e := openEngine(t, path, b, engine.Options{MaxSeqs: 12})
					return quantSteps(t, e, c.VocabSize), b.Stats()
				}
				got, st := same(true)
				want, _ := same(false)
				if st.ExpertScratch == 0 || st.BlockMatrices < experts*c.NumLayers {
					t.Fatalf("%d matrices kept in their blocks (want at least the %d experts'), scratch %d bytes",
						st.BlockMatrices, experts*c.NumLayers, st.ExpertScratch)
				}
				for i := range want {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("step %d: experts kept in blocks give other logits than experts widened at upload (‖Δ‖₂/‖ref‖₂ %.3g)", i, relL2(got[i], want[i]))
					}
				}
			})
		}
	}
}

// keptAgainstWidened runs the GGUF file at path (of scheme, vocab tokens)
// over quantSteps with its matrices kept in blocks on the device (at least
// one) against the same file widened to bf16 at upload, no norm folded in
// either (the widened weights could take folds, blocks cannot): dequantized
// on the device the weights are bit for bit the widened ones, so where
// cuBLASLt runs the logits differ only by its algorithm's rounding
// (‖Δ‖₂/‖ref‖₂ ≤ 1e-2);
// Q4_K's and Q6_K's products of at most 8 rows run on the GEMV with x
// rounded to int8 per 32 values, as llama.cpp's MMVQ does (≤ 5e-2 there).
func keptAgainstWidened(t *testing.T, path string, vocab int, scheme string) {
	t.Helper()
	run := func(bk *cuda.Backend) [][]float32 {
		e := openEngine(t, path, bk, engine.Options{MaxSeqs: 12})
		return quantSteps(t, e, vocab)
	}
	kept := backendOf(t, "bf16")
	kept.NoFoldNorms = true
	got := run(kept)
	if n := kept.Stats().BlockMatrices; n == 0 {
		t.Fatalf("no matrix kept in its blocks")
	}
	wide := backendOf(t, "bf16")
	wide.WidenBlocks, wide.NoFoldNorms = true, true
	want := run(wide)
	compareSteps(t, got, want, func(i int) (float64, string) {
		if i <= 6 && scheme == "q4_k_m" {
			return 5e-2, "Q4_K and Q6_K GEMV, int8 x"
		}
		return 1e-2, "dequantized + cuBLASLt"
	})
}

// writeGGUF writes m as a GGUF file of quantization scheme (kiln
// quantize's) into the test's directory and returns its path.
func writeGGUF(t *testing.T, m *model.Model, scheme string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), scheme+".gguf")
	sc, err := convert.ParseScheme(scheme)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = convert.GGUF(f, m, sc, nil)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFP8KVCache runs a bf16 model (head dim 128, GQA groups of 2) over
// quantSteps with its KV cache in FP8 (E4M3, scale 1; compute capability
// 8.9+), against the same steps with the bf16 cache on the GPU and with the
// CPU backend's FP8 cache (float32 compute, the same codes but where a
// key's bf16 and float32 values round to neighbouring codes). Keys and
// values keep 3 significant bits (a relative error of up to 2^-4 each), so
// the logits stay within 1e-1 of the bf16 cache's (as FP8 activations do,
// TestFP8Weights) and within 5e-2 of the CPU's FP8 cache; a block of the
// FP8 cache takes half the bf16 cache's bytes.
func TestFP8KVCache(t *testing.T) {
	b := fp8Backend(t)
	s := bench.Shape{Name: "kvfp8", Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, FFN: 768, Vocab: 1000, Context: 512}
	dir := randomModel(t, s, tensor.BF16, 17)
	run := func(bk backend.Backend, fp8 bool) ([][]float32, *engine.Engine) {
		e := openEngine(t, dir, bk, engine.Options{MaxSeqs: 12, KVCacheFP8: fp8})
		return quantSteps(t, e, s.Vocab), e
	}
	got, e8 := run(b, true)
	want, e16 := run(backendOf(t, "bf16"), false)
	cpuFP8, _ := run(&cpu.Backend{}, true)
	if a, c := e16.KVBytes()/int64(e16.KVSpec().Blocks), e8.KVBytes()/int64(e8.KVSpec().Blocks); a != 2*c {
		t.Errorf("a block of the bf16 cache takes %d bytes, of the FP8 cache %d: want half", a, c)
	}
	t.Log("against the bf16 cache:")
	compareSteps(t, got, want, func(int) (float64, string) { return 1e-1, "E4M3 keys and values" })
	t.Log("against the CPU's FP8 cache:")
	compareSteps(t, got, cpuFP8, func(int) (float64, string) { return 5e-2, "bf16 compute, codes of bf16 keys" })
}

// TestGGUFBlocksFoldNorms runs a Q4_K_M file (Q4_K and Q6_K matrices kept
// in their blocks) over quantSteps with the norms folded into the K-quant
// products around them (kernels.BlocksFold: the residual added by the
// product before the norm, x times the gain in the product after it, the
// 1/rms applied by RoPE or SwiGLU) and without, every other choice the
// same: the steps the K-quant GEMV takes (at most 8 rows) fold, and their
// logits stay within the int8 x's bound of the unfolded ones (x rounded to
// int8 from the unnormalized rows times the gain rather than from the
// norm's bf16 output); the other steps run the same kernels.
func TestGGUFBlocksFoldNorms(t *testing.T) {
	s := bench.Shape{Name: "gguf", Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, FFN: 768, Vocab: 1000, Context: 512}
	backendOf(t, "bf16")
	m, err := model.Load(randomModel(t, s, tensor.BF16, 13))
	if err != nil {
		t.Fatal(err)
	}
	path := writeGGUF(t, m, "q4_k_m")
	m.Close()
	run := func(fold bool) ([][]float32, cuda.Stats) {
		b := backendOf(t, "bf16")
		b.NoFoldNorms, b.Tune = !fold, tune.Defaults
		e := openEngine(t, path, b, engine.Options{MaxSeqs: 12})
		return quantSteps(t, e, s.Vocab), b.Stats()
	}
	got, st := run(true)
	want, base := run(false)
	if st.NormFolds == 0 || base.NormFolds != 0 {
		t.Fatalf("norms folded: %d with folds, %d without: want some, none", st.NormFolds, base.NormFolds)
	}
	t.Logf("%d norms folded", st.NormFolds)
	compareSteps(t, got, want, func(i int) (float64, string) {
		return 5e-2, "Q4_K and Q6_K GEMV, int8 x of the folded rows"
	})
}
