package cu

import (
	"encoding/binary"
	"testing"
)

// tmaCopySrc copies one box of a 3-D tensor map into 1024-byte aligned
// shared memory by a bulk tensor copy that one thread issues, completed on
// an mbarrier with the box's bytes expected, then writes shared memory out
// as it lies (the swizzle included).
const tmaCopySrc = `
struct __align__(64) KilnTensorMap { unsigned long long v[16]; };
extern "C" __global__ void tma_copy(const __grid_constant__ KilnTensorMap map, unsigned short* out, int c0, int c1, int c2, int bytes) {
	extern __shared__ unsigned char smem[];
	unsigned base;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(base) : "l"(smem));
	const unsigned data = (base + 1023) & ~1023u, bar = data + bytes;
	if (threadIdx.x == 0) {
		asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
		asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
		asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
		             ::"r"(data), "l"((unsigned long long)&map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
	}
	asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra WAIT;\n}" ::"r"(bar) : "memory");
	const unsigned short* s = (const unsigned short*)(smem + (data - base));
	for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = s[i];
}
`

// TestTensorMapCopy (compute capability 9.0): a tensor map over a paged
// KV cache's layout (head dim 128, 4 kv heads, 64 slots, 16-bit elements;
// a box of 64 head dims of one head over 16 slots, 128-byte swizzle), passed
// by value to a kernel whose bulk tensor copy puts the box in shared memory
// as prefill_wg's copies do (chunk c of row r at (c ^ r%8)·16); rows past
// the last slot read as zeros.
func TestTensorMapCopy(t *testing.T) {
	d := gpu(t)
	if d.Major < 9 {
		t.Skipf("%s is compute capability %d.%d: no TMA", d.Name, d.Major, d.Minor)
	}
	const hd, heads, slots = 128, 4, 64
	src := make([]byte, 2*hd*heads*slots)
	for i := 0; i < hd*heads*slots; i++ {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	p, err := d.Alloc(len(src))
	must(t, err)
	defer d.Free(p)
	must(t, d.Upload(p, src))
	const rows = 16
	m, err := d.EncodeTiled(TiledMap{Elem: 2, Base: p, Dims: []uint64{hd, heads, slots}, Strides: []uint64{2 * hd, 2 * hd * heads},
		Box: []uint32{64, 1, rows}, Swizzle: 128})
	must(t, err)
	mod, err := d.Compile("tma_copy", tmaCopySrc)
	must(t, err)
	defer mod.Close()
	out, err := d.Alloc(rows * 128)
	must(t, err)
	defer d.Free(out)
	for _, c := range []struct{ c0, c1, c2 int }{{64, 2, 32}, {0, 0, 0}, {0, 3, 56}} {
		must(t, d.Memset8(out, 0xff, rows*128, nil))
		must(t, mod.Launch("tma_copy", D1(1), D1(128), rows*128+1024+16, nil, m, out, int32(c.c0), int32(c.c1), int32(c.c2), int32(rows*128)))
		must(t, d.Sync())
		got := make([]byte, rows*128)
		must(t, d.Download(got, out))
		bad := 0
		for r := 0; r < rows; r++ {
			for ch := 0; ch < 8; ch++ {
				for e := 0; e < 8; e++ {
					want := uint16(0) // past the last slot
					if slot := c.c2 + r; slot < slots {
						want = uint16((slot*heads+c.c1)*hd + c.c0 + ch*8 + e)
					}
					at := r*64 + (ch^(r%8))*8 + e
					if g := binary.LittleEndian.Uint16(got[2*at:]); g != want && bad < 5 {
						t.Errorf("box at (%d, %d, %d): row %d chunk %d element %d: %d, want %d", c.c0, c.c1, c.c2, r, ch, e, g, want)
						bad++
					}
				}
			}
		}
	}
}
