// Package cuda is kiln's NVIDIA GPU backend: the compiled graph's weights are
// uploaded once (converted to the GPU's compute dtype), each plan's memory
// plan becomes one device arena, and a step runs the plan's nodes as kernels
// of backend/cuda/kernels and cuBLASLt products, on one stream, from the
// device's worker thread.
//
// Activations, weight matrices and the KV cache are in the compute dtype
// (bf16 by default, f16 for f16 checkpoints, f32 on request); norm weights,
// biases and RoPE tables are f32; math is f32 throughout. The logits come
// back as f32.
package cuda

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kiln/backend"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
	"kiln/tensor"
	"kiln/tune"
)

// Backend is the CUDA target of one device.
type Backend struct {
	// Trials, when set (a tuner's child process: kiln tune), journals
	// each candidate's check and timings in a first-use race, and bars
	// those that killed an earlier child (tune.Supervise).
	Trials *tune.Trials
	Device *cu.Device
	// DType is the compute dtype (ParseDType); under "auto" (or "") bf16, or
	// f16 for an f16 checkpoint.
	DType string
	// Progress receives the weight-upload progress line; nil: none.
	Progress io.Writer
	// NoGraphs launches decode steps kernel by kernel instead of replaying
	// captured CUDA graphs (for comparisons).
	NoGraphs bool
	// NoPDL launches every kernel plainly instead of as programmatic
	// dependent launches (Hopper: a kernel is scheduled while the previous
	// one finishes), for comparisons.
	NoPDL bool
	// ExternalDir, when set, holds external kernels
	// (kernels.ReadExternal; docs/EXTERNAL_KERNELS.md): each compiled for
	// the device at Load and offered to the first-use races of the
	// products it takes, verified against the default before it is timed.
	ExternalDir string
	// Products chooses the kernel of products: "" measures, per shape,
	// GEMV against cuBLASLt for at most kernels.GEMVMaxT rows (beyond
	// kernels.GEMVVectorMaxT rows per power-of-two bucket), and cuBLASLt's
	// candidate algorithms from kernels.GEMVVectorMaxT+1 rows (per
	// power-of-two bucket of rows), keeping the fastest; "gemv" takes GEMV wherever it applies,
	// "cublaslt" never takes it, and both take cuBLASLt's first algorithm
	// (for tests and comparisons that need the same kernels every run);
	// "external" takes the first external kernel that takes a product and
	// passes its check against cuBLASLt (for tests of external kernels).
	Products string
	// VectorWay, when set (KILN_CUDA_VECTOR_WAY: kernels.WayCUDACores or
	// kernels.WayTensorCores), runs every product of at most
	// kernels.GEMVVectorMaxT rows that the GEMV takes that way, untimed.
	VectorWay string
	// NoEpilogues runs the ops that take a GEMV's product apart (SwiGLU;
	// RoPE with the cache writes) as kernels of their own instead of in the
	// GEMV's epilogue, for comparisons.
	NoEpilogues bool
	// poisonExpertScratch fills the experts' scratch with NaN before each
	// mixture layer (tests: nothing but what the step widens may be read).
	poisonExpertScratch bool
	// ExpertBlocks keeps a mixture's experts' matrices of GGUF files in
	// their blocks on the device, widened a step at a time into one
	// layer's scratch (moe.go), instead of widening them at upload: a
	// third of the memory, at about half the speed (docs/PERF.md, issue
	// 16), so off by default.
	ExpertBlocks bool
	// NoFoldNorms runs the bf16 RMSNorms before the Q/K/V and gate/up
	// products as kernels of their own instead of folding them into the
	// products around them (normfold.go), for comparisons.
	NoFoldNorms bool
	// NoFP8 widens FP8 (E4M3) matrices to the compute dtype as they are
	// uploaded instead of keeping them in E4M3 for FP8 products (compute
	// capability 8.9 on), for comparisons.
	NoFP8 bool
	// WidenBlocks widens GGUF block-quantized matrices to the compute dtype
	// as they are uploaded instead of keeping them in their blocks (and
	// dequantizing them for each product), for comparisons.
	WidenBlocks bool
	// FixedDecodePlan keeps kernels.PlanDecode's split for decode attention
	// instead of timing the candidates (kernels.DecodePlans) on first use of
	// each batch shape and context bucket, for tests that compare runs bit
	// for bit.
	FixedDecodePlan bool
	// HostSampling leaves token choice to the host (the executables do not
	// offer RunSample), for comparisons.
	HostSampling bool
	// Timing records events around every step and adds the device time
	// between them to Stats.DeviceTime.
	Timing bool
	// Profile runs steps (decode steps without their graphs) node by node
	// with an event after each kernel (behind a hold of the stream, so that
	// launches leave no gaps) and adds each kernel's time to
	// Stats.Profile; for `kiln bench model --profile`.
	Profile bool

	// OnRace, when set, is called after each first-use race with its line
	// (the candidates' times, those rejected and why, the one kept) and
	// the counts so far: kiln tune's progress.
	OnRace func(line string, so RaceCounts)

	// Tune is how the choices timed at first use are kept across starts
	// (tune.Cached, the default when "", tune.Off or tune.Full; tuned.go), in
	// TuneDir (default tune.DefaultDir()); tune.Defaults times nothing and
	// takes every race's default (cuBLASLt's first algorithm for the
	// products, the first decode plan and prefill build).
	Tune, TuneDir string

	// Comm is the device's rank in a tensor-parallel group (cu.NewComms),
	// for graphs sharded with compile.Options.Shard: their collectives run
	// through it on the step's stream (and in its captured graphs). Nil:
	// none.
	Comm *cu.Comm
	// Peers, set by OpenGroup where the group's devices reach each other's
	// memory, runs the all-reduces of up to its CapBytes a rank as one
	// kernel over peer memory (kernels.PeerAllReduce) instead of NCCL's.
	// Nil: NCCL's.
	Peers *kernels.PeerGroup

	stats        Stats
	profIndex    map[string]int // Stats.Profile's entry of each name
	tuneOnce     sync.Once
	tuned        *tune.Cache
	tuneInMemory bool            // the tune cache is an artifact's (StartFrom): never written
	races        atomic.Int64    // first-use races run (JITWork, Stats.Raced.Races)
	graphWork    [3]atomic.Int64 // steps, graph captures and replays (GraphWork, Stats)
}

// GraphWork counts b's steps since it opened, the CUDA graphs it captured
// and the steps it replayed from one (the rest ran kernel by kernel), as
// Stats does. Safe to call from any goroutine.
func (b *Backend) GraphWork() (steps, captures, replays int64) {
	return b.graphWork[0].Load(), b.graphWork[1].Load(), b.graphWork[2].Load()
}

// RaceCounts counts first-use races: the races run, the candidates they
// tried (defaults included) and those rejected (wrong results, failed
// launches), the rest timed.
type RaceCounts struct{ Races, Candidates, Rejected int }

// Stats counts how steps were launched.
type Stats struct {
	Steps         int // steps run
	GraphReplays  int // decode steps replayed from a captured graph
	GraphCaptures int // graphs captured
	GraphFailures int // captures that failed (those compositions run directly)
	// WorkspaceGrowths counts the decode attention workspace's
	// allocations: one at a reservation (ReserveSteps), and one for each
	// step that then needed more (none, when the reservation covers every
	// step).
	WorkspaceGrowths int
	// Epilogues counts the launches (captures included) of a GEMV with the
	// op reading its product in its epilogue.
	Epilogues int
	// NormFolds counts the norms (launches, captures included) folded into
	// the products after them (normfold.go): no kernel of their own.
	NormFolds int
	// FP8Scaled counts the FP8 products (launches, captures included)
	// whose scales their reader applied (no pass of their own), FP8Written
	// the activations a kernel wrote in FP8 form for the FP8 product after
	// it (no quantization of their own).
	FP8Scaled, FP8Written int
	// SampledShares counts the sampled steps of a tensor-parallel rank
	// that chose the ids of its share of the rows alone, from the rows the
	// step's peer scatter brought it (kernels.PeerScatterRows).
	SampledShares int
	// PeerNorms counts the all-reduces (launches, captures included) that
	// ran the residual add and RMSNorm after them in their kernel
	// (peernorm.go).
	PeerNorms   int
	LastFailure error // the latest capture failure
	// FP8Matrices counts the matrices loads kept in E4M3 on the device
	// (Backend.FP8), BlockMatrices those kept in GGUF blocks.
	FP8Matrices, BlockMatrices int
	// ExpertScratch is the device memory loads set aside for a layer's
	// experts widened a step at a time (Backend.ExpertBlocks).
	ExpertScratch int64
	// DeviceTime is the stream time from a step's first operation (the
	// batch's upload) to its last (the logits' copy), summed over steps run
	// with Timing.
	DeviceTime time.Duration
	// Raced counts the first-use races and their candidates.
	Raced RaceCounts
	// Uploaded is the bytes of weights Load copied to the device, in
	// UploadTime; KernelTime is the time the kernels took to come from the
	// kernel cache or NVRTC, alongside (both summed over Loads).
	Uploaded               int64
	UploadTime, KernelTime time.Duration
	// Compiles lists the modules Load compiled (not found in the kernel
	// cache or an artifact), each with NVRTC's time.
	Compiles []string
	// Choices lists the product shapes timed on both the skinny GEMV and
	// cuBLASLt, and the decode attention splits timed, with the times and
	// the one kept, in the order first met.
	Choices []string
	// Profile is the device time of each kernel over the ProfileSteps
	// steps run with Backend.Profile, in the order first met.
	Profile      []ProfileEntry
	ProfileSteps int
}

// Stats returns the launch counters of everything loaded on b.
func (b *Backend) Stats() Stats {
	s := b.stats
	steps, captures, replays := b.GraphWork()
	s.Steps, s.GraphCaptures, s.GraphReplays = int(steps), int(captures), int(replays)
	s.Raced = b.raceCounts()
	s.Profile = append([]ProfileEntry(nil), s.Profile...)
	return s
}

// Available reports why no CUDA device can be used, or nil.
func Available() error {
	if err := cu.Available(); err != nil {
		return err
	}
	if err := cu.NVRTCAvailable(); err != nil {
		return err
	}
	if err := cu.BlasLtAvailable(); err != nil {
		return err
	}
	n, err := cu.DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("cuda: no device")
	}
	return nil
}

// Open opens device ordinal for a backend of compute dtype dtype.
func Open(ordinal int, dtype string) (*Backend, error) {
	if _, _, err := ParseDType(dtype); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	way := os.Getenv("KILN_CUDA_VECTOR_WAY")
	if way != "" && way != kernels.WayCUDACores && way != kernels.WayTensorCores {
		return nil, fmt.Errorf("KILN_CUDA_VECTOR_WAY %q: want %q or %q", way, kernels.WayCUDACores, kernels.WayTensorCores)
	}
	d, err := cu.Open(ordinal)
	if err != nil {
		return nil, err
	}
	return &Backend{Device: d, DType: dtype, VectorWay: way}, nil
}

// Close releases the device. Everything loaded on it must be closed first.
func (b *Backend) Close() error { return b.Device.Close() }

// ParseDType reads a compute dtype: "auto" (or ""), "bf16", "f16" or "f32"
// (also spelled bfloat16, float16/fp16, float32/fp32).
func ParseDType(s string) (dt cu.DType, auto bool, err error) {
	switch s {
	case "", "auto":
		return cu.BF16, true, nil
	case "bf16", "bfloat16":
		return cu.BF16, false, nil
	case "f16", "float16", "fp16":
		return cu.F16, false, nil
	case "f32", "float32", "fp32":
		return cu.F32, false, nil
	}
	return 0, false, fmt.Errorf("dtype %q: want auto, bf16, f16 or f32", s)
}

// Name implements compile.Target.
func (b *Backend) Name() string { return "cuda" }

// Supports implements compile.Target: every op the kernels implement.
// Stacked projections (Split) suit the GPU: one product instead of three.
func (b *Backend) Supports(op ir.Op) bool {
	switch op {
	case ir.Tokens, ir.Positions, ir.Weight, ir.Const, ir.Embed, ir.RMSNorm, ir.MatMul, ir.Add, ir.AddBias,
		ir.SiLU, ir.Mul, ir.RoPE, ir.KVWrite, ir.Attention, ir.SelectRows, ir.AddRMSNorm, ir.SwiGLU,
		ir.RoPEKVWrite, ir.Split, ir.SwiGLUPacked, ir.RoPEQKVWrite, ir.MatMulBias, ir.GELUTanh, ir.SoftCap, ir.MoE:
		return true
	case ir.AllReduce, ir.AllGather:
		return b.Comm != nil
	}
	return false
}

// FP8 reports whether FP8 (E4M3) matrices stay E4M3 on the device for a
// graph of compute dtype act: on devices of compute capability 8.9 on,
// under f16 or bf16, unless NoFP8.
func (b *Backend) FP8(act cu.DType) bool {
	return !b.NoFP8 && b.Device.FP8() && act != cu.F32
}

// StacksLazily implements compile.LazyStacker: the upload copies each
// matrix of a stack (Q/K/V, gate/up) to its rows of the device's copy, so
// the graph compiler makes no host copy of the stack (for the Llama-3-8B
// shape 9 GB, which took the start 10 s: docs/PERF.md, Tuning, session
// 19).
func (b *Backend) StacksLazily() bool { return true }

// ComputeDType is the compute dtype for a graph: the requested one, or
// under "auto" f16 when the weight matrices are f16 and bf16 otherwise.
func (b *Backend) ComputeDType(g *ir.Graph) cu.DType {
	dt, auto, _ := ParseDType(b.DType)
	if !auto {
		return dt
	}
	f16, other := 0, 0
	for _, n := range g.Nodes {
		if n.Op == ir.Weight && len(n.Attrs.Tensor.Shape) == 2 {
			if n.Attrs.Tensor.DType == tensor.F16 {
				f16++
			} else {
				other++
			}
		}
	}
	if f16 > 0 && other == 0 {
		return cu.F16
	}
	return cu.BF16
}

// Load implements backend.Backend: compiles (or loads from the kernel cache)
// the kernels of the compute dtype and uploads the weights.
func (b *Backend) Load(c *compile.Compiled) (backend.Loaded, error) {
	if _, _, err := ParseDType(b.DType); err != nil {
		return nil, err
	}
	// hd is the graph's one head dim (0 when its layers differ): the
	// module then holds that head dim's attention kernels alone.
	hd := -1
	for _, n := range c.Graph.Nodes {
		if n.Op == ir.MoE { // what the expert kernels take, before any upload
			if err := moeShape(n).Check(); err != nil {
				return nil, err
			}
		}
		if n.Op == ir.Attention {
			if err := checkHeadDim(n.Attrs.HeadDim); err != nil {
				return nil, err
			}
			if hd == -1 || hd == n.Attrs.HeadDim {
				hd = n.Attrs.HeadDim
			} else {
				hd = 0
			}
		}
	}
	hd = max(hd, 0)
	act := b.ComputeDType(c.Graph)
	lt, err := b.Device.NewBlasLt(32 << 20)
	if err != nil {
		return nil, err
	}
	stream, err := b.Device.NewStream()
	if err != nil {
		lt.Close()
		return nil, err
	}
	l := &loaded{b: b, dev: b.Device, lt: lt, stream: stream, act: act, compiled: c, gemvChoice: map[mmKey]productWay{}, algoChoice: map[algoKey]string{},
		moeTables:    map[*ir.Node]cu.Ptr{},
		moeWiden:     map[*ir.Node][]kernels.ExpertTable{},
		decodeChoice: map[decodeKey]kernels.DecodePlan{}, prefillChoice: map[prefillKey]string{}, normChoice: map[normKey]bool{}, fp8: b.FP8(act)}
	// The kernels compile (or come from the kernel cache) while the weights
	// upload: on a cold cache a start takes the longer of the two, not
	// their sum.
	mods := make(chan compiledModules, 1)
	go func() {
		start := time.Now()
		m := compileModules(b.Device, act, hd, c.KVBlockSize)
		m.took = time.Since(start)
		mods <- m
	}()
	start := time.Now()
	uploaded, upErr := l.uploadWeights(b.Progress)
	if upErr == nil {
		upErr = l.uploadMoETables()
	}
	b.stats.Uploaded += uploaded
	b.stats.UploadTime += time.Since(start)
	var m compiledModules
	select {
	case m = <-mods:
	default: // the weights are up, the kernels still compiling: say so
		if b.Progress != nil {
			fmt.Fprintf(b.Progress, "\r\033[Kcompiling the kernels for %s (NVRTC, once: they are cached for the next start)...", b.Device.Name)
		}
		m = <-mods
		if b.Progress != nil {
			fmt.Fprint(b.Progress, "\r\033[K")
		}
	}
	b.stats.KernelTime += m.took
	if upErr != nil || m.err != nil {
		m.close()
		l.Close()
		return nil, cmp.Or(upErr, m.err)
	}
	l.k, l.gemv, l.smp = m.k, m.gemv, m.smp // gemv nil: every product goes through cuBLASLt
	l.k.PDL = !b.NoPDL
	if l.gemv != nil {
		l.gemv.PDL = !b.NoPDL
	}
	if m.gemvErr != nil {
		b.stats.Choices = append(b.stats.Choices, fmt.Sprintf("every product on cuBLASLt: %v", m.gemvErr))
	}
	for _, m := range m.modules() {
		if !m.Hit {
			b.stats.Compiles = append(b.stats.Compiles, fmt.Sprintf("%s: %.1f s", m.Name(), m.BuildTime.Seconds()))
		}
	}
	if err := l.loadExternals(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// loadExternals compiles the external kernels of Backend.ExternalDir for
// the device of the activation dtype (those of other dtypes are left).
// Any that cannot be read or compiled fails the load, naming it: a user
// who offers kernels hears why one is not taken.
func (l *loaded) loadExternals() error {
	if l.b.ExternalDir == "" {
		return nil
	}
	specs, err := kernels.ReadExternal(l.b.ExternalDir)
	if err != nil {
		return err
	}
	for _, s := range specs {
		if s.DType != l.act.String() {
			continue
		}
		e, err := kernels.NewExternal(l.dev, s)
		if err != nil {
			return err
		}
		l.externals = append(l.externals, e)
	}
	return nil
}

// compiledModules are a model's kernels and GEMV modules (gemv nil when
// they failed to build: gemvErr says why, and the products run on
// cuBLASLt).
type compiledModules struct {
	k       *kernels.Kernels
	gemv    *kernels.GEMV
	gemvErr error
	err     error // the kernels' error
	// smp is the device sampler (nil when it failed to build: the first
	// step that samples on the device builds it again, and fails then).
	smp  *kernels.Sampler
	took time.Duration
}

// compileModules builds (or takes from the kernel cache) the kernels of
// act and head dim hd (0: every one) for KV-cache blocks of bs tokens (0:
// any), the GEMV and the device sampler.
// They (the first two in parts: kernels.compileParts) compile at once, so
// that on a cold kernel cache their compiles overlap.
func compileModules(d *cu.Device, act cu.DType, hd, bs int) compiledModules {
	var m compiledModules
	gemvDone, smpDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(gemvDone)
		m.gemv, m.gemvErr = kernels.NewGEMV(d, act)
	}()
	go func() {
		defer close(smpDone)
		if s, err := kernels.NewSampler(d); err == nil {
			m.smp = s
		}
	}()
	m.k, m.err = kernels.NewFor(d, act, hd, bs)
	<-gemvDone
	<-smpDone
	if m.gemvErr != nil {
		m.gemv = nil
	}
	return m
}

// modules lists the cu modules m loaded.
func (m compiledModules) modules() []*cu.Module {
	var mods []*cu.Module
	if m.k != nil {
		mods = m.k.Modules()
	}
	if m.gemv != nil {
		mods = slices.Concat(mods, m.gemv.Modules())
	}
	if m.smp != nil {
		mods = append(mods, m.smp.M)
	}
	return mods
}

// close releases what m loaded.
func (m compiledModules) close() {
	if m.k != nil {
		m.k.Close()
	}
	if m.gemv != nil {
		m.gemv.Close()
	}
	if m.smp != nil {
		m.smp.Close()
	}
}

// loaded is a graph resident on the device.
type loaded struct {
	b        *Backend
	dev      *cu.Device
	k        *kernels.Kernels
	kf8      *kernels.Kernels // the module of FP8 KV caches (kernels.NewFP8KV), made by the first such cache
	lt       *cu.BlasLt
	stream   *cu.Stream
	act      cu.DType
	fp8      bool // FP8 matrices stay E4M3 on the device (Backend.FP8)
	compiled *compile.Compiled
	// weights maps each weight and constant node to its device copy.
	weights map[*ir.Node]deviceTensor
	allocs  []cu.Ptr         // everything to free on Close
	hosts   []*cu.HostBuf    // pinned buffers of the executables
	events  [4]*cu.Event     // step timing (Backend.Timing), then product timing; made on first use
	smp     *kernels.Sampler // the device sampler, made on first use
	gemv    *kernels.GEMV    // the skinny product kernel (nil: cuBLASLt only)
	// profEvents time the kernels of profiled steps (Backend.Profile).
	profEvents []*cu.Event
	// gemvChoice records, per product shape, the way measured fastest
	// (GEMV, an external kernel or cuBLASLt).
	gemvChoice map[mmKey]productWay
	// externals are the external kernels (Backend.ExternalDir) compiled
	// for the device.
	externals []*kernels.External
	// algoChoice records, per product shape and row bucket, the cuBLASLt
	// candidate algorithm measured fastest, by its configuration
	// (cu.BlasLt.Find finds it among the candidates of each product of the
	// bucket: their lists differ with the rows and alignments).
	algoChoice map[algoKey]string
	// decodeChoice records, per decode attention shape and context bucket,
	// the split kept (measured fastest, or PlanDecode's under
	// Backend.FixedDecodePlan).
	decodeChoice map[decodeKey]kernels.DecodePlan
	// prefillChoice records, per prefill attention shape and bucket of
	// tokens, the build kept (kernels.PrefillVariants).
	prefillChoice map[prefillKey]string
	// normChoice records the buckets of norms whose prefetch is decided
	// (normPath; the choice itself is the kernels' SetNormPrefetch).
	normChoice map[normKey]bool
	// moeTables holds each MoE layer's device table of its experts'
	// weight pointers (uploadMoETables).
	moeTables map[*ir.Node]cu.Ptr
	// moeWiden holds, for the MoE layers with matrices in GGUF blocks,
	// the tables the step widens them by (uploadMoETables).
	moeWiden map[*ir.Node][]kernels.ExpertTable
	// moeScratch is where a step widens the experts kept in GGUF blocks
	// (moeScratchBytes, one layer's; uploadMoETables).
	moeScratch      cu.Ptr
	moeScratchBytes int
	// foldedGains marks the weights a norm's gain is folded into
	// (markNormFolds), by their device pointer.
	foldedGains map[cu.Ptr]bool
	// gainCopies: norm gains in the activation dtype for K-quant products
	// that multiply x by them (normFold.gainX), by the gain's pointer.
	gainCopies map[cu.Ptr]cu.Ptr

	// Step memory every executable shares (stepmem.go): the activation
	// arena, and the decode attention workspace (wsCounters bytes of split
	// counters, then partial results).
	arena      cu.Ptr
	arenaCap   int
	ws         cu.Ptr
	wsCap      int
	wsCounters int
	execs      []*executable
	// The quantized products' scratch (quant.go): qs for the activation's
	// copies (FP8: its scale, absolute maximum and E4M3 copy; Q4_K: its
	// int8 groups), dq for the rows of a GGUF matrix dequantized for
	// cuBLASLt.
	qs, dq       cu.Ptr
	qsCap, dqCap int
	f8One        cu.Ptr // 1.0, the weights' scale of FP8 products with scales a row
}

// deviceTensor is a weight or constant on the device.
type deviceTensor struct {
	p     cu.Ptr
	dtype cu.DType
	rows  int // first dimension (vocabulary of an embedding table)
	// An E4M3 matrix's scales, one float32 a row (uploadScales), and
	// whether they are one per-tensor scale repeated.
	scales    cu.Ptr
	perTensor bool
	// A matrix kept in GGUF blocks (dtype devBlocks): their format.
	blocks tensor.DType
}

// DType is the compute dtype of the loaded graph.
func (l *loaded) DType() cu.DType { return l.act }

func (l *loaded) alloc(n int) (cu.Ptr, error) {
	p, err := l.dev.Alloc(max(n, 256))
	if err != nil {
		return 0, oom(err)
	}
	l.allocs = append(l.allocs, p)
	return p, nil
}

// free releases p, which alloc returned.
func (l *loaded) free(p cu.Ptr) error {
	for i, q := range l.allocs {
		if q == p {
			l.allocs = append(l.allocs[:i], l.allocs[i+1:]...)
			return l.dev.Free(p)
		}
	}
	return fmt.Errorf("cuda: free of %#x, which this model did not allocate", uint64(p))
}

// Go implements backend.Worker: f runs on the device's worker thread, where
// the model's steps run (a tensor-parallel group's ranks start together).
func (l *loaded) Go(f func() error) (wait func() error, err error) { return l.dev.Go(f) }

func (l *loaded) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if err := l.dev.Sync(); err != nil {
		keep(err)
	}
	// Captured graphs first: they hold the memory freed below, and a
	// tensor-parallel rank's hold its NCCL communicator (whose destroy
	// waits for them).
	for _, e := range l.execs {
		e.dropGraphs()
	}
	for _, p := range l.allocs {
		if err := l.dev.Free(p); err != nil {
			keep(err)
		}
	}
	l.allocs = nil
	for _, h := range l.hosts {
		if err := h.Free(); err != nil {
			keep(err)
		}
	}
	l.hosts = nil
	if l.smp != nil {
		if err := l.smp.Close(); err != nil {
			keep(err)
		}
	}
	if l.gemv != nil {
		if err := l.gemv.Close(); err != nil {
			keep(err)
		}
	}
	for _, e := range l.externals {
		if err := e.Close(); err != nil {
			keep(err)
		}
	}
	for _, ev := range append(l.events[:], l.profEvents...) {
		if ev != nil {
			ev.Close()
		}
	}
	for _, c := range []interface{ Close() error }{l.stream, l.lt} {
		if err := c.Close(); err != nil {
			keep(err)
		}
	}
	if l.k != nil { // nil when Load failed before the kernels came
		if err := l.k.Close(); err != nil {
			keep(err)
		}
	}
	if l.kf8 != nil {
		if err := l.kf8.Close(); err != nil {
			keep(err)
		}
	}
	return first
}

// sampler returns the device sampler, compiling it on first use.
func (l *loaded) sampler() (*kernels.Sampler, error) {
	if l.smp == nil {
		s, err := kernels.NewSampler(l.dev)
		if err != nil {
			return nil, err
		}
		l.smp = s
	}
	return l.smp, nil
}

// timer makes the step-timing events.
func (l *loaded) timer() error {
	for i := range l.events {
		if l.events[i] == nil {
			ev, err := l.dev.NewEvent(true)
			if err != nil {
				return err
			}
			l.events[i] = ev
		}
	}
	return nil
}

// kvCache holds, per layer, keys and values as
// [Blocks][BlockSize][KVHeads][HeadDim] in the compute dtype, or as E4M3
// codes (spec.FP8), which the kernels of kern write and read.
type kvCache struct {
	spec backend.KVSpec
	l    *loaded
	kern *kernels.Kernels // the cache writers and attention for its dtype
	k, v []cu.Ptr
	base cu.Ptr
}

// elemSize is the bytes of a cache element.
func (c *kvCache) elemSize() int { return kvElem(c.spec, c.l.act) }

func kvElem(s backend.KVSpec, act cu.DType) int {
	if s.FP8 {
		return 1
	}
	return act.Size()
}

func (c *kvCache) Spec() backend.KVSpec { return c.spec }

// CopyBlocks queues the copies on the model's stream, ahead of the next step.
func (c *kvCache) CopyBlocks(pairs [][2]int32) error {
	s := c.spec
	n := s.BlockSize * s.KVHeads * s.HeadDim * c.elemSize()
	return c.l.dev.Do(func() error {
		for _, p := range pairs {
			if p[0] < 0 || p[1] < 0 || int(p[0]) >= s.Blocks || int(p[1]) >= s.Blocks {
				return fmt.Errorf("cuda: copy of block %d to %d in a cache of %d", p[0], p[1], s.Blocks)
			}
			for l := range c.k {
				for _, base := range []cu.Ptr{c.k[l], c.v[l]} {
					if err := c.l.dev.CopyDtoD(base.Add(int(p[1])*n), base.Add(int(p[0])*n), n, c.l.stream); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// FreeMemory implements backend.MemoryReporter: the device's free memory.
func (l *loaded) FreeMemory() (int64, error) {
	free, _, err := l.dev.MemInfo()
	return int64(free), err
}

// KVBytes implements backend.MemoryReporter: keys and values in the compute
// dtype, or a byte each in FP8.
func (l *loaded) KVBytes(s backend.KVSpec) int64 {
	return 2 * int64(s.Layers) * int64(s.Blocks) * int64(s.BlockSize) * int64(s.KVHeads) * int64(s.HeadDim) * int64(kvElem(s, l.act))
}

// fp8Kernels is the module of FP8 KV caches, compiled on first use, after
// checking that every attention layer of the model takes one.
func (l *loaded) fp8Kernels() (*kernels.Kernels, error) {
	if l.kf8 != nil {
		return l.kf8, nil
	}
	for _, n := range l.compiled.Graph.Nodes {
		if n.Op == ir.Attention {
			if err := kernels.FP8OK(n.Attrs.Heads, n.Attrs.KVHeads, n.Attrs.HeadDim); err != nil {
				return nil, fmt.Errorf("cuda: %w", err)
			}
		}
	}
	k, err := kernels.NewFP8KVFor(l.dev, l.act, l.k.HeadDim, l.k.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	k.PDL = l.k.PDL
	l.kf8 = k
	return k, nil
}

// checkKVIndex says whether the attention kernels, built for blocks of
// built tokens (0: any), take a cache of spec: its block size theirs, and
// a layer's slots times kv heads within the 32-bit row index of kv_row
// (attention.cu).
func checkKVIndex(spec backend.KVSpec, built int) error {
	if built != 0 && spec.BlockSize != built {
		return fmt.Errorf("cuda: a KV cache of %d-token blocks for attention kernels built for %d-token blocks (compile.Options.KVBlockSize)", spec.BlockSize, built)
	}
	if rows := int64(spec.Blocks) * int64(spec.BlockSize) * int64(spec.KVHeads); rows-1 > math.MaxInt32 {
		return fmt.Errorf("cuda: a KV cache of %d blocks of %d tokens × %d kv heads passes the attention kernels' 32-bit row index (%d rows): ask for fewer blocks",
			spec.Blocks, spec.BlockSize, spec.KVHeads, rows)
	}
	return nil
}

func (l *loaded) NewKVCache(spec backend.KVSpec) (backend.KVCache, error) {
	if spec.Layers <= 0 || spec.Blocks <= 0 || spec.BlockSize <= 0 || spec.KVHeads <= 0 || spec.HeadDim <= 0 {
		return nil, fmt.Errorf("cuda: bad kv cache spec %+v", spec)
	}
	if spec.F16 {
		return nil, fmt.Errorf("cuda: an f16 KV cache is the CPU's (the GPU's holds the activation dtype, 16-bit unless f32, or FP8)")
	}
	if err := checkKVIndex(spec, l.k.BlockSize); err != nil {
		return nil, err
	}
	c := &kvCache{spec: spec, l: l, kern: l.k}
	if spec.FP8 {
		k, err := l.fp8Kernels()
		if err != nil {
			return nil, err
		}
		c.kern = k
	}
	per := int64(spec.Blocks) * int64(spec.BlockSize) * int64(spec.KVHeads) * int64(spec.HeadDim) * int64(c.elemSize())
	per = (per + 255) &^ 255
	total := 2 * per * int64(spec.Layers)
	if free, _, err := l.dev.MemInfo(); err == nil && uint64(total) > free {
		return nil, fmt.Errorf("cuda: kv cache of %d MiB does not fit in the %d MiB free", total>>20, free>>20)
	}
	base, err := l.alloc(int(total))
	if err != nil {
		return nil, err
	}
	// Zero it: a kernel reading an unwritten slot (it never should) gets 0,
	// not NaN from stale memory.
	if err := l.dev.Memset8(base, 0, int(total), l.stream); err != nil {
		return nil, err
	}
	if err := l.stream.Sync(); err != nil {
		return nil, err
	}
	c.base = base
	for i := 0; i < spec.Layers; i++ {
		c.k = append(c.k, base.Add(int(2*int64(i)*per)))
		c.v = append(c.v, base.Add(int((2*int64(i)+1)*per)))
	}
	return c, nil
}
