package kernels

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sync"

	"kiln/backend/cuda/cu"
)

// The skinny matrix product of decode steps (gemv.cu, a module of its own
// per activation dtype): a few token rows against a weight matrix, where
// the time is the streaming of the weights.

//go:embed gemv.cu
var gemvFile string

// gemvSource is the module's NVRTC source: the functions shared with
// kernels.cu (shared.cu), then gemv.cu.
var gemvSource = shared + "\n" + gemvFile

// GEMVSource is the CUDA C source of the skinny matrix product.
func GEMVSource() string { return gemvSource }

// GEMVMaxT is the largest number of rows GEMV takes.
const GEMVMaxT = 8

// gemvThreads is GEMV_THREADS in gemv.cu.
const gemvThreads = 128

// ErrGEMVShape reports a product GEMV does not take (rows, alignment, K):
// the caller falls back to cuBLASLt.
var ErrGEMVShape = errors.New("kernels: gemv does not take this product")

// GEMV computes out[T,N] = x[T,K]·w[N,K]ᵀ for small T (1 ≤ T ≤ 8), x, w in
// the activation dtype, out in the activation dtype or f32 (outF32),
// accumulated in f32: the matrix products of decode steps, where the time is
// the streaming of w. Every warp streams whole rows of w with 16-byte loads;
// f16/bf16 with T ≥ 2 run on the tensor cores (mma.sync, x as the 8 columns
// of B, so that T = 8 costs what T = 2 does), T = 1 and f32 on the CUDA
// cores. x and w must be 16-byte aligned and K·(element size) a multiple of
// 16 bytes (K a multiple of 8 for f16/bf16, of 4 for f32); other products
// get an error wrapping ErrGEMVShape, before anything is queued, and go to
// cuBLASLt. Safe for concurrent use.
type GEMV struct {
	D   *cu.Device
	Act cu.DType
	M   *cu.Module
	// PDL launches as programmatic dependent launches (cu.LaunchDependent):
	// the weights stream in while the previous kernel finishes. On by
	// default.
	PDL bool

	mu  sync.Mutex
	fns map[gemvCfg]*cu.Function
}

// gemvEpi is what a GEMV kernel does with its sums (the epilogues of gemv.cu).
type gemvEpi int

const (
	epiStore  gemvEpi = iota // store the product
	epiSwiGLU                // SwiGLU of the stacked gate/up product (RunSwiGLU)
	epiRoPE                  // RoPE and the cache writes of the stacked Q/K/V product (RunRoPEQKV)
)

// rows is the number of weight rows behind one output.
func (e gemvEpi) rows() int {
	if e == epiStore {
		return 1
	}
	return 2
}

func (e gemvEpi) prefix() string {
	return [...]string{"", "swiglu_", "rope_"}[e]
}

// gemvCfg is one kernel of gemv.cu for t rows of x. CUDA cores
// (gemv_<t>_<r>_<u>_<lm>): r rows of w per warp, u 16-byte loads per row
// and lane in flight. Tensor cores (gemv_mma_<u>_<warps>_<lm>, f16/bf16, t
// at run time): 16 rows of w per block of warps warps splitting K, u loads
// per row and lane in flight. lm: the weight load flavour. epi: the
// epilogue (gemv_swiglu_…, gemv_mma_rope_…).
type gemvCfg struct {
	t     int
	mma   bool
	r, u  int
	warps int
	lm    int
	epi   gemvEpi
}

func (c gemvCfg) name() string {
	if c.mma {
		return fmt.Sprintf("gemv_mma_%s%d_%d_%d", c.epi.prefix(), c.u, c.warps, c.lm)
	}
	return fmt.Sprintf("gemv_%s%d_%d_%d_%d", c.epi.prefix(), c.t, c.r, c.u, c.lm)
}

// grid is the launch grid for n outputs.
func (c gemvCfg) grid(n int) cu.Dim3 {
	if c.mma {
		outs := 16 / c.epi.rows()
		return cu.D1((n + outs - 1) / outs)
	}
	outs := c.r / c.epi.rows() // per warp
	warps := (n + outs - 1) / outs
	return cu.D1((warps*32 + gemvThreads - 1) / gemvThreads)
}

func (c gemvCfg) block() cu.Dim3 {
	if c.mma {
		return cu.D1(32 * c.warps)
	}
	return cu.D1(gemvThreads)
}

func ccCfg(t, r, u int) gemvCfg { return gemvCfg{t: t, r: r, u: u, lm: 1} }

func mmaCfg(t, u, warps int) gemvCfg {
	return gemvCfg{t: t, mma: true, r: 16, u: u, warps: warps, lm: 2}
}

// gemvCC is the CUDA-core kernel for t rows (GEMV_CC in gemv.cu).
func gemvCC(t int) gemvCfg {
	if t <= 4 {
		return ccCfg(t, 2, 4)
	}
	return ccCfg(t, 4, 4)
}

// gemvProd lists the kernels of the module for t rows: the CUDA-core one,
// and the tensor-core one for f16/bf16.
func gemvProd(act cu.DType, t int) []gemvCfg {
	if act == cu.F32 {
		return []gemvCfg{gemvCC(t)}
	}
	return []gemvCfg{gemvCC(t), mmaCfg(t, 4, 8)}
}

// gemvDefault is the configuration Run uses for t rows: for f16/bf16 the
// tensor cores from 2 rows on (the CUDA cores' work grows with t, and at
// t = 1 they stream a little faster on most decode shapes), else the CUDA
// cores.
func gemvDefault(act cu.DType, t int) gemvCfg {
	if act != cu.F32 && t >= 2 {
		return mmaCfg(t, 4, 8)
	}
	return gemvCC(t)
}

// NewGEMV compiles (or loads from the kernel cache) the skinny product for
// activation dtype act.
func NewGEMV(d *cu.Device, act cu.DType) (*GEMV, error) {
	return newGEMV(d, act, false)
}

// newGEMV compiles the module; sweep adds every configuration the
// benchmarks compare (-DGEMV_SWEEP).
func newGEMV(d *cu.Device, act cu.DType, sweep bool) (*GEMV, error) {
	if act != cu.F32 && act != cu.F16 && act != cu.BF16 {
		return nil, fmt.Errorf("kernels: gemv activation dtype %v", act)
	}
	name := "kiln_gemv_" + cname(act)
	opts := []string{"-DACT=" + cname(act), "--std=c++17"}
	if act != cu.F32 {
		opts = append(opts, "-DGEMV_MMA=1")
	}
	if sweep {
		name += "_sweep"
		opts = append(opts, "-DGEMV_SWEEP=1")
	}
	m, err := d.Compile(name, gemvSource, opts...)
	if err != nil {
		return nil, err
	}
	return &GEMV{D: d, Act: act, M: m, PDL: true, fns: map[gemvCfg]*cu.Function{}}, nil
}

// Close unloads the module.
func (g *GEMV) Close() error { return g.M.Close() }

// Check reports whether Run takes the product (nil) or not (an error
// wrapping ErrGEMVShape).
func (g *GEMV) Check(out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	es := g.Act.Size()
	oes := es
	if outF32 {
		oes = 4
	}
	switch {
	case t < 1 || t > GEMVMaxT:
		return fmt.Errorf("%w: %d rows (1 to %d)", ErrGEMVShape, t, GEMVMaxT)
	case k <= 0 || n <= 0 || int64(k)*int64(t) > math.MaxInt32 || int64(n)*int64(t) > math.MaxInt32:
		return fmt.Errorf("%w: %d×%d by %d×%d", ErrGEMVShape, t, k, n, k)
	case k*es%16 != 0:
		return fmt.Errorf("%w: rows of %d %v elements are not a multiple of 16 bytes", ErrGEMVShape, k, g.Act)
	case x == 0 || w == 0 || out == 0:
		return fmt.Errorf("%w: null operand", ErrGEMVShape)
	case x%16 != 0 || w%16 != 0:
		return fmt.Errorf("%w: x (%#x) and w (%#x) must be 16-byte aligned", ErrGEMVShape, uint64(x), uint64(w))
	case uint64(out)%uint64(oes) != 0:
		return fmt.Errorf("%w: out (%#x) not aligned to its %d-byte elements", ErrGEMVShape, uint64(out), oes)
	}
	return nil
}

// Run queues out[t,n] = x[t,k]·w[n,k]ᵀ on stream s (nil: the default
// stream); out is f32 when outF32, else the activation dtype. It can be
// captured into a CUDA graph.
func (g *GEMV) Run(s *cu.Stream, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	if err := g.Check(out, x, w, t, k, n, outF32); err != nil {
		return err
	}
	return g.run(s, gemvDefault(g.Act, t), out, x, w, t, k, n, outF32)
}

// run launches configuration c on a checked product of t rows (c.t for
// the CUDA-core kernels).
func (g *GEMV) run(s *cu.Stream, c gemvCfg, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	if c.mma {
		return g.launch(s, c, t, n, x, w, out, int32(k), int32(n), int32(t), b2i(outF32))
	}
	return g.launch(s, c, t, n, x, w, out, int32(k), int32(n), b2i(outF32))
}

// launch launches configuration c for t rows of x and n outputs with the
// kernel's arguments args.
func (g *GEMV) launch(s *cu.Stream, c gemvCfg, t, n int, args ...any) error {
	key := c
	if c.mma {
		key.t = 0
	} else if c.t != t {
		return fmt.Errorf("kernels: %s for %d rows", c.name(), t)
	}
	g.mu.Lock()
	f := g.fns[key]
	g.mu.Unlock()
	if f == nil {
		var err error
		if f, err = g.M.Function(c.name()); err != nil {
			return fmt.Errorf("kernels: %s: %w", c.name(), err)
		}
		g.mu.Lock()
		g.fns[key] = f
		g.mu.Unlock()
	}
	launch := f.Launch
	if g.PDL {
		launch = f.LaunchDependent
	}
	if err := launch(c.grid(n), c.block(), 0, s, args...); err != nil {
		return fmt.Errorf("kernels: %s: %w", c.name(), err)
	}
	return nil
}

// RunSwiGLU queues out[t,f] = SiLU(x·w[:f]ᵀ)·(x·w[f:]ᵀ) for the stacked
// gate/up weight w[2f,k]: the product of Run with the SwiGLU of
// Kernels.SwiGLUPacked in its epilogue (both halves rounded to the
// activation dtype first, as Run's store would), so that decode steps skip
// that kernel. out is of the activation dtype. It can be captured into a
// CUDA graph.
func (g *GEMV) RunSwiGLU(s *cu.Stream, out, x, w cu.Ptr, t, k, f int) error {
	if f <= 0 || f > math.MaxInt32/2 {
		return fmt.Errorf("%w: swiglu of %d columns", ErrGEMVShape, f)
	}
	if err := g.Check(out, x, w, t, k, 2*f, false); err != nil {
		return err
	}
	c := gemvDefault(g.Act, t)
	c.epi = epiSwiGLU
	if c.mma {
		return g.launch(s, c, t, f, x, w, out, int32(k), int32(f), int32(t))
	}
	return g.launch(s, c, t, f, x, w, out, int32(k), int32(f))
}

// RoPEQKV is where RunRoPEQKV puts the stacked Q/K/V product, as
// Kernels.RoPEQKVWrite does: the query heads rotated by the tokens'
// positions Pos (int32) into Q[t, Heads·HeadDim], the key heads rotated and
// the value heads stored into one layer's caches at the tokens' Slots
// (int32); Table is the folded f32 [maxPos, HeadDim] table (cos, then sin);
// pairs (2i, 2i+1) when Interleaved, else (i, i+HeadDim/2).
type RoPEQKV struct {
	Q, KCache, VCache, Pos, Slots, Table cu.Ptr
	Heads, KVHeads, HeadDim              int
	Interleaved                          bool
}

// RunRoPEQKV queues the product x[t,k]·w[n,k]ᵀ of the stacked Q/K/V weight
// (n = (Heads+2·KVHeads)·HeadDim rows) with r's rotations and cache writes
// in its epilogue (each element rounded to the activation dtype first, as
// Run's store would), so that decode steps skip Kernels.RoPEQKVWrite. It
// can be captured into a CUDA graph.
func (g *GEMV) RunRoPEQKV(s *cu.Stream, r RoPEQKV, x, w cu.Ptr, t, k int) error {
	if r.Heads <= 0 || r.KVHeads <= 0 || r.HeadDim <= 0 || r.HeadDim%2 != 0 ||
		int64(r.Heads+2*r.KVHeads)*int64(r.HeadDim) > math.MaxInt32/GEMVMaxT {
		return fmt.Errorf("%w: rope of %d heads and %d kv heads of %d", ErrGEMVShape, r.Heads, r.KVHeads, r.HeadDim)
	}
	if r.Q == 0 || r.KCache == 0 || r.VCache == 0 || r.Pos == 0 || r.Slots == 0 || r.Table == 0 {
		return fmt.Errorf("%w: rope with a null operand", ErrGEMVShape)
	}
	n := (r.Heads + 2*r.KVHeads) * r.HeadDim
	if err := g.Check(r.Q, x, w, t, k, n, false); err != nil {
		return err
	}
	c := gemvDefault(g.Act, t)
	c.epi = epiRoPE
	args := []any{r.Q, r.KCache, r.VCache, r.Pos, r.Slots, r.Table, int32(r.Heads), int32(r.KVHeads), int32(r.HeadDim), b2i(r.Interleaved)}
	if c.mma {
		return g.launch(s, c, t, n/2, append([]any{x, w, int32(k), int32(t)}, args...)...)
	}
	return g.launch(s, c, t, n/2, append([]any{x, w, int32(k)}, args...)...)
}
