package kernels

import (
	"fmt"
	"slices"
	"strings"

	"kiln/backend/cuda/cu"
)

// PrefillAttention runs causal (optionally windowed) attention for every
// token of the batch, tiled over its prefill tiles: FlashAttention-style,
// keys in shared-memory stages, online softmax. f16 and bf16 run on the
// tensor cores (mma.sync, prefill_fa in prefill_mma.cu), f32 on the CUDA
// cores.
func (k *Kernels) PrefillAttention(s *cu.Stream, a Attn, m DevMeta) error {
	return k.prefill(s, a, m, k.PrefillVariants(a)[0])
}

// PrefillVariants lists the builds of the prefill kernel that take a, the
// one PrefillAttention runs first; then, on sm_90a, the wgmma kernel's
// (prefill_wg.cu, wgBuilds) where it takes a, and on the tensor cores the
// builds of fewer query heads a block (two, one), which a race may find
// faster for some shapes (each is checked as the first by the kernels'
// tests).
func (k *Kernels) PrefillVariants(a Attn) []string {
	if !a.FP8 && (k.Act == cu.F32 || a.HeadDim%16 != 0 || !mmaOK(a)) {
		return []string{"attn"}
	}
	if a.HeadDim > 128 {
		return []string{"mma1"} // the one build past head dim 128 (prefill_mma.cu)
	}
	vs := []string{"mma"}
	switch hb := mmaHeads(a.Heads / max(a.KVHeads, 1)); {
	case hb == 4:
		vs = append(vs, "mma2", "mma1")
	case hb == 2:
		vs = append(vs, "mma1")
	}
	if k.wgOK(a) {
		// After mma.sync's first build: the model's race, which checks
		// each build against the first on its operands, takes them where
		// they are faster (the plain builds ran in the model's tests on
		// the H200 in sessions 45 and 46, the TMA builds in the kernels'
		// tests in sessions 46 and 47).
		at := 1
		for _, b := range wgBuilds {
			if !b.tma || k.tmaOK(a) {
				vs = slices.Insert(vs, at, b.variant)
				at++
			}
		}
	}
	return vs
}

// wgOK reports whether the wgmma prefill (prefill_wg.cu) takes a: a module
// built with it, a cache of the activation dtype, head dim 64 or 128, and
// GQA groups of an even number of query heads (a block's two heads share
// their kv head).
func (k *Kernels) wgOK(a Attn) bool {
	return k.WG && !a.FP8 && (a.HeadDim == 64 || a.HeadDim == 128) && a.KVHeads > 0 && (a.Heads/a.KVHeads)%2 == 0 && mmaOK(a)
}

// tmaOK reports whether the TMA builds of the wgmma prefill take a: a
// module that holds them (TMA) and a's caches' size known (CacheSlots).
func (k *Kernels) tmaOK(a Attn) bool { return k.TMA && k.wgOK(a) && a.CacheSlots > 0 }

// wgShared is prefill_wg's dynamic shared memory at head dim hd, bk keys a
// stage and st slots: 1 KB to round the base up to an atom, Q of the
// block's two heads (64 rows each), st slots of K and st of V.
func wgShared(hd, bk, st int) int { return 1024 + 2*PrefillTile*hd*2 + 2*st*bk*hd*2 }

// wgBuild is a build of prefill_wg: its variant name, keys a stage, slots
// of K and of V, whether K and V come by TMA (prefill_wgt_…), and whether
// its warpgroups run in ping-pong (prefill_wgp_…, TMA too).
type wgBuild struct {
	variant    string
	bk, stages int
	tma, pp    bool
}

// kernel is the build's kernel at head dim hd.
func (b wgBuild) kernel(hd int) string {
	switch {
	case b.pp:
		return fmt.Sprintf("prefill_wgp_%d_%d_%d", hd, b.bk, b.stages)
	case b.tma:
		return fmt.Sprintf("prefill_wgt_%d_%d_%d", hd, b.bk, b.stages)
	}
	return fmt.Sprintf("prefill_wg_%d_%d_%d", hd, b.bk, b.stages)
}

// shared is the build's dynamic shared memory at head dim hd: wgShared's,
// and the TMA builds' mbarriers (8 bytes for each slot of K and of V; the
// ping-pong build's as many again, the slots' releases).
func (b wgBuild) shared(hd int) int {
	n := wgShared(hd, b.bk, b.stages)
	if b.tma {
		n += 16 * b.stages
	}
	if b.pp {
		n += 16 * b.stages
	}
	return n
}

// wgBuilds are prefill_wg's builds (prefill_wg.cu's WG_KERNELS): the TMA
// builds (offered where the module holds them): the ping-pong one
// (WGP_KERNEL: 1.02-1.04x the fastest plain one on an H200 in session 47,
// the fastest of all), then WGT_KERNEL's (1.02-1.03x the plain ones in
// session 46); then the plain ones, the faster first in
// BenchmarkPrefillAttention on an H200 (docs/PERF.md, sessions 44 to 47).
var wgBuilds = []wgBuild{{"wgp128", 128, 3, true, true}, {"wgt128", 128, 2, true, false}, {"wgt", 64, 2, true, false},
	{"wg128", 128, 2, false, false}, {"wg", 64, 2, false, false}}

// PrefillAttentionWith is PrefillAttention on build variant of
// PrefillVariants.
func (k *Kernels) PrefillAttentionWith(s *cu.Stream, a Attn, m DevMeta, variant string) error {
	return k.prefill(s, a, m, variant)
}

// mmaOK reports whether the tensor-core kernel takes a: 16-byte aligned
// queries and output (16-byte cp.async of Q rows, 32-bit stores), and a
// positive scale (the online softmax takes maxima of the unscaled scores).
func mmaOK(a Attn) bool { return aligned16(a.Q, a.Out) && a.Scale > 0 }

// pfCfg is one build of prefill_fa (prefill_mma.cu): mb query heads per
// warp, wg groups of 4 warps per block (mb·wg heads per block), bk keys per
// stage, stages of K and V in shared memory, Q fragments in registers (qreg)
// or in shared memory.
type pfCfg struct {
	mb, wg, bk, stages int
	qreg               bool
}

// heads is the number of query heads of one block.
func (c pfCfg) heads() int { return c.mb * c.wg }

// shared is the dynamic shared memory of the kernel at head dim hd; over
// an FP8 cache (fp8) one stage of widened K and V rows, and the ring of
// the stages' codes (rows of hd + 16 bytes).
func (c pfCfg) shared(hd int, fp8 bool) int {
	rows, codes := 2*c.stages*c.bk, 0
	if fp8 {
		rows, codes = 2*c.bk, 2*c.stages*c.bk*(hd+16)
	}
	if !c.qreg {
		rows += c.heads() * PrefillTile
	}
	return rows*(hd+8)*2 + codes
}

// pfMMA is the shape of prefill_mma<suffix>_<hd> for heads (4, 2 or 1)
// query heads per block: 4 warps of 16 rows of one or two heads each (two
// heads: each K/V fragment serves both), and with 4 heads two such groups of
// warps sharing the K/V stages.
func pfMMA(hd, heads int) (suffix string, c pfCfg) {
	switch heads {
	case 4:
		return "", pfCfg{mb: 2, wg: 2, bk: 64, stages: 2, qreg: 2*hd <= 128}
	case 2:
		c = pfCfg{mb: 2, wg: 1, bk: 64, stages: 2, qreg: 2*hd <= 128}
		if !c.qreg {
			c.bk = 32 // measured faster at head dim 128 (4 warps a block)
		}
		return "2", c
	}
	return "1", pfCfg{mb: 1, wg: 1, bk: 64, stages: 2, qreg: true}
}

// prefill runs one variant of the prefill kernel: "attn" (CUDA cores, any
// dtype), "mma" (tensor cores, f16/bf16: four heads per block when the GQA
// group allows, else two, else one), "mma2" and "mma1" (two heads, one head
// per block), wgBuilds' (wgmma on sm_90a, two heads a block).
func (k *Kernels) prefill(s *cu.Stream, a Attn, m DevMeta, variant string) error {
	if err := k.checkAttn(&a, m); err != nil {
		return err
	}
	args := []any{a.Q, a.KCache, a.VCache, a.Out, m.At(m.TileTok0), m.At(m.TileCount), m.At(m.Positions), m.At(m.SeqIndex),
		m.At(m.SeqBlockOff), m.At(m.BlockTable), int32(a.Heads), int32(a.KVHeads), int32(m.BlockSize), int32(a.Window), a.Scale, a.Cap}
	if variant == "attn" {
		if a.FP8 {
			return fmt.Errorf("kernels: no CUDA-core prefill over an FP8 cache")
		}
		return k.launch(fmt.Sprintf("prefill_attn_%d", a.HeadDim), cu.Dim3{X: m.Tiles, Y: a.Heads, Z: 1}, cu.D1(128), 0, s, args...)
	}
	if k.Act == cu.F32 {
		return fmt.Errorf("kernels: no tensor-core prefill for f32")
	}
	if strings.HasPrefix(variant, "wg") {
		i := slices.IndexFunc(wgBuilds, func(b wgBuild) bool { return b.variant == variant })
		if i < 0 {
			return fmt.Errorf("kernels: no prefill variant %q", variant)
		}
		if !k.wgOK(a) {
			return fmt.Errorf("kernels: the wgmma prefill takes sm_90a, an f16/bf16 cache, head dim 64 or 128 and even GQA groups")
		}
		b := wgBuilds[i]
		if b.tma {
			if !k.tmaOK(a) {
				return fmt.Errorf("kernels: the TMA prefill takes a module built with it (one block size of 8 to 64 tokens, a power of two) and the caches' slots")
			}
			km, vm, err := k.cacheMaps(a)
			if err != nil {
				return err
			}
			args = append(args, km, vm)
		}
		name, shared := b.kernel(a.HeadDim), b.shared(a.HeadDim)
		if err := k.raiseShared(name, shared); err != nil {
			return err
		}
		return k.launch(name, cu.D1(m.Tiles*a.Heads/2), cu.D1(256), shared, s, args...)
	}
	if a.HeadDim%16 != 0 || !mmaOK(a) {
		return fmt.Errorf("kernels: tensor-core prefill needs a head dim multiple of 16, 16-byte aligned q and out, scale > 0")
	}
	group := a.Heads / a.KVHeads
	hb := mmaHeads(group)
	if a.HeadDim > 128 {
		hb = 1 // prefill_mma1 alone is built
	}
	switch variant {
	case "mma":
	case "mma2":
		hb = min(hb, 2)
	case "mma1":
		hb = 1
	default:
		return fmt.Errorf("kernels: no prefill variant %q", variant)
	}
	suffix, cfg := pfMMA(a.HeadDim, hb)
	name := fmt.Sprintf("prefill_mma%s_%d", suffix, a.HeadDim)
	shared := cfg.shared(a.HeadDim, a.FP8)
	if err := k.raiseShared(name, shared); err != nil {
		return err
	}
	return k.launch(name, cu.D1(m.Tiles*a.Heads/cfg.heads()), cu.D1(128*cfg.wg), shared, s, args...)
}

// mmaHeads is the number of query heads of one tensor-core prefill block
// for a GQA group (query heads per kv head).
func mmaHeads(group int) int {
	switch {
	case group%4 == 0:
		return 4
	case group%2 == 0:
		return 2
	}
	return 1
}

// cacheTiledMap is the tensor map of a's cache at base in blocks of bs
// tokens (cacheMaps).
func cacheTiledMap(a Attn, base cu.Ptr, bs int) cu.TiledMap {
	return cu.TiledMap{Elem: 2, Base: base, Dims: []uint64{uint64(a.HeadDim), uint64(a.KVHeads), uint64(a.CacheSlots)},
		Strides: []uint64{uint64(2 * a.HeadDim), uint64(2 * a.HeadDim * a.KVHeads)}, Box: []uint32{64, 1, uint32(bs)}, Swizzle: 128}
}

// tensorMapKey names a cache's tensor map: its base, slots, kv heads and
// head dim.
type tensorMapKey struct {
	base                    cu.Ptr
	slots, kvHeads, headDim int
}

// cacheMaps are the tensor maps of a's K and V caches (encoded at their
// first use, then kept): each a tensor of (head dim, kv heads, slots)
// elements of the activation dtype, a box of 64 head dims of one kv head
// over a block's slots, rows swizzled in 128 bytes as prefill_wg lays K
// and V in shared memory.
func (k *Kernels) cacheMaps(a Attn) (km, vm cu.TensorMap, err error) {
	get := func(base cu.Ptr) (cu.TensorMap, error) {
		key := tensorMapKey{base, a.CacheSlots, a.KVHeads, a.HeadDim}
		k.mu.Lock()
		m, ok := k.maps[key]
		k.mu.Unlock()
		if ok {
			return m, nil
		}
		m, err := k.D.EncodeTiled(cacheTiledMap(a, base, k.BlockSize))
		if err != nil {
			return m, fmt.Errorf("kernels: the KV cache's tensor map: %w", err)
		}
		k.mu.Lock()
		if k.maps == nil {
			k.maps = map[tensorMapKey]cu.TensorMap{}
		}
		k.maps[key] = m
		k.mu.Unlock()
		return m, nil
	}
	if km, err = get(a.KCache); err == nil {
		vm, err = get(a.VCache)
	}
	return km, vm, err
}
