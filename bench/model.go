// Package bench measures kiln: the offline model benchmark (prompt processing
// and generation speed with their memory-bandwidth roofline, like
// llama-bench) and, later, load generation against servers.
//
// Invariant: every figure is measured in the run that reports it, including
// the machine limit it is compared with.
package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"kiln/backend/cpu/gemm"
	"kiln/engine"
	"kiln/model"
	"kiln/tensor"
)

// ModelOptions choose what RunModel measures.
type ModelOptions struct {
	PromptTokens int   // pp: tokens of one prompt (0: skip)
	GenTokens    int   // tg: tokens generated per sequence (0: skip)
	Batches      []int // sequences decoding together in tg
	// Depth is the context each tg sequence holds before it starts decoding
	// (a prompt of Depth random tokens, prefilled untimed), like
	// llama-bench's depth.
	Depth int
	Reps  int // repetitions of each test (at least 1)
	// WarmUp is how long each test's untimed warm-up lasts: its run is
	// repeated until this much time has passed (at least once). A GPU
	// under its power cap slows within a second or so of a heavy load
	// (the H200's prefill ran 9–13% faster before the cap acted), so one
	// short warm-up run leaves the first timed repetitions at the full
	// clock and lifts the mean.
	WarmUp time.Duration
	// MixedChunk, when set, adds to every generation-test step a prompt
	// chunk of this many tokens (a new sequence's whole prompt, freed after
	// the step), as a server's continuous batching mixes a new request's
	// prefill into the running decodes: the test is named
	// "tg128+pp256", and its figures are the decoded tokens' rate, the
	// prompt tokens' (PromptTokensPerSec) and the model FLOP/s of both.
	MixedChunk int
	Seed       uint64
	// Memory measures the bandwidth decode is compared with (nil: this
	// machine's host memory).
	Memory Memory
	// PeakFLOPS, when set, measures the device's large-GEMM rate in the
	// compute dtype (FLOP/s), which prompt processing is compared with; it
	// is called before each timed repetition.
	PeakFLOPS func() (float64, error)
	// DeviceTime, when set, is the device's cumulative busy time over the
	// steps run (stream time from a step's first operation to its last).
	DeviceTime func() time.Duration
	// Profile, when set, is called once per test (prefill and
	// generation), after its last timed repetition, with the test's label
	// and a function that runs ProfileSteps more steps (prefills), untimed:
	// the backend profiles what run runs.
	Profile func(label string, run func() error) error
	// WeightElemBytes is the width of a weight element as the backend holds
	// it (0: as stored in the file, FP8 matrices as the CPU's bf16);
	// KVElemBytes that of a KV-cache element
	// (0: 4, float32; an FP8 cache's is 1 whatever it says).
	WeightElemBytes, KVElemBytes int
	// FP8Weights: the backend holds FP8 matrices as they are stored, one
	// byte an element (else widened to two).
	FP8Weights bool
	// Blocks are the GGUF block formats the backend holds as stored (the
	// others at WeightElemBytes).
	Blocks []tensor.DType
	// WidenExperts: the backend holds a mixture of experts' matrices at
	// WeightElemBytes whatever their format (the GPU's expert kernels).
	WidenExperts bool
	// Progress, when set, is told each repetition as it starts ("pp512
	// batch 1: warm-up", "tg128 batch 4: 2 of 3").
	Progress func(test string)
	// Devices is the number of devices of a tensor-parallel group (0 or 1:
	// one), each like the one Memory and PeakFLOPS measure: the rooflines
	// are their sum (each device reads its share of the bytes).
	Devices int
}

// progress tells o.Progress that repetition i (0: the warm-up) of res's
// test starts.
func (o ModelOptions) progress(res ModelResult, i int) {
	if o.Progress == nil {
		return
	}
	rep := "warm-up"
	if i > 0 {
		rep = fmt.Sprintf("%d of %d", i, o.Reps)
	}
	o.Progress(fmt.Sprintf("%s batch %d: %s", res.Test, res.Batch, rep))
}

// warmUp runs run, untimed, until o.WarmUp has passed since it began
// (at least once), and notes the runs and their time in res.
func (o ModelOptions) warmUp(res *ModelResult, run func() error) error {
	start := time.Now()
	for {
		if err := run(); err != nil {
			return err
		}
		res.WarmUpRuns++
		if res.WarmUpSeconds = time.Since(start).Seconds(); res.WarmUpSeconds >= o.WarmUp.Seconds() {
			return nil
		}
	}
}

// devices is o.Devices, at least 1.
func (o ModelOptions) devices() float64 { return float64(max(1, o.Devices)) }

// Memory measures the memory bandwidth of the device a backend runs on.
type Memory interface {
	// CopyRate is the best copy bandwidth of reps passes, counted as bytes
	// read plus bytes written per second.
	CopyRate(reps int) float64
	// ReadRate is the best read-only bandwidth of reps passes (0: not
	// measured).
	ReadRate(reps int) float64
}

// ModelResult is one test's figures.
type ModelResult struct {
	Test         string    `json:"test"`  // "pp512", "tg128"
	Batch        int       `json:"batch"` // sequences per step
	Tokens       int       `json:"tokens"`
	TokensPerSec float64   `json:"tokens_per_s"`
	StdDev       float64   `json:"tokens_per_s_stddev"`
	Samples      []float64 `json:"samples_tokens_per_s"`
	// WarmUpRuns are the untimed runs before the samples
	// (ModelOptions.WarmUp), WarmUpSeconds their time.
	WarmUpRuns    int     `json:"warmup_runs"`
	WarmUpSeconds float64 `json:"warmup_s"`
	// FLOPS is prompt processing's model FLOP/s: the products' 2·N·K per
	// token (the logits' only for the last token) plus causal attention's
	// 4·heads·headDim per key, over the measured time; in a mixed test
	// (ModelOptions.MixedChunk) the decoded tokens' and the chunks'.
	FLOPS float64 `json:"flops_per_s,omitempty"`
	// PromptTokensPerSec is a mixed test's prompt tokens a second, beside
	// the decoded tokens of TokensPerSec.
	PromptTokensPerSec float64 `json:"prompt_tokens_per_s,omitempty"`
	// PeakFraction is the median over repetitions of each one's model
	// FLOP/s over the GEMM rate measured just before it (the device's
	// clocks drift as it warms, so each run is compared with its own
	// moment).
	PeakFraction float64 `json:"peak_fraction,omitempty"`
	// DeviceBusy is the fraction of a step's wall time (a decode step's, or
	// the whole prefill's) during which the device ran the step
	// (DeviceTime); the rest is spent outside it (host work, launches,
	// synchronisation): OutsideSeconds per step (per prefill).
	DeviceBusy     float64 `json:"device_busy_fraction,omitempty"`
	OutsideSeconds float64 `json:"outside_seconds_per_step,omitempty"`
	// BytesPerStep is the memory a decode step must read: the weights as
	// stored plus the KV cache of every sequence, averaged over the run.
	BytesPerStep float64 `json:"bytes_per_step,omitempty"`
	// Bandwidth is BytesPerStep × steps per second.
	Bandwidth float64 `json:"bytes_per_s,omitempty"`
	// Roofline is Bandwidth over the copy bandwidth (read+write traffic),
	// the median over repetitions of each repetition's ratio to the copy
	// bandwidth measured right before it.
	Roofline float64 `json:"roofline_fraction,omitempty"`
	// ReadFraction is the same against a plain SIMD read pass over a large
	// buffer (the most a read-only stream reached on this machine).
	ReadFraction float64 `json:"read_pass_fraction,omitempty"`
}

// ModelReport is the result of RunModel.
type ModelReport struct {
	Schema        string        `json:"schema"` // "kiln.bench.model/v1"
	Model         string        `json:"model"`
	Format        string        `json:"format"`
	Params        int64         `json:"params"`
	WeightBytes   int64         `json:"weight_bytes"`
	Backend       string        `json:"backend"`
	KVCache       string        `json:"kv_cache,omitempty"` // the KV cache's element type (fp8, f32, bf16, ...)
	Threads       int           `json:"threads"`
	CopyBandwidth float64       `json:"copy_bytes_per_s"`
	ReadBandwidth float64       `json:"read_bytes_per_s"`
	PeakFLOPS     float64       `json:"peak_flops_per_s,omitempty"`
	Date          string        `json:"date"`
	Results       []ModelResult `json:"results"`
}

// RunModel benchmarks e (built from m with at least max(Batches) sequences
// and a context of PromptTokens+1 and GenTokens+1).
func RunModel(e *engine.Engine, m *model.Model, backendName string, threads int, o ModelOptions) (*ModelReport, error) {
	if o.Reps < 1 {
		o.Reps = 1
	}
	r := rand.New(rand.NewPCG(o.Seed, 7))
	rep := &ModelReport{
		Schema: "kiln.bench.model/v1", Model: m.Path, Format: m.Format, Params: m.ParamCount(), WeightBytes: m.ParamBytes(),
		Backend: backendName, Threads: threads, Date: time.Now().UTC().Format(time.RFC3339),
	}
	mem := o.Memory
	if mem == nil {
		mem = newMemProbe(256 << 20)
	}
	rep.CopyBandwidth, rep.ReadBandwidth = mem.CopyRate(5), mem.ReadRate(5)
	randomTokens := func(n int) []int {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = r.IntN(e.Vocab())
		}
		return ids
	}
	if o.PromptTokens > 0 {
		prompt := randomTokens(o.PromptTokens)
		res := ModelResult{Test: fmt.Sprintf("pp%d", o.PromptTokens), Batch: 1, Tokens: o.PromptTokens}
		flopsPerToken := prefillFLOPsPerToken(m, o.PromptTokens)
		var peaks, fractions, busy, outside []float64
		// prefill times one prefill of the prompt: its wall time and the
		// device's busy time in it.
		prefill := func() (el, dev time.Duration, err error) {
			seq := e.NewSequence()
			defer e.Free(seq)
			var dev0 time.Duration
			if o.DeviceTime != nil {
				dev0 = o.DeviceTime()
			}
			start := time.Now()
			if _, err := e.Prefill(seq, prompt, false); err != nil {
				return 0, 0, err
			}
			el = time.Since(start)
			if o.DeviceTime != nil {
				dev = o.DeviceTime() - dev0
			}
			return el, dev, nil
		}
		o.progress(res, 0)
		if err := o.warmUp(&res, func() error { _, _, err := prefill(); return err }); err != nil {
			return nil, err
		}
		for i := 1; i <= o.Reps; i++ {
			o.progress(res, i)
			peak := 0.0
			if o.PeakFLOPS != nil {
				var err error
				if peak, err = o.PeakFLOPS(); err != nil {
					return nil, err
				}
			}
			el, dev, err := prefill()
			if err != nil {
				return nil, err
			}
			if o.DeviceTime != nil {
				busy = append(busy, dev.Seconds()/el.Seconds())
				outside = append(outside, (el - dev).Seconds())
			}
			rate := float64(o.PromptTokens) / el.Seconds()
			res.Samples = append(res.Samples, rate)
			if peak > 0 {
				peaks = append(peaks, peak)
				fractions = append(fractions, rate*flopsPerToken/(peak*o.devices()))
			}
		}
		if o.Profile != nil {
			err := o.Profile(res.Test, func() error {
				for range ProfileSteps {
					seq := e.NewSequence()
					_, err := e.Prefill(seq, prompt, false)
					e.Free(seq)
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		res.TokensPerSec, res.StdDev = meanStd(res.Samples)
		res.DeviceBusy, res.OutsideSeconds = median(busy), median(outside)
		res.FLOPS = res.TokensPerSec * flopsPerToken
		if len(peaks) > 0 {
			rep.PeakFLOPS, res.PeakFraction = median(peaks), median(fractions)
		}
		rep.Results = append(rep.Results, res)
	}
	if o.GenTokens > 0 {
		for _, batch := range o.Batches {
			res, err := benchDecode(e, m, batch, o, randomTokens, mem)
			if err != nil {
				return nil, err
			}
			rep.Results = append(rep.Results, res)
		}
	}
	return rep, nil
}

// ProfileSteps is how many steps ModelOptions.Profile runs.
const ProfileSteps = 5

// benchDecode starts batch sequences from one random token each and decodes
// GenTokens steps of one token per sequence.
func benchDecode(e *engine.Engine, m *model.Model, batch int, o ModelOptions, randomTokens func(int) []int, mem Memory) (ModelResult, error) {
	res := ModelResult{Test: fmt.Sprintf("tg%d", o.GenTokens), Batch: batch, Tokens: batch * o.GenTokens}
	if o.Depth > 0 {
		res.Test += fmt.Sprintf("@d%d", o.Depth)
	}
	chunk := o.MixedChunk
	if chunk > 0 {
		res.Test += fmt.Sprintf("+pp%d", chunk)
	}
	spec := e.KVSpec()
	kvElem := o.KVElemBytes
	switch {
	case spec.FP8:
		kvElem = 1
	case spec.F16:
		kvElem = 2
	case kvElem == 0:
		kvElem = 4
	}
	// Every rank of a group caches its share of the KV heads.
	kvPerToken := float64(2*spec.Layers*spec.KVHeads*spec.HeadDim*kvElem) * o.devices()
	items := make([]engine.Item, batch, batch+1)
	toks := make([]int, batch)
	// Greedy choice, on the device when the backend samples there (the
	// chunk's token is sampled too, as a prompt's last is).
	samplers := make([]*engine.Sampler, batch+1)
	for i := range samplers {
		samplers[i] = engine.NewSampler(engine.SamplingParams{}, e.Vocab(), nil)
	}
	// run decodes GenTokens steps of batch fresh sequences (each first
	// prefilled to Depth, untimed): the steps' wall time, the device's busy
	// time in them and the KV-cache bytes they read; with profile, then
	// o.Profile over ProfileSteps more steps.
	run := func(profile bool) (el, dev time.Duration, kvBytes float64, err error) {
		seqs := make([]*engine.Sequence, batch)
		defer func() {
			for _, s := range seqs {
				if s != nil {
					e.Free(s)
				}
			}
		}()
		for s := range seqs {
			seqs[s] = e.NewSequence()
			toks[s] = randomTokens(1)[0]
			if o.Depth > 0 {
				if _, err := e.Prefill(seqs[s], randomTokens(o.Depth), false); err != nil {
					return 0, 0, 0, err
				}
			}
		}
		var dev0 time.Duration
		if o.DeviceTime != nil {
			dev0 = o.DeviceTime()
		}
		step := func() error {
			items = items[:batch]
			for s := range items {
				items[s] = engine.Item{Seq: seqs[s], Tokens: toks[s : s+1]}
				kvBytes += float64(seqs[s].Len()+1) * kvPerToken
			}
			if chunk == 0 {
				ids, err := e.StepSample(items, samplers[:batch])
				copy(toks, ids)
				return err
			}
			prompt := e.NewSequence()
			defer e.Free(prompt)
			items = append(items, engine.Item{Seq: prompt, Tokens: randomTokens(chunk)})
			ids, err := e.StepSample(items, samplers)
			copy(toks, ids)
			return err
		}
		start := time.Now()
		for range o.GenTokens {
			if err := step(); err != nil {
				return 0, 0, 0, err
			}
		}
		el = time.Since(start)
		if o.DeviceTime != nil {
			dev = o.DeviceTime() - dev0
		}
		if profile {
			kv := kvBytes
			err := o.Profile(fmt.Sprintf("%s batch %d", res.Test, batch), func() error {
				for range ProfileSteps {
					if err := step(); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return 0, 0, 0, err
			}
			kvBytes = kv
		}
		return el, dev, kvBytes, nil
	}
	var roof, read, busy, outside []float64
	o.progress(res, 0)
	if err := o.warmUp(&res, func() error { _, _, _, err := run(false); return err }); err != nil {
		return res, err
	}
	for i := 1; i <= o.Reps; i++ {
		o.progress(res, i)
		var copyRate, readRate float64 // measured before each repetition (a mixed test has no roofline)
		if chunk == 0 {
			copyRate, readRate = mem.CopyRate(3)*o.devices(), mem.ReadRate(3)*o.devices()
		}
		el, dev, kvBytes, err := run(o.Profile != nil && i == o.Reps)
		if err != nil {
			return res, err
		}
		if o.DeviceTime != nil {
			busy = append(busy, dev.Seconds()/el.Seconds())
			outside = append(outside, (el-dev).Seconds()/float64(o.GenTokens))
		}
		rate := float64(batch*o.GenTokens) / el.Seconds()
		res.Samples = append(res.Samples, rate)
		if chunk > 0 {
			continue
		}
		res.BytesPerStep = float64(weightBytesPerStep(m, batch, o)) + kvBytes/float64(o.GenTokens)
		bw := res.BytesPerStep * rate / float64(batch)
		roof = append(roof, bw/copyRate)
		if readRate > 0 {
			read = append(read, bw/readRate)
		}
	}
	res.TokensPerSec, res.StdDev = meanStd(res.Samples)
	res.DeviceBusy, res.OutsideSeconds = median(busy), median(outside)
	if chunk > 0 {
		// A mixed step is bound by its arithmetic, not by what it reads:
		// its model FLOP/s instead of a roofline share. A decoded token
		// costs a prompt token of its context's length, less the causal
		// mean (the key count's half) and plus the logits.
		steps := res.TokensPerSec / float64(batch)
		res.PromptTokensPerSec = steps * float64(chunk)
		ctx := o.Depth + o.GenTokens/2
		decode := prefillFLOPsPerToken(m, 1) + 4*float64(m.Config.NumLayers*m.Config.NumHeads*m.Config.HeadDim)*float64(ctx)
		res.FLOPS = res.TokensPerSec*decode + res.PromptTokensPerSec*prefillFLOPsPerToken(m, chunk)
		return res, nil
	}
	res.Bandwidth = res.BytesPerStep * res.TokensPerSec / float64(batch)
	res.Roofline, res.ReadFraction = median(roof), median(read)
	return res, nil
}

// weightBytesPerStep is the weight memory one decode step reads: every
// matrix once, except that an untied embedding table is only gathered from
// (one row per sequence). o.WeightElemBytes is the width of an element as
// held (0: as stored); FP8 matrices take one byte an element when
// o.FP8Weights (held as stored), else two (widened to bf16 or f16);
// block-quantized ones of the formats o.Blocks as stored; a mixture's
// matrices at o.WeightElemBytes when o.WidenExperts. A mixture of experts' matrices count for the
// experts a step reads: E·(1−(1−K/E)^batch) of a layer's E, the expected
// number of distinct experts when rows route uniformly and independently
// (as random weights route them; expertShare).
func weightBytesPerStep(m *model.Model, batch int, o ModelOptions) int64 {
	elemBytes := o.WeightElemBytes
	size := func(t *tensor.Tensor) int64 {
		switch {
		case slices.Contains(o.Blocks, t.DType):
			return int64(len(t.Data))
		case t.DType == tensor.F8_E4M3 && o.FP8Weights:
			return t.Shape.Elements()
		case t.DType == tensor.F8_E4M3:
			return 2 * t.Shape.Elements()
		case elemBytes > 0:
			return t.Shape.Elements() * int64(elemBytes)
		}
		return int64(len(t.Data))
	}
	experts, mixture := expertNames(&m.Config), mixtureNames(&m.Config)
	share := expertShare(&m.Config, batch)
	var n int64
	for name, t := range m.Tensors {
		b := size(t)
		if o.WidenExperts && elemBytes > 0 && mixture[name] {
			b = t.Shape.Elements() * int64(elemBytes)
		}
		if experts[name] {
			n += int64(math.Round(share * float64(b)))
			continue
		}
		n += b
	}
	if !m.Config.TiedEmbeddings {
		if t, ok := m.Tensors[model.EmbedName]; ok {
			n -= size(t) - int64(batch)*(size(t)/int64(t.Shape[0]))
		}
	}
	return n
}

// expertNames is the set of a mixture of experts' routed matrices (not
// its router or shared expert).
func expertNames(c *model.Config) map[string]bool {
	out := map[string]bool{}
	for l := 0; l < c.NumLayers; l++ {
		for e := 0; e < c.NumExperts; e++ {
			g, u, d := c.MoEExpert(l, e)
			out[g], out[u], out[d] = true, true, true
		}
	}
	return out
}

// mixtureNames is the set of a mixture's matrices: its routed experts',
// its routers and its shared experts' (with their gates).
func mixtureNames(c *model.Config) map[string]bool {
	out := expertNames(c)
	if c.NumExperts == 0 {
		return out
	}
	for l := 0; l < c.NumLayers; l++ {
		out[c.MoERouter(l)] = true
		if c.SharedExpertSize > 0 {
			g, u, d := c.MoEShared(l)
			out[g], out[u], out[d] = true, true, true
			if c.SharedExpertGate {
				out[c.MoESharedGate(l)] = true
			}
		}
	}
	return out
}

// expertShare is the expected share of a layer's experts a step of batch
// rows reads, each row routed to K of E uniformly: 1−(1−K/E)^batch (1
// without experts).
func expertShare(c *model.Config, batch int) float64 {
	if c.NumExperts == 0 {
		return 1
	}
	return 1 - math.Pow(1-float64(c.ExpertsPerToken)/float64(c.NumExperts), float64(batch))
}

// prefillFLOPsPerToken is the model FLOPs per token of a t-token prompt: 2
// per weight of every product (the embedding table is a gather, and the
// logits are computed for the last token only; a token goes through K of
// a layer's E experts), plus causal attention's scores and weighted sum,
// 4·heads·headDim per key, (t+1)/2 keys on average.
func prefillFLOPsPerToken(m *model.Model, t int) float64 {
	c := m.Config
	experts := expertNames(&c)
	var mat float64
	for name, x := range m.Tensors {
		if len(x.Shape) == 2 && name != model.EmbedName && name != model.HeadName {
			if experts[name] {
				mat += float64(x.Shape.Elements()) * float64(c.ExpertsPerToken) / float64(c.NumExperts)
				continue
			}
			mat += float64(x.Shape.Elements())
		}
	}
	logits := float64(c.VocabSize) * float64(c.HiddenSize) / float64(t)
	attn := 4 * float64(c.NumLayers*c.NumHeads*c.HeadDim) * float64(t+1) / 2
	return 2*(mat+logits) + attn
}

func meanStd(xs []float64) (float64, float64) {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	if len(xs) < 2 {
		return mean, 0
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// memProbe measures this machine's memory bandwidth over buffers far larger
// than the caches, with one goroutine per core each taking its share: a copy
// (bytes read plus bytes written per second, as STREAM's Copy counts them)
// and a read-only SIMD pass. Each rate is the best of reps passes.
type memProbe struct {
	src, dst []byte
	workers  int
}

func newMemProbe(n int) *memProbe {
	p := &memProbe{src: make([]byte, n), dst: make([]byte, n), workers: runtime.GOMAXPROCS(0)}
	for i := range p.src {
		p.src[i] = byte(i)
	}
	copy(p.dst, p.src) // fault the pages in
	return p
}

// parallel runs f on each worker's share of [0, n) and returns the seconds.
func (p *memProbe) parallel(f func(lo, hi int)) float64 {
	n := len(p.src)
	chunk := (n/p.workers + 63) / 64 * 64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < p.workers; w++ {
		lo, hi := min(w*chunk, n), min((w+1)*chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
	return time.Since(start).Seconds()
}

// CopyRate implements Memory.
func (p *memProbe) CopyRate(reps int) float64 {
	best := 0.0
	for i := 0; i < reps; i++ {
		best = math.Max(best, 2*float64(len(p.src))/p.parallel(func(lo, hi int) { copy(p.dst[lo:hi], p.src[lo:hi]) }))
	}
	return best
}

// ReadRate implements Memory.
func (p *memProbe) ReadRate(reps int) float64 {
	floats := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(p.src))), len(p.src)/4)
	best := 0.0
	for i := 0; i < reps; i++ {
		secs := p.parallel(func(lo, hi int) {
			part := floats[lo/4 : hi/4]
			sink.Store(math.Float32bits(gemm.Dot(part, part))) // each line is read once
		})
		best = math.Max(best, float64(len(p.src))/secs)
	}
	return best
}

var sink atomic.Uint32
