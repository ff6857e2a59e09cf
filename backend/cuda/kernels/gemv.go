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
var gemvSource string

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

// gemvCfg is one kernel of gemv.cu for t rows of x. CUDA cores
// (gemv_<t>_<r>_<u>_<lm>): r rows of w per warp, u 16-byte loads per row
// and lane in flight. Tensor cores (gemv_mma_<u>_<warps>_<lm>, f16/bf16, t
// at run time): 16 rows of w per block of warps warps splitting K, u loads
// per row and lane in flight. lm: the weight load flavour.
type gemvCfg struct {
	t     int
	mma   bool
	r, u  int
	warps int
	lm    int
}

func (c gemvCfg) name() string {
	if c.mma {
		return fmt.Sprintf("gemv_mma_%d_%d_%d", c.u, c.warps, c.lm)
	}
	return fmt.Sprintf("gemv_%d_%d_%d_%d", c.t, c.r, c.u, c.lm)
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
	var err error
	launch := f.Launch
	if g.PDL {
		launch = f.LaunchDependent
	}
	if c.mma {
		err = launch(cu.D1((n+15)/16), cu.D1(32*c.warps), 0, s, x, w, out, int32(k), int32(n), int32(t), b2i(outF32))
	} else {
		warps := (n + c.r - 1) / c.r
		err = launch(cu.D1((warps*32+gemvThreads-1)/gemvThreads), cu.D1(gemvThreads), 0, s, x, w, out, int32(k), int32(n), b2i(outF32))
	}
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", c.name(), err)
	}
	return nil
}
