package cu

import (
	"fmt"
	"sync"
	"unsafe"
)

// DType is an element type of a cuBLASLt operand.
type DType int

const (
	F32 DType = iota
	F16
	BF16
	// F8E4M3 is FP8 with 4 exponent and 3 mantissa bits (OCP E4M3FN, as
	// tensor.F8_E4M3): cuBLASLt products on Hopper and later, with float32
	// scales (Matmul.XScale, WScale).
	F8E4M3
)

func (t DType) String() string {
	if t < F32 || t > F8E4M3 {
		return fmt.Sprintf("dtype(%d)", int(t))
	}
	return [...]string{"f32", "f16", "bf16", "f8e4m3"}[t]
}

// Size is the element size in bytes.
func (t DType) Size() int { return [...]int{4, 2, 2, 1}[t] }

// cudaDataType values (library_types.h).
func (t DType) cuda() int {
	return [...]int{0 /*CUDA_R_32F*/, 2 /*CUDA_R_16F*/, 14 /*CUDA_R_16BF*/, 28 /*CUDA_R_8F_E4M3*/}[t]
}

// BlasLt is a cuBLASLt handle with a workspace, bound to a device.
type BlasLt struct {
	d      *Device
	h      unsafe.Pointer
	ws     Ptr
	wsSize int
	plans  map[planKey]unsafe.Pointer
	mu     sync.Mutex       // guards found
	found  map[foundKey]int // Find's answers
}

// foundKey is a configuration looked up in a plan's candidates.
type foundKey struct {
	plan planKey
	cfg  string
}

// NewBlasLt creates a cuBLASLt handle and a workspace of wsBytes (32 MiB if
// 0, as NVIDIA recommends for Hopper).
func (d *Device) NewBlasLt(wsBytes int) (*BlasLt, error) {
	if err := BlasLtAvailable(); err != nil {
		return nil, err
	}
	if wsBytes <= 0 {
		wsBytes = 32 << 20
	}
	lt := &BlasLt{d: d, wsSize: wsBytes, plans: map[planKey]unsafe.Pointer{}, found: map[foundKey]int{}}
	err := d.Do(func() error {
		var err error
		if lt.h, err = ltCreate(); err != nil {
			return err
		}
		if lt.ws, err = drvMemAlloc(wsBytes); err != nil {
			ltDestroy(lt.h)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return lt, nil
}

// Close frees the plans, the workspace and the handle.
func (lt *BlasLt) Close() error {
	if lt.h == nil {
		return nil
	}
	err := lt.d.Do(func() error {
		for k, p := range lt.plans {
			ltPlanFree(p)
			delete(lt.plans, k)
		}
		err := drvCtxSync()
		if e := drvMemFree(lt.ws); err == nil {
			err = e
		}
		if e := ltDestroy(lt.h); err == nil {
			err = e
		}
		return err
	})
	lt.h = nil
	return err
}

// Matmul is one row-major product Out[T,N] = X[T,K]·W[N,K]ᵀ (+ Bias[N])
// (+ Out when Accumulate, or + Add[T,N] when Accumulate with Add set: an
// addend laid out as Out, which it may be), accumulated in float32.
//
// FP8 (In F8E4M3, Out BF16 or F16; K a multiple of 16): Out[t,n] =
// xs·ws·Σ X[t,k]·W[n,k] with the float32 scales XScale and WScale, device
// pointers to one value each (per tensor), 16-byte aligned. cuBLASLt's fast accumulation is
// on, as inference engines run FP8 on Hopper. Scales per row (cuBLASLt's
// outer-vector mode) and f32 outputs are refused by cuBLASLt 13.0 on the
// H200 (backend/cuda/NOTES.md, session 12).
type Matmul struct {
	T, K, N    int
	In         DType // of X and W: BF16, F16, F32 or F8E4M3
	Out        DType // of Out and Bias: In or F32 (F8E4M3: BF16 or F16)
	X, W, Dst  Ptr
	Bias       Ptr // optional
	Accumulate bool
	Add        Ptr // with Accumulate: the addend (0: Dst itself)
	// XScale and WScale scale an FP8 product (nil otherwise).
	XScale, WScale Ptr
	// LDD is the distance in elements between Dst's rows (0: N): a
	// product into columns of a wider output.
	LDD int
	// Algo picks among the heuristic's candidate algorithms for this
	// product (Algorithms says how many): 0, its first choice, unless a
	// timing found another faster.
	Algo   int
	Stream *Stream
}

type planKey struct {
	in, out       DType
	t, k, n, ldd  int
	bias          bool
	alX, alW, alD int
}

func alignOf(p Ptr) int {
	a := 256
	for a > 1 && uint64(p)%uint64(a) != 0 {
		a /= 2
	}
	return a
}

// Matmul queues m on m.Stream (nil: the default stream). It can be captured
// into a CUDA graph (Stream.BeginCapture on m.Stream): the plan is made, or
// found in the cache, on the host at capture time, and the graph holds the
// product's kernels with the pointers, bias and lt's workspace baked in, so
// lt must outlive the graph. In column-major terms Outᵀ[N,T] = W[K,N]ᵀ·X[K,T]: A is W
// (stored K×N, ld K, transposed), B is X (stored K×T, ld K), D is Out
// (N×T, ld N); the bias runs along D's rows, i.e. Out's columns. Plans
// (descriptors and the heuristic's candidate algorithms) are cached per
// shape, types and pointer alignment; m.Algo picks the candidate.
func (lt *BlasLt) Matmul(m Matmul) error {
	if err := m.check(); err != nil {
		return err
	}
	return lt.d.Do(func() error {
		plan, err := lt.plan(m)
		if err != nil {
			return err
		}
		beta, c := float32(0), m.Dst
		if m.Accumulate {
			beta = 1
			if m.Add != 0 {
				c = m.Add
			}
		}
		return ltRun(lt.h, plan, m.Algo, m.W, m.X, c, m.Dst, m.Bias, m.WScale, m.XScale, 1, beta, lt.ws, lt.wsSize, m.Stream.handle())
	})
}

// Algorithms is the number of candidate algorithms cuBLASLt's heuristic
// offers for m: the values m.Algo may take. The first (at most 8, best
// guess first) are those it offers within lt's workspace, then (up to 16
// in all) those it offers within 1 MiB and within none that are not
// already listed: the workspace limit is part of what a race searches. On
// Hopper several of them split K for the few rows of batched decode
// (Config); adding split variants of the others gained nothing there
// (backend/cuda/NOTES.md, session 10).
func (lt *BlasLt) Algorithms(m Matmul) (int, error) {
	if err := m.check(); err != nil {
		return 0, err
	}
	n := 0
	err := lt.d.Do(func() error {
		plan, err := lt.plan(m)
		if err == nil {
			n = ltAlgos(plan)
		}
		return err
	})
	return n, err
}

// ldd is Dst's leading dimension.
func (m Matmul) ldd() int {
	if m.LDD == 0 {
		return m.N
	}
	return m.LDD
}

func (m Matmul) check() error {
	if m.T <= 0 || m.K <= 0 || m.N <= 0 {
		return fmt.Errorf("cublasLt: matmul of %d×%d by %d×%d", m.T, m.K, m.N, m.K)
	}
	if m.LDD != 0 && m.LDD < m.N {
		return fmt.Errorf("cublasLt: output rows %d apart for %d columns", m.LDD, m.N)
	}
	if m.In < F32 || m.In > F8E4M3 || m.Out < F32 || m.Out > F8E4M3 {
		return fmt.Errorf("cublasLt: element types %d and %d", m.In, m.Out)
	}
	if m.X == 0 || m.W == 0 || m.Dst == 0 {
		return fmt.Errorf("cublasLt: matmul with a null operand")
	}
	if m.In == F8E4M3 {
		switch {
		case m.Out != BF16 && m.Out != F16:
			return fmt.Errorf("cublasLt: %s product with %s output (bf16 or f16)", m.In, m.Out)
		case m.K%16 != 0:
			return fmt.Errorf("cublasLt: %s product with K %d, not a multiple of 16", m.In, m.K)
		case m.XScale == 0 || m.WScale == 0:
			return fmt.Errorf("cublasLt: %s product without its scales", m.In)
		case m.XScale%16 != 0 || m.WScale%16 != 0:
			// cuBLASLt 13.0 refused ("not supported") a scale 4 bytes
			// past a 16-byte boundary on the H200.
			return fmt.Errorf("cublasLt: %s scales at %#x and %#x (16-byte aligned)", m.In, uint64(m.XScale), uint64(m.WScale))
		}
		return nil
	}
	if m.Out != m.In && m.Out != F32 {
		return fmt.Errorf("cublasLt: %s inputs with %s output", m.In, m.Out)
	}
	if m.XScale != 0 || m.WScale != 0 {
		return fmt.Errorf("cublasLt: scales on a %s product (FP8 only)", m.In)
	}
	return nil
}

// Find is the index among m's candidates (the values m.Algo may take) of
// the one whose configuration (AlgoConfig.Key) is cfg, or -1: the
// heuristic's list, and a configuration's place in it, moves with the
// rows and the operands' alignment, so a choice made for one product of
// a shape is found again by its configuration for another. Answers are
// remembered per plan.
func (lt *BlasLt) Find(m Matmul, cfg string) (int, error) {
	if err := m.check(); err != nil {
		return -1, err
	}
	fk := foundKey{m.planKey(), cfg}
	lt.mu.Lock()
	i, ok := lt.found[fk]
	lt.mu.Unlock()
	if ok {
		return i, nil
	}
	i = -1
	err := lt.d.Do(func() error {
		plan, err := lt.plan(m)
		if err != nil {
			return err
		}
		for a := range ltAlgos(plan) {
			if ltAlgoConfig(plan, a).Key() == cfg {
				i = a
				break
			}
		}
		return nil
	})
	if err != nil {
		return -1, err
	}
	lt.mu.Lock()
	lt.found[fk] = i
	lt.mu.Unlock()
	return i, nil
}

// planKey identifies m's plan. C and D share one alignment: Dst's, or the
// addend's where that is less.
func (m Matmul) planKey() planKey {
	alD := alignOf(m.Dst)
	if m.Accumulate && m.Add != 0 {
		alD = min(alD, alignOf(m.Add))
	}
	return planKey{m.In, m.Out, m.T, m.K, m.N, m.ldd(), m.Bias != 0, alignOf(m.X), alignOf(m.W), alD}
}

// plan returns m's plan, made on first use; on the device's thread.
func (lt *BlasLt) plan(m Matmul) (unsafe.Pointer, error) {
	key := m.planKey()
	if plan := lt.plans[key]; plan != nil {
		return plan, nil
	}
	plan, err := ltPlanCreate(lt.h, ltPlanArgs{
		abType: m.In.cuda(), cdType: m.Out.cuda(), transa: 1, transb: 0,
		m: m.N, n: m.T, k: m.K, lda: m.K, ldb: m.K, ldc: m.ldd(),
		bias: m.Bias != 0, ws: lt.wsSize, alA: key.alW, alB: key.alX, alC: key.alD,
		scaled: m.In == F8E4M3,
	})
	if err != nil {
		err.(*Error).Call += fmt.Sprintf(" [T=%d K=%d N=%d %s→%s]", m.T, m.K, m.N, m.In, m.Out)
		return nil, err
	}
	lt.plans[key] = plan
	return plan, nil
}

type ltPlanArgs struct {
	abType, cdType, transa, transb int
	m, n, k, lda, ldb, ldc         int
	bias                           bool
	ws                             int
	alA, alB, alC                  int
	scaled                         bool // FP8: scale pointers
}

// AlgoConfig is how a candidate algorithm computes a product, as cuBLASLt
// describes it (-1 where it does not say).
type AlgoConfig struct {
	ID        int // cuBLASLt's algorithm id
	Tile      int // cublasLtMatmulTile_t
	Stages    int // cublasLtMatmulStages_t
	SplitK    int // parts K is split in
	Reduction int // cublasLtReductionScheme_t of the split's sums
	Swizzle   int // CTA swizzling
	Custom    int // the algorithm's custom option
	Inner     int // cublasLtMatmulInnerShape_t
	Cluster   int // cublasLtClusterShape_t
	// WorkspaceKiB is the workspace it needs (KiB, rounded up).
	WorkspaceKiB int
}

// Key names the configuration (the workspace aside, which grows with the
// product's size for the same algorithm): the tune cache files a choice
// under it, and Find looks it up.
func (c AlgoConfig) Key() string {
	return fmt.Sprintf("id %d tile %d stages %d split %d reduction %d swizzle %d custom %d inner %d cluster %d",
		c.ID, c.Tile, c.Stages, c.SplitK, c.Reduction, c.Swizzle, c.Custom, c.Inner, c.Cluster)
}

// String is Key with the workspace the candidate needs.
func (c AlgoConfig) String() string {
	return fmt.Sprintf("%s workspace %d KiB", c.Key(), c.WorkspaceKiB)
}

// Config describes candidate algo of m (see Algorithms).
func (lt *BlasLt) Config(m Matmul, algo int) (AlgoConfig, error) {
	if err := m.check(); err != nil {
		return AlgoConfig{}, err
	}
	var c AlgoConfig
	err := lt.d.Do(func() error {
		plan, err := lt.plan(m)
		if err != nil {
			return err
		}
		if algo < 0 || algo >= ltAlgos(plan) {
			return fmt.Errorf("cublasLt: no candidate %d (of %d)", algo, ltAlgos(plan))
		}
		c = ltAlgoConfig(plan, algo)
		return nil
	})
	return c, err
}
