package kernels

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// The skinny matrix product of decode steps (gemv.cu, a module of its own
// per activation dtype): a few token rows against a weight matrix, where
// the time is the streaming of the weights.

var (
	//go:embed gemv.cu
	gemvFile string
	//go:embed gemv_tile.cu
	gemvTile string
	//go:embed wgmma.cu
	wgmmaHelpers string
	//go:embed gemv_kq.cu
	gemvKQ string
	//go:embed moe_tile.cu
	moeTile string
)

// gemvSource is the module's NVRTC source: the functions shared with
// kernels.cu (shared.cu), gemv.cu, then the asynchronous copies, the
// K-quant kernels, the tensor-core helpers (mma.sync, and Hopper's wgmma)
// and the tile kernels, with the mixture of experts' on them (built for
// f16/bf16 only).
var gemvSource = shared + "\n" + gemvFile + "\n" + async + "\n" + gemvKQ + "\n" + mmaHelpers + "\n" + wgmmaHelpers + "\n" + gemvTile +
	"\n" + moeTile

// GEMVSource is the CUDA C source of the skinny matrix product.
func GEMVSource() string { return gemvSource }

// GEMVMaxT is the largest number of rows GEMV takes: up to GEMVVectorMaxT
// rows on the vector kernels (CUDA cores, or the tensor cores with x as
// one n8 tile), beyond on the tile kernels (f16/bf16 only).
const (
	GEMVMaxT       = 64
	GEMVVectorMaxT = 8
)

// The tile kernels' shape (gemv_tile.cu): GT_ROWS weight rows a block of
// GT_THREADS threads; the configuration Run takes: K in stages of tileBK
// columns, tileStages deep, the L2 prefetch of the weights on (tilePF).
const (
	tileRows    = 128
	tileThreads = 128
	tileBK      = 64
	tileStages  = 4
	tilePF      = 1
)

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
// cuBLASLt. From 9 rows on (f16/bf16, K a multiple of 64) the tile kernels
// of gemv_tile.cu run instead, with K split over a thread-block cluster
// when the tiles alone would leave multiprocessors idle. Safe for
// concurrent use.
type GEMV struct {
	D     *cu.Device
	Act   cu.DType
	M     *cu.Module   // the part of the CUDA-core and mma GEMVs (of parts)
	parts *moduleParts // the parts, each holding some of the kernels
	// PDL launches as programmatic dependent launches (cu.LaunchDependent):
	// the weights stream in while the previous kernel finishes. On by
	// default.
	PDL bool

	mu     sync.Mutex
	fns    map[gemvCfg]*cu.Function
	splits map[tileKey]int         // measured choices (SetTileSplits)
	ways   map[vecKey]string       // measured choices (SetVectorWay)
	kqOcc  map[gemvCfg]int         // resident blocks of a K-quant kernel and shared memory (kqBlocks)
	moeFns map[string]*cu.Function // moe_tile.cu's kernels (launchMoETile)
	// kqSharedLimit, when set, is the shared memory a K-quant launch may
	// take in place of the device's (tests: several launches of rows).
	kqSharedLimit int
}

// vecKey identifies a vector product (at most GEMVVectorMaxT rows) for the
// choice of its way (SetVectorWay): its rows, K and N (the product's, for
// a paired epilogue too).
type vecKey struct{ t, k, n int }

// The ways a product of at most GEMVVectorMaxT rows runs (VectorWays).
const (
	WayCUDACores   = "cuda cores"   // gemv_<t>_<r>_<u>_<lm>: r weight rows a warp
	WayTensorCores = "tensor cores" // gemv_mma_…: 16 weight rows a block of warps splitting K
)

// VectorWays lists the ways a product of t rows (at most GEMVVectorMaxT)
// runs, the default first (the CUDA cores at one row or in f32, else the
// tensor cores); each is built into the module, with the epilogues.
func (g *GEMV) VectorWays(t int) []string {
	if t < 1 || t > GEMVVectorMaxT {
		return nil
	}
	if g.Act == cu.F32 {
		return []string{WayCUDACores}
	}
	if gemvDefault(g.Act, t).mma {
		return []string{WayTensorCores, WayCUDACores}
	}
	return []string{WayCUDACores, WayTensorCores}
}

// SetVectorWay makes the products of t rows (at most GEMVVectorMaxT), k
// columns and n outputs, and their epilogues, run way (one of
// VectorWays) instead of the default.
func (g *GEMV) SetVectorWay(t, k, n int, way string) error {
	if !slices.Contains(g.VectorWays(t), way) {
		return fmt.Errorf("%w: no way %q for %d rows", ErrGEMVShape, way, t)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ways == nil {
		g.ways = map[vecKey]string{}
	}
	g.ways[vecKey{t, k, n}] = way
	return nil
}

// VectorWay reports the way SetVectorWay set for the products of t rows,
// k columns and n outputs, if it set one.
func (g *GEMV) VectorWay(t, k, n int) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	way, ok := g.ways[vecKey{t, k, n}]
	return way, ok
}

// ForgetVectorWay undoes SetVectorWay: the default way again.
func (g *GEMV) ForgetVectorWay(t, k, n int) {
	g.mu.Lock()
	delete(g.ways, vecKey{t, k, n})
	g.mu.Unlock()
}

// cfgFor is the configuration of a product of t rows, k columns and n
// outputs: the way SetVectorWay set, else gemvDefault's.
func (g *GEMV) cfgFor(t, k, n int) gemvCfg {
	if t <= GEMVVectorMaxT {
		g.mu.Lock()
		way, ok := g.ways[vecKey{t, k, n}]
		g.mu.Unlock()
		switch {
		case ok && way == WayCUDACores:
			return gemvCC(t)
		case ok && way == WayTensorCores:
			return mmaCfg(t, 4, 8)
		}
	}
	return gemvDefault(g.Act, t)
}

// tileKey identifies a tile product for the choice of its splits: the
// tile width, K and the number of tiles (the same for a product and its
// paired epilogue, whose tiles hold half as many outputs of two rows).
type tileKey struct{ nt, k, tiles int }

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

// gemvCfg is one kernel of the module for t rows of x. CUDA cores
// (gemv_<t>_<r>_<u>_<lm>): r rows of w per warp, u 16-byte loads per row
// and lane in flight. Tensor cores (gemv_mma_<u>_<warps>_<lm>, f16/bf16, t
// at run time): 16 rows of w per block of warps warps splitting K, u loads
// per row and lane in flight. lm: the weight load flavour. Tiles
// (gemv_tile_<nt>_<bk>_<stages>_<pf>, t at run time): nt n8 tiles of x
// rows, stages of bk columns, K split over clusters of splits blocks. epi:
// the epilogue (gemv_swiglu_…, gemv_mma_rope_…, gemv_tile_swiglu_…).
type gemvCfg struct {
	t      int
	mma    bool
	r, u   int
	warps  int
	lm     int
	tile   bool
	rows   int // the tile's weight rows (0: tileRows; 64: the sweep's gemv_tile_r64_…)
	nt     int
	bk     int
	stages int
	pf     int
	splits int
	epi    gemvEpi
	f8     bool // FP8 weights (gemv_f8_<t>_<r>_<u>_<lm>, the CUDA-core layout)
	// K-quant weights (gemv_<kq>_<t>, gemv_kq.cu): kq names the format
	// ("q4k", "q6k"); the grid's blocks and their dynamic shared memory
	// are the launch's (runKQuant).
	kq     string
	blocks int
	sh     int
	// fold: the CUDA-core and tile kernels with a norm folded in (Fold):
	// "add_" (gemv_add_…, gemv_tile_add_…: the residual added) or "norm_"
	// (gemv_norm_…, gemv_swiglu_norm_…, gemv_rope_norm_…, and gemv_tile_…'s:
	// the 1/rms applied); the K-quant kernels' (BlocksFold): "add_" or
	// "gain_" (gemv_<kq>_gain_<t>: x times the gain).
	fold string
}

func (c gemvCfg) name() string {
	if c.tile && c.rows == 64 {
		return fmt.Sprintf("gemv_tile_r64_%s%d_%d_%d_%d", c.epi.prefix(), c.nt, c.bk, c.stages, c.pf)
	}
	if c.tile {
		return fmt.Sprintf("gemv_tile_%s%s%d_%d_%d_%d", c.epi.prefix(), c.fold, c.nt, c.bk, c.stages, c.pf)
	}
	if c.mma {
		return fmt.Sprintf("gemv_mma_%s%d_%d_%d", c.epi.prefix(), c.u, c.warps, c.lm)
	}
	if c.f8 {
		return fmt.Sprintf("gemv_f8_%d_%d_%d_%d", c.t, c.r, c.u, c.lm)
	}
	if c.kq != "" {
		return fmt.Sprintf("gemv_%s_%s%d", c.kq, c.fold, c.t)
	}
	return fmt.Sprintf("gemv_%s%s%d_%d_%d_%d", c.epi.prefix(), c.fold, c.t, c.r, c.u, c.lm)
}

// grid is the launch grid for n outputs.
func (c gemvCfg) grid(n int) cu.Dim3 {
	if c.tile {
		return cu.D1(c.tiles(n) * c.splits)
	}
	if c.mma {
		outs := 16 / c.epi.rows()
		return cu.D1((n + outs - 1) / outs)
	}
	if c.kq != "" {
		return cu.D1(c.blocks)
	}
	outs := c.r / c.epi.rows() // per warp
	warps := (n + outs - 1) / outs
	return cu.D1((warps*32 + gemvThreads - 1) / gemvThreads)
}

// tiles is the number of tiles of n outputs (tile kernels).
func (c gemvCfg) tiles(n int) int {
	outs := c.tileRows() / c.epi.rows()
	return (n + outs - 1) / outs
}

// shared is the dynamic shared memory a block takes (tile and K-quant
// kernels).
func (c gemvCfg) shared() int {
	if c.kq != "" {
		return c.sh
	}
	if !c.tile {
		return 0
	}
	// The stages, and 1 KB to start them on a 1024-byte boundary
	// (gemv_tile.cu).
	return c.stages*(c.tileRows()+8*c.nt)*c.bk*2 + 1024
}

// tileRows is a tile configuration's weight rows a tile.
func (c gemvCfg) tileRows() int {
	if c.rows > 0 {
		return c.rows
	}
	return tileRows
}

func (c gemvCfg) block() cu.Dim3 {
	if c.tile {
		return cu.D1(tileThreads)
	}
	if c.mma {
		return cu.D1(32 * c.warps)
	}
	if c.kq != "" {
		return cu.D1(32 * kqWarps)
	}
	return cu.D1(gemvThreads)
}

func ccCfg(t, r, u int) gemvCfg { return gemvCfg{t: t, r: r, u: u, lm: 1} }

func mmaCfg(t, u, warps int) gemvCfg {
	return gemvCfg{t: t, mma: true, r: 16, u: u, warps: warps, lm: 2}
}

// gemvF8Cfg is the FP8-weight kernel for t rows (GEMV_F8 in gemv.cu).
func gemvF8Cfg(t int) gemvCfg { return gemvCfg{t: t, r: 2, u: 4, lm: 1, f8: true} }

// gemvCC is the CUDA-core kernel for t rows (GEMV_CC in gemv.cu).
func gemvCC(t int) gemvCfg {
	if t <= 4 {
		return ccCfg(t, 2, 4)
	}
	return ccCfg(t, 4, 4)
}

// tileCfg is the tile kernel for t rows (9 to 64), its K split over
// splits blocks (0: as tileSplits chooses at launch).
func tileCfg(t, splits int) gemvCfg {
	nt := 2
	for 8*nt < t {
		nt *= 2
	}
	return gemvCfg{t: t, tile: true, nt: nt, bk: tileBK, stages: tileStages, pf: tilePF, splits: splits}
}

// tileSplits is how many blocks share a tile's K: enough that the tiles
// cover every multiprocessor once (a block streams its weights at the
// rate one multiprocessor can draw, so fewer blocks than multiprocessors
// leave bandwidth unused), as few as that takes (each split adds a partial
// tile to sum), at most a portable cluster of 8 and one stage a block.
// Without clusters, 1.
func tileSplits(d *cu.Device, tiles, kt int) int {
	if !d.Clusters() || tiles >= d.SMs {
		return 1
	}
	return max(1, min((d.SMs+tiles-1)/tiles, 8, kt))
}

// gemvProd lists the kernels of the module for t rows: the CUDA-core one,
// and the tensor-core one for f16/bf16; for more than GEMVVectorMaxT rows
// the tile kernel alone.
func gemvProd(act cu.DType, t int) []gemvCfg {
	if t > GEMVVectorMaxT {
		return []gemvCfg{tileCfg(t, 0)}
	}
	if act == cu.F32 {
		return []gemvCfg{gemvCC(t)}
	}
	return []gemvCfg{gemvCC(t), mmaCfg(t, 4, 8)}
}

// gemvDefault is the configuration Run uses for t rows: for f16/bf16 the
// tensor cores from 2 rows on (the CUDA cores' work grows with t, and at
// t = 1 they stream a little faster on most decode shapes), else the CUDA
// cores; from GEMVVectorMaxT+1 rows the tile kernel.
func gemvDefault(act cu.DType, t int) gemvCfg {
	if t > GEMVVectorMaxT {
		return tileCfg(t, 0)
	}
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
		if d.Arch() == "sm_90a" {
			opts = append(opts, "-DGEMV_WGMMA=1") // the tile kernels on wgmma (gemv_tile.cu)
		}
	}
	if sweep {
		name += "_sweep"
		opts = append(opts, "-DGEMV_SWEEP=1")
	}
	// In parts compiled at once (moduleParts): the CUDA-core and mma
	// GEMVs, the K-quant GEMVs, the tile kernels (f16 and bf16 only).
	parts := []int{0, 1}
	if act != cu.F32 {
		parts = append(parts, 2)
	}
	mp, err := compileParts(d, name, gemvSource, opts, parts)
	if err != nil {
		return nil, err
	}
	return &GEMV{D: d, Act: act, M: mp.mods[0], parts: mp, PDL: true, fns: map[gemvCfg]*cu.Function{}, splits: map[tileKey]int{}, kqOcc: map[gemvCfg]int{}}, nil
}

// Modules are the parts g was compiled in.
func (g *GEMV) Modules() []*cu.Module { return g.parts.mods }

// Close unloads the module.
func (g *GEMV) Close() error { return g.parts.close() }

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
	case t > GEMVVectorMaxT && g.Act == cu.F32:
		return fmt.Errorf("%w: %d rows of f32 (the tile kernels take f16 and bf16)", ErrGEMVShape, t)
	case t > GEMVVectorMaxT && k%tileBK != 0:
		return fmt.Errorf("%w: %d rows with K %d, not a multiple of %d", ErrGEMVShape, t, k, tileBK)
	case uint64(out)%uint64(oes) != 0:
		return fmt.Errorf("%w: out (%#x) not aligned to its %d-byte elements", ErrGEMVShape, uint64(out), oes)
	}
	return nil
}

// Run queues out[t,n] = x[t,k]·w[n,k]ᵀ on stream s (nil: the default
// stream); out is f32 when outF32, else the activation dtype. It can be
// captured into a CUDA graph.
func (g *GEMV) Run(s *cu.Stream, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	return g.RunFolded(s, out, x, w, t, k, n, outF32, Fold{})
}

// Fold is a norm folded into the products around it that run on the
// CUDA-core kernels or the tile kernels (GEMV.Folds tells which products
// take one), so that the norm's kernel does not run:
//   - Add, for the product before the norm: a residual of the activation
//     dtype ([t,n]) added to each sum before the store, out = x·wᵀ + Add
//     rounded once (the norm's input rows, as the norm's add would write
//     them); not with Eps;
//   - Eps > 0, for the product after it: x holds the norm's input rows
//     and w the norm's gain folded in (w·diag(g)), and each sum is
//     multiplied by its row's 1/rms, 1/sqrt(Σx²/k + Eps), before the
//     store or the epilogue.
//
// The zero Fold is neither.
type Fold struct {
	Add cu.Ptr
	Eps float32
}

// kernel is the fold's infix in a kernel's name (gemvCfg.fold) and the
// arguments the folded kernels take last.
func (f Fold) kernel() (string, []any) {
	switch {
	case f.Add != 0:
		return "add_", []any{f.Add}
	case f.Eps > 0:
		return "norm_", []any{f.Eps}
	}
	return "", nil
}

// Folds reports whether the products of t rows (1 to GEMVMaxT), k columns
// and n outputs run on the CUDA-core kernels or the tile kernels (past
// GEMVVectorMaxT rows), which take a Fold, as the vector way set for them
// (SetVectorWay) or the default has it.
func (g *GEMV) Folds(t, k, n int) bool {
	if t < 1 || t > GEMVMaxT {
		return false
	}
	return !g.cfgFor(t, k, n).mma
}

// checkFold checks fold f for a product of t rows, k columns and n outputs
// (epi: into an epilogue, which takes no Add).
func (g *GEMV) checkFold(f Fold, t, k, n int, outF32, epi bool) error {
	switch {
	case f == Fold{}:
		return nil
	case !g.Folds(t, k, n):
		return fmt.Errorf("%w: a folded norm at %d rows (the CUDA-core and tile kernels take it, not %s)", ErrGEMVShape, t, g.cfgFor(t, k, n).name())
	case f.Eps < 0 || math.IsNaN(float64(f.Eps)):
		return fmt.Errorf("%w: a folded norm's eps %g", ErrGEMVShape, f.Eps)
	case f.Add != 0 && (outF32 || epi || f.Eps != 0):
		return fmt.Errorf("%w: a residual added to an f32 product, an epilogue's or a normed one", ErrGEMVShape)
	case uint64(f.Add)%uint64(g.Act.Size()) != 0:
		return fmt.Errorf("%w: the residual (%#x) not aligned to its elements", ErrGEMVShape, uint64(f.Add))
	}
	return nil
}

// RunFolded is Run with a norm folded in (f; see Fold), on the CUDA-core
// or tile kernels; where neither takes the product (Folds), an error
// wrapping ErrGEMVShape before anything is queued.
func (g *GEMV) RunFolded(s *cu.Stream, out, x, w cu.Ptr, t, k, n int, outF32 bool, f Fold) error {
	if err := g.Check(out, x, w, t, k, n, outF32); err != nil {
		return err
	}
	if err := g.checkFold(f, t, k, n, outF32, false); err != nil {
		return err
	}
	return g.run(s, g.cfgFor(t, k, n), out, x, w, t, k, n, outF32, f)
}

// run launches configuration c on a checked product of t rows (c.t for
// the CUDA-core kernels; those and the tile kernels take a fold f, whose
// residual form has no outF32).
func (g *GEMV) run(s *cu.Stream, c gemvCfg, out, x, w cu.Ptr, t, k, n int, outF32 bool, f Fold) error {
	if c.mma {
		return g.launch(s, c, t, n, x, w, out, int32(k), int32(n), int32(t), b2i(outF32))
	}
	var tail []any
	c.fold, tail = f.kernel()
	args := []any{x, w, out, int32(k), int32(n)}
	if c.tile {
		c = g.split(c, n, k)
		args = append(args, int32(t))
	}
	if f.Add == 0 {
		args = append(args, b2i(outF32))
	}
	if c.tile {
		args = append(args, int32(c.splits))
	}
	return g.launch(s, c, t, n, append(args, tail...)...)
}

// split sets the splits of tile configuration c for n outputs of k
// columns when c leaves them open: the measured choice (SetTileSplits),
// else tileSplits'.
func (g *GEMV) split(c gemvCfg, n, k int) gemvCfg {
	if !c.tile || c.splits != 0 {
		return c
	}
	g.mu.Lock()
	s, ok := g.splits[tileKey{c.nt, k, c.tiles(n)}]
	g.mu.Unlock()
	if !ok {
		s = tileSplits(g.D, c.tiles(n), k/c.bk)
	}
	c.splits = s
	return c
}

// TileSplits lists the splits of K worth timing for a product of t rows
// (more than GEMVVectorMaxT), k columns and n outputs: 1, 2, 3, 4, 6 and 8
// blocks a tile, as K allows (one stage a block at least); only 1 without
// thread-block clusters. nil when the product does not take the tile
// kernels.
func (g *GEMV) TileSplits(t, k, n int) []int {
	if t <= GEMVVectorMaxT || t > GEMVMaxT || g.Act == cu.F32 || k%tileBK != 0 {
		return nil
	}
	if !g.D.Clusters() {
		return []int{1}
	}
	var ss []int
	for _, s := range []int{1, 2, 3, 4, 6, 8} {
		if s <= k/tileBK {
			ss = append(ss, s)
		}
	}
	return ss
}

// SetTileSplits makes the tile products of t rows (the same tile width),
// k columns and n outputs, and their paired epilogues, split K over s
// blocks (one of TileSplits) instead of tileSplits' choice.
func (g *GEMV) SetTileSplits(t, k, n, s int) {
	c := tileCfg(t, 0)
	g.mu.Lock()
	g.splits[tileKey{c.nt, k, c.tiles(n)}] = s
	g.mu.Unlock()
}

// TileSplit reports the split SetTileSplits set for the tile products of
// t rows, k columns and n outputs, if it set one.
func (g *GEMV) TileSplit(t, k, n int) (int, bool) {
	c := tileCfg(t, 0)
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.splits[tileKey{c.nt, k, c.tiles(n)}]
	return s, ok
}

// ForgetTileSplits undoes SetTileSplits for the tile products of t rows,
// k columns and n outputs: tileSplits' choice again.
func (g *GEMV) ForgetTileSplits(t, k, n int) {
	c := tileCfg(t, 0)
	g.mu.Lock()
	delete(g.splits, tileKey{c.nt, k, c.tiles(n)})
	g.mu.Unlock()
}

// RunTileSplits is Run for more than GEMVVectorMaxT rows with K split over
// s blocks (one of TileSplits), for timing the choice.
func (g *GEMV) RunTileSplits(st *cu.Stream, s int, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	if err := g.Check(out, x, w, t, k, n, outF32); err != nil {
		return err
	}
	if !slices.Contains(g.TileSplits(t, k, n), s) {
		return fmt.Errorf("%w: %d rows with K split %d ways", ErrGEMVShape, t, s)
	}
	return g.run(st, tileCfg(t, s), out, x, w, t, k, n, outF32, Fold{})
}

// function is kernel c of the module, looked up once, allowed the dynamic
// shared memory its launches take (the device's most for the K-quant
// kernels, whose shared memory varies with t and K).
func (g *GEMV) function(c gemvCfg) (*cu.Function, error) {
	key := c
	key.splits, key.blocks, key.sh = 0, 0, 0
	if c.mma || c.tile {
		key.t = 0
	}
	g.mu.Lock()
	f := g.fns[key]
	g.mu.Unlock()
	if f != nil {
		return f, nil
	}
	m, err := g.parts.holding(c.name())
	if err == nil {
		f, err = m.Function(c.name())
	}
	if err != nil {
		return nil, fmt.Errorf("kernels: %s: %w", c.name(), err)
	}
	sh := c.shared()
	if c.kq != "" {
		sh = g.D.SharedPerBlock
	}
	if sh > 48<<10 {
		if err := f.SetMaxDynamicShared(sh); err != nil {
			return nil, fmt.Errorf("kernels: %s: %d bytes of shared memory: %w", c.name(), sh, err)
		}
	}
	g.mu.Lock()
	g.fns[key] = f
	g.mu.Unlock()
	return f, nil
}

// launch launches configuration c for t rows of x and n outputs with the
// kernel's arguments args.
func (g *GEMV) launch(s *cu.Stream, c gemvCfg, t, n int, args ...any) error {
	if !c.mma && !c.tile && c.t != t {
		return fmt.Errorf("kernels: %s for %d rows", c.name(), t)
	}
	f, err := g.function(c)
	if err != nil {
		return err
	}
	launch := f.Launch
	if g.PDL {
		launch = f.LaunchDependent
	}
	if c.splits > 1 {
		err = f.LaunchInClusters(c.splits, g.PDL, c.grid(n), c.block(), c.shared(), s, args...)
	} else {
		err = launch(c.grid(n), c.block(), c.shared(), s, args...)
	}
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", c.name(), err)
	}
	return nil
}

// RunF8 queues out[t,n] = s[n]·x[t,k]·w[n,k]ᵀ for FP8 (E4M3) weights w with
// a float32 scale a row at wscale (s[n]; a per-tensor scale repeated n
// times): weight-only FP8 for decode
// steps of 1 to GEMVVectorMaxT rows (half the bytes of bf16 weights to
// stream), x of the activation dtype, out of it or f32 (outF32), sums in
// f32. K must be a multiple of 16, x and w 16-byte aligned; compute
// capability 8.9 or later (the E4M3 conversion). Other products get an
// error wrapping ErrGEMVShape before anything is queued. It can be
// captured into a CUDA graph.
func (g *GEMV) RunF8(s *cu.Stream, out, x, w, wscale cu.Ptr, t, k, n int, outF32 bool) error {
	if err := g.checkWeightOnly("FP8", 16, out, x, w, t, k, n, outF32); err != nil {
		return err
	}
	switch {
	case !g.D.FP8():
		return fmt.Errorf("%w: FP8 weights need compute capability 8.9 (%s is %d.%d)", ErrGEMVShape, g.D.Name, g.D.Major, g.D.Minor)
	case wscale == 0 || wscale%4 != 0:
		return fmt.Errorf("%w: the weights' scale at %#x (4-byte aligned)", ErrGEMVShape, uint64(wscale))
	}
	return g.launch(s, gemvF8Cfg(t), t, n, x, w, wscale, out, int32(k), int32(n), b2i(outF32))
}

// checkWeightOnly checks a product of t rows by weights of format (FP8,
// Q4_K, Q6_K) for RunF8 and RunBlocks: 1 to GEMVVectorMaxT rows, K a multiple of
// kMul, x and w 16-byte aligned, out aligned to its elements.
func (g *GEMV) checkWeightOnly(format string, kMul int, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	if err := checkWeightOnlyShape(format, kMul, t, k, n); err != nil {
		return err
	}
	oes := g.Act.Size()
	if outF32 {
		oes = 4
	}
	switch {
	case x == 0 || w == 0 || out == 0:
		return fmt.Errorf("%w: null operand", ErrGEMVShape)
	case x%16 != 0 || w%16 != 0:
		return fmt.Errorf("%w: x (%#x) and w (%#x) must be 16-byte aligned", ErrGEMVShape, uint64(x), uint64(w))
	case uint64(out)%uint64(oes) != 0:
		return fmt.Errorf("%w: out (%#x) not aligned to its %d-byte elements", ErrGEMVShape, uint64(out), oes)
	}
	return nil
}

// checkWeightOnlyShape checks checkWeightOnly's rules on the product's
// shape alone.
func checkWeightOnlyShape(format string, kMul, t, k, n int) error {
	switch {
	case t < 1 || t > GEMVVectorMaxT:
		return fmt.Errorf("%w: %d rows with %s weights (1 to %d)", ErrGEMVShape, t, format, GEMVVectorMaxT)
	case k <= 0 || n <= 0 || k%kMul != 0 || int64(k)*int64(t) > math.MaxInt32 || int64(n)*int64(t) > math.MaxInt32:
		return fmt.Errorf("%w: %d×%d by %s %d×%d (K a multiple of %d)", ErrGEMVShape, t, k, format, n, k, kMul)
	}
	return nil
}

// The K-quant kernels' shape (gemv_kq.cu): KQ_WARPS warps a block, each
// streaming its rows through a ring of KQ_STAGES units of 8 super-blocks;
// x's int8 values and group scales take KQ_XSB bytes and KQ_SSB floats a
// super-block.
const (
	kqWarps  = 8
	kqStages = 4
	kqXSB    = 272
	kqSSB    = 20
)

// Q4KBlockBytes and Q6KBlockBytes are the sizes of GGUF's Q4_K and Q6_K
// super-blocks of 256 weights.
const (
	Q4KBlockBytes = 144
	Q6KBlockBytes = 210
)

// kqShared is the dynamic shared memory of a K-quant kernel for t rows of
// k values and super-blocks of bb bytes: the warps' rings, then x.
func kqShared(bb, t, k int) int {
	unit := 8 * bb // KQ_UNIT: room for a unit off the 16-byte grid
	if bb%16 != 0 {
		unit += 16
	}
	return kqWarps*kqStages*unit + t*(k/256)*(kqXSB+4*kqSSB)
}

// kqFormat is a GGUF format the K-quant kernels take (gemv_kq.cu).
type kqFormat struct {
	name string // as errors name it
	kq   string // the kernels' infix
	bb   int    // bytes a super-block of 256 weights
}

var kqFormats = map[tensor.DType]kqFormat{
	tensor.Q4_K: {"Q4_K", "q4k", Q4KBlockBytes},
	tensor.Q6_K: {"Q6_K", "q6k", Q6KBlockBytes},
}

// TakesBlocks reports whether RunBlocks takes weights of GGUF format f
// (Q4_K, Q6_K).
func TakesBlocks(f tensor.DType) bool {
	_, ok := kqFormats[f]
	return ok
}

// TakesBlocksProduct reports whether RunBlocks runs a product of t rows, k
// columns and n outputs by weights of GGUF format f (its operands aside).
func (g *GEMV) TakesBlocksProduct(f tensor.DType, t, k, n int) bool {
	kf, ok := kqFormats[f]
	return g != nil && ok && checkWeightOnlyShape(kf.name, 256, t, k, n) == nil && kqShared(kf.bb, 1, k) <= g.kqLimit()
}

// kqLimit is the shared memory a K-quant launch may take.
func (g *GEMV) kqLimit() int {
	if g.kqSharedLimit > 0 {
		return g.kqSharedLimit
	}
	return g.D.SharedPerBlock
}

// RunBlocks queues out[t,n] = x[t,k]·w[n,k]ᵀ for weights w in GGUF's Q4_K
// or Q6_K (format; each row k/256 super-blocks of Q4KBlockBytes or
// Q6KBlockBytes, as tensor.Q4_K and tensor.Q6_K store them), for decode
// steps of 1 to GEMVVectorMaxT rows, out of the activation dtype or f32,
// as llama.cpp's MMVQ computes it: x rounded to int8 per group of 32
// values, multiplied by the 4-bit (Q4_K) or 6-bit less 32 (Q6_K) weights
// in integers (dp4a) and scaled per 32 or 16 values (gemv_q4k_<t>,
// gemv_q6k_<t>, gemv_kq.cu: each block quantizes x into its shared memory,
// each warp streams its rows through a ring of cp.async copies). K must be
// a multiple of 256, x and w 16-byte aligned. Rows of x whose int8 copy
// would not fit a block's shared memory run in several launches. Other
// products and formats get an error wrapping ErrGEMVShape before anything
// is queued. It can be captured into a CUDA graph.
func (g *GEMV) RunBlocks(s *cu.Stream, format tensor.DType, out, x, w cu.Ptr, t, k, n int, outF32 bool) error {
	return g.RunBlocksFolded(s, format, out, x, w, t, k, n, outF32, BlocksFold{})
}

// BlocksFold is a norm folded into the K-quant products around it (the
// gain cannot be folded into blocks of weights as Fold's products take it):
// Add, the residual added to the product before the norm (out = x·wᵀ +
// Add, of the activation dtype, Add of out's shape; it may be out), or
// Gain, the norm's gain (k values of the activation dtype, 16-byte
// aligned) by which the product after the norm multiplies x, column by
// column, before it rounds x to int8: x·diag(Gain)·wᵀ, the rows' 1/rms
// left to the product's reader. At most one of them.
type BlocksFold struct {
	Add, Gain cu.Ptr
}

// RunBlocksFolded is RunBlocks with a norm folded in (f; see BlocksFold),
// on the same kernels' gemv_<format>_add_<t> and gemv_<format>_gain_<t>
// forms; a fold it does not take is an error wrapping ErrGEMVShape before
// anything is queued.
func (g *GEMV) RunBlocksFolded(s *cu.Stream, format tensor.DType, out, x, w cu.Ptr, t, k, n int, outF32 bool, fold BlocksFold) error {
	f, err := g.checkBlocks(format, out, x, w, t, k, n, outF32)
	if err != nil {
		return err
	}
	switch {
	case fold.Add != 0 && fold.Gain != 0:
		return fmt.Errorf("%w: a K-quant product with both a residual and a gain folded in", ErrGEMVShape)
	case fold.Add != 0 && (outF32 || uint64(fold.Add)%uint64(g.Act.Size()) != 0):
		return fmt.Errorf("%w: a residual (%#x) added to an f32 product, or not aligned to its elements", ErrGEMVShape, uint64(fold.Add))
	case fold.Gain%16 != 0:
		return fmt.Errorf("%w: the gain (%#x) must be 16-byte aligned", ErrGEMVShape, uint64(fold.Gain))
	}
	return g.runKQuant(f, s, out, x, w, t, k, n, outF32, fold)
}

// checkBlocks checks a K-quant product of t rows by weights of format
// (checkWeightOnly's rules).
func (g *GEMV) checkBlocks(format tensor.DType, out, x, w cu.Ptr, t, k, n int, outF32 bool) (kqFormat, error) {
	f, ok := kqFormats[format]
	if !ok {
		return f, fmt.Errorf("%w: weights of %v", ErrGEMVShape, format)
	}
	if err := g.checkWeightOnly(f.name, 256, out, x, w, t, k, n, outF32); err != nil {
		return f, err
	}
	return f, nil
}

// runKQuant runs the K-quant kernel of format f on the product, in as few
// launches of consecutive rows of x as the device's shared memory per
// block allows, each on a grid that stays resident (its warps loop over
// the rows of w).
func (g *GEMV) runKQuant(f kqFormat, s *cu.Stream, out, x, w cu.Ptr, t, k, n int, outF32 bool, fold BlocksFold) error {
	limit := g.kqLimit()
	per := t
	for per > 0 && kqShared(f.bb, per, k) > limit {
		per--
	}
	if per == 0 {
		return fmt.Errorf("%w: %s rows of %d values need %d bytes of shared memory, %d a block", ErrGEMVShape, f.name, k, kqShared(f.bb, 1, k), limit)
	}
	oes := g.Act.Size()
	if outF32 {
		oes = 4
	}
	for t0 := 0; t0 < t; t0 += per {
		c := gemvCfg{t: min(per, t-t0), kq: f.kq}
		args := []any{x.Add(t0 * k * g.Act.Size()), w, out.Add(t0 * n * oes), int32(k), int32(n)}
		switch {
		case fold.Add != 0:
			c.fold, args = "add_", append(args, fold.Add.Add(t0*n*oes))
		case fold.Gain != 0:
			c.fold, args = "gain_", append(args, b2i(outF32), fold.Gain)
		default:
			args = append(args, b2i(outF32))
		}
		c.sh = kqShared(f.bb, c.t, k)
		blocks, err := g.kqBlocks(c)
		if err != nil {
			return err
		}
		c.blocks = min(blocks, (n+kqWarps-1)/kqWarps)
		if err := g.launch(s, c, c.t, n, args...); err != nil {
			return err
		}
	}
	return nil
}

// kqBlocks is how many blocks of K-quant kernel c the device keeps
// resident (measured once a kernel and shared memory size).
func (g *GEMV) kqBlocks(c gemvCfg) (int, error) {
	g.mu.Lock()
	b, ok := g.kqOcc[c]
	g.mu.Unlock()
	if ok {
		return b, nil
	}
	f, err := g.function(c)
	if err != nil {
		return 0, err
	}
	per, err := f.Occupancy(32*kqWarps, c.sh)
	if err != nil {
		return 0, err
	}
	b = max(1, per) * g.D.SMs
	g.mu.Lock()
	g.kqOcc[c] = b
	g.mu.Unlock()
	return b, nil
}

// RunSwiGLU queues out[t,f] = SiLU(x·w[:f]ᵀ)·(x·w[f:]ᵀ) for the stacked
// gate/up weight w[2f,k]: the product of Run with the SwiGLU of
// Kernels.SwiGLUPacked in its epilogue (both halves rounded to the
// activation dtype first, as Run's store would), so that decode steps skip
// that kernel. out is of the activation dtype. normEps > 0: a norm folded
// in (Fold's Eps; 0: none). It can be captured into a CUDA graph.
func (g *GEMV) RunSwiGLU(s *cu.Stream, out, x, w cu.Ptr, t, k, f int, normEps float32) error {
	if f <= 0 || f > math.MaxInt32/2 {
		return fmt.Errorf("%w: swiglu of %d columns", ErrGEMVShape, f)
	}
	if err := g.Check(out, x, w, t, k, 2*f, false); err != nil {
		return err
	}
	if err := g.checkFold(Fold{Eps: normEps}, t, k, 2*f, false, true); err != nil {
		return err
	}
	c := g.cfgFor(t, k, 2*f)
	c.epi = epiSwiGLU
	if c.mma {
		return g.launch(s, c, t, f, x, w, out, int32(k), int32(f), int32(t))
	}
	var tail []any
	c.fold, tail = Fold{Eps: normEps}.kernel()
	if c.tile {
		c = g.split(c, f, k)
		return g.launch(s, c, t, f, append([]any{x, w, out, int32(k), int32(f), int32(t), int32(c.splits)}, tail...)...)
	}
	return g.launch(s, c, t, f, append([]any{x, w, out, int32(k), int32(f)}, tail...)...)
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
	// NormEps > 0: a norm folded into the product (Fold's Eps; 0: none).
	NormEps float32
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
	if err := g.checkFold(Fold{Eps: r.NormEps}, t, k, n, false, true); err != nil {
		return err
	}
	c := g.cfgFor(t, k, n)
	c.epi = epiRoPE
	args := []any{r.Q, r.KCache, r.VCache, r.Pos, r.Slots, r.Table, int32(r.Heads), int32(r.KVHeads), int32(r.HeadDim), b2i(r.Interleaved)}
	if c.mma {
		return g.launch(s, c, t, n/2, append([]any{x, w, int32(k), int32(t)}, args...)...)
	}
	var tail []any
	c.fold, tail = Fold{Eps: r.NormEps}.kernel()
	args = append(args, tail...)
	if c.tile {
		c = g.split(c, n/2, k)
		return g.launch(s, c, t, n/2, append([]any{x, w, int32(k), int32(t), int32(c.splits)}, args...)...)
	}
	return g.launch(s, c, t, n/2, append([]any{x, w, int32(k)}, args...)...)
}
