package tensor

import "encoding/binary"

// The GGML block-quantized types, decoded exactly as ggml's
// dequantize_row_* (ggml-quants.c) do, operation for operation (float32
// products and differences in the same order, so the values agree bit for
// bit: TestGGMLDequantize). Blocks of 32 (QK = 32) hold one or two f16
// scales and 4, 5 or 8-bit values; the k-quants' super-blocks of 256 hold
// sub-block scales (and minimums) quantized against f16 super-scales.

// ggmlBlock is a block type: elements and bytes a block, and its decoder
// (b holds exactly one block, y its elements).
type ggmlBlock struct {
	size, bytes int
	decode      func(b []byte, y []float32)
}

var ggmlBlocks = map[DType]ggmlBlock{
	Q8_0:   {32, 34, decodeQ8_0},
	Q4_0:   {32, 18, decodeQ4_0},
	Q4_1:   {32, 20, decodeQ4_1},
	Q5_0:   {32, 22, decodeQ5_0},
	Q5_1:   {32, 24, decodeQ5_1},
	IQ4_NL: {32, 18, decodeIQ4_NL},
	Q2_K:   {256, 84, decodeQ2_K},
	Q3_K:   {256, 110, decodeQ3_K},
	Q4_K:   {256, 144, decodeQ4_K},
	Q5_K:   {256, 176, decodeQ5_K},
	Q6_K:   {256, 210, decodeQ6_K},
}

// BlockDecoder returns GGML block type d's decoder (b one block of
// d.BlockBytes() bytes, y its d.BlockSize() values), for loops that decode
// block by block; nil for other types.
func BlockDecoder(d DType) func(b []byte, y []float32) {
	return ggmlBlocks[d].decode
}

func f16At(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// Q8_0: d (f16), 32 int8: y = d·q.
func decodeQ8_0(b []byte, y []float32) {
	d := f16At(b, 0)
	for j := range 32 {
		y[j] = float32(int8(b[2+j])) * d
	}
}

// Q4_0: d, 16 bytes; byte j holds element j (low nibble) and j+16 (high),
// both offset by 8: y = (q-8)·d.
func decodeQ4_0(b []byte, y []float32) {
	d := f16At(b, 0)
	for j := range 16 {
		q := b[2+j]
		y[j] = float32(int(q&0x0f)-8) * d
		y[j+16] = float32(int(q>>4)-8) * d
	}
}

// Q4_1: d, m, 16 bytes of nibbles as Q4_0's: y = q·d + m.
func decodeQ4_1(b []byte, y []float32) {
	d, m := f16At(b, 0), f16At(b, 2)
	for j := range 16 {
		q := b[4+j]
		y[j] = float32(q&0x0f)*d + m
		y[j+16] = float32(q>>4)*d + m
	}
}

// Q5_0: d, 32 high bits (uint32), 16 bytes of low nibbles: y = (q-16)·d.
func decodeQ5_0(b []byte, y []float32) {
	d := f16At(b, 0)
	qh := binary.LittleEndian.Uint32(b[2:])
	for j := range 16 {
		h0 := byte((qh>>uint(j))<<4) & 0x10
		h1 := byte(qh>>uint(j+12)) & 0x10
		y[j] = float32(int(b[6+j]&0x0f|h0)-16) * d
		y[j+16] = float32(int(b[6+j]>>4|h1)-16) * d
	}
}

// Q5_1: d, m, high bits, low nibbles: y = q·d + m.
func decodeQ5_1(b []byte, y []float32) {
	d, m := f16At(b, 0), f16At(b, 2)
	qh := binary.LittleEndian.Uint32(b[4:])
	for j := range 16 {
		h0 := byte((qh>>uint(j))<<4) & 0x10
		h1 := byte(qh>>uint(j+12)) & 0x10
		y[j] = float32(b[8+j]&0x0f|h0)*d + m
		y[j+16] = float32(b[8+j]>>4|h1)*d + m
	}
}

// iq4nlValues is ggml's kvalues_iq4nl: the 16 levels of IQ4_NL.
var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// IQ4_NL: d, nibbles as Q4_0's indexing a non-linear table: y = d·v[q].
func decodeIQ4_NL(b []byte, y []float32) {
	d := f16At(b, 0)
	for j := range 16 {
		q := b[2+j]
		y[j] = d * float32(iq4nlValues[q&0x0f])
		y[j+16] = d * float32(iq4nlValues[q>>4])
	}
}

// Q2_K: 16 bytes of sub-block scales (low nibble) and minimums (high), 64
// bytes of 2-bit values, d, dmin. Each half of 128 elements reads 32 bytes
// four times at shifts 0, 2, 4, 6; each pass covers two sub-blocks of 16.
func decodeQ2_K(b []byte, y []float32) {
	sc, q := b[0:16], b[16:80]
	d, dmin := f16At(b, 80), f16At(b, 82)
	is, k := 0, 0
	for n := 0; n < 256; n += 128 {
		for shift := uint(0); shift < 8; shift += 2 {
			for half := 0; half < 2; half++ {
				s := sc[is]
				is++
				dl, ml := d*float32(s&0x0f), dmin*float32(s>>4)
				for l := range 16 {
					y[k] = dl*float32(int8((q[16*half+l]>>shift)&3)) - ml
					k++
				}
			}
		}
		q = q[32:]
	}
}

// Q3_K: 32 bytes of high bits (hmask), 64 bytes of low 2 bits, 12 bytes
// of 16 packed 6-bit scales, d. A value is its 2 low bits minus 4 unless
// its hmask bit is set, times d·(scale-32).
func decodeQ3_K(b []byte, y []float32) {
	hm, q := b[0:32], b[32:96]
	d := f16At(b, 108)
	const kmask1, kmask2 = 0x03030303, 0x0f0f0f0f
	var aux [4]uint32
	for i := range 3 {
		aux[i] = binary.LittleEndian.Uint32(b[96+4*i:])
	}
	tmp := aux[2]
	aux[2] = (aux[0]>>4)&kmask2 | ((tmp>>4)&kmask1)<<4
	aux[3] = (aux[1]>>4)&kmask2 | ((tmp>>6)&kmask1)<<4
	aux[0] = aux[0]&kmask2 | (tmp&kmask1)<<4
	aux[1] = aux[1]&kmask2 | ((tmp>>2)&kmask1)<<4
	var scales [16]int8
	for i := range 16 {
		scales[i] = int8(aux[i/4] >> (8 * uint(i%4)))
	}
	is, k := 0, 0
	m := byte(1)
	for n := 0; n < 256; n += 128 {
		for shift := uint(0); shift < 8; shift += 2 {
			for half := 0; half < 2; half++ {
				dl := d * float32(int(scales[is])-32)
				is++
				for l := range 16 {
					v := int8((q[16*half+l] >> shift) & 3)
					if hm[16*half+l]&m == 0 {
						v -= 4
					}
					y[k] = dl * float32(v)
					k++
				}
			}
			m <<= 1
		}
		q = q[32:]
	}
}

// KScaleMin is ggml's get_scale_min_k4: sub-block j's 6-bit scale and
// minimum from the 12 packed bytes of Q4_K and Q5_K.
func KScaleMin(j int, q []byte) (sc, m byte) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0x0f | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// kScales is the scales and minimums of sub-blocks is and is+1 of a Q4_K or
// Q5_K super-block.
func kScales(d, dmin float32, scales []byte, is int) (d1, m1, d2, m2 float32) {
	sc, m := KScaleMin(is, scales)
	d1, m1 = d*float32(sc), dmin*float32(m)
	sc, m = KScaleMin(is+1, scales)
	return d1, m1, d * float32(sc), dmin * float32(m)
}

// Q4_K: d, dmin, 12 bytes of 8 scales and minimums, 128 bytes of nibbles:
// each 64 elements are 32 low nibbles then the same bytes' high nibbles.
func decodeQ4_K(b []byte, y []float32) {
	d, dmin := f16At(b, 0), f16At(b, 2)
	scales, q := b[4:16], b[16:144]
	k := 0
	for is := 0; is < 8; is += 2 {
		d1, m1, d2, m2 := kScales(d, dmin, scales, is)
		for l := range 32 {
			y[k+l] = d1*float32(q[l]&0x0f) - m1
			y[k+32+l] = d2*float32(q[l]>>4) - m2
		}
		q, k = q[32:], k+64
	}
}

// Q5_K: Q4_K's layout with 32 bytes of fifth bits (qh) before the nibbles;
// sub-block pair p takes bits 2p and 2p+1 of qh.
func decodeQ5_K(b []byte, y []float32) {
	d, dmin := f16At(b, 0), f16At(b, 2)
	scales, qh, ql := b[4:16], b[16:48], b[48:176]
	k := 0
	u1, u2 := byte(1), byte(2)
	for is := 0; is < 8; is += 2 {
		d1, m1, d2, m2 := kScales(d, dmin, scales, is)
		for l := range 32 {
			lo, hi := ql[l]&0x0f, ql[l]>>4
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			y[k+l] = d1*float32(lo) - m1
			y[k+32+l] = d2*float32(hi) - m2
		}
		ql, k = ql[32:], k+64
		u1, u2 = u1<<2, u2<<2
	}
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
// scales, d: y = d·scale·(q-32), 128 elements per pass in four runs of 32.
func decodeQ6_K(b []byte, y []float32) {
	ql, qh, sc := b[0:128], b[128:192], b[192:208]
	d := f16At(b, 208)
	for n := 0; n < 256; n += 128 {
		for l := range 32 {
			is := l / 16
			q1 := int8(ql[l]&0x0f|(qh[l]&3)<<4) - 32
			q2 := int8(ql[l+32]&0x0f|((qh[l]>>2)&3)<<4) - 32
			q3 := int8(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
			q4 := int8(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
			y[n+l] = d * float32(int8(sc[is])) * float32(q1)
			y[n+l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			y[n+l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			y[n+l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
		ql, qh, sc = ql[64:], qh[32:], sc[8:]
	}
}
