package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/testmodel"
	"kiln/model"
	"kiln/tensor"
)

// TestRunModelReports checks the report's arithmetic on a tiny model: every
// requested test is present, rates are positive, and the bytes a decode step
// reads are the weights plus the KV cache it holds.
func TestRunModelReports(t *testing.T) {
	m, e := tinyEngine(t)
	rep, err := RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 16, GenTokens: 8, Batches: []int{1, 2}, Reps: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 || rep.Results[0].Test != "pp16" || rep.Results[1].Test != "tg8" || rep.Results[2].Batch != 2 {
		t.Fatalf("results %+v", rep.Results)
	}
	if rep.CopyBandwidth <= 0 || rep.ReadBandwidth <= 0 {
		t.Error("no copy or read bandwidth")
	}
	spec := e.KVSpec()
	kvPerToken := float64(2 * spec.Layers * spec.KVHeads * spec.HeadDim * 4)
	for _, r := range rep.Results {
		if r.TokensPerSec <= 0 || len(r.Samples) != 1 {
			t.Errorf("%s: %g tokens/s from %d samples", r.Test, r.TokensPerSec, len(r.Samples))
		}
		if r.Test[:2] != "tg" {
			continue
		}
		// Sequence lengths run 1..8 during the 8 steps: mean cache 4.5 tokens.
		emb := m.Tensors[model.EmbedName]
		weights := float64(m.ParamBytes() - int64(len(emb.Data)) + int64(r.Batch*len(emb.Data)/emb.Shape[0]))
		want := weights + float64(r.Batch)*4.5*kvPerToken
		if r.BytesPerStep != want {
			t.Errorf("%s batch %d: %g bytes per step, want %g", r.Test, r.Batch, r.BytesPerStep, want)
		}
		if r.Roofline <= 0 || r.ReadFraction <= 0 {
			t.Errorf("roofline %g, read-pass fraction %g", r.Roofline, r.ReadFraction)
		}
	}
}

func TestModelBudget(t *testing.T) {
	b, err := ParseModelBudget("[min_tokens_per_s]\n\"pp512\" = 100\n\"tg128 batch 1\" = 50\n\"tg64 batch 9\" = 1\n[min_roofline]\n\"tg128 batch 1\" = 0.5\n")
	if err != nil {
		t.Fatal(err)
	}
	r := &ModelReport{Results: []ModelResult{{Test: "pp512", Batch: 1, TokensPerSec: 120}, {Test: "tg128", Batch: 1, TokensPerSec: 40, Roofline: 0.6}}}
	var got []string
	for _, v := range b.Check(r) {
		got = append(got, fmt.Sprintf("%s=%v", v.Name, v.OK))
	}
	want := []string{"min_tokens_per_s pp512=true", "min_tokens_per_s tg128 batch 1=false", "min_tokens_per_s tg64 batch 9=false", "min_roofline tg128 batch 1=true"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("verdicts %v, want %v", got, want)
	}
	if _, err := ParseModelBudget("min_tokens = 3"); err == nil {
		t.Error("an unknown key was accepted")
	}
}

// tinyEngine is a CPU engine of 2 sequences on a random model of the tiny
// shape; tinySeqsEngine of seqs.
func tinyEngine(t *testing.T) (*model.Model, *engine.Engine) {
	t.Helper()
	return tinySeqsEngine(t, 2)
}

func tinySeqsEngine(t *testing.T, seqs int) (*model.Model, *engine.Engine) {
	t.Helper()
	dir := t.TempDir()
	if err := WriteRandomModel(dir, Shapes["tiny"], tensor.BF16, 1); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if m.Config.DType != tensor.BF16 || m.Config.TiedEmbeddings {
		t.Fatalf("random model is %v tied=%v", m.Config.DType, m.Config.TiedEmbeddings)
	}
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 32, MaxSeqs: seqs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return m, e
}

// TestPeakFractionPerRepetition checks that prompt processing is compared
// with a GEMM rate measured before each timed repetition: the fraction is
// the median of the repetitions' own ratios, and the reported rate the
// median of the measurements.
func TestPeakFractionPerRepetition(t *testing.T) {
	m, e := tinyEngine(t)
	peaks := []float64{1e12, 4e12, 2e12}
	calls := 0
	peak := func() (float64, error) {
		calls++
		return peaks[(calls-1)%len(peaks)], nil
	}
	rep, err := RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 16, Reps: 3, PeakFLOPS: peak})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Fatalf("the GEMM was measured %d times for 3 repetitions", calls)
	}
	r := rep.Results[0]
	per := prefillFLOPsPerToken(m, 16)
	var fr []float64
	for i, s := range r.Samples {
		fr = append(fr, s*per/peaks[i])
	}
	if want := median(fr); r.PeakFraction != want {
		t.Errorf("peak fraction %g, want the median of %v", r.PeakFraction, fr)
	}
	if rep.PeakFLOPS != 2e12 {
		t.Errorf("peak %g, want the median 2e12", rep.PeakFLOPS)
	}
	if _, err := RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 16, Reps: 1,
		PeakFLOPS: func() (float64, error) { return 0, fmt.Errorf("no device") }}); err == nil {
		t.Error("a failed GEMM measurement was not reported")
	}
}

// TestPrefillDeviceBusy: the prompt-processing test reports the share of
// each timed prefill's wall time the device reported (here a clock running
// at half speed: about half), and the rest, per prefill, as outside.
func TestPrefillDeviceBusy(t *testing.T) {
	m, e := tinyEngine(t)
	t0 := time.Now()
	half := func() time.Duration { return time.Since(t0) / 2 }
	rep, err := RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 16, Reps: 3, DeviceTime: half})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Results[0]
	if r.DeviceBusy < 0.45 || r.DeviceBusy > 0.6 {
		t.Errorf("device busy %g of a prefill, want about 0.5", r.DeviceBusy)
	}
	// Against the median prefill, as OutsideSeconds is a median: the mean
	// rate of three prefills of ~0.2 ms moves with one slow one (CI saw
	// 0.61 of the mean's prefill).
	secs := make([]float64, len(r.Samples))
	for i, rate := range r.Samples {
		secs[i] = 16 / rate
	}
	if per := median(secs); r.OutsideSeconds < 0.3*per || r.OutsideSeconds > 0.6*per {
		t.Errorf("%g s outside a prefill of about %g s, want about half", r.OutsideSeconds, per)
	}
	if rep, err = RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 16, Reps: 1}); err != nil || rep.Results[0].DeviceBusy != 0 {
		t.Errorf("without a device clock: busy %v, %v", rep.Results[0].DeviceBusy, err)
	}
}

// TestProfileHook checks that ModelOptions.Profile is called once per
// generation test, after its timed repetitions, with the test's label, and
// that the steps it runs succeed within the cache the tests size.
func TestProfileHook(t *testing.T) {
	m, e := tinyEngine(t)
	var labels []string
	var device time.Duration // the profiled steps' device time only
	o := ModelOptions{GenTokens: 8, Batches: []int{1, 2}, Reps: 2, Profile: func(label string, run func() error) error {
		labels = append(labels, label)
		device += time.Hour
		return run()
	}, DeviceTime: func() time.Duration { return device }}
	rep, err := RunModel(e, m, "cpu", 0, o)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"tg8 batch 1", "tg8 batch 2"}; !slices.Equal(labels, want) {
		t.Errorf("profiled %q, want %q", labels, want)
	}
	plain := o
	plain.Profile = nil
	base, err := RunModel(e, m, "cpu", 0, plain)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rep.Results {
		if len(r.Samples) != 2 {
			t.Errorf("%s batch %d: %d timed samples, want 2", r.Test, r.Batch, len(r.Samples))
		}
		// The profiled steps count in no figure.
		if r.BytesPerStep != base.Results[i].BytesPerStep || r.DeviceBusy != 0 {
			t.Errorf("%s batch %d: %g bytes a step (%g unprofiled), device busy %g (want 0)", r.Test, r.Batch, r.BytesPerStep, base.Results[i].BytesPerStep, r.DeviceBusy)
		}
	}
	o.Profile = func(string, func() error) error { return fmt.Errorf("profiler broke") }
	if _, err := RunModel(e, m, "cpu", 0, o); err == nil || !strings.Contains(err.Error(), "profiler broke") {
		t.Errorf("a failing profile gave %v", err)
	}
}

// TestModelProgress: ModelOptions.Progress hears of every repetition of
// every test, the warm-ups included, in order.
func TestModelProgress(t *testing.T) {
	m, e := tinyEngine(t)
	var got []string
	if _, err := RunModel(e, m, "cpu", 0, ModelOptions{PromptTokens: 8, GenTokens: 2, Batches: []int{1, 2}, Reps: 2, Progress: func(s string) { got = append(got, s) }}); err != nil {
		t.Fatal(err)
	}
	want := []string{"pp8 batch 1: warm-up", "pp8 batch 1: 1 of 2", "pp8 batch 1: 2 of 2",
		"tg2 batch 1: warm-up", "tg2 batch 1: 1 of 2", "tg2 batch 1: 2 of 2",
		"tg2 batch 2: warm-up", "tg2 batch 2: 1 of 2", "tg2 batch 2: 2 of 2"}
	if !slices.Equal(got, want) {
		t.Errorf("progress\n got %q\nwant %q", got, want)
	}
}

// TestWarmUpLasts: each test's warm-up repeats its run until
// ModelOptions.WarmUp has passed, and without one runs it once; the
// warm-up runs are not among the samples.
func TestWarmUpLasts(t *testing.T) {
	m, e := tinyEngine(t)
	for _, warm := range []time.Duration{0, 60 * time.Millisecond} {
		var runs int               // the DeviceTime calls of the test now warming up: two a run
		var began time.Time        // when its warm-up began
		var warmRuns []int         // each test's warm-up runs
		var warmed []time.Duration // and how long they took
		o := ModelOptions{PromptTokens: 8, GenTokens: 2, Batches: []int{1, 2}, Reps: 2, WarmUp: warm,
			DeviceTime: func() time.Duration { runs++; return 0 },
			Progress: func(s string) {
				switch {
				case strings.HasSuffix(s, "warm-up"):
					runs, began = 0, time.Now()
				case strings.HasSuffix(s, "1 of 2"):
					warmRuns, warmed = append(warmRuns, runs/2), append(warmed, time.Since(began))
				}
			}}
		rep, err := RunModel(e, m, "cpu", 0, o)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rep.Results {
			if len(r.Samples) != 2 {
				t.Errorf("warm-up %v, %s batch %d: %d samples, want 2", warm, r.Test, r.Batch, len(r.Samples))
			}
			if i < len(warmRuns) && (r.WarmUpRuns != warmRuns[i] || r.WarmUpSeconds < warm.Seconds() || r.WarmUpSeconds > warmed[i].Seconds()) {
				t.Errorf("warm-up %v, %s batch %d: reported %d runs in %.3f s, counted %d in %v", warm, r.Test, r.Batch,
					r.WarmUpRuns, r.WarmUpSeconds, warmRuns[i], warmed[i])
			}
		}
		if len(warmRuns) != 3 {
			t.Fatalf("warm-up %v: %d tests warmed up, want 3", warm, len(warmRuns))
		}
		for i, n := range warmRuns {
			switch {
			case warm == 0 && n != 1:
				t.Errorf("no warm-up time, test %d: %d warm-up runs, want 1", i, n)
			case warm > 0 && (warmed[i] < warm || n < 2):
				// A tiny model's prefill of 8 tokens or 2 decode steps take
				// well under the 60 ms: several runs.
				t.Errorf("warm-up %v, test %d: %d runs in %v", warm, i, n, warmed[i])
			}
		}
	}
}

// TestExpertBytes: a mixture of experts' decode roofline counts the experts
// a step is expected to read, and its prefill FLOPs the K of E a token
// goes through; the router and the rest count whole.
func TestExpertBytes(t *testing.T) {
	c := model.Config{Arch: "mixtral", HiddenSize: 16, IntermediateSize: 8, NumLayers: 2, NumHeads: 2, NumKVHeads: 2, HeadDim: 8,
		VocabSize: 32, MaxPositions: 64, RMSNormEps: 1e-5, RopeTheta: 10000, NumExperts: 8, ExpertsPerToken: 2, TiedEmbeddings: true}
	m := testmodel.Zeros(c)
	expertBytes, other := int64(0), int64(0)
	experts := expertNames(&c)
	for name, x := range m.Tensors {
		if experts[name] {
			expertBytes += int64(len(x.Data))
		} else {
			other += int64(len(x.Data))
		}
	}
	if len(experts) != 2*8*3 || expertBytes == 0 {
		t.Fatalf("%d expert matrices of %d bytes", len(experts), expertBytes)
	}
	for _, batch := range []int{1, 4, 64} {
		share := 1 - math.Pow(1-2.0/8, float64(batch))
		want := other + int64(math.Round(share*float64(expertBytes)))
		if got := weightBytesPerStep(m, batch, ModelOptions{}); got < want-int64(len(experts)) || got > want+int64(len(experts)) {
			t.Errorf("batch %d: %d bytes a step, want %d (experts' share %.3f)", batch, got, want, share)
		}
	}
	// The GPU widens a mixture's matrices whatever their format (here F32
	// held as stored, the experts and routers at 2 bytes).
	router := int64(0)
	for l := 0; l < c.NumLayers; l++ {
		router += int64(len(m.Tensors[c.MoERouter(l)].Data))
	}
	widened := ModelOptions{WeightElemBytes: 2, WidenExperts: true, Blocks: []tensor.DType{tensor.F32}}
	for _, batch := range []int{1, 64} {
		share := 1 - math.Pow(1-2.0/8, float64(batch))
		want := other - router/2 + int64(math.Round(share*float64(expertBytes/2)))
		if got := weightBytesPerStep(m, batch, widened); got < want-int64(len(experts)) || got > want+int64(len(experts)) {
			t.Errorf("widened, batch %d: %d bytes a step, want %d", batch, got, want)
		}
	}
	// A random shape with experts is written in Mixtral's layout and runs.
	dir := t.TempDir()
	sh := Shape{Name: "tiny-moe", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 32, Vocab: 256, Context: 128, Experts: 4, ExpertsPerToken: 2}
	if err := WriteRandomModel(dir, sh, tensor.F32, 1); err != nil {
		t.Fatal(err)
	}
	rm, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	if rc := rm.Config; rc.Arch != "mixtral" || rc.NumExperts != 4 || rc.ExpertsPerToken != 2 || !rc.NormTopK {
		t.Fatalf("random experts read back as %+v", rc)
	}
	e, err := engine.New(rm, &cpu.Backend{}, engine.Options{MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := RunModel(e, rm, "cpu", 0, ModelOptions{PromptTokens: 8, GenTokens: 4, Batches: []int{1, 4}, Reps: 1}); err != nil {
		t.Fatalf("bench of a random mixture of experts: %v", err)
	}
	dense := c
	dense.NumExperts = 0
	if s := expertShare(&dense, 7); s != 1 {
		t.Errorf("share of a dense model %g", s)
	}
}

// TestRandomLongContext: the llama3.1-8b shape's config says its context
// and llama3 scaling, read back as Llama 3.1's (checked on a small copy of
// it: the same config, tiny widths).
func TestRandomLongContext(t *testing.T) {
	s := Shapes["llama3.1-8b"]
	s.Hidden, s.Layers, s.Heads, s.KVHeads, s.FFN, s.Vocab = 64, 1, 4, 2, 32, 128
	c := writtenConfig(t, s)
	if c.MaxPositions != 131072 || c.RopeTheta != 500000 || c.RopeScaling.Type != "llama3" || c.RopeScaling.Factor != 8 ||
		c.RopeScaling.OriginalMaxPositions != 8192 {
		t.Fatalf("config %+v", c)
	}
}

// TestTPRankShapes: the shapes one rank of llama3-8b holds at TP=2 and 4
// divide its heads, KV heads, MLP and vocabulary and keep its head width,
// which the written config.json states (head_dim) and the loader reads.
func TestTPRankShapes(t *testing.T) {
	full := Shapes["llama3-8b"]
	for n, name := range map[int]string{2: "llama3-8b-tp2-rank", 4: "llama3-8b-tp4-rank"} {
		s := Shapes[name]
		if s.Hidden != full.Hidden || s.Layers != full.Layers || s.Heads*n != full.Heads || s.KVHeads*n != full.KVHeads ||
			s.FFN*n != full.FFN || s.Vocab*n != full.Vocab || s.HeadDim != full.Hidden/full.Heads {
			t.Errorf("%s: %+v is not a 1/%d of %+v", name, s, n, full)
		}
	}
	s := Shapes["llama3-8b-tp4-rank"]
	s.Hidden, s.Layers, s.HeadDim, s.FFN, s.Vocab = 64, 1, 16, 32, 128
	if c := writtenConfig(t, s); c.HeadDim != 16 || c.NumHeads != 8 || c.NumKVHeads != 2 {
		t.Fatalf("config %+v: want 8 heads of 16, 2 KV heads", c)
	}
}

// writtenConfig writes a random f32 model of shape s and returns the
// config the loader reads back from it.
func writtenConfig(t *testing.T, s Shape) model.Config {
	t.Helper()
	dir := t.TempDir()
	if err := WriteRandomModel(dir, s, tensor.F32, 1); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.Config
}

// TestMixedSteps: with MixedChunk every generation step also prefills a
// new prompt of that many tokens: the test is named for it, its prompt
// rate is the chunk per step, its FLOP/s counts both kinds of token, and
// no roofline is claimed (such a step is bound by its arithmetic); every
// chunk's sequence is freed.
func TestMixedSteps(t *testing.T) {
	m, e := tinySeqsEngine(t, 3)
	free := e.FreeBlocks()
	rep, err := RunModel(e, m, "cpu", 0, ModelOptions{GenTokens: 4, Batches: []int{2}, Depth: 3, Reps: 1, MixedChunk: 12})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Results[0]
	if r.Test != "tg4@d3+pp12" || r.Batch != 2 {
		t.Fatalf("result %+v", r)
	}
	if got, want := r.PromptTokensPerSec, 6*r.TokensPerSec; math.Abs(got-want) > 1e-9*want || got <= 0 {
		t.Errorf("prompt tokens/s %g, want 12 a step beside 2 decoded: %g", got, want)
	}
	if r.FLOPS <= 0 || r.Roofline != 0 || r.BytesPerStep != 0 {
		t.Errorf("FLOP/s %g, roofline %g, bytes a step %g", r.FLOPS, r.Roofline, r.BytesPerStep)
	}
	if e.FreeBlocks() != free {
		t.Errorf("%d blocks free after the test, %d before", e.FreeBlocks(), free)
	}
}
