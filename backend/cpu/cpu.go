// Package cpu is kiln's CPU backend: a reference kernel for every operation
// (plain loops, the oracle every faster kernel on every backend is tested
// against) and faster kernels (SIMD matrix products spread over all cores,
// fused operations, a single-pass attention) chosen over them by priority.
//
// Invariants: activations are float32 and live in one arena per executable,
// laid out by the compiler's memory plan; weights are read in place (a
// memory-mapped file's bytes, widened in registers); a step allocates
// nothing when only fast kernels run.
package cpu

import (
	"fmt"
	"sync"

	"kiln/backend"
	"kiln/backend/cpu/gemm"
	"kiln/backend/cpu/workers"
	"kiln/compile"
	"kiln/ir"
	"kiln/tensor"
	"kiln/tune"
)

// Backend is the CPU target.
type Backend struct {
	// Reference selects the reference kernels only.
	Reference bool
	// Threads is the number of worker threads (0: all cores).
	Threads int
	// StackProjections lets the compiler stack sibling projections (Q/K/V,
	// gate/up) into one product. Stacking copies those weights out of the
	// model file's memory mapping, and on the CPU the separate products
	// already run at memory speed, so it is off by default.
	StackProjections bool
	// Tune says whether the products take the tilings kiln tune found for
	// their shapes on this machine (tune.Cached, the default when "", and
	// tune.Full: yes; tune.Off: the default tiling), kept in TuneDir
	// (default tune.DefaultDir()).
	Tune, TuneDir string
	// Comm is the backend's side of a tensor-parallel group (LocalGroup),
	// for graphs sharded with compile.Options.Shard; nil: none.
	Comm Comm
}

// Name implements compile.Target.
func (b *Backend) Name() string {
	if b.Reference {
		return "cpu-reference"
	}
	return "cpu"
}

// Supports implements compile.Target: every op with a registered kernel,
// and weights and constants, which the backend reads in place.
func (b *Backend) Supports(op ir.Op) bool {
	if op == ir.Split {
		return b.StackProjections
	}
	if op == ir.AllReduce || op == ir.AllGather {
		return b.Comm != nil
	}
	return op == ir.Weight || op == ir.Const || len(registry[op]) > 0
}

// Load implements backend.Backend.
func (b *Backend) Load(c *compile.Compiled) (backend.Loaded, error) {
	return &loaded{backend: b, compiled: c, pool: workers.New(b.Threads), vectors: map[*ir.Node][]float32{},
		matrices: map[*ir.Node]gemm.Weights{}}, nil
}

type loaded struct {
	backend  *Backend
	compiled *compile.Compiled
	pool     *workers.Pool
	// vectors caches 1-D weights (norms, biases) decoded to float32.
	vectors map[*ir.Node][]float32
	// matrices caches 2-D weights in the form their products read
	// (productWeights), with their tuned tiling.
	matrices map[*ir.Node]gemm.Weights
	tuneOnce sync.Once
	tuned    *tune.Cache
}

func (l *loaded) Close() error {
	l.pool.Close()
	return nil
}

// kvCache stores, per layer, keys and values as
// [Blocks][BlockSize][KVHeads][HeadDim] float32 (k, v), FP8 E4M3 codes
// (kq, vq) when spec.FP8, or half-precision values (kh, vh) when spec.F16.
type kvCache struct {
	spec   backend.KVSpec
	k, v   [][]float32
	kq, vq [][]byte
	kh, vh [][]uint16
	row    []float32 // one slot's keys, rotated before put (RoPEKVWrite runs on one goroutine)
}

func (c *kvCache) Spec() backend.KVSpec { return c.spec }

func (c *kvCache) CopyBlocks(pairs [][2]int32) error {
	n := c.spec.BlockSize * c.spec.KVHeads * c.spec.HeadDim
	for _, p := range pairs {
		if p[0] < 0 || p[1] < 0 || int(p[0]) >= c.spec.Blocks || int(p[1]) >= c.spec.Blocks {
			return fmt.Errorf("cpu: copy of block %d to %d in a cache of %d", p[0], p[1], c.spec.Blocks)
		}
		from, to := int(p[0])*n, int(p[1])*n
		for l := range c.k {
			copy(c.k[l][to:to+n], c.k[l][from:])
			copy(c.v[l][to:to+n], c.v[l][from:])
		}
		for l := range c.kq {
			copy(c.kq[l][to:to+n], c.kq[l][from:])
			copy(c.vq[l][to:to+n], c.vq[l][from:])
		}
		for l := range c.kh {
			copy(c.kh[l][to:to+n], c.kh[l][from:])
			copy(c.vh[l][to:to+n], c.vh[l][from:])
		}
	}
	return nil
}

// put stores one slot's keys k and values v (KVHeads·HeadDim each) of
// layer l at element offset at.
func (c *kvCache) put(l, at int, k, v []float32) {
	width := len(k)
	switch {
	case c.spec.FP8:
		encodeE4M3(c.kq[l][at:at+width], k)
		encodeE4M3(c.vq[l][at:at+width], v)
	case c.spec.F16:
		encodeF16(c.kh[l][at:at+width], k)
		encodeF16(c.vh[l][at:at+width], v)
	default:
		copy(c.k[l][at:at+width], k)
		copy(c.v[l][at:at+width], v)
	}
}

// encodeF16 stores x as half-precision values in h (rounded to nearest).
func encodeF16(h []uint16, x []float32) {
	h = h[:len(x)]
	for i, v := range x {
		h[i] = tensor.F32ToF16(v)
	}
}

// encodeE4M3 stores x as FP8 E4M3 codes in q.
func encodeE4M3(q []byte, x []float32) {
	q = q[:len(x)]
	for i, v := range x {
		q[i] = tensor.F32ToE4M3(v)
	}
}

func (l *loaded) NewKVCache(spec backend.KVSpec) (backend.KVCache, error) {
	if spec.Layers <= 0 || spec.Blocks <= 0 || spec.BlockSize <= 0 || spec.KVHeads <= 0 || spec.HeadDim <= 0 || spec.FP8 && spec.F16 {
		return nil, fmt.Errorf("cpu: bad kv cache spec %+v", spec)
	}
	return newKVCache(spec), nil
}

// newKVCache allocates the cache spec describes, zeroed.
func newKVCache(spec backend.KVSpec) *kvCache {
	per := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim
	c := &kvCache{spec: spec, row: make([]float32, spec.KVHeads*spec.HeadDim)}
	for i := 0; i < spec.Layers; i++ {
		if spec.FP8 {
			c.kq = append(c.kq, make([]byte, per))
			c.vq = append(c.vq, make([]byte, per))
			continue
		}
		if spec.F16 {
			c.kh = append(c.kh, make([]uint16, per))
			c.vh = append(c.vh, make([]uint16, per))
			continue
		}
		c.k = append(c.k, make([]float32, per))
		c.v = append(c.v, make([]float32, per))
	}
	return c
}
