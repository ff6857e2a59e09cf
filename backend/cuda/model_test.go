package cuda_test

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/backend/cuda"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/bench"
	"kiln/engine"
	"kiln/internal/hffixture"
	"kiln/internal/testmodel"
	"kiln/internal/testshared"
	"kiln/model"
	"kiln/tensor"
	"kiln/tokenizer"
	"kiln/tune"
)

var (
	devOnce sync.Once
	dev     *cu.Device
	devErr  error
)

// backendOf returns a backend of compute dtype dtype on the shared test
// device, or skips when there is no GPU.
func backendOf(t *testing.T, dtype string) *cuda.Backend {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU (these tests run on the GPU machine: tools/gpu/build.sh, tools/gpu/run.sh): %v", err)
	}
	devOnce.Do(func() { dev, devErr = cu.Open(0) })
	if devErr != nil {
		t.Fatalf("open device 0: %v", devErr)
	}
	// The tests time their own choices: no cache of tuned choices read
	// from or left in the user's cache directory (TestTuneCache has its own).
	return &cuda.Backend{Device: dev, DType: dtype, Tune: tune.Off}
}

// openEngine loads the model at path and builds an engine on b; both are
// closed when the test ends.
// randomModel writes a model of shape s with random weights of dtype dt
// (from seed) into a temporary directory and returns the directory.
func randomModel(t *testing.T, s bench.Shape, dt tensor.DType, seed uint64) string {
	t.Helper()
	dir := t.TempDir()
	if err := bench.WriteRandomModel(dir, s, dt, seed); err != nil {
		t.Fatal(err)
	}
	return dir
}

func openEngine(t *testing.T, path string, b backend.Backend, o engine.Options) *engine.Engine {
	t.Helper()
	m, err := model.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.New(m, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// relL2 is ‖got−want‖₂ / ‖want‖₂ (infinite when got holds a NaN).
func relL2(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(num / den)
}

// isMixture reports whether the model at dir routes through experts.
func isMixture(t *testing.T, dir string) bool {
	t.Helper()
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.Config.NumExperts > 0
}

// withoutRoutingFlips is relL2 of got against want over the rows left when
// the worst rows beyond limit, at most one in 16 (and one at least), are
// set aside and logged. A mixture of experts picks its experts by their
// router logits' order, and bf16's rounding can flip a near-tied choice:
// that row then differs by a whole expert's share (qwen2-moe-shared's
// position 25 on the H200, 2026-11-26: 0.122, while its other 26 rows
// were within 0.009).
func withoutRoutingFlips(t *testing.T, got, want []float32, vocab int, limit float64) float64 {
	t.Helper()
	rows := len(want) / vocab
	type rowErr struct {
		r int
		e float64
	}
	errs := make([]rowErr, rows)
	for r := range errs {
		errs[r] = rowErr{r, relL2(got[r*vocab:(r+1)*vocab], want[r*vocab:(r+1)*vocab])}
	}
	slices.SortFunc(errs, func(a, b rowErr) int { return cmp.Compare(b.e, a.e) })
	skip := map[int]bool{}
	for _, x := range errs[:max(1, rows/16)] {
		if x.e > limit {
			skip[x.r] = true
			t.Logf("position %d set aside as a routing flip: ‖Δ‖₂/‖ref‖₂ = %.3g", x.r, x.e)
		}
	}
	var g, w []float32
	for r := 0; r < rows; r++ {
		if !skip[r] {
			g, w = append(g, got[r*vocab:(r+1)*vocab]...), append(w, want[r*vocab:(r+1)*vocab]...)
		}
	}
	return relL2(g, w)
}

// checkArgmax requires the argmax of every row of got to be the reference's.
// Unless exact, a different argmax passes only at a near-tie: where the
// reference's margin between its top token and got's is within twice the
// largest error of that row (the random-weight fixtures have rows whose top
// logits differ by less than bf16's rounding), and such flips are logged and
// must stay under a tenth of the rows.
func checkArgmax(t *testing.T, got, want []float32, vocab int, exact bool) {
	t.Helper()
	rows, flips := len(want)/vocab, 0
	for r := 0; r < rows; r++ {
		g, w := got[r*vocab:(r+1)*vocab], want[r*vocab:(r+1)*vocab]
		ag, aw := engine.Argmax(g), engine.Argmax(w)
		if ag == aw {
			continue
		}
		var maxErr float64
		for i := range w {
			maxErr = math.Max(maxErr, math.Abs(float64(g[i])-float64(w[i])))
		}
		margin := float64(w[aw]) - float64(w[ag])
		if exact || !(margin <= 2*maxErr) { // NaN: an error
			t.Errorf("position %d: argmax %d, reference %d (reference margin %.4g, largest error of the row %.4g)", r, ag, aw, margin, maxErr)
			continue
		}
		flips++
		t.Logf("position %d: near-tie: argmax %d, reference %d (reference margin %.4g ≤ 2 × row error %.4g)", r, ag, aw, margin, maxErr)
	}
	if flips*10 > rows {
		t.Errorf("%d of %d positions flipped at near-ties", flips, rows)
	}
}

// TestHFTransformersFixtures runs every architecture variant of the
// transformers fixtures on the GPU: all-position logits within
// ‖Δ‖₂/‖ref‖₂ ≤ 1e-4 in f32 (at most 7.7e-7 on the H200, 2026-11-26) and
// ≤ 2e-2 in bf16 (mixtures: but for routing flips), the same argmax at every
// position (in bf16, except at near-ties: checkArgmax), and in f32
// transformers' greedy continuation. Each runs with the prompt whole
// (prefill attention) and in chunks of 1 to 8 tokens (decode attention over a
// growing cache, and mixed buckets).
func TestHFTransformersFixtures(t *testing.T) {
	for dir, f := range hffixture.Load(t, "../../testdata/hf") {
		for _, dtype := range []string{"f32", "bf16"} {
			for _, buckets := range [][]int{nil, {1, 2, 4, 8}} {
				name := f.Variant + "/" + dtype
				if buckets != nil {
					name += "/chunked"
				}
				t.Run(name, func(t *testing.T) {
					b := backendOf(t, dtype)
					e := openEngine(t, dir, b, engine.Options{Buckets: buckets})
					logits := f.Prefill(t, e)
					limit := 1e-4
					if dtype == "bf16" {
						limit = 2e-2
					}
					vocab := f.LogitsShape[1]
					got := relL2(logits, f.Logits)
					t.Logf("‖Δ‖₂/‖ref‖₂ = %.3g (limit %g)", got, limit)
					if dtype == "bf16" && isMixture(t, dir) {
						got = withoutRoutingFlips(t, logits, f.Logits, vocab, limit)
					}
					if !(got <= limit) { // NaN fails too
						t.Errorf("logits: ‖Δ‖₂/‖ref‖₂ = %.3g > %g", got, limit)
					}
					checkArgmax(t, logits, f.Logits, vocab, dtype == "f32")
					if dtype == "f32" { // a near-tie flipped in bf16 changes the rest of a greedy continuation
						f.CheckGreedy(t, e)
					}
				})
			}
		}
	}
}

// TestStories260KGreedy: in f32 the GPU reproduces llama2.c's greedy output
// of a real trained model byte for byte.
func TestStories260KGreedy(t *testing.T) {
	b := backendOf(t, "f32")
	dir := testshared.Path(t, "models", "stories260K")
	want, err := os.ReadFile(dir + "/expected_greedy_200steps.txt")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir + "/tok512.bin")
	if err != nil {
		t.Fatal(err)
	}
	e := openEngine(t, dir+"/stories260K.bin", b, engine.Options{})
	ids := []int{1}
	_, err = e.Generate([]int{1}, engine.SamplingParams{MaxTokens: 200, StopTokens: []int{1}}, func(id int) bool {
		ids = append(ids, id)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Decode(ids)
	if strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
		t.Errorf("greedy output differs\ngot:  %q\nwant: %q", got, want)
	}
}

// TestBatchedMatchesCPU decodes several sequences of different lengths
// together on the GPU (f32) and compares every step's logits with the CPU
// backend on the same steps, on a random model with head dim 64 and 128,
// with the small products on GEMV, on cuBLASLt, and on the measured choice.
func TestBatchedMatchesCPU(t *testing.T) {
	for _, products := range []string{"", "gemv", "cublaslt"} {
		for _, s := range []bench.Shape{
			{Name: "hd64", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 300, Context: 512},
			{Name: "hd128", Hidden: 512, Layers: 2, Heads: 4, KVHeads: 1, FFN: 384, Vocab: 1000, Context: 512, Tied: true},
		} {
			t.Run(s.Name+"/"+products, func(t *testing.T) {
				b := backendOf(t, "f32")
				b.Products = products
				dir := randomModel(t, s, tensor.F32, 7)
				run := func(bk backend.Backend) [][]float32 { return batchedSteps(t, dir, bk, s.Vocab) }
				gpu, ref := run(b), run(&cpu.Backend{})
				for i := range ref {
					if e := relL2(gpu[i], ref[i]); e > 1e-4 || math.IsNaN(e) {
						t.Errorf("step %d: ‖Δ‖₂/‖ref‖₂ = %.3g > 1e-4", i, e)
					}
				}
			})
		}
	}
}

// batchedSteps runs the model at dir on bk: prompts of 70, 3 and 130
// tokens in one step, 10 decode steps of the three sequences, a mixed step
// (their decodes and a fourth sequence's prompt of 40 tokens: decode
// attention for the first, prefill attention for the chunk), then 10 decode
// steps of the four; it returns every step's logits.
func batchedSteps(t *testing.T, dir string, bk backend.Backend, vocab int) [][]float32 {
	return batchedStepsOn(t, openEngine(t, dir, bk, engine.Options{MaxSeqs: 4}), vocab)
}

// batchedStepsOn is batchedSteps on engine e (of 4 sequences at least).
func batchedStepsOn(t *testing.T, e *engine.Engine, vocab int) [][]float32 {
	seqs := []*engine.Sequence{e.NewSequence(), e.NewSequence(), e.NewSequence(), e.NewSequence()}
	var out [][]float32
	var items []engine.Item
	prompt := func(i, n int) engine.Item {
		toks := make([]int, n)
		for j := range toks {
			toks[j] = (j*7 + i*13) % vocab
		}
		return engine.Item{Seq: seqs[i], Tokens: toks}
	}
	for i, n := range []int{70, 3, 130} {
		items = append(items, prompt(i, n))
	}
	step := func(items []engine.Item) {
		l, err := e.Step(items)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, slices.Clone(l))
	}
	step(items)
	for s := 0; s < 21; s++ {
		for i := range items {
			items[i].Tokens = []int{(s*31 + i*5) % vocab}
		}
		if s == 10 {
			step(append(slices.Clone(items), prompt(3, 40)))
			items = append(items, engine.Item{Seq: seqs[3]})
			continue
		}
		step(items)
	}
	return out
}

// TestGemmaMatchesCPU: Gemma 2 and 3 shapes (scaled embeddings, GeGLU,
// sandwich norms, soft-capped attention and logits, windowed layers among
// global ones, Gemma 3's q/k norms and local RoPE base) run on the GPU in
// f32 with the CPU's logits (‖Δ‖₂/‖ref‖₂ ≤ 1e-4) through a batched
// prefill past the windows and 20 decode steps, at head dims 16 (the
// CUDA-core attention), 64 and Gemma's 256 (the tensor-core kernels in
// bf16: the median step within 1.5e-2 and every step within 4e-2, with
// Gemma 2's final cap of 30 for the logits).
func TestGemmaMatchesCPU(t *testing.T) {
	for _, dtype := range []string{"f32", "bf16"} {
		for _, hd := range []int{16, 64, 256} {
			for _, arch := range []string{"gemma2", "gemma3"} {
				t.Run(fmt.Sprintf("%s/hd%d/%s", arch, hd, dtype), func(t *testing.T) {
					b := backendOf(t, dtype)
					c := model.Config{Arch: arch, HiddenSize: 128, IntermediateSize: 192, NumLayers: 4, NumHeads: 4, NumKVHeads: 2,
						HeadDim: hd, VocabSize: 300, MaxPositions: 512, RMSNormEps: 1e-6, RopeTheta: 10000, DType: tensor.F32,
						TiedEmbeddings: true, EmbedScale: math.Sqrt(128), NormOffset: 1, PostNorms: true, GELU: true,
						QueryScale: 1 / math.Sqrt(float64(hd))}
					if arch == "gemma2" {
						c.AttnSoftCap, c.FinalSoftCap, c.LayerWindows = 2, 3, []int{40, 0, 40, 0}
						if dtype == "bf16" {
							// Gemma 2's own final cap: a cap of 3 under
							// logits of rms 7 (max 68) shrinks the norm
							// the error is measured against while the
							// rounding of the unsaturated logits passes
							// through whole (0.021–0.038 on the H200,
							// 2026-11-26); 30 still bends the largest.
							c.FinalSoftCap = 30
						}
					} else {
						c.QKNorm, c.LayerWindows, c.RopeLocalTheta, c.RopeTheta = true, []int{40, 40, 0, 40}, 10000, 1e6
						c.RopeScaling = model.RopeScaling{Type: "linear", Factor: 2}
					}
					m := testmodel.Random(c, 5)
					if dtype == "f32" {
						matchesCPU(t, m, b, 1e-4)
						return
					}
					// In bf16 a typical step within 1.5e-2 and none past
					// 4e-2: these random Gemma-shaped models amplify
					// rounding at some steps (Gemma 2's without soft caps
					// up to 0.09 at head dim 16 to 256 on the H200, with
					// them 0.029 at one step of 21, the median 0.009;
					// 2026-11-26), while the f32 runs hold 1e-4.
					errs := stepErrors(t, m, b)
					t.Logf("steps' ‖Δ‖₂/‖ref‖₂: %.3g", errs)
					if slices.ContainsFunc(errs, math.IsNaN) {
						t.Fatalf("bf16: a step's logits are NaN")
					}
					sorted := slices.Sorted(slices.Values(errs))
					if med, worst := sorted[len(sorted)/2], sorted[len(sorted)-1]; !(med <= 1.5e-2 && worst <= 4e-2) {
						t.Errorf("bf16: median step ‖Δ‖₂/‖ref‖₂ %.3g (limit 1.5e-2), worst %.3g (limit 4e-2)", med, worst)
					}
				})
			}
		}
	}
}

// TestMoEMatchesCPU: mixtures of experts (Mixtral's routing, Qwen3-MoE's
// q/k norms and the softmax over every expert, Qwen2-MoE's q/k/v biases
// and gated shared expert, OLMoE's whole-width q/k norms) run on the GPU's
// expert kernels in f32 with the CPU's logits (‖Δ‖₂/‖ref‖₂ ≤ 1e-4) through
// a batched prefill and 20 decode steps (the decode steps in CUDA graphs).
func TestMoEMatchesCPU(t *testing.T) {
	for _, arch := range []string{"mixtral", "qwen3_moe", "qwen2_moe", "olmoe"} {
		t.Run(arch, func(t *testing.T) {
			b := backendOf(t, "f32")
			c := model.Config{Arch: arch, HiddenSize: 128, IntermediateSize: 64, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
				HeadDim: 32, VocabSize: 300, MaxPositions: 512, RMSNormEps: 1e-6, RopeTheta: 10000, DType: tensor.F32,
				NumExperts: 8, ExpertsPerToken: 2}
			switch arch {
			case "mixtral":
				c.NormTopK = true
			case "qwen3_moe":
				c.QKNorm = true
			case "qwen2_moe":
				c.QKVBias, c.SharedExpertSize, c.SharedExpertGate = true, 96, true
			case "olmoe":
				c.QKNormWhole, c.NumKVHeads = true, 4
			}
			matchesCPU(t, testmodel.Random(c, 9), b, 1e-4)
		})
	}
}

// matchesCPU runs batchedStepsOn with model m on gpu and on the CPU: every
// step's logits within limit (‖Δ‖₂/‖ref‖₂).
func matchesCPU(t *testing.T, m *model.Model, gpu backend.Backend, limit float64) {
	t.Helper()
	for i, e := range stepErrors(t, m, gpu) {
		if e > limit || math.IsNaN(e) {
			t.Errorf("step %d: ‖Δ‖₂/‖ref‖₂ = %.3g > %g", i, e, limit)
		}
	}
}

// stepErrors runs batchedStepsOn with model m on gpu and on the CPU and
// returns each step's ‖Δ‖₂/‖ref‖₂.
func stepErrors(t *testing.T, m *model.Model, gpu backend.Backend) []float64 {
	t.Helper()
	run := func(bk backend.Backend) [][]float32 {
		e, err := engine.New(m, bk, engine.Options{MaxSeqs: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		return batchedStepsOn(t, e, m.Config.VocabSize)
	}
	got, ref := run(gpu), run(&cpu.Backend{})
	errs := make([]float64, len(ref))
	for i := range ref {
		errs[i] = relL2(got[i], ref[i])
	}
	return errs
}

// TestGraphsMatchDirect decodes the same steps with captured CUDA graphs and
// kernel by kernel, each with and without programmatic dependent launches,
// and with the GEMV's epilogues off (SwiGLU and RoPE as kernels of their
// own): the logits must be bit-identical (the same products, rounded the
// same way, on the same data), the graphs must have been replayed and the
// epilogues run where on. bf16 runs again over an FP8 KV cache (compute
// capability 8.9+), where the GEMV's RoPE epilogue stands aside (it writes
// the cache in the activation dtype) and SwiGLU's alone runs.
func TestGraphsMatchDirect(t *testing.T) {
	for _, c := range []struct {
		dtype string
		fp8   bool
	}{{"f32", false}, {"bf16", false}, {"bf16", true}} {
		dtype := c.dtype
		name := dtype
		if c.fp8 {
			name += "-fp8-cache"
		}
		t.Run(name, func(t *testing.T) {
			if c.fp8 && !backendOf(t, dtype).Device.FP8() {
				t.Skip("no FP8 on this device")
			}
			s := bench.Shape{Name: "g", Hidden: 256, Layers: 3, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 512}
			dir := randomModel(t, s, tensor.F32, 3)
			run := func(noGraphs, noPDL, noEpilogues bool) ([][]float32, cuda.Stats) {
				b := backendOf(t, dtype)
				b.NoGraphs, b.NoPDL, b.NoEpilogues = noGraphs, noPDL, noEpilogues
				// The same kernels both ways (no timing-dependent choice).
				// No norm folded: a GEMV running RoPE or SwiGLU in its
				// epilogue keeps the norm before it, so without epilogues
				// other norms fold (TestNormFolds holds the folds' graphs
				// to their direct launches).
				b.Products, b.FixedDecodePlan, b.NoFoldNorms = "gemv", true, true
				e := openEngine(t, dir, b, engine.Options{MaxSeqs: 4, KVCacheFP8: c.fp8})
				var out [][]float32
				seqs := []*engine.Sequence{e.NewSequence(), e.NewSequence(), e.NewSequence()}
				for i, sq := range seqs {
					if _, err := e.Prefill(sq, []int{1, 2 + i, 3, 4 + 2*i, 5}, false); err != nil {
						t.Fatal(err)
					}
				}
				// 60 steps of 3 sequences, then 70 of 2: positions cross the
				// 64 and 128 context buckets, so several graphs are captured.
				for step := 0; step < 130; step++ {
					n := 3
					if step >= 60 {
						n = 2
					}
					var items []engine.Item
					for i := 0; i < n; i++ {
						items = append(items, engine.Item{Seq: seqs[i], Tokens: []int{(step*7 + i) % s.Vocab}})
					}
					l, err := e.Step(items)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, slices.Clone(l))
				}
				return out, b.Stats()
			}
			direct, ds := run(true, true, false)
			for _, v := range []struct {
				name                         string
				noGraphs, noPDL, noEpilogues bool
			}{
				{"direct launches with PDL", true, false, false},
				{"graph replay without PDL", false, true, false},
				{"graph replay with PDL", false, false, false},
				{"graph replay with PDL, SwiGLU and RoPE as kernels of their own", false, false, true},
			} {
				got, gs := run(v.noGraphs, v.noPDL, v.noEpilogues)
				t.Logf("%s: %+v", v.name, gs)
				if !v.noGraphs && (gs.GraphFailures > 0 || gs.GraphCaptures < 3 || gs.GraphReplays < 120) {
					t.Errorf("%s: %+v (want at least 3 captures, 120 replays, no failure)", v.name, gs)
				}
				if (gs.Epilogues == 0) != v.noEpilogues {
					t.Errorf("%s: %d epilogue launches", v.name, gs.Epilogues)
				}
				for i := range direct {
					if !slices.Equal(direct[i], got[i]) {
						t.Fatalf("step %d: logits differ between %s and plain direct launches (‖Δ‖₂/‖ref‖₂ = %.3g)", i, v.name, relL2(got[i], direct[i]))
					}
				}
			}
			perLayer := 2 // SwiGLU and RoPE
			if c.fp8 {
				perLayer = 1
			}
			if ds.Epilogues < perLayer*s.Layers*130 || c.fp8 && ds.Epilogues > s.Layers*130+s.Layers*3 {
				t.Errorf("direct: %d epilogue launches, want %d a layer and step", ds.Epilogues, perLayer)
			}
			if ds.GraphReplays != 0 {
				t.Errorf("direct: %+v replayed graphs", ds)
			}
		})
	}
}

// samplingSettings are the sampling tests' settings: greedy, temperature,
// top-k, top-p, min-p, the penalties, and a penalty under greedy choice.
var samplingSettings = []engine.SamplingParams{
	{},
	{Temperature: 0.8, Seed: 1},
	{Temperature: 1.2, TopK: 40, Seed: 2},
	{Temperature: 1, TopP: 0.9, Seed: 3},
	{Temperature: 0.7, TopK: 100, TopP: 0.95, MinP: 0.02, Seed: 4},
	{Temperature: 1, RepetitionPenalty: 1.3, FrequencyPenalty: 0.5, PresencePenalty: 0.3, Seed: 5},
	{RepetitionPenalty: 1.5},
}

// TestDeviceSampling generates with several sampling settings, choosing each
// token on the GPU and, from the same logits, on the host: the same seed must
// give the same tokens (the device sampler reproduces engine.Sampler given
// the host's uniform draw).
func TestDeviceSampling(t *testing.T) {
	s := bench.Shape{Name: "s", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 3000, Context: 256}
	dir := randomModel(t, s, tensor.F32, 5)
	gen := func(host bool) [][]int {
		b := backendOf(t, "f32")
		b.HostSampling = host
		e := openEngine(t, dir, b, engine.Options{})
		var all [][]int
		for _, p := range samplingSettings {
			p.MaxTokens = 40
			var ids []int
			if _, err := e.Generate([]int{1, 17, 400, 17, 9}, p, func(id int) bool {
				ids = append(ids, id)
				return true
			}); err != nil {
				t.Fatal(err)
			}
			all = append(all, ids)
		}
		return all
	}
	device, host := gen(false), gen(true)
	for i := range samplingSettings {
		if !slices.Equal(device[i], host[i]) {
			t.Errorf("%+v:\ndevice %v\n  host %v", samplingSettings[i], device[i], host[i])
		}
	}
}

// TestProfile runs decode steps with Backend.Profile: they give the same
// logits as steps run directly, replay no graph, and time every kernel of
// every step (each node's kernel once a step, products named by shape).
func TestProfile(t *testing.T) {
	s := bench.Shape{Name: "p", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 256}
	dir := randomModel(t, s, tensor.F32, 5)
	const steps = 6
	var captures, replays int
	run := func(profile bool) ([][]float32, *cuda.Backend) {
		b := backendOf(t, "bf16")
		b.Products, b.FixedDecodePlan = "gemv", true
		b.NoGraphs = !profile
		e := openEngine(t, dir, b, engine.Options{MaxSeqs: 2})
		seqs := []*engine.Sequence{e.NewSequence(), e.NewSequence()}
		for i, sq := range seqs {
			if _, err := e.Prefill(sq, []int{1, 2 + i, 3}, false); err != nil {
				t.Fatal(err)
			}
		}
		// The prefills (decode-like steps of 3 tokens) may capture and
		// replay a graph; the profiled steps below must not.
		before := b.Stats()
		b.Profile = profile
		var out [][]float32
		for step := range steps {
			items := []engine.Item{{Seq: seqs[0], Tokens: []int{step + 7}}, {Seq: seqs[1], Tokens: []int{step + 9}}}
			l, err := e.Step(items)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, slices.Clone(l))
		}
		after := b.Stats()
		captures, replays = after.GraphCaptures-before.GraphCaptures, after.GraphReplays-before.GraphReplays
		return out, b
	}
	want, _ := run(false)
	got, b := run(true)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("step %d: profiled logits differ from direct launches (‖Δ‖₂/‖ref‖₂ = %.3g)", i, relL2(got[i], want[i]))
		}
	}
	st := b.Stats()
	if st.ProfileSteps != steps || replays != 0 || captures != 0 {
		t.Fatalf("%d profiled steps (want %d), %d graph replays, %d captures in them", st.ProfileSteps, steps, replays, captures)
	}
	calls := map[string]int{}
	for _, p := range st.Profile {
		t.Logf("%-60s %3d calls %8.1f µs", p.Name, p.Calls, p.Time.Seconds()*1e6)
		if p.Calls%steps != 0 || p.Time <= 0 {
			t.Errorf("%s: %d calls over %d steps, %v", p.Name, p.Calls, steps, p.Time)
		}
		calls[p.Name] = p.Calls / steps
	}
	// A layer: two norms, the Q/K/V product with RoPE and the cache writes
	// in its epilogue, attention, the output product, gate/up with SwiGLU
	// in its epilogue, down; then the final norm, the LM head and the copy.
	attention := 0
	for name, n := range calls {
		if strings.HasPrefix(name, "decode attention, 4/2 heads ×64 (") {
			attention += n
		}
	}
	if attention != s.Layers {
		t.Errorf("%d decode attention calls a step, want %d (profile %v)", attention, s.Layers, calls)
	}
	for name, n := range map[string]int{
		"product 2×256×512 gemv + rope_qkv_write": s.Layers,
		"product 2×256×1024 gemv + swiglu_packed": s.Layers,
		"product 2×256×256 gemv":                  s.Layers,
		"product 2×512×256 gemv":                  s.Layers,
		"logits to the host":                      1,
	} {
		if calls[name] != n {
			t.Errorf("%q: %d calls a step, want %d (profile %v)", name, calls[name], n, calls)
		}
	}
	b.ResetProfile()
	if st := b.Stats(); st.ProfileSteps != 0 || len(st.Profile) != 0 {
		t.Errorf("after ResetProfile: %d steps, %d entries", st.ProfileSteps, len(st.Profile))
	}
}

// TestProfilePrefill: prefills profiled kernel by kernel give the logits
// of direct launches, and the profile names each layer's prefill attention.
func TestProfilePrefill(t *testing.T) {
	s := bench.Shape{Name: "p", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 256}
	dir := randomModel(t, s, tensor.F32, 5)
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = (i*7 + 3) % s.Vocab
	}
	run := func(profile bool) ([]float32, *cuda.Backend) {
		b := backendOf(t, "bf16")
		b.Products = "cublaslt"
		e := openEngine(t, dir, b, engine.Options{MaxSeqs: 2})
		b.Profile = profile
		l, err := e.Prefill(e.NewSequence(), prompt, false)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l), b
	}
	want, _ := run(false)
	got, b := run(true)
	if !slices.Equal(got, want) {
		t.Fatalf("profiled prefill's logits differ from direct launches (‖Δ‖₂/‖ref‖₂ = %.3g)", relL2(got, want))
	}
	st := b.Stats()
	attention := 0
	for _, p := range st.Profile {
		t.Logf("%-60s %3d calls %8.1f µs", p.Name, p.Calls, p.Time.Seconds()*1e6)
		if p.Time <= 0 {
			t.Errorf("%s: %v", p.Name, p.Time)
		}
		if strings.HasPrefix(p.Name, "prefill attention, 4/2 heads ×64") {
			attention += p.Calls
		}
	}
	if st.ProfileSteps == 0 || attention != s.Layers*st.ProfileSteps {
		t.Errorf("%d prefill attention calls over %d profiled steps, want %d a step", attention, st.ProfileSteps, s.Layers)
	}
}

// TestNormFolds: in bf16 the norms before the Q/K/V and gate/up products
// fold into them (normfold.go) in steps where the products run on
// cuBLASLt: a prefill of 20 prompts and 12 decode steps of 20 sequences,
// their logits against the CPU's within the bound the unfolded bf16 path
// is held to (TestGemmaMatchesCPU: the median step 1.5e-2, every step
// 4e-2), the unfolded path in the same run beside them. Launched kernel
// by kernel, the norms count as folded two a layer and step (the first
// layer's plain RMSNorm of the embeddings and its AddRMSNorm; none with
// NoFoldNorms); the decode steps' captured graphs, and direct launches
// without programmatic dependent launches, give the same logits bit for
// bit. Then with the products chosen by their first-use races, as
// served: the prefill (past the GEMV's rows) folds, and the decode steps
// fold or keep the norm at its unit gain over the folded weights as their
// products' ways fall, within the same bound.
func TestNormFolds(t *testing.T) {
	c := model.Config{Arch: "llama", HiddenSize: 256, IntermediateSize: 512, NumLayers: 3, NumHeads: 4, NumKVHeads: 2, HeadDim: 64,
		VocabSize: 500, MaxPositions: 512, RMSNormEps: 1e-5, RopeTheta: 10000, DType: tensor.F32}
	m := testmodel.Random(c, 11)
	// testmodel's N(0, 0.5²) everywhere makes attention one-hot and the
	// logits chaotic in bf16 (6% off the CPU's with no fold, 2026-11-27):
	// matrices scaled by their fan-in instead (embeddings N(0, 1)), and
	// gains 1 + N(0, 0.5²), far enough from 1 that a gain folded twice or
	// lost shows.
	for _, name := range m.Names() {
		w := m.Tensors[name]
		v, err := w.F32s()
		if err != nil {
			t.Fatal(err)
		}
		f, add := 2/math.Sqrt(float64(w.Shape[len(w.Shape)-1])), float32(0)
		switch {
		case len(w.Shape) == 1:
			f, add = 1, 1
		case name == model.EmbedName:
			f = 2
		}
		for i := range v {
			v[i] = v[i]*float32(f) + add
		}
		m.Tensors[name] = tensor.FromF32(name, w.Shape, v)
	}
	const steps = 12
	run := func(bk backend.Backend, seqs int) [][]float32 {
		e, err := engine.New(m, bk, engine.Options{MaxSeqs: seqs})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var items []engine.Item
		for i := range seqs {
			toks := make([]int, 5+i)
			for j := range toks {
				toks[j] = (j*7 + i*13) % c.VocabSize
			}
			items = append(items, engine.Item{Seq: e.NewSequence(), Tokens: toks})
		}
		var out [][]float32
		for step := 0; step <= steps; step++ {
			l, err := e.Step(items)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, slices.Clone(l))
			for i := range items {
				items[i].Tokens = []int{(step*31 + i*5) % c.VocabSize}
			}
		}
		return out
	}
	ref := run(&cpu.Backend{}, 20)
	var direct, plain [][]float32
	for _, v := range []struct{ fold, graphs, raced, noPDL bool }{
		{false, true, false, false}, {true, false, false, false}, {true, false, false, true}, {true, true, false, false}, {true, true, true, false},
	} {
		b := backendOf(t, "bf16")
		b.NoFoldNorms, b.NoGraphs, b.NoPDL = !v.fold, !v.graphs, v.noPDL
		if !v.raced {
			// The same kernels every run (no timing-dependent choice).
			b.Products, b.Tune = "cublaslt", tune.Defaults
		}
		got := run(b, 20)
		errs := boundedSteps(t, fmt.Sprintf("%+v", v), got, ref)
		st := b.Stats()
		t.Logf("%+v: %d norms folded, %d graph replays; steps' ‖Δ‖₂/‖ref‖₂: %.3g", v, st.NormFolds, st.GraphReplays, errs)
		if plain == nil {
			plain = got
		} else {
			d := make([]float64, len(plain))
			for i := range plain {
				d[i] = relL2(got[i], plain[i])
			}
			t.Logf("%+v: against the unfolded bf16 run: %.3g", v, d)
		}
		switch {
		case !v.fold && st.NormFolds != 0:
			t.Errorf("%+v: %d norms folded", v, st.NormFolds)
		case v.raced:
			if st.NormFolds < 2*c.NumLayers {
				t.Errorf("%+v: %d norms folded, want at least the prefill's %d", v, st.NormFolds, 2*c.NumLayers)
			}
		case v.fold && !v.graphs && !v.noPDL:
			if want := 2 * c.NumLayers * (steps + 1); st.NormFolds != want {
				t.Errorf("%+v: %d norms folded, want %d", v, st.NormFolds, want)
			}
			direct = got
		case v.fold:
			if v.graphs && st.GraphReplays == 0 {
				t.Errorf("%+v: no graph replayed", v)
			}
			for i := range direct {
				if !slices.Equal(direct[i], got[i]) {
					t.Errorf("%+v, step %d: logits differ from direct launches with PDL (‖Δ‖₂/‖ref‖₂ = %.3g)", v, i, relL2(got[i], direct[i]))
				}
			}
		}
	}
	// The GEMV's CUDA-core kernels take the fold at up to 8 rows, its tile
	// kernels past them (the residual added by the output and down
	// products, the 1/rms applied by Q/K/V and gate/up with RoPE and
	// SwiGLU in their epilogues): 4 sequences (the CUDA cores) and 20 (the
	// tile kernels), every decode product on the GEMV. Every decode step
	// after the first (whose products' ways are not yet known when the
	// chains are decided) folds both norms of every layer; the logits stay
	// within the same bound of the CPU's, and the captured graphs give the
	// direct launches' logits bit for bit.
	for _, seqs := range []int{4, 20} {
		refN := ref
		if seqs != 20 {
			refN = run(&cpu.Backend{}, seqs)
		}
		var gemvDirect [][]float32
		for _, graphs := range []bool{false, true} {
			b := backendOf(t, "bf16")
			b.NoGraphs = !graphs
			b.Products, b.Tune, b.VectorWay = "gemv", tune.Defaults, kernels.WayCUDACores
			got := run(b, seqs)
			what := fmt.Sprintf("the GEMV, %d sequences, graphs %v", seqs, graphs)
			errs := boundedSteps(t, what, got, refN)
			st := b.Stats()
			t.Logf("%s: %d norms folded, %d graph replays; steps' ‖Δ‖₂/‖ref‖₂: %.3g", what, st.NormFolds, st.GraphReplays, errs)
			if !graphs {
				if want := 2 * c.NumLayers * (steps - 1); st.NormFolds < want {
					t.Errorf("%s: %d norms folded, want at least %d", what, st.NormFolds, want)
				}
				gemvDirect = got
				continue
			}
			if st.GraphReplays == 0 {
				t.Errorf("%s: no graph replayed", what)
			}
			for i := range gemvDirect {
				if !slices.Equal(gemvDirect[i], got[i]) {
					t.Errorf("%s, step %d: logits with graphs differ from direct launches (‖Δ‖₂/‖ref‖₂ = %.3g)", what, i, relL2(got[i], gemvDirect[i]))
				}
			}
		}
	}
}

// boundedSteps is each step's ‖got − ref‖₂/‖ref‖₂, checked against the
// bound the unfolded bf16 path is held to (TestGemmaMatchesCPU: the median
// step 1.5e-2, every step 4e-2).
func boundedSteps(t *testing.T, what string, got, ref [][]float32) []float64 {
	t.Helper()
	errs := make([]float64, len(ref))
	for i := range ref {
		errs[i] = relL2(got[i], ref[i])
	}
	sorted := slices.Sorted(slices.Values(errs))
	if med, worst := sorted[len(sorted)/2], sorted[len(sorted)-1]; !(med <= 1.5e-2 && worst <= 4e-2) {
		t.Errorf("%s: median step ‖Δ‖₂/‖ref‖₂ %.3g (limit 1.5e-2), worst %.3g (limit 4e-2)", what, med, worst)
	}
	return errs
}
