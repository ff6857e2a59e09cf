// Package kernels holds kiln's CUDA kernels (kernels.cu, attention.cu,
// mma.cu, wgmma.cu, prefill_mma.cu, prefill_wg.cu and decode_mma.cu, one
// source compiled by NVRTC for the exact device) and their Go launch
// wrappers. One Kernels value serves one activation dtype (f32, f16 or
// bf16); math is f32. Every op follows the CPU reference kernels of
// backend/cpu (ref.go).
//
// Pointers are device addresses; all launches are asynchronous on the given
// stream (nil: the default stream).
package kernels

import (
	_ "embed"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

var (
	//go:embed shared.cu
	shared string
	//go:embed kernels.cu
	common string
	//go:embed async.cu
	async string
	//go:embed attention.cu
	attention string
	//go:embed mma.cu
	mmaHelpers string
	//go:embed prefill_mma.cu
	prefillMMA string
	//go:embed prefill_wg.cu
	prefillWG string
	//go:embed decode_mma.cu
	decodeMMA string
	//go:embed moe.cu
	moe string
	//go:embed allreduce.cu
	allReduce string
	// source is the one NVRTC source: the functions shared with gemv.cu,
	// the common and elementwise kernels and a mixture of experts', then
	// the peer all-reduce, the asynchronous copies, attention, the
	// tensor-core helpers (mma.sync's, wgmma's), prefill and decode.
	source = shared + "\n" + common + "\n" + moe + "\n" + allReduce + "\n" + async + "\n" + attention + "\n" + mmaHelpers + "\n" + wgmmaHelpers + "\n" + prefillMMA + "\n" + prefillWG + "\n" + decodeMMA
)

// Source is the CUDA C source of the kernels.
func Source() string { return source }

// HeadDims lists the head dimensions the attention kernels are built for.
// The tensor-core prefill needs a multiple of 16; head dim 8 (tiny models
// such as stories260K) takes the CUDA-core prefill kernel; past 128
// (Gemma's 256) the tensor cores take one head a block and two stages.
var HeadDims = []int{8, 16, 32, 64, 80, 96, 128, 256}

// Kernels is the module of one activation dtype on one device, compiled
// in parts (build).
type Kernels struct {
	D   *cu.Device
	Act cu.DType
	M   *cu.Module // the part of the common kernels (of mods)
	// PDL launches the kernels that start with pdl_enter (every kernel of
	// kernels.cu, and decode attention) as programmatic dependent launches:
	// each is scheduled while the previous kernel finishes, hiding the gap
	// between them. On by default.
	PDL bool
	// KVF8: the module of an FP8 KV cache (NewFP8KV), whose cache writers
	// store E4M3 codes and whose attention reads them.
	KVF8 bool
	// HeadDim is the one head dim whose attention kernels the module holds
	// (NewHeadDim), 0 when it holds every one of HeadDims.
	HeadDim int
	// BlockSize is the KV-cache block size (tokens a block) the attention
	// kernels were built for (NewFor), 0 when they take any.
	BlockSize int
	// WG: the module holds the prefill attention on Hopper's wgmma
	// (prefill_wg.cu: sm_90a, f16/bf16 activations, not an FP8 cache).
	WG bool
	// TMA: it also holds that prefill's builds whose K and V come by TMA
	// (prefill_wgt_… and the ping-pong prefill_wgp_…: -DWG_TMA, which a
	// module built for one block size of 8 to 64 tokens, a power of two,
	// has; tmaBlockSize).
	TMA bool

	parts     *moduleParts // the parts, each holding some of the kernels
	mu        sync.Mutex
	sharedSet map[string]int                // dynamic shared memory limits raised per function
	maps      map[tensorMapKey]cu.TensorMap // the caches' tensor maps (prefill_wgt), encoded once
	// normPrefetch overrides, per power-of-two bucket of rows and row
	// length, whether the norms' register path loads its weights before
	// the PDL wait (SetNormPrefetch: a measured choice).
	normPrefetch map[[2]int]bool
}

func cname(t cu.DType) string { return [...]string{"f32", "f16", "bf16"}[t] }

// New compiles (or loads from the kernel cache) the kernels for activation
// dtype act.
func New(d *cu.Device, act cu.DType) (*Kernels, error) {
	return NewHeadDim(d, act, 0)
}

// NewHeadDim is New with the attention kernels of head dim hd alone (one
// of HeadDims; 0: all): a model has one, and NVRTC then compiles a
// fraction of the attention kernels.
func NewHeadDim(d *cu.Device, act cu.DType, hd int) (*Kernels, error) {
	return NewFor(d, act, hd, 0)
}

// NewFor is NewHeadDim with the attention kernels built for a KV cache of
// blockSize tokens a block (0: any), a constant of their address
// arithmetic then (KILN_BS): prefill attention ran 1.07–1.35× as fast as
// with the block size read at run time on the H200 (docs/PERF.md, sessions
// 45 and 46). They then take caches of that block size alone.
func NewFor(d *cu.Device, act cu.DType, hd, blockSize int) (*Kernels, error) {
	if act != cu.F32 && act != cu.F16 && act != cu.BF16 {
		return nil, fmt.Errorf("kernels: activation dtype %v", act)
	}
	return build(d, act, false, hd, blockSize)
}

// build compiles the module of act, for an FP8 KV cache with kvF8, with
// the attention kernels of head dim hd (0: all) for caches of blocks of bs
// tokens (0: any).
func build(d *cu.Device, act cu.DType, kvF8 bool, hd, bs int) (*Kernels, error) {
	if hd != 0 && !slices.Contains(HeadDims, hd) {
		return nil, fmt.Errorf("kernels: attention head dim %d (built for %v)", hd, HeadDims)
	}
	if bs < 0 {
		return nil, fmt.Errorf("kernels: KV-cache block size %d", bs)
	}
	name, opts := "kiln_kernels_"+cname(act), []string{"-DACT=" + cname(act), "--std=c++17"}
	if act != cu.F32 {
		opts = append(opts, "-DACT_MMA=1") // the tensor-core prefill kernels
	}
	wg := act != cu.F32 && !kvF8 && d.Arch() == "sm_90a"
	if wg {
		opts = append(opts, "-DACT_WGMMA=1") // the wgmma prefill kernels (prefill_wg.cu)
	}
	if kvF8 {
		name, opts = name+"_kvf8", append(opts, "-DKV_F8=1")
	}
	if hd != 0 {
		name, opts = fmt.Sprintf("%s_hd%d", name, hd), append(opts, fmt.Sprintf("-DKILN_HD=%d", hd))
	}
	if bs != 0 {
		name, opts = fmt.Sprintf("%s_bs%d", name, bs), append(opts, fmt.Sprintf("-DKILN_BS=%d", bs))
		if wg && tmaBlockSize(bs) {
			opts = append(opts, "-DWG_TMA=1") // the wgmma prefill's TMA builds (prefill_wg.cu)
		}
	}
	// The source compiles as up to six NVRTC programs at once (KILN_PART
	// in shared.cu: 0 the common kernels, 1 the tensor-core prefill
	// attention, 2 the CUDA-core prefill attention, 3 the tensor-core
	// decode attention, 4 and 5 the CUDA-core decode attention's split and
	// cluster plans): NVRTC spends most of a cold start in the attention
	// kernels, a program on few host threads even with --split-compile, so
	// the parts take about as long as the longest of them instead of their
	// sum (each part's time: docs/PERF.md, Tuning, sessions 18 and 19).
	parts := []int{0, 1, 2, 3, 4, 5}
	switch {
	case act == cu.F32:
		parts = []int{0, 2, 4, 5} // no tensor-core kernels (ACT_MMA) in f32
	case kvF8:
		parts = []int{0, 1, 3} // an FP8 cache has no CUDA-core attention
	}
	mods, err := compileParts(d, name, source, opts, parts)
	if err != nil {
		return nil, err
	}
	k := &Kernels{D: d, Act: act, M: mods.mods[0], parts: mods, PDL: true, KVF8: kvF8, HeadDim: hd, BlockSize: bs, WG: wg,
		sharedSet: map[string]int{}}
	if wg && bs > 0 {
		for _, h := range []int{64, 128} {
			if hd == 0 || hd == h {
				_, err := mods.holding(fmt.Sprintf("prefill_wgt_%d_128_2", h))
				k.TMA = k.TMA || err == nil
			}
		}
	}
	return k, nil
}

// tmaBlockSize reports whether the wgmma prefill's TMA builds take caches
// of bs-token blocks (prefill_wg.cu's WGT_KERNEL: a box of a block's rows,
// 8 to 64 of them, a power of two). The ping-pong build (prefill_wgp) ran
// the fastest of the prefill kernels on an H200 at 2,048 and 4,096 tokens
// in session 47 (docs/PERF.md).
func tmaBlockSize(bs int) bool { return bs >= 8 && bs <= 64 && bs&(bs-1) == 0 }

// Modules are the parts k was compiled in.
func (k *Kernels) Modules() []*cu.Module { return k.parts.mods }

// module is the module of k's parts that holds kernel name.
func (k *Kernels) module(name string) (*cu.Module, error) { return k.parts.holding(name) }

// NewFP8KV compiles (or loads from the kernel cache) the module of an FP8
// KV cache for activation dtype act (f16 or bf16, compute capability 8.9
// or later): the kernels of New, built with -DKV_F8, so that the cache
// writers (KVWrite, RoPEKVWrite, RoPEQKVWrite) store keys and values as
// E4M3 codes (scale 1, rounded to nearest even and saturated at ±448, as
// tensor.F32ToE4M3) and the tensor-core attention (prefill and decode)
// widens the codes in shared memory. The CUDA-core attention kernels are
// not built in it: Attn values with FP8 set take the tensor-core plans,
// and FP8OK says which layers those serve.
func NewFP8KV(d *cu.Device, act cu.DType) (*Kernels, error) {
	return NewFP8KVHeadDim(d, act, 0)
}

// NewFP8KVHeadDim is NewFP8KV with the attention kernels of head dim hd
// alone (0: all).
func NewFP8KVHeadDim(d *cu.Device, act cu.DType, hd int) (*Kernels, error) {
	return NewFP8KVFor(d, act, hd, 0)
}

// NewFP8KVFor is NewFP8KVHeadDim with the attention kernels built for
// caches of blockSize tokens a block (0: any), as NewFor's.
func NewFP8KVFor(d *cu.Device, act cu.DType, hd, blockSize int) (*Kernels, error) {
	if act != cu.F16 && act != cu.BF16 {
		return nil, fmt.Errorf("kernels: an FP8 KV cache needs f16 or bf16 activations (not %v)", act)
	}
	if !d.FP8() {
		return nil, fmt.Errorf("kernels: an FP8 KV cache needs compute capability 8.9 (%s is %d.%d)", d.Name, d.Major, d.Minor)
	}
	return build(d, act, true, hd, blockSize)
}

// FP8OK reports whether the attention of a layer of heads query heads over
// kvHeads kv heads of headDim takes an FP8 cache: the tensor-core kernels'
// shapes (a head dim multiple of 16 among HeadDims, GQA groups of at most
// 32).
func FP8OK(heads, kvHeads, headDim int) error {
	if headDim%16 != 0 || !slices.Contains(HeadDims, headDim) || kvHeads <= 0 || heads%kvHeads != 0 || heads/kvHeads > 32 {
		return fmt.Errorf("kernels: an FP8 KV cache needs the tensor-core attention: head dim a multiple of 16 (%d), GQA groups of at most 32 query heads (%d/%d)",
			headDim, heads, kvHeads)
	}
	return nil
}

// Close unloads the module.
func (k *Kernels) Close() error { return k.parts.close() }

func (k *Kernels) launch(name string, grid, block cu.Dim3, shared int, s *cu.Stream, args ...any) error {
	m, err := k.module(name)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", name, err)
	}
	return launchOn(m, name, grid, block, shared, s, args...)
}

// launchDep launches a kernel that starts with pdl_enter: as a
// programmatic dependent launch when k.PDL is set.
func (k *Kernels) launchDep(name string, grid, block cu.Dim3, shared int, s *cu.Stream, args ...any) error {
	if !k.PDL {
		return k.launch(name, grid, block, shared, s, args...)
	}
	m, err := k.module(name)
	if err == nil {
		err = m.LaunchDependent(name, grid, block, shared, s, args...)
	}
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", name, err)
	}
	return nil
}

func launchOn(m *cu.Module, name string, grid, block cu.Dim3, shared int, s *cu.Stream, args ...any) error {
	if err := m.Launch(name, grid, block, shared, s, args...); err != nil {
		return fmt.Errorf("kernels: %s: %w", name, err)
	}
	return nil
}

// elementwise grid: enough blocks of 256 to cover n, capped (grid-stride loops).
func ewGrid(n int) cu.Dim3 { return cu.D1(max(1, min((n+255)/256, 65535))) }

func normBlock(dim int) cu.Dim3 {
	b := 256
	for b > 32 && b/2 >= dim {
		b /= 2
	}
	return cu.D1(b)
}

func wsuffix(w cu.DType) string { return "_w" + cname(w) }

func checkRows(what string, rows, cols int) error {
	if rows <= 0 || cols <= 0 || int64(rows)*int64(cols) > math.MaxInt32 {
		return fmt.Errorf("kernels: %s of %d×%d", what, rows, cols)
	}
	return nil
}

// Embed gathers rows of table[vocab, dim] (dtype w) by ids (int32[rows]) into
// out[rows, dim]. An id out of range yields NaN.
func (k *Kernels) Embed(s *cu.Stream, out, table cu.Ptr, w cu.DType, vocab int, ids cu.Ptr, rows, dim int) error {
	return k.EmbedShard(s, out, table, w, vocab, ids, rows, dim, 0, vocab, 1)
}

// EmbedShard is Embed of a vocabulary shard: table holds rows [start,
// start+vocab) of a vocabulary of total; an id of another shard gives a row
// of zeros, one out of [0, total) NaN. The rows are times scale (Gemma's
// √dim; 1 for most models).
func (k *Kernels) EmbedShard(s *cu.Stream, out, table cu.Ptr, w cu.DType, vocab int, ids cu.Ptr, rows, dim, start, total int, scale float32) error {
	if err := checkRows("embed", rows, dim); err != nil {
		return err
	}
	if start < 0 || start+vocab > total {
		return fmt.Errorf("kernels: embedding shard [%d,%d) of %d", start, start+vocab, total)
	}
	return k.launchDep("embed"+wsuffix(w), cu.D1(rows), normBlock(dim), 0, s, table, ids, out, int32(rows), int32(vocab), int32(dim),
		int32(start), int32(total), scale)
}

// InterleaveRanks lays out a tensor-parallel all-gather's rank-major
// in[ranks, rows, n] (f32) by rows: out[rows, ranks·n].
func (k *Kernels) InterleaveRanks(s *cu.Stream, out, in cu.Ptr, rows, n, ranks int) error {
	if err := checkRows("interleave", rows*ranks, n); err != nil {
		return err
	}
	return k.launchDep("interleave_ranks", cu.Dim3{X: rows, Y: ranks, Z: 1}, cu.D1(256), 0, s, in, out,
		int32(rows), int32(n), int32(ranks))
}

// vec is the number of activations in 16 bytes (VEC in kernels.cu).
func (k *Kernels) vec() int { return 16 / k.Act.Size() }

// aligned16 reports whether every pointer is 16-byte aligned.
func aligned16(ps ...cu.Ptr) bool {
	for _, p := range ps {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// normMaxVectors is NORM_MAXV in kernels.cu: 16-byte vectors per thread of
// the norms' register path, at 256 threads.
const normMaxVectors = 8

// normPrefetchRows is the most rows for which the norms' register path also
// loads its weights before the PDL wait ("_vp"): decode batches. Prefill's
// thousands of rows keep the plain path, which needs fewer registers
// (docs/PERF.md: prefill fell while the prefetching variant served it).
const normPrefetchRows = 256

// normKernel picks a norm's kernel and block for rows of dim: the register
// path ("_v", "_vp" for few rows; with fp8 its variant writing the FP8
// form, "_vq", "_vpq") when the rows split into 16-byte vectors that fit
// it, else the plain loop. It reports whether it took the register path.
func (k *Kernels) normKernel(name string, wt cu.DType, rows, dim int, fp8 bool, ptrs ...cu.Ptr) (string, cu.Dim3, bool) {
	nv := dim / k.vec()
	if k.NormRegisterPath(dim, ptrs...) {
		v := "_v"
		if k.NormPrefetch(rows, dim) {
			v = "_vp"
		}
		if fp8 {
			v += "q"
		}
		return name + v + wsuffix(wt), rowBlock(nv), true
	}
	return name + wsuffix(wt), normBlock(dim), false
}

// rowBlock is the block of the kernels that take a row of nv 16-byte
// vectors a block (or several rows, a thread the same vectors of each): a
// thread a vector, in whole warps, at most 256.
func rowBlock(nv int) cu.Dim3 { return cu.D1(min(256, (nv+31)/32*32)) }

// NormRegisterPath reports whether the norms of rows of dim over the
// operands at ptrs take the register path ("_v"), where NormPrefetch
// applies.
func (k *Kernels) NormRegisterPath(dim int, ptrs ...cu.Ptr) bool {
	return dim%k.vec() == 0 && dim/k.vec() <= normMaxVectors*256 && aligned16(ptrs...)
}

// NormPrefetch reports whether the norms' register path of rows rows of
// dim loads its weights before the PDL wait ("_vp"): the choice
// SetNormPrefetch set for their power-of-two bucket and dim, else rows ≤
// normPrefetchRows.
func (k *Kernels) NormPrefetch(rows, dim int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if on, ok := k.normPrefetch[[2]int{bucketOf(rows), dim}]; ok {
		return on
	}
	return rows <= normPrefetchRows
}

// SetNormPrefetch sets NormPrefetch for the bucket of rows and dim.
func (k *Kernels) SetNormPrefetch(rows, dim int, on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.normPrefetch == nil {
		k.normPrefetch = map[[2]int]bool{}
	}
	k.normPrefetch[[2]int{bucketOf(rows), dim}] = on
}

// bucketOf is the power-of-two bucket of n rows (n rounded up).
func bucketOf(n int) int {
	b := 1
	for b < n {
		b *= 2
	}
	return b
}

// RMSNorm: out[r,:] = x[r,:] / sqrt(mean(x[r,:]²)+eps) · w (w of dtype wt).
func (k *Kernels) RMSNorm(s *cu.Stream, out, x, w cu.Ptr, wt cu.DType, rows, dim int, eps float32) error {
	if err := checkRows("rmsnorm", rows, dim); err != nil {
		return err
	}
	name, block, _ := k.normKernel("rmsnorm", wt, rows, dim, false, out, x)
	return k.launchDep(name, cu.D1(rows), block, 0, s, x, w, out, int32(rows), int32(dim), eps)
}

// AddRMSNorm: sum = x + r; normed = RMSNorm(sum, w). sum may alias x or r;
// x may be an FP8 product's with its scales xs (ProductScales{}: none).
func (k *Kernels) AddRMSNorm(s *cu.Stream, sum, normed, x, r cu.Ptr, xs ProductScales, w cu.Ptr, wt cu.DType, rows, dim int, eps float32) error {
	if err := checkRows("add_rmsnorm", rows, dim); err != nil {
		return err
	}
	name, block, _ := k.normKernel("add_rmsnorm", wt, rows, dim, false, sum, normed, x, r, xs.Cols)
	return k.launchDep(name, cu.D1(rows), block, 0, s, x, r, xs.Rows, xs.Cols, w, sum, normed, int32(rows), int32(dim), eps)
}

// E4M3Rows is where a kernel writes its output rows in their FP8 form, as
// QuantizeRowsE4M3 would write them from the rows it otherwise writes: Q
// the codes (rows×cols bytes, 8-byte aligned), Scales a float32 a row.
type E4M3Rows struct{ Q, Scales cu.Ptr }

// RMSNormE4M3 is RMSNorm with its output in FP8 form: one kernel on the
// norms' register path, else RMSNorm into out and QuantizeRowsE4M3 of it.
func (k *Kernels) RMSNormE4M3(s *cu.Stream, q E4M3Rows, out, x, w cu.Ptr, wt cu.DType, rows, dim int, eps float32) error {
	if err := checkRows("rmsnorm", rows, dim); err != nil {
		return err
	}
	if name, block, ok := k.normKernel("rmsnorm", wt, rows, dim, true, x); ok && q.Q%8 == 0 && dim%16 == 0 {
		return k.launchDep(name, cu.D1(rows), block, 0, s, x, w, q.Q, q.Scales, int32(rows), int32(dim), eps)
	}
	if err := k.RMSNorm(s, out, x, w, wt, rows, dim, eps); err != nil {
		return err
	}
	return k.QuantizeRowsE4M3(s, q.Q, q.Scales, out, rows, dim)
}

// AddRMSNormE4M3 is AddRMSNorm with normed in FP8 form (sum as it is; x
// may be an FP8 product's with its scales xs, as AddRMSNorm's): one
// kernel on the norms' register path, else AddRMSNorm and
// QuantizeRowsE4M3 of normed.
func (k *Kernels) AddRMSNormE4M3(s *cu.Stream, sum, normed cu.Ptr, q E4M3Rows, x, r cu.Ptr, xs ProductScales, w cu.Ptr, wt cu.DType, rows, dim int, eps float32) error {
	if err := checkRows("add_rmsnorm", rows, dim); err != nil {
		return err
	}
	if name, block, ok := k.normKernel("add_rmsnorm", wt, rows, dim, true, sum, x, r, xs.Cols); ok && q.Q%8 == 0 && dim%16 == 0 {
		if shared := normRowsQ * dim * k.Act.Size(); rows >= prefillRowsQ && shared <= maxRowsShared && aligned16(w) {
			rq := "add_rmsnorm_rq" + wsuffix(wt)
			if err := k.preferShared(rq, shared); err != nil {
				return err
			}
			return k.launchDep(rq, cu.D1((rows+normRowsQ-1)/normRowsQ), block, shared, s, x, r, xs.Rows, xs.Cols, w, sum, q.Q, q.Scales,
				int32(rows), int32(dim), eps)
		}
		return k.launchDep(name, cu.D1(rows), block, 0, s, x, r, xs.Rows, xs.Cols, w, sum, q.Q, q.Scales, int32(rows), int32(dim), eps)
	}
	if err := k.AddRMSNorm(s, sum, normed, x, r, xs, w, wt, rows, dim, eps); err != nil {
		return err
	}
	return k.QuantizeRowsE4M3(s, q.Q, q.Scales, normed, rows, dim)
}

// AddBias: out[r,c] = x[r,c] + b[c] (b of dtype bt).
func (k *Kernels) AddBias(s *cu.Stream, out, x, b cu.Ptr, bt cu.DType, rows, cols int) error {
	if err := checkRows("add_bias", rows, cols); err != nil {
		return err
	}
	return k.launchDep("add_bias"+wsuffix(bt), ewGrid(rows*cols), cu.D1(256), 0, s, x, b, out, int32(rows), int32(cols))
}

// ProductScales are the scales of an FP8 product that cuBLASLt ran with
// unit scales (QuantizeRowsE4M3): Rows, a float32 a row of the product (its
// activation's, per token), and Cols, a float32 a column (the weight's
// scale a row); a zero pointer stands for ones. The kernels that take them
// (ScaleRowsCols, SwiGLUPacked, RoPEQKVWrite) read each element of the
// product as x·Rows[r]·Cols[c] rounded to the activation dtype, exactly
// what ScaleRowsCols writes.
type ProductScales struct{ Rows, Cols cu.Ptr }

// ScaleRowsCols: out[r,c] = x[r,c]·sc.Rows[r]·sc.Cols[c] over rows×cols
// elements (in place when out is x): an FP8 product's scales applied.
func (k *Kernels) ScaleRowsCols(s *cu.Stream, out, x cu.Ptr, sc ProductScales, rows, cols int) error {
	if err := checkRows("scale_rows_cols", rows, cols); err != nil {
		return err
	}
	if v := k.vec(); cols%v == 0 && aligned16(x, out, sc.Cols) {
		return k.launchDep("scale_rows_cols_v", ewGrid(rows*cols/v), cu.D1(256), 0, s, x, sc.Rows, sc.Cols, out, int32(rows), int32(cols/v))
	}
	return k.launchDep("scale_rows_cols", ewGrid(rows*cols), cu.D1(256), 0, s, x, sc.Rows, sc.Cols, out, int32(rows), int32(cols))
}

// DequantFormats are the GGUF block formats Dequantize widens on the
// device: every block format tensor decodes.
var DequantFormats = []tensor.DType{tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.IQ4_NL,
	tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K}

// Dequantize widens n values of GGUF blocks of format f at w to the
// activation dtype at out (16-byte aligned), exactly as tensor's reference
// decoders do, rounded to the activation dtype: a quantized matrix's rows
// for a product through cuBLASLt. n must be whole blocks.
func (k *Kernels) Dequantize(s *cu.Stream, out, w cu.Ptr, f tensor.DType, n int) error {
	if !slices.Contains(DequantFormats, f) {
		return fmt.Errorf("kernels: no dequantization of %v on the device", f)
	}
	if n <= 0 || n%f.BlockSize() != 0 || out%16 != 0 || w == 0 {
		return fmt.Errorf("kernels: dequantize %d values of %v (whole blocks of %d) to %#x", n, f, f.BlockSize(), uint64(out))
	}
	groups := n / 32
	return k.launchDep("dequant_"+f.String(), ewGrid(groups), cu.D1(256), 0, s, w, out, int64(groups), cu.Ptr(0), cu.Ptr(0), cu.Ptr(0), int32(0))
}

// ExpertTable is a table of matrices for DequantizeExperts: Matrices
// device pointers to GGUF blocks of format Format at Src, each widened to
// the activation dtype at the pointer in the same place of Dst (16-byte
// aligned), N values each (whole blocks). Matrix j belongs to expert j %
// Experts; with Count (the experts' entries of a step, moe_order's count)
// an expert with none is skipped.
type ExpertTable struct {
	Format            tensor.DType
	Src, Dst          cu.Ptr
	Matrices, Experts int
	N                 int
	Count             cu.Ptr
	// Routed (a table of MoE.Widen): Count is the step's moe_order
	// counts, which Kernels.MoE sets.
	Routed bool
}

// DequantizeExperts widens the matrices of table t (a mixture's experts
// kept in their GGUF blocks) as Dequantize widens one: a launch for the
// whole table, the matrices of experts no entry went to left as they were.
func (k *Kernels) DequantizeExperts(s *cu.Stream, t ExpertTable) error {
	f := t.Format
	if !slices.Contains(DequantFormats, f) {
		return fmt.Errorf("kernels: no dequantization of %v on the device", f)
	}
	if t.N <= 0 || t.N%f.BlockSize() != 0 || t.Src == 0 || t.Dst == 0 || t.Matrices <= 0 || t.Matrices > 65535 || t.Experts <= 0 {
		return fmt.Errorf("kernels: dequantize %d matrices of %d values of %v (whole blocks of %d), %d experts", t.Matrices, t.N, f, f.BlockSize(), t.Experts)
	}
	groups := t.N / 32
	g := ewGrid(groups)
	g.Y = t.Matrices
	return k.launchDep("dequant_"+f.String(), g, cu.D1(256), 0, s, cu.Ptr(0), cu.Ptr(0), int64(groups), t.Src, t.Dst, t.Count, int32(t.Experts))
}

// Add: out = a + b over n elements.
func (k *Kernels) Add(s *cu.Stream, out, a, b cu.Ptr, n int) error {
	return k.launchDep("add", ewGrid(n), cu.D1(256), 0, s, a, b, out, int64(n))
}

// Spin holds stream s for d: what is queued behind it waits that long.
func (k *Kernels) Spin(s *cu.Stream, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("kernels: spin of %v", d)
	}
	return k.launch("spin_ns", cu.D1(1), cu.D1(1), 0, s, uint64(d.Nanoseconds()))
}

// Mul: out = a · b over n elements.
func (k *Kernels) Mul(s *cu.Stream, out, a, b cu.Ptr, n int) error {
	return k.launchDep("mul", ewGrid(n), cu.D1(256), 0, s, a, b, out, int64(n))
}

// SiLU: out = x · sigmoid(x) over n elements.
func (k *Kernels) SiLU(s *cu.Stream, out, x cu.Ptr, n int) error {
	return k.launchDep("silu", ewGrid(n), cu.D1(256), 0, s, x, out, int64(n))
}

// GELUTanh: out = GELU(x) by its tanh approximation over n elements.
func (k *Kernels) GELUTanh(s *cu.Stream, out, x cu.Ptr, n int) error {
	return k.launchDep("gelu_tanh", ewGrid(n), cu.D1(256), 0, s, x, out, int64(n))
}

// SoftCap: out = cap·tanh(x/cap) over n f32 values (cap > 0).
func (k *Kernels) SoftCap(s *cu.Stream, out, x cu.Ptr, cap float32, n int) error {
	if !(cap > 0) {
		return fmt.Errorf("kernels: soft cap %g", cap)
	}
	return k.launchDep("softcap_f32", ewGrid(n), cu.D1(256), 0, s, x, out, cap, int64(n))
}

// SwiGLU: out = SiLU(gate) · up over n elements.
func (k *Kernels) SwiGLU(s *cu.Stream, out, gate, up cu.Ptr, n int) error {
	if v := k.vec(); n%v == 0 && aligned16(out, gate, up) {
		return k.launchDep("swiglu_v", ewGrid(n/v), cu.D1(256), 0, s, gate, up, out, int64(n/v))
	}
	return k.launchDep("swiglu", ewGrid(n), cu.D1(256), 0, s, gate, up, out, int64(n))
}

// SwiGLUPacked: out[rows, n] = SiLU(gu[:, :n]) · gu[:, n:] for gu[rows, 2n],
// gu an FP8 product's with its scales sc (ProductScales{}: none).
func (k *Kernels) SwiGLUPacked(s *cu.Stream, out, gu cu.Ptr, sc ProductScales, rows, n int) error {
	if err := checkRows("swiglu_packed", rows, 2*n); err != nil {
		return err
	}
	if v := k.vec(); n%v == 0 && aligned16(out, gu, sc.Cols) {
		return k.launchDep("swiglu_packed_v", ewGrid(rows*n/v), cu.D1(256), 0, s, gu, sc.Rows, sc.Cols, out, int32(rows), int32(n/v))
	}
	return k.launchDep("swiglu_packed", ewGrid(rows*n), cu.D1(256), 0, s, gu, sc.Rows, sc.Cols, out, int32(rows), int32(n))
}

// RowRMS names the rows whose rms a product's rows are still to be divided
// by: X[rows, Dim] in the activation dtype, 16-byte aligned, with the norm's
// Eps. It stands for a norm whose gain was folded into the product's
// weights (FoldGain) and which did not run: the product read X itself.
type RowRMS struct {
	X   cu.Ptr
	Dim int
	Eps float32
}

func (nx RowRMS) check(what string) error {
	if nx.X == 0 || nx.Dim <= 0 || nx.Dim%16 != 0 || !aligned16(nx.X) {
		return fmt.Errorf("kernels: %s over rows of %d at %#x (a multiple of 16, 16-byte aligned)", what, nx.Dim, nx.X)
	}
	return nil
}

// MaxRMSRows is the most rows the RowRMS readers take (a grid's height).
const MaxRMSRows = 65535

// rowChunks is the grid of the RowRMS readers: a block of 256 threads for
// each per elements of a row (whole rows' blocks each recompute the row's
// rms, a read of Dim elements), rows high.
func rowChunks(units, per, rows int) cu.Dim3 {
	return cu.Dim3{X: max(1, (units+256*per-1)/(256*per)), Y: rows, Z: 1}
}

// SwiGLUPackedRMS is SwiGLUPacked of a product gu whose rows are still to
// be divided by the rms of nx's: each element read as x/rms rounded to the
// activation dtype (as SwiGLUPacked reads a product given its row scales).
// n a multiple of the 16-byte vector, operands 16-byte aligned.
func (k *Kernels) SwiGLUPackedRMS(s *cu.Stream, out, gu cu.Ptr, nx RowRMS, rows, n int) error {
	if err := checkRows("swiglu_packed", rows, 2*n); err != nil {
		return err
	}
	if err := nx.check("swiglu_packed"); err != nil {
		return err
	}
	v := k.vec()
	if n%v != 0 || !aligned16(out, gu) || rows > MaxRMSRows {
		return fmt.Errorf("kernels: swiglu_packed of %d rows of %d over a norm's rows: unaligned", rows, n)
	}
	return k.launchDep("swiglu_packed_n", rowChunks(n/v, 2, rows), cu.D1(256), 0, s, gu, nx.X, int32(nx.Dim), nx.Eps, out, int32(n/v))
}

// FoldGain multiplies w[rows, cols] (the activation dtype) by the norm
// gain g[cols] (dtype gt) column by column, in place, each product rounded
// to the activation dtype: the norm that a product of w reads, folded into
// w.
func (k *Kernels) FoldGain(s *cu.Stream, w, g cu.Ptr, gt cu.DType, rows, cols int) error {
	if err := checkRows("fold_gain", rows, cols); err != nil {
		return err
	}
	return k.launch("fold_gain"+wsuffix(gt), ewGrid(rows*cols), cu.D1(256), 0, s, w, g, int32(rows), int32(cols))
}

// swigluE4M3MinRows is the fewest rows SwiGLUPackedE4M3 gives its one
// kernel (a block a row): with fewer, too few blocks spread over the device
// (on an H200, batch-64 decode of the Llama-3-8B-shaped FP8 model ran 3%
// slower with it than with the two kernels; batch 256 and prefill gained).
const swigluE4M3MinRows = 256

// The FP8-form writers' kernels for the many rows of a prefill (at least
// prefillRowsQ; kernels.cu's swiglu_packed_qr, add_rmsnorm_rq_w*): a block
// takes swigluRowsQ (ROWS_Q) or normRowsQ (ROWS_N) rows, holding their
// values in at most maxRowsShared bytes of shared memory. A block a row
// streamed the FP8 prefill's rows at 0.8–1.0 TB/s (Nsight Compute, H200,
// docs/PERF.md issue 16, session 32): each column's scales read again for
// every row, and a thread's loads waiting for one another.
const (
	prefillRowsQ  = 1024
	swigluRowsQ   = 2
	normRowsQ     = 2
	maxRowsShared = 160 << 10
)

// swigluQRShared is swiglu_packed_qr's dynamic shared memory for rows of nv
// vectors: swigluRowsQ rows of all but each thread's last vector.
func swigluQRShared(nv int) int { return swigluRowsQ * max(0, nv-int(rowBlock(nv).X)) * 16 }

// SwiGLUPackedE4M3 is SwiGLUPacked with its output in FP8 form: one kernel,
// a block for two rows from prefillRowsQ rows on, a block a row for at
// least swigluE4M3MinRows rows that fit the norms' register path, else
// SwiGLUPacked into out and QuantizeRowsE4M3 of it.
func (k *Kernels) SwiGLUPackedE4M3(s *cu.Stream, q E4M3Rows, out, gu cu.Ptr, sc ProductScales, rows, n int) error {
	if err := checkRows("swiglu_packed", rows, 2*n); err != nil {
		return err
	}
	v := k.vec()
	if shared := swigluQRShared(n / v); rows >= prefillRowsQ && n%16 == 0 && shared <= maxRowsShared && aligned16(gu, sc.Cols) && q.Q%8 == 0 {
		nv := n / v
		if err := k.preferShared("swiglu_packed_qr", shared); err != nil {
			return err
		}
		return k.launchDep("swiglu_packed_qr", cu.D1((rows+swigluRowsQ-1)/swigluRowsQ), rowBlock(nv), shared, s,
			gu, sc.Rows, sc.Cols, q.Q, q.Scales, int32(rows), int32(nv))
	}
	if rows >= swigluE4M3MinRows && n%16 == 0 && n/v <= normMaxVectors*256 && aligned16(gu, sc.Cols) && q.Q%8 == 0 {
		nv := n / v
		return k.launchDep("swiglu_packed_q", cu.D1(rows), rowBlock(nv), 0, s, gu, sc.Rows, sc.Cols, q.Q, q.Scales, int32(nv))
	}
	if err := k.SwiGLUPacked(s, out, gu, sc, rows, n); err != nil {
		return err
	}
	return k.QuantizeRowsE4M3(s, q.Q, q.Scales, out, rows, n)
}

// QuantizeRowsE4M3 queues the per-token dynamic FP8 quantization of
// x[rows, cols] (the activation dtype) for cuBLASLt's FP8 products
// (cu.Matmul with In F8E4M3 and unit scales, their scales applied after
// through ProductScales): each row's q = E4M3(x/s) with s = max|x|/448 of
// the row (1 when it is all zeros), rounded to nearest even and saturated
// at ±448, and s into scales[row] (float32). One launch, a block a row
// (fp8_quant_rows in kernels.cu). cols must be a multiple of 16 (cuBLASLt's
// FP8 K is), x 16-byte aligned, q 8-byte aligned and scales 4-byte
// aligned; compute capability 8.9 or later.
func (k *Kernels) QuantizeRowsE4M3(s *cu.Stream, q, scales, x cu.Ptr, rows, cols int) error {
	switch {
	case !k.D.FP8():
		return fmt.Errorf("kernels: FP8 quantization needs compute capability 8.9 (%s is %d.%d)", k.D.Name, k.D.Major, k.D.Minor)
	case cols <= 0 || cols%16 != 0 || checkRows("fp8_quant_rows", rows, cols) != nil:
		return fmt.Errorf("kernels: FP8 quantization of %d rows of %d values (a positive multiple of 16)", rows, cols)
	case !aligned16(x) || q%8 != 0 || scales%4 != 0 || q == 0 || scales == 0:
		return fmt.Errorf("kernels: FP8 quantization operands misaligned or null (x %#x, q %#x, scales %#x)",
			uint64(x), uint64(q), uint64(scales))
	}
	cvs := cols / k.vec()
	return k.launchDep("fp8_quant_rows", cu.D1(rows), normBlock(cvs), 0, s, x, q, scales, int32(cvs))
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// RoPE rotates x[rows, heads·headDim] by positions pos (int32[rows]) with the
// folded table (f32 [maxPos, headDim]: cos then sin) into out; out may be x.
// interleaved pairs (2i, 2i+1), else (i, i+headDim/2).
func (k *Kernels) RoPE(s *cu.Stream, out, x, pos, table cu.Ptr, rows, heads, headDim int, interleaved bool) error {
	if err := checkRows("rope", rows, heads*headDim); err != nil || headDim%2 != 0 {
		return fmt.Errorf("kernels: rope of %d rows, %d heads of %d", rows, heads, headDim)
	}
	return k.launchDep("rope", ewGrid(rows*heads*headDim/2), cu.D1(256), 0, s, x, out, pos, table,
		int32(rows), int32(heads), int32(headDim), b2i(interleaved))
}

// KVWrite stores k and v ([rows, width], width = kvHeads·headDim) into one
// layer's caches kc, vc ([slots, width]) at slots (int32[rows], Meta.Slots).
func (k *Kernels) KVWrite(s *cu.Stream, kc, vc, kx, vx, slots cu.Ptr, rows, width int) error {
	if err := checkRows("kv_write", rows, width); err != nil {
		return err
	}
	return k.launchDep("kv_write", ewGrid(rows*width), cu.D1(256), 0, s, kx, vx, kc, vc, slots, int32(rows), int32(width))
}

// RoPEQKVWrite takes qkv[rows, (heads+2·kvHeads)·headDim] apart: the q heads
// rotated by pos into q[rows, heads·headDim], the k heads rotated and the v
// heads stored into one layer's caches at slots, like RoPE and RoPEKVWrite.
// qkv may be an FP8 product's with its scales sc (ProductScales{}: none).
func (k *Kernels) RoPEQKVWrite(s *cu.Stream, q, kc, vc, qkv cu.Ptr, sc ProductScales, pos, slots, table cu.Ptr, rows, heads, kvHeads, headDim int, interleaved bool) error {
	if err := checkRows("rope_qkv_write", rows, (heads+2*kvHeads)*headDim); err != nil || headDim%2 != 0 || kvHeads <= 0 || heads <= 0 {
		return fmt.Errorf("kernels: rope_qkv_write of %d rows, %d heads and %d kv heads of %d", rows, heads, kvHeads, headDim)
	}
	if rows <= MaxRMSRows && k.ropeVectors(headDim, q, kc, vc, qkv, sc.Cols, table) {
		return k.launchDep("rope_qkv_write_v", k.ropeGrid(heads, kvHeads, headDim, rows), cu.D1(ropeThreads), 0, s,
			qkv, sc.Rows, sc.Cols, q, kc, vc, pos, slots, table, int32(heads), int32(kvHeads), int32(headDim), b2i(interleaved))
	}
	if rows <= MaxRMSRows {
		return k.launchDep("rope_qkv_write_r", rowChunks((heads+2*kvHeads)*headDim/2, ropePairs, rows), cu.D1(256), 0, s, qkv, sc.Rows, sc.Cols,
			q, kc, vc, pos, slots, table, int32(heads), int32(kvHeads), int32(headDim), b2i(interleaved))
	}
	return k.launchDep("rope_qkv_write", ewGrid(rows*(heads+2*kvHeads)*headDim/2), cu.D1(256), 0, s, qkv, sc.Rows, sc.Cols, q, kc, vc, pos, slots, table,
		int32(rows), int32(heads), int32(kvHeads), int32(headDim), b2i(interleaved))
}

// ropeThreads is rope_qkv_write_v's block: 128 threads, up to ropeUnits
// units each (ROPE_UNITS in kernels.cu): Llama-3-8B's 48 heads of 8 units, a
// block a row.
const (
	ropeThreads = 128
	ropeUnits   = 4
)

// ropeVectors reports whether rope_qkv_write_v takes heads of
// headDim over the operands ps: half a head a multiple of the 16-byte
// vector, every operand 16-byte aligned.
func (k *Kernels) ropeVectors(headDim int, ps ...cu.Ptr) bool {
	return headDim%(2*k.vec()) == 0 && aligned16(ps...)
}

// ropeGrid is the grid of rope_qkv_write_v over rows of heads +
// 2·kvHeads heads of headDim (units of 2·VEC elements), blocks of
// ropeThreads.
func (k *Kernels) ropeGrid(heads, kvHeads, headDim, rows int) cu.Dim3 {
	units := (heads + 2*kvHeads) * headDim / (2 * k.vec())
	per := ropeThreads * ropeUnits
	return cu.Dim3{X: (units + per - 1) / per, Y: rows, Z: 1}
}

// ropePairs is ROPE_P in kernels.cu: the pairs a thread of rope_qkv_write_r
// takes at a time.
const ropePairs = 4

// RoPEQKVWriteRMS is RoPEQKVWrite of a product qkv whose rows are still
// to be divided by the rms of nx's: each element read as x/rms rounded to
// the activation dtype (as RoPEQKVWrite reads a product given its row
// scales).
func (k *Kernels) RoPEQKVWriteRMS(s *cu.Stream, q, kc, vc, qkv cu.Ptr, nx RowRMS, pos, slots, table cu.Ptr, rows, heads, kvHeads, headDim int, interleaved bool) error {
	if err := checkRows("rope_qkv_write", rows, (heads+2*kvHeads)*headDim); err != nil || headDim%2 != 0 || kvHeads <= 0 || heads <= 0 || rows > MaxRMSRows {
		return fmt.Errorf("kernels: rope_qkv_write of %d rows, %d heads and %d kv heads of %d", rows, heads, kvHeads, headDim)
	}
	if err := nx.check("rope_qkv_write"); err != nil {
		return err
	}
	return k.launchDep("rope_qkv_write_n", rowChunks((heads+2*kvHeads)*headDim/2, 4, rows), cu.D1(256), 0, s, qkv, nx.X, int32(nx.Dim), nx.Eps,
		q, kc, vc, pos, slots, table, int32(heads), int32(kvHeads), int32(headDim), b2i(interleaved))
}

// RoPEKVWrite rotates k by pos, then stores k and v like KVWrite.
func (k *Kernels) RoPEKVWrite(s *cu.Stream, kc, vc, kx, vx, pos, slots, table cu.Ptr, rows, kvHeads, headDim int, interleaved bool) error {
	if err := checkRows("rope_kv_write", rows, kvHeads*headDim); err != nil || headDim%2 != 0 {
		return fmt.Errorf("kernels: rope_kv_write of %d rows, %d heads of %d", rows, kvHeads, headDim)
	}
	return k.launchDep("rope_kv_write", ewGrid(rows*kvHeads*headDim/2), cu.D1(256), 0, s, kx, vx, kc, vc, pos, slots, table,
		int32(rows), int32(kvHeads), int32(headDim), b2i(interleaved))
}

// Split copies the column slices of x[rows, Σsizes] into outs[i][rows, sizes[i]].
func (k *Kernels) Split(s *cu.Stream, x cu.Ptr, rows int, outs []cu.Ptr, sizes []int) error {
	if len(outs) != len(sizes) || len(outs) == 0 {
		return fmt.Errorf("kernels: split into %d outputs, %d sizes", len(outs), len(sizes))
	}
	cols := 0
	for _, c := range sizes {
		if c <= 0 {
			return fmt.Errorf("kernels: split size %d", c)
		}
		cols += c
	}
	if err := checkRows("split", rows, cols); err != nil {
		return err
	}
	off := 0
	for i := 0; i < len(outs); i += 4 {
		args := []any{x, int32(rows), int32(cols), int32(off), int32(0)}
		span := 0
		for j := 0; j < 4; j++ {
			if i+j < len(outs) {
				args = append(args, outs[i+j], int32(sizes[i+j]))
				span += sizes[i+j]
			} else {
				args = append(args, cu.Ptr(0), int32(0))
			}
		}
		args[4] = int32(span)
		if err := k.launchDep("split", ewGrid(rows*span), cu.D1(256), 0, s, args...); err != nil {
			return err
		}
		off += span
	}
	return nil
}

// SelectRows: out[i,:] = x[rowIdx[i],:] for i < nrows (rowIdx: int32, Meta.Rows).
func (k *Kernels) SelectRows(s *cu.Stream, out, x, rowIdx cu.Ptr, nrows, cols int) error {
	if err := checkRows("select_rows", nrows, cols); err != nil {
		return err
	}
	return k.launchDep("select_rows", ewGrid(nrows*cols), cu.D1(256), 0, s, x, out, rowIdx, int32(nrows), int32(cols))
}

// Attn describes one attention layer call.
type Attn struct {
	Out, Q         cu.Ptr // [T, Heads·HeadDim]
	KCache, VCache cu.Ptr // this layer's caches [Blocks][BlockSize][KVHeads][HeadDim]
	Heads, KVHeads int
	HeadDim        int
	Window         int // 0: full causal
	Scale          float32
	// Cap, when set, soft-caps the scores to Cap·tanh(s/Cap) (Gemma 2).
	Cap float32
	// FP8: KCache and VCache hold E4M3 codes (a module of NewFP8KV).
	FP8 bool
	// CacheSlots is the slots (blocks times block size) of each of this
	// layer's caches, which the TMA builds' tensor maps span (0: unknown,
	// and those builds are not offered).
	CacheSlots int
}

func (k *Kernels) checkAttn(a *Attn, m DevMeta) error {
	if !slices.Contains(HeadDims, a.HeadDim) {
		return fmt.Errorf("kernels: attention head dim %d (built for %v)", a.HeadDim, HeadDims)
	}
	if k.HeadDim != 0 && a.HeadDim != k.HeadDim {
		return fmt.Errorf("kernels: attention head dim %d in a module built for head dim %d alone", a.HeadDim, k.HeadDim)
	}
	if a.Heads <= 0 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 || a.Window < 0 || a.Cap < 0 || m.Meta == nil || m.T == 0 {
		return fmt.Errorf("kernels: attention of %d heads over %d kv heads, window %d", a.Heads, a.KVHeads, a.Window)
	}
	if a.KCache%16 != 0 || a.VCache%16 != 0 {
		return fmt.Errorf("kernels: attention caches must be 16-byte aligned")
	}
	if a.FP8 != k.KVF8 {
		return fmt.Errorf("kernels: attention over an FP8 cache (%v) by the module of an FP8 cache (%v)", a.FP8, k.KVF8)
	}
	if k.BlockSize != 0 && m.BlockSize != k.BlockSize {
		return fmt.Errorf("kernels: attention over a cache of %d-token blocks by kernels built for %d-token blocks", m.BlockSize, k.BlockSize)
	}
	return nil
}

// raiseShared lets kernel name take shared bytes of dynamic shared memory
// (above 48 KiB it must be raised, once per function), and prefers the
// largest shared memory carveout, so that the blocks' stages fit beside
// each other on a multiprocessor.
func (k *Kernels) raiseShared(name string, shared int) error {
	if shared <= 48<<10 {
		return nil
	}
	return k.preferShared(name, shared)
}

// preferShared is raiseShared whatever shared is: the largest carveout
// also for a kernel whose blocks each take 48 KiB or less, where the
// driver's own choice left room for fewer of them than the registers
// allow (add_rmsnorm_rq at four rows a block, session 40: 3 of 4 blocks
// of 33 KB).
func (k *Kernels) preferShared(name string, shared int) error {
	k.mu.Lock()
	have, set := k.sharedSet[name]
	k.mu.Unlock()
	if set && have >= shared {
		return nil
	}
	m, err := k.module(name)
	if err != nil {
		return err
	}
	f, err := m.Function(name)
	if err != nil {
		return err
	}
	// Raised whatever shared is: the block's static shared memory counts
	// against the same 48 KiB (swiglu_packed_qr's 48 KB and its 128 bytes).
	if err := f.SetMaxDynamicShared(shared); err != nil {
		return err
	}
	if err := f.SetPreferredSharedCarveout(100); err != nil {
		return err
	}
	k.mu.Lock()
	k.sharedSet[name] = shared
	k.mu.Unlock()
	return nil
}

// DecodePlan is the split of a decode attention call: keys per split, the
// grid's splits per token, and the bytes of partial results it needs. A
// cluster plan (Cluster set, compute capability 9.0+) spreads each token's
// keys evenly over the MaxSplits blocks of one thread-block cluster, which
// merge through distributed shared memory (no workspace); Chunk is then the
// most keys a block takes. A tensor-core plan (MMA set, f16/bf16; see
// decode_mma.cu) splits like the split plans, with Chunk up to
// decodeMMAMaxChunk keys, and computes each block's scores and outputs with
// mma.sync, the GQA group's query heads as the rows of the tiles; its
// Stages is the ring of 64-key shared-memory stages: 0 for the default
// (decodeMMAStages, 3: two blocks an SM at head dim 128), or 2 (three
// blocks an SM, a stage in flight while one is computed; over an FP8
// cache four). Heads (tensor-core plans over a cache of the activation
// dtype, GQA groups of up to 16 query heads) is the kv heads a block
// takes one after the other, their stages one pipeline, so that a head's
// first keys load while the one before it ends (0 or 1: one; 2 or 4).
type DecodePlan struct {
	Chunk, MaxSplits int
	WorkspaceBytes   int
	Cluster          bool
	MMA              bool
	Stages           int
	Heads            int
}

// String names the plan in the backend's statistics.
func (p DecodePlan) String() string {
	switch {
	case p.Cluster:
		return fmt.Sprintf("a cluster of %d", p.MaxSplits)
	case p.MMA:
		s := fmt.Sprintf("tensor cores, %d keys a split", p.Chunk)
		if p.Stages != 0 {
			s += fmt.Sprintf(", %d stages", p.Stages)
		}
		if p.Heads > 1 {
			s += fmt.Sprintf(", %d kv heads a block", p.Heads)
		}
		return s
	}
	return fmt.Sprintf("%d keys a split", p.Chunk)
}

// decodeThreads is decode attention's block size (DC_THREADS in
// attention.cu); a block takes at most that many keys (a thread a key's
// slot).
const decodeThreads = 128

// PlanDecode picks the keys per split (32 to 128) so that the grid covers
// the device's sms multiprocessors where it can, keeping shared memory within
// bounds.
func PlanDecode(a Attn, m *Meta, sms int) DecodePlan {
	ctx := decodeContext(a, m)
	group := a.Heads / a.KVHeads
	chunk := decodeThreads
	for chunk > 32 && (group*chunk > 4096 || m.T*a.KVHeads*((ctx+chunk-1)/chunk) < sms) {
		chunk /= 2
	}
	return planChunk(a, m, chunk)
}

// DecodePlans lists the plans worth timing for a batch: PlanDecode's, then
// the same with two and four times the keys per split, up to 128 (fewer
// blocks, less merging: at short context latency decides, not how many
// multiprocessors read). The first needs the most workspace. With clusters
// (Device.Clusters) the cluster plans of 2 to cu.MaxCluster (16) blocks
// whose blocks take at most 128 keys follow. For f16 and bf16 activations
// (act) the tensor-core plans follow where they apply (decodeMMAOK; see
// decodeMMAPlans); every one needs at most the first plan's workspace (at
// least 128 keys a split, against at most 128). Over an FP8 cache (a.FP8)
// only the tensor-core plans are offered (none where they do not apply).
func DecodePlans(a Attn, m *Meta, sms int, clusters bool, act cu.DType) []DecodePlan {
	if a.FP8 {
		if act == cu.F32 || !decodeMMAOK(a) {
			return nil
		}
		return decodeMMAPlans(a, m, sms)
	}
	plans := []DecodePlan{PlanDecode(a, m, sms)}
	group := a.Heads / a.KVHeads
	for c := 2 * plans[0].Chunk; c <= decodeThreads && group*c <= 4096; c *= 2 {
		plans = append(plans, planChunk(a, m, c))
	}
	ctx := decodeContext(a, m)
	if clusters {
		for n := 2; n <= cu.MaxCluster; n *= 2 {
			if chunk := (ctx + n - 1) / n; chunk <= decodeThreads && group*chunk <= 4096 {
				plans = append(plans, DecodePlan{Chunk: chunk, MaxSplits: n, Cluster: true})
			}
		}
	}
	if act != cu.F32 && decodeMMAOK(a) {
		plans = append(plans, decodeMMAPlans(a, m, sms)...)
	}
	return plans
}

// decodeMMAPlans lists the tensor-core plans worth timing: 128, 256, ...
// keys a split, up to the first that takes the whole context or
// decodeMMAMaxChunk, less those whose doubled chunk still makes a grid of
// four blocks an SM or more (two waves at two blocks an SM: fewer splits
// then merge less for as full a machine); then at most one chunk between
// them (a multiple of 64 keys, 256 to decodeMMAMaxChunk) whose grid comes
// closer to whole waves (decodeMMAWaveChunk); then those powers of two of
// at least 256 keys whose grid has more than two blocks an SM again with a
// ring of 2 stages (Stages 2: three blocks an SM at head dim 128); then
// the 3-stage plan of one split, where decodeMMAHeadsOK, with 2 and 4
// kv heads a block while its grid keeps a block for every SM (measured on
// the H200: with splits, several kv heads a block lost to one).
func decodeMMAPlans(a Attn, m *Meta, sms int) []DecodePlan {
	ctx := decodeContext(a, m)
	th := m.T * a.KVHeads
	var chunks []int
	for c := decodeMMAMinChunk; c <= decodeMMAMaxChunk; c *= 2 {
		last := c >= ctx || c == decodeMMAMaxChunk
		if !last && th*((ctx+2*c-1)/(2*c)) >= 4*sms {
			continue
		}
		chunks = append(chunks, c)
		if last {
			break
		}
	}
	var plans []DecodePlan
	for _, c := range chunks {
		plans = append(plans, decodeMMAPlan(a, m, c, 0))
	}
	if c := decodeMMAWaveChunk(a, ctx, th, sms, chunks); c > 0 {
		plans = append(plans, decodeMMAPlan(a, m, c, 0))
	}
	for _, c := range chunks {
		if c > 2*decodeMMAKeys && decodeMMAStages2(th, ctx, c, sms) && a.HeadDim <= 128 { // past 128 every plan has 2 stages
			plans = append(plans, decodeMMAPlan(a, m, c, 2))
		}
	}
	for _, p := range plans[:len(plans):len(plans)] {
		for _, g := range []int{2, 4} {
			q := p
			q.Heads = g
			if q.MaxSplits == 1 && decodeMMAHeadsOK(a, q) && th/g >= sms {
				plans = append(plans, q)
			}
		}
	}
	return plans
}

// decodeMMAHeadsOK reports whether decode_mma.cu has a kernel taking
// p.Heads kv heads a block for plan p over a (decode_mma_h<G>_<HD>): a
// 3-stage tensor-core plan over a cache of the activation dtype, head dims
// up to 128 and GQA groups of up to 16 query heads (the warps' partials
// fit a ring stage), 2 or 4 dividing the kv heads.
func decodeMMAHeadsOK(a Attn, p DecodePlan) bool {
	return (p.Heads == 2 || p.Heads == 4) && p.MMA && p.Stages == 0 && !a.FP8 && a.HeadDim <= 128 && decodeMMARows(a) == 16 &&
		a.KVHeads%p.Heads == 0
}

// decodeMMAStages2 reports whether a grid of th token heads at chunk keys
// a split has more blocks than two an SM, so that the third block an SM
// the 2-stage ring allows can matter.
func decodeMMAStages2(th, ctx, chunk, sms int) bool {
	return th*((ctx+chunk-1)/chunk) > 2*sms
}

func decodeMMAPlan(a Attn, m *Meta, chunk, stages int) DecodePlan {
	p := planChunk(a, m, chunk)
	p.MMA = true
	if a.HeadDim > 128 {
		stages = 2 // three stages of 256-wide rows pass decodeMaxShared
	}
	p.Stages = stages
	return p
}

// decodeMMAWaveChunk is a chunk (a multiple of 64 keys from 256 to
// decodeMMAMaxChunk, not one of have) whose grid of th token heads ×
// splits blocks takes less time than any of have's by a simple model, by
// at least 3%: whole waves (the blocks resident at once, from the shared
// memory, at most 4 an SM) times a split's mean keys; 0 if none.
func decodeMMAWaveChunk(a Attn, ctx, th, sms int, have []int) int {
	est := func(c int) int {
		res := min(4, (228<<10)/(decodeMMAShared(a, DecodePlan{Chunk: c, MMA: true})+1024))
		slots := max(1, sms*res)
		splits := (ctx + c - 1) / c
		blocks := th * splits
		return (blocks + slots - 1) / slots * ((ctx + splits - 1) / splits)
	}
	best := 0
	for _, c := range have {
		if e := est(c); best == 0 || e < best {
			best = e
		}
	}
	pick, pickEst := 0, 0
	for s := 1; s <= 64; s++ {
		c := ((ctx+s-1)/s + decodeMMAKeys - 1) / decodeMMAKeys * decodeMMAKeys
		if c < 4*decodeMMAKeys || c > decodeMMAMaxChunk || slices.Contains(have, c) {
			continue
		}
		if e := est(c); 100*e <= 97*best && (pick == 0 || e < pickEst) {
			pick, pickEst = c, e
		}
	}
	return pick
}

// The tensor-core decode's shape (decode_mma.cu): keys per shared-memory
// stage (DM_BK), stages in its ring (DM_ST), warps (DM_WARPS), and the
// chunks its plans take.
const (
	decodeMMAKeys     = 64
	decodeMMAStages   = 3
	decodeMMAWarps    = 4
	decodeMMAMinChunk = 128
	decodeMMAMaxChunk = 4096
)

// decodeMMAOK reports whether the tensor-core decode takes a: a head dim
// its kernels are built for (a multiple of 16), GQA groups of at most 32
// query heads (two 16-row tiles), and what the tensor-core prefill needs
// too (mmaOK: 16-byte aligned q and out, scale > 0).
func decodeMMAOK(a Attn) bool {
	return a.HeadDim%16 == 0 && a.KVHeads > 0 && a.Heads%a.KVHeads == 0 && a.Heads/a.KVHeads <= 32 && mmaOK(a)
}

// decodeMMARows is the query rows of a tensor-core decode block: the GQA
// group rounded up to 16 (decode_mma_<hd>) or 32 (decode_mma32_<hd>).
func decodeMMARows(a Attn) int {
	if a.Heads/a.KVHeads > 16 {
		return 32
	}
	return 16
}

// decodeMMAShared is the tensor-core decode's dynamic shared memory
// (decode_mma.cu): the warps' row maxima and sums, two stages' cache rows
// (tab), Q's rows padded by 16
// bytes, then the ring of K and V stages (as many as a split has, up to
// decodeMMAStages; with several kv heads a block, all of them, as the
// heads' stages run on through it), which the warps' f32 accumulators
// overlay at the end of each head.
// Over an FP8 cache the ring's rows are the codes padded by 16 bytes.
func decodeMMAShared(a Attn, p DecodePlan) int {
	rows := decodeMMARows(a)
	rowBytes := (a.HeadDim + 8) * 2
	stages := decodeMMAStages
	if p.Stages > 0 {
		stages = p.Stages
	}
	if p.Heads <= 1 { // a block's stages are its split's (several kv heads a block: their stages run on through the ring)
		stages = min(stages, (p.Chunk+decodeMMAKeys-1)/decodeMMAKeys)
	}
	ringRow := rowBytes
	if a.FP8 {
		ringRow = a.HeadDim + 16
	}
	ring := stages * 2 * decodeMMAKeys * ringRow
	red := decodeMMAWarps * rows * (a.HeadDim + 8) * 4
	return 2*decodeMMAWarps*rows*4 + 2*decodeMMAKeys*4 + rows*rowBytes + max(ring, red)
}

func decodeContext(a Attn, m *Meta) int {
	ctx := m.MaxPos + 1
	if a.Window > 0 {
		ctx = min(ctx, a.Window)
	}
	return ctx
}

func planChunk(a Attn, m *Meta, chunk int) DecodePlan {
	splits := (decodeContext(a, m) + chunk - 1) / chunk
	return DecodePlan{Chunk: chunk, MaxSplits: splits, WorkspaceBytes: decodePartialBytes(a, m.T, splits)}
}

// ForBatch is plan p for a batch of meta m's tokens (of the context p was
// planned for): the same split, with the workspace its tokens need.
func (p DecodePlan) ForBatch(a Attn, m *Meta) DecodePlan {
	if !p.Cluster {
		p.WorkspaceBytes = decodePartialBytes(a, m.T, p.MaxSplits)
	}
	return p
}

// decodePartialBytes is the size of the partial results of tokens × splits
// blocks: per query head an accumulator of HeadDim floats, a maximum and a
// sum (DecodePlan.ws).
func decodePartialBytes(a Attn, tokens, splits int) int {
	return 4 * tokens * a.Heads * splits * (a.HeadDim + 2)
}

// DecodeCounterBytes is the size of the split counters DecodeAttention
// needs for a batch of tokens with kvHeads kv heads. The counters are kept
// apart from the partial results, whose layout changes with the plan: a
// launch leaves them at zero for the next one, whatever its plan.
func DecodeCounterBytes(tokens, kvHeads int) int { return 4 * tokens * kvHeads }

// decodeShared is decode attention's dynamic shared memory (decode_impl in
// attention.cu; decodeMMAShared for the tensor-core plans): q rows padded by 4 floats, the partial accumulators
// (cluster plans), scores, slots, sums and statistics, then the chunk's K
// rows padded by 16 bytes.
func decodeShared(act cu.DType, a Attn, p DecodePlan) int {
	if p.MMA {
		return decodeMMAShared(a, p)
	}
	es := act.Size()
	ns := decodeThreads / (a.HeadDim * es / 16)
	group := a.Heads / a.KVHeads
	floats := group*(a.HeadDim+4) + group*p.Chunk + p.Chunk + ns*4*a.HeadDim + 2*group
	if p.Cluster {
		floats += group * a.HeadDim
	}
	return (4*floats+15)&^15 + p.Chunk*(a.HeadDim*es+16)
}

// decodeMaxShared bounds decode attention's shared memory (Hopper allows
// 227 KiB a block).
const decodeMaxShared = 200 << 10

// DecodeAttention runs attention for every token of the batch with
// flash-decoding: each token's key range is cut into plan.MaxSplits chunks
// handled by separate blocks (partial max, sum, accumulator into the f32
// workspace ws of plan.WorkspaceBytes), and the last block of a token's
// splits to finish merges them, in the same launch; a token whose keys fit
// one chunk is finished by its block. counters (DecodeCounterBytes) must be
// zeroed when allocated: every launch leaves them at zero. A cluster plan
// merges through its cluster's shared memory and uses neither ws nor
// counters. A tensor-core plan (f16/bf16) splits, and uses ws and counters,
// as a split plan does. Suited to batches of few tokens per sequence
// (decode steps).
func (k *Kernels) DecodeAttention(s *cu.Stream, a Attn, m DevMeta, plan DecodePlan, ws, counters cu.Ptr) error {
	if err := k.checkAttn(&a, m); err != nil {
		return err
	}
	ctx := decodeContext(a, m.Meta)
	bad := plan.Chunk <= 0 || plan.MaxSplits <= 0 || plan.Chunk*plan.MaxSplits < ctx || (!plan.MMA && (plan.Stages != 0 || a.FP8))
	switch {
	case plan.MMA:
		bad = bad || (plan.Stages != 0 && plan.Stages != 2) || plan.Cluster || k.Act == cu.F32 || !decodeMMAOK(a) || plan.WorkspaceBytes < decodePartialBytes(a, m.T, plan.MaxSplits)
	case plan.Cluster:
		bad = bad || plan.Chunk > decodeThreads || plan.MaxSplits > cu.MaxCluster || !k.D.Clusters()
	default:
		bad = bad || plan.Chunk > decodeThreads || plan.WorkspaceBytes < decodePartialBytes(a, m.T, plan.MaxSplits)
	}
	bad = bad || plan.Heads < 0 || (plan.Heads > 1 && !decodeMMAHeadsOK(a, plan))
	if bad {
		return fmt.Errorf("kernels: decode plan %+v for context %d", plan, ctx)
	}
	if !aligned16(a.Q, ws) || counters%4 != 0 {
		return fmt.Errorf("kernels: decode attention's q and workspace must be 16-byte aligned")
	}
	name := fmt.Sprintf("decode_attn_%d", a.HeadDim)
	switch {
	case plan.Cluster:
		name = fmt.Sprintf("decode_attn_cl_%d", a.HeadDim)
	case plan.MMA:
		name = "decode_mma"
		if decodeMMARows(a) == 32 {
			name = "decode_mma32"
		}
		if plan.Stages == 2 {
			name += "_s2"
		}
		if plan.Heads > 1 {
			name += fmt.Sprintf("_h%d", plan.Heads)
		}
		name = fmt.Sprintf("%s_%d", name, a.HeadDim)
	}
	shared := decodeShared(k.Act, a, plan)
	if shared > decodeMaxShared {
		return fmt.Errorf("kernels: decode attention needs %d bytes of shared memory", shared)
	}
	if err := k.raiseShared(name, shared); err != nil {
		return err
	}
	wsAcc, wsM, wsL := plan.ws(a, m, ws)
	grid := cu.Dim3{X: plan.MaxSplits, Y: a.KVHeads / max(1, plan.Heads), Z: m.T}
	args := []any{a.Q, a.KCache, a.VCache, a.Out, wsAcc, wsM, wsL, counters, m.At(m.Positions), m.At(m.SeqIndex), m.At(m.SeqBlockOff), m.At(m.SeqFresh),
		m.At(m.BlockTable), int32(a.Heads), int32(a.KVHeads), int32(m.BlockSize), int32(a.Window), a.Scale, a.Cap, int32(plan.Chunk), int32(plan.MaxSplits)}
	if plan.Cluster {
		m, err := k.module(name)
		if err == nil {
			err = m.LaunchInClusters(name, plan.MaxSplits, k.PDL, grid, cu.D1(decodeThreads), shared, s, args...)
		}
		if err != nil {
			return fmt.Errorf("kernels: %s: %w", name, err)
		}
		return nil
	}
	return k.launchDep(name, grid, cu.D1(decodeThreads), shared, s, args...)
}

// ws splits the workspace: accumulators (first, so that they are 16-byte
// aligned), maxima, sums.
func (p DecodePlan) ws(a Attn, m DevMeta, ws cu.Ptr) (wsAcc, wsM, wsL cu.Ptr) {
	n := m.T * a.Heads * p.MaxSplits
	wsM = ws.Add(4 * n * a.HeadDim)
	return ws, wsM, wsM.Add(4 * n)
}
