package gemm

import (
	"runtime"
	"sync"
	"unsafe"

	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// Rows interleaved by eights (Q4_K, Q6_K, Q8_0, Q4_0; PackRows8), as
// llama.cpp's CPU backend repacks Q4_K and Q4_0 for its fastest kernels:
// each row's scales unpacked beside the other 7 rows' and their values
// interleaved 4 bytes (Q8_0: 2) at a time, so that one vector holds 8 rows
// and a kernel (rows8_amd64.s) keeps each row's sums and result in its own
// lanes: no broadcast of scales, no horizontal sums. The products equal the
// row kernels' integer sums exactly (TestRows8 holds Go references of each
// layout).
//
// Q4_K: a group of 8 rows is nb blocks of q4k8Block bytes, block b holding the
// rows' super-block b:
//
//	0     d[8]      f16, one a row
//	16    dmin[8]   f16
//	32    sc[8][8]  uint8: sub-block j's scale of row r at 32+8j+r
//	96    mn[4][8][2] uint8: the minimums of sub-blocks 2i and 2i+1 of row r at 96+16i+2r
//	160   qs[32][8][4]: vector v = 8c+u holds, at 4r, bytes 32c+4u..+4 of row r's values
//
// (byte l of a row's 32-byte chunk c holds value 64c+l in its low nibble and
// 64c+32+l in its high one, as in the file).
const q4k8Block = 1184

// packQ4K8 puts the blocks of a group's 8 rows, rows[stride·r:][:fileBlock]
// for row r, into dst, the group's packed block.
func packQ4K8(dst, rows []byte, stride int) {
	dst = dst[:q4k8Block]
	for r := 0; r < 8; r++ {
		blk := rows[stride*r:][:144]
		copy(dst[2*r:], blk[0:2])
		copy(dst[16+2*r:], blk[2:4])
		for j := 0; j < 8; j++ {
			sc, m := tensor.KScaleMin(j, blk[4:16])
			dst[32+8*j+r] = sc
			dst[96+16*(j/2)+2*r+j%2] = m
		}
		for c := 0; c < 4; c++ {
			for u := 0; u < 8; u++ {
				copy(dst[160+32*(8*c+u)+4*r:][:4], blk[16+32*c+4*u:])
			}
		}
	}
}

// packGroups runs pack over the groups [0, n/8) of 8 rows in shares, one
// goroutine a share, up to a share a thread: packing is part of a plan's
// start-up (BenchmarkPackRows8, docs/PERF.md).
func packGroups(n int, pack func(g0, g1 int)) {
	groups := n / 8
	parts := max(1, min(runtime.GOMAXPROCS(0), groups/64))
	var wg sync.WaitGroup
	for i := 0; i < parts; i++ {
		g0, g1 := groups*i/parts, groups*(i+1)/parts
		wg.Add(1)
		go func() {
			defer wg.Done()
			pack(g0, g1)
		}()
	}
	wg.Wait()
}

// rows8Layout is one block type's interleaved layout: the bytes of a
// block in the file (fileBlock, of blockValues values) and of the packed
// block of a group of 8 rows (packBlock), and how the group's 8 blocks
// land in it (pack).
type rows8Layout struct {
	fileBlock, blockValues, packBlock int
	pack                              func(dst, rows []byte, stride int)
}

// rows8Layouts are the layouts PackRows8 writes.
var rows8Layouts = map[tensor.DType]rows8Layout{
	tensor.Q4_K: {144, 256, q4k8Block, packQ4K8},
	tensor.Q6_K: {210, 256, q6k8Block, packQ6K8},
	tensor.Q8_0: {34, 32, q808Block, packQ8_08},
	tensor.Q4_0: {18, 32, q408Block, packQ4_08},
}

// PackRows8 returns w's rows interleaved by eights for the SIMD kernels
// (Weights.Packed, rows8Layouts), or nil where they do not apply: w not
// Q4_K, Q6_K, Q8_0 or Q4_0, its rows not a multiple of 8, or no SIMD
// kernels on this CPU.
func PackRows8(w Weights) []byte {
	l, ok := rows8Layouts[w.DType]
	if !ok || w.N%8 != 0 || !haveSIMD || len(w.Data) < w.N*w.rowBytes() {
		return nil
	}
	nb := w.K / l.blockValues
	out := make([]byte, packedBytes(w))
	packGroups(w.N, func(g0, g1 int) {
		for g := g0; g < g1; g++ {
			for b := 0; b < nb; b++ {
				l.pack(out[(g*nb+b)*l.packBlock:][:l.packBlock], w.Data[(8*g*nb+b)*l.fileBlock:], nb*l.fileBlock)
			}
		}
	})
	return out
}

// packedBytes is the size PackRows8 gives w (0 for a type it does not
// pack).
func packedBytes(w Weights) int {
	l, ok := rows8Layouts[w.DType]
	if !ok {
		return 0
	}
	return w.N / 8 * w.K / l.blockValues * l.packBlock
}

// groups8 is a product's share of work over packed rows: groups [lo, hi)
// of 8 rows for every token.
type groups8 struct{ *quantTask }

func (t groups8) Do(lo, hi int) {
	w := t.w
	nb := w.K / xBlock(w.DType)
	gb := packedBytes(w) / (w.N / 8)
	p := unsafe.Pointer(&w.Packed[lo*gb])
	for tk := 0; tk < t.T; tk++ {
		x := t.a.token(tk, w.K, xBlock(w.DType))
		out := &t.out[tk*w.N+8*lo]
		switch w.DType {
		case tensor.Q8_0:
			rowsQ8_08(p, unsafe.SliceData(x.q16), unsafe.SliceData(x.d), nb, hi-lo, out)
		case tensor.Q4_0:
			rowsQ4_08(p, unsafe.SliceData(x.q), unsafe.SliceData(x.d), unsafe.SliceData(x.sums), nb, hi-lo, out)
		case tensor.Q6_K:
			rowsQ6K8(p, unsafe.SliceData(x.q), unsafe.SliceData(x.d), unsafe.SliceData(x.sums16), nb, hi-lo, out)
		default:
			rowsQ4K8(p, unsafe.SliceData(x.q), unsafe.SliceData(x.d), unsafe.SliceData(x.sums), nb, hi-lo, out)
		}
	}
}

// runGroups8 runs t over w's packed groups of 8 rows for T tokens on p
// (nil: here), in shares of about w.grainBytes(T).
func runGroups8(p *workers.Pool, w Weights, T int, t *quantTask) {
	groups := w.N / 8
	if p == nil {
		groups8{t}.Do(0, groups)
		return
	}
	p.Run(groups, max(1, w.grainBytes(T)/(8*w.rowBytes())), groups8{t})
}

// Q8_0 rows interleaved by eights: a group of 8 rows is nb blocks of
// q808Block bytes, block b holding the rows' blocks b: d[8] (f16, one a
// row) at 0, then 16 chunks of 16 bytes, chunk u holding at 2r values 2u
// and 2u+1 of row r (int8).
const q808Block = 272

// packQ8_08 puts the blocks of a group's 8 rows, rows[stride·r:][:fileBlock]
// for row r, into dst, the group's packed block.
func packQ8_08(dst, rows []byte, stride int) {
	dst = dst[:q808Block]
	for r := 0; r < 8; r++ {
		blk := rows[stride*r:][:34]
		copy(dst[2*r:], blk[0:2])
		for u := 0; u < 16; u++ {
			copy(dst[16+16*u+2*r:][:2], blk[2+2*u:])
		}
	}
}

// Q4_0 rows interleaved by eights: a group of 8 rows is nb blocks of
// q408Block bytes, block b holding the rows' blocks b: d[8] (f16, one a
// row) at 0, then 4 vectors of 32 bytes, vector u holding at 4r bytes
// 4u..4u+4 of row r's 16 (value 4u+i in the low nibble of byte i, 16+4u+i
// in the high one, each q−8).
const q408Block = 144

// packQ4_08 puts the blocks of a group's 8 rows, rows[stride·r:][:fileBlock]
// for row r, into dst, the group's packed block.
func packQ4_08(dst, rows []byte, stride int) {
	dst = dst[:q408Block]
	for r := 0; r < 8; r++ {
		blk := rows[stride*r:][:18]
		copy(dst[2*r:], blk[0:2])
		for u := 0; u < 4; u++ {
			copy(dst[16+32*u+4*r:][:4], blk[2+4*u:])
		}
	}
}

// Q6_K rows interleaved by eights: a group of 8 rows is nb blocks of
// q6k8Block bytes, block b holding the rows' super-blocks b:
//
//	0     d[8]        f16, one a row
//	16    sc[16][8]   int8: sub-block s's scale of row r at 16+8s+r
//	144   ql[32][8][4]: vector 16h+u holds, at 4r, bytes 64h+4u..+4 of row r's ql
//	1168  qh[16][8][4]: vector 8h+u holds, at 4r, bytes 32h+4u..+4 of row r's qh
//
// (ggml's layout within a row: value 128h+32g+l, g < 4, l < 32, takes its low
// 4 bits from ql[64h+l+32(g&1)] (the low nibble for g < 2, the high one
// beyond) and its high 2 from bits 2g, 2g+1 of qh[32h+l]).
const q6k8Block = 1680

// packQ6K8 puts the blocks of a group's 8 rows, rows[stride·r:][:fileBlock]
// for row r, into dst, the group's packed block.
func packQ6K8(dst, rows []byte, stride int) {
	dst = dst[:q6k8Block]
	for r := 0; r < 8; r++ {
		blk := rows[stride*r:][:210]
		copy(dst[2*r:], blk[208:210])
		for s := 0; s < 16; s++ {
			dst[16+8*s+r] = blk[192+s]
		}
		for u := 0; u < 32; u++ {
			copy(dst[144+32*u+4*r:][:4], blk[4*u:])
		}
		for u := 0; u < 16; u++ {
			copy(dst[1168+32*u+4*r:][:4], blk[128+4*u:])
		}
	}
}
