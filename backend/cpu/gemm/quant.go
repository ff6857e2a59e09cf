package gemm

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"

	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// Integer products for Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights. Each
// token's x is quantized in blocks, every weight block is multiplied with
// its x block in integers (exact), and the scales are applied once a block
// (Q8_0, Q4_0) or a sub-block (k-quants) in float32:
//
//   - the k-quants and Q4_0, as llama.cpp computes them on the CPU: x in
//     8-bit blocks of 256 (of 32 for Q4_0) with a float32 scale and the
//     sums of each 32 and each 16 values, from which the minimums' and
//     offsets' terms come;
//   - Q8_0: x in 16-bit blocks of 32 with a float32 scale. llama.cpp
//     rounds x to 8 bits here too, which made the demo model's greedy text
//     leave bf16's at its 32nd token and doubled its KL divergence from
//     bf16; with 16 bits Q8_0 stays the near-lossless format it is meant to
//     be, at the cost of reading x twice as wide (from L1).
//
// Rounding x is the only approximation: each x value moves by about half
// its block's step amax/127 (amax/32767), which bounds the product's error
// (quantBound in the tests).
//
// On amd64 with AVX2 the row kernels are assembly (quant_amd64.s: byte
// products by VPMADDUBSW, pairs by VPMADDWD, a block's sum converted to
// float32 once); the Go kernels below are the same arithmetic, for other
// platforms, SetPure and the tests.

// intDot reports whether products with weights of type d take the integer
// path.
func intDot(d tensor.DType) bool {
	return d == tensor.Q8_0 || d == tensor.Q4_0 || d == tensor.Q4_K || d == tensor.Q5_K || d == tensor.Q6_K
}

// xBlock is the length of the blocks x is quantized in for weights of
// type d (32 for Q8_0 and Q4_0, 256 for the k-quants).
func xBlock(d tensor.DType) int {
	if d == tensor.Q8_0 || d == tensor.Q4_0 {
		return 32
	}
	return 256
}

// xBits is the width of x's quantized values for weights of type d.
func xBits(d tensor.DType) int {
	if d == tensor.Q8_0 {
		return 16
	}
	return 8
}

// qx is x quantized for one product: T rows of K values in blocks of bs
// with scales d, in 8 bits (q, with sums[i] the sum of q's values
// [32i, 32i+32), which Q4_0's offsets and the k-quants' minimums need, and
// sums16[i] that of [16i, 16i+16), which Q6_K's offsets need) or 16 bits
// (q16): q[t*K+k] ≈ x[t][k]/d[(t*K+k)/bs].
type qx struct {
	q      []int8
	q16    []int16
	d      []float32
	sums   []int16
	sums16 []int16
}

var qxPool = sync.Pool{New: func() any { return new(qx) }}

// quantize fills a with x's T rows of K values in blocks of bs (K a
// multiple of bs) of bits 8 or 16, reusing a's buffers.
func (a *qx) quantize(x []float32, T, K, bs, bits int) {
	n := T * K
	if cap(a.d) < n/32 {
		a.d = make([]float32, n/32)
	}
	a.d = a.d[:n/bs]
	if bits == 16 {
		if cap(a.q16) < n {
			a.q16 = make([]int16, n)
		}
		a.q16 = a.q16[:n]
		a.q, a.sums, a.sums16 = a.q[:0], a.sums[:0], a.sums16[:0]
	} else {
		if cap(a.q) < n {
			a.q = make([]int8, n)
			a.sums = make([]int16, n/32)
			a.sums16 = make([]int16, n/16)
		}
		a.q, a.sums, a.sums16 = a.q[:n], a.sums[:n/32], a.sums16[:n/16]
		a.q16 = a.q16[:0]
	}
	top := float32(int(1)<<(bits-1) - 1) // 127 or 32767
	simd := SIMD()
	for b := range n / bs {
		xs := x[b*bs : (b+1)*bs]
		var amax float32
		if simd {
			amax = absMax(&xs[0], bs/8)
		} else {
			for _, v := range xs {
				amax = max(amax, abs32(v))
			}
		}
		var id float32
		switch {
		case amax == 0:
			a.d[b] = 0
		case amax != amax || amax > math.MaxFloat32:
			// NaN and Inf cannot be scaled: a NaN scale makes the
			// products NaN, as the float path would.
			a.d[b] = float32(math.NaN())
		default:
			a.d[b] = amax / top
			id = top / amax
		}
		// Round to nearest, ties to even (VCVTPS2DQ; math.RoundToEven is
		// one instruction on amd64, math.Round is not).
		switch {
		case bits == 16 && simd:
			round16(&xs[0], bs/16, id, &a.q16[b*bs])
		case bits == 16:
			q16 := a.q16[b*bs : (b+1)*bs]
			for i, v := range xs {
				q16[i] = int16(math.RoundToEven(float64(v * id)))
			}
		case simd:
			round8(&xs[0], bs/32, id, &a.q[b*bs], &a.sums[b*bs/32], &a.sums16[b*bs/16])
		default:
			qs := a.q[b*bs : (b+1)*bs]
			for i, v := range xs {
				qs[i] = int8(math.RoundToEven(float64(v * id)))
			}
			for s := 0; s < bs/16; s++ {
				var sum int16
				for _, v := range qs[16*s : 16*s+16] {
					sum += int16(v)
				}
				a.sums16[b*bs/16+s] = sum
			}
			for s := 0; s < bs/32; s++ {
				a.sums[b*bs/32+s] = a.sums16[b*bs/16+2*s] + a.sums16[b*bs/16+2*s+1]
			}
		}
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// quantTask is one integer product's shared state (recycled, as mmTask).
type quantTask struct {
	out []float32
	a   *qx
	T   int
	w   Weights
}

var quantTasks = sync.Pool{New: func() any { return new(quantTask) }}

func matMulQuant(p *workers.Pool, out, x []float32, T int, w Weights) {
	a := qxPool.Get().(*qx)
	a.quantize(x, T, w.K, xBlock(w.DType), xBits(w.DType))
	t := quantTasks.Get().(*quantTask)
	*t = quantTask{out: out, a: a, T: T, w: w}
	if w.Packed != nil && SIMD() {
		runGroups8(p, w, T, t)
	} else {
		runRowGroups(p, w, T, t)
	}
	*t = quantTask{}
	quantTasks.Put(t)
	qxPool.Put(a)
}

// token returns token tk's part of a (K values a token, blocks of bs).
func (a *qx) token(tk, K, bs int) qx {
	var r qx
	if len(a.q16) > 0 {
		r.q16 = a.q16[tk*K : (tk+1)*K]
	}
	if len(a.q) > 0 {
		r.q = a.q[tk*K : (tk+1)*K]
		r.sums = a.sums[tk*K/32 : (tk+1)*K/32]
		r.sums16 = a.sums16[tk*K/16 : (tk+1)*K/16]
	}
	r.d = a.d[tk*K/bs : (tk+1)*K/bs]
	return r
}

// Do computes rows [4·lo, 4·hi) for every token, token after token, so the
// rows are read from memory once and from cache for the later tokens.
func (t *quantTask) Do(lo, hi int) {
	w := t.w
	n0, n1 := 4*lo, min(4*hi, w.N)
	rb := w.rowBytes()
	rows := w.Data[n0*rb : n1*rb]
	for tk := 0; tk < t.T; tk++ {
		x := t.a.token(tk, w.K, xBlock(w.DType))
		out := t.out[tk*w.N+n0 : tk*w.N+n1]
		if SIMD() {
			rowsSIMD(w.DType, rows, rb, &x, out)
		} else {
			rowsGo(w.DType, rows, rb, &x, out)
		}
	}
}

// rowsSIMD runs the assembly kernel of d over len(out) rows of rb bytes
// with one token's x.
func rowsSIMD(d tensor.DType, rows []byte, rb int, x *qx, out []float32) {
	w := unsafe.Pointer(unsafe.SliceData(rows))
	dp, op := unsafe.SliceData(x.d), unsafe.SliceData(out)
	switch d {
	case tensor.Q8_0:
		rowsQ8_0(w, uintptr(rb), unsafe.SliceData(x.q16), dp, len(x.d), len(out), op)
	case tensor.Q4_0:
		rowsQ4_0(w, uintptr(rb), unsafe.SliceData(x.q), dp, unsafe.SliceData(x.sums), len(x.d), len(out), op)
	case tensor.Q4_K:
		rowsQ4K(w, uintptr(rb), unsafe.SliceData(x.q), dp, unsafe.SliceData(x.sums), len(x.d), len(out), op)
	case tensor.Q5_K:
		rowsQ5K(w, uintptr(rb), unsafe.SliceData(x.q), dp, unsafe.SliceData(x.sums), len(x.d), len(out), op)
	case tensor.Q6_K:
		rowsQ6K(w, uintptr(rb), unsafe.SliceData(x.q), dp, unsafe.SliceData(x.sums16), len(x.d), len(out), op)
	}
}

// rowsGo is rowsSIMD in Go.
func rowsGo(d tensor.DType, rows []byte, rb int, x *qx, out []float32) {
	for i := range out {
		row := rows[i*rb : (i+1)*rb]
		switch d {
		case tensor.Q8_0:
			out[i] = dotQ8_0(row, x.q16, x.d)
		case tensor.Q4_0:
			out[i] = dotQ4_0(row, x.q, x.d, x.sums)
		case tensor.Q4_K:
			out[i] = dotQ4K(row, x.q, x.d, x.sums)
		case tensor.Q5_K:
			out[i] = dotQ5K(row, x.q, x.d, x.sums)
		case tensor.Q6_K:
			out[i] = dotQ6K(row, x.q, x.d)
		}
	}
}

func f16(b []byte) float32 { return tensor.F16ToF32(binary.LittleEndian.Uint16(b)) }

// dotQ8_0: blocks of 34 bytes, d (f16) and 32 int8; x in 16 bits.
func dotQ8_0(row []byte, q []int16, xd []float32) float32 {
	var s float32
	for b := range xd {
		blk := row[34*b : 34*b+34]
		var isum int32
		for i, v := range blk[2:] {
			isum += int32(int8(v)) * int32(q[32*b+i])
		}
		s += f16(blk) * xd[b] * float32(isum)
	}
	return s
}

// dotQ4_0: blocks of 18 bytes, d (f16) and 16 bytes: byte l holds value l
// (low nibble) and l+16 (high), each q−8; x in 8 bits, with its sums of 32.
func dotQ4_0(row []byte, q []int8, xd []float32, sums []int16) float32 {
	var s float32
	for b := range xd {
		blk := row[18*b : 18*b+18]
		var isum int32
		for l, v := range blk[2:] {
			isum += int32(v&0xF)*int32(q[32*b+l]) + int32(v>>4)*int32(q[32*b+16+l])
		}
		s += f16(blk) * xd[b] * float32(isum-8*int32(sums[b]))
	}
	return s
}

// dotQ4K: blocks of 144 bytes: d, dmin (f16), 12 bytes of scales and
// minimums, 128 bytes of 4-bit values; value i of sub-block j (32 values)
// is d·sc[j]·q − dmin·m[j], q the low nibbles of bytes [32(j/2), +32) for
// even j, the high ones for odd j.
func dotQ4K(row []byte, q []int8, xd []float32, sums []int16) float32 {
	return dotK(row, q, xd, sums, false)
}

// dotQ5K: blocks of 176 bytes: Q4_K's d, dmin and scales, 32 bytes of
// high bits qh, 128 bytes of nibbles; value l of sub-block j is Q4_K's
// nibble plus 16 when bit j of qh[l] is set.
func dotQ5K(row []byte, q []int8, xd []float32, sums []int16) float32 {
	return dotK(row, q, xd, sums, true)
}

// dotK is dotQ4K, or dotQ5K with five.
func dotK(row []byte, q []int8, xd []float32, sums []int16, five bool) float32 {
	bb, qsAt := 144, 16
	if five {
		bb, qsAt = 176, 48
	}
	var s float32
	for b := range xd {
		blk := row[bb*b : bb*(b+1)]
		qh, qs := blk[16:48], blk[qsAt:]
		xq := q[256*b : 256*b+256]
		var isum, msum int32
		for j := 0; j < 8; j++ {
			var sub int32
			for l := 0; l < 32; l++ {
				v := qs[32*(j/2)+l]
				if j%2 == 0 {
					v &= 0xF
				} else {
					v >>= 4
				}
				if five {
					v |= (qh[l] >> j & 1) << 4
				}
				sub += int32(v) * int32(xq[32*j+l])
			}
			sc, m := tensor.KScaleMin(j, blk[4:16])
			isum += int32(sc) * sub
			msum += int32(m) * int32(sums[8*b+j])
		}
		s += f16(blk)*xd[b]*float32(isum) - f16(blk[2:])*xd[b]*float32(msum)
	}
	return s
}

// dotQ6K: blocks of 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit
// pairs, 16 int8 scales (one a sub-block of 16) and d (f16); value q−32 of
// 6 bits, laid out as ggml's dequantize_row_q6_K reads it.
func dotQ6K(row []byte, q []int8, xd []float32) float32 {
	var s float32
	for b := range xd {
		blk := row[210*b : 210*b+210]
		var isum int32
		for h := 0; h < 2; h++ {
			ql, qh := blk[64*h:], blk[128+32*h:]
			sc := blk[192+8*h:]
			xq := q[256*b+128*h:]
			for l := 0; l < 32; l++ {
				is := l / 16
				v := [4]int32{
					int32(ql[l]&0xF|(qh[l]>>0&3)<<4) - 32,
					int32(ql[l+32]&0xF|(qh[l]>>2&3)<<4) - 32,
					int32(ql[l]>>4|(qh[l]>>4&3)<<4) - 32,
					int32(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32,
				}
				for g := 0; g < 4; g++ {
					isum += int32(int8(sc[is+2*g])) * v[g] * int32(xq[l+32*g])
				}
			}
		}
		s += f16(blk[208:]) * xd[b] * float32(isum)
	}
	return s
}
