package kernels

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
)

// TestPrefillVariants: the builds PrefillVariants lists (no GPU): mma.sync's
// first build first, then, in a module built with the wgmma prefill (WG,
// sm_90a), its builds where it takes the layer (a cache of the activation
// dtype, head dim 64 or 128, an even GQA group), then mma.sync's builds of
// fewer heads a block; the CUDA-core kernel alone in f32 and for head dims
// off the tensor cores' grid. The TMA builds come first of the wgmma ones
// where the module holds them (TMA) and the caches' slots are known.
func TestPrefillVariants(t *testing.T) {
	at := func(heads, kvHeads, hd int, fp8 bool) Attn {
		return Attn{Out: 0x10000, Q: 0x20000, KCache: 0x30000, VCache: 0x40000, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.1, FP8: fp8,
			CacheSlots: 1024}
	}
	noSlots := at(32, 8, 128, false)
	noSlots.CacheSlots = 0
	for _, c := range []struct {
		name string
		k    *Kernels
		a    Attn
		want []string
	}{
		{"hopper, group 4, hd 128", &Kernels{Act: cu.BF16, WG: true}, at(32, 8, 128, false), []string{"mma", "wg128", "wg", "mma2", "mma1"}},
		{"hopper, group 2, hd 64", &Kernels{Act: cu.F16, WG: true}, at(8, 4, 64, false), []string{"mma", "wg128", "wg", "mma1"}},
		{"hopper, TMA, group 4", &Kernels{Act: cu.BF16, WG: true, TMA: true}, at(32, 8, 128, false),
			[]string{"mma", "wgp128", "wgt128", "wgt", "wg128", "wg", "mma2", "mma1"}},
		{"hopper, TMA, caches' size unknown", &Kernels{Act: cu.BF16, WG: true, TMA: true}, noSlots, []string{"mma", "wg128", "wg", "mma2", "mma1"}},
		{"hopper, TMA, FP8 cache", &Kernels{Act: cu.BF16, WG: true, TMA: true, KVF8: true}, at(32, 8, 128, true), []string{"mma", "mma2", "mma1"}},
		{"hopper, group 1", &Kernels{Act: cu.BF16, WG: true}, at(8, 8, 128, false), []string{"mma"}},
		{"hopper, group 3", &Kernels{Act: cu.BF16, WG: true}, at(12, 4, 128, false), []string{"mma"}},
		{"hopper, hd 80", &Kernels{Act: cu.BF16, WG: true}, at(32, 8, 80, false), []string{"mma", "mma2", "mma1"}},
		{"hopper, FP8 cache", &Kernels{Act: cu.BF16, WG: true, KVF8: true}, at(32, 8, 128, true), []string{"mma", "mma2", "mma1"}},
		{"hopper, hd 256", &Kernels{Act: cu.BF16, WG: true}, at(16, 8, 256, false), []string{"mma1"}},
		{"ampere, group 4", &Kernels{Act: cu.BF16}, at(32, 8, 128, false), []string{"mma", "mma2", "mma1"}},
		{"f32", &Kernels{Act: cu.F32}, at(32, 8, 128, false), []string{"attn"}},
		{"unaligned queries", &Kernels{Act: cu.BF16, WG: true}, Attn{Out: 0x10000, Q: 0x20008, Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.1}, []string{"attn"}},
	} {
		if got := c.k.PrefillVariants(c.a); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestWGShared: prefill_wg's dynamic shared memory (wgBuild.shared, which
// the emulator's driver repeats as wg_shared) fits a multiprocessor of
// sm_90 (227 KiB) for every build of wgBuilds at head dims 64 and 128: 1
// KiB of alignment, Q of two heads, the slots of K and V, and the TMA
// builds' mbarriers.
func TestWGShared(t *testing.T) {
	if got, want := wgShared(128, 128, 2), 164864; got != want { // 1 KiB + 32 KiB of Q + 128 KiB of K and V
		t.Errorf("wgShared(128, 128, 2) = %d, want %d", got, want)
	}
	if got, want := (wgBuild{"wgt128", 128, 2, true, false}).shared(128), 164864+32; got != want {
		t.Errorf("the TMA build's shared memory %d, want %d", got, want)
	}
	// 1 KiB + 32 KiB of Q + 192 KiB of K and V in three slots each, 96
	// bytes of mbarriers.
	if got, want := (wgBuild{"wgp128", 128, 3, true, true}).shared(128), 1024+32768+196608+96; got != want {
		t.Errorf("the ping-pong build's shared memory %d, want %d", got, want)
	}
	for _, b := range wgBuilds {
		for _, hd := range []int{64, 128} {
			if n := b.shared(hd); n > 227<<10 {
				t.Errorf("%s at head dim %d: %d bytes of shared memory, more than 227 KiB", b.variant, hd, n)
			}
		}
	}
}

// TestCheckAttnBlockSize (no GPU): kernels built for one KV-cache block
// size (NewFor, KILN_BS) refuse a cache of another, naming both; kernels
// built for any take every size.
func TestCheckAttnBlockSize(t *testing.T) {
	a := Attn{Out: 0x10000, Q: 0x20000, KCache: 0x30000, VCache: 0x40000, Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.1}
	meta := func(bs int) DevMeta { return DevMeta{Meta: &Meta{T: 1, BlockSize: bs}} }
	for _, c := range []struct {
		built, cache int
		ok           bool
	}{{0, 16, true}, {0, 24, true}, {16, 16, true}, {32, 32, true}, {16, 32, false}, {16, 8, false}, {24, 16, false}} {
		k := &Kernels{Act: cu.BF16, BlockSize: c.built}
		err := k.checkAttn(&a, meta(c.cache))
		if (err == nil) != c.ok {
			t.Errorf("built for %d, cache of %d: %v, want ok %v", c.built, c.cache, err, c.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), fmt.Sprint(c.built)) || !strings.Contains(err.Error(), fmt.Sprint(c.cache))) {
			t.Errorf("built for %d, cache of %d: %q does not name both", c.built, c.cache, err)
		}
	}
}

// TestCacheTiledMap (no GPU): the TMA builds' tensor maps of the caches
// pass the driver's rules (cu.TiledMap.Check) at both head dims, every
// block size the builds take, one kv head and eight.
func TestCacheTiledMap(t *testing.T) {
	for _, hd := range []int{64, 128} {
		for _, bs := range []int{8, 16, 32, 64} {
			for _, kvHeads := range []int{1, 8} {
				a := Attn{HeadDim: hd, KVHeads: kvHeads, Heads: 4 * kvHeads, CacheSlots: 100 * bs}
				if err := cacheTiledMap(a, 0x7f0000000000, bs).Check(); err != nil {
					t.Errorf("head dim %d, blocks of %d, %d kv heads: %v", hd, bs, kvHeads, err)
				}
			}
		}
	}
}
