package tensor

import (
	"encoding/binary"
	"math"
)

// The k-quant quantizers, as ggml's reference ones (quantize_row_q4_K_ref,
// quantize_row_q5_K_ref and quantize_row_q6_K_ref, what llama-quantize runs without an
// importance matrix), operation for operation in float32, so that the
// blocks are ggml's bit for bit (TestGGMLQuantize).

// nearestInt rounds to nearest, ties to even, as ggml's nearest_int does
// (through the float32 sum with 1.5·2²³), for |v| < 2²².
func nearestInt(v float32) int {
	u := math.Float32bits(v + 12582912)
	return int(u&0x007fffff) - 0x00400000
}

func absf(v float32) float32  { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
func sqrtf(v float32) float32 { return float32(math.Sqrt(float64(v))) }

// groupMaxEps is ggml's GROUP_MAX_EPS: a group below it is all zeros.
const groupMaxEps = 1e-15

// makeQKX2 is ggml's make_qkx2_quants: levels L in [0, nmax] and a scale
// and minimum for x, searching nstep+1 scales around nmax/(max-min) for
// the least weighted squared (or, with mad, absolute) error. It returns
// the scale and the minimum's negation.
func makeQKX2(nmax int, x, w []float32, L, laux []uint8, rmin, rdelta float32, nstep int, mad bool) (scale, negMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		sumW += w[i]
		sumX += w[i] * x[i]
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		clear(L[:n])
		return 0, -mn
	}
	fmax := float32(nmax)
	iscale := fmax / (mx - mn)
	scale = 1 / iscale
	errOf := func(d float32) float32 {
		if mad {
			return absf(d)
		}
		return d * d
	}
	var best float32
	for i := range n {
		L[i] = uint8(max(0, min(nmax, nearestInt(iscale*(x[i]-mn)))))
		best += w[i] * errOf(scale*float32(L[i])+mn-x[i])
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + rdelta*float32(is) + fmax) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := max(0, min(nmax, nearestInt(iscale*(x[i]-mn))))
			laux[i] = uint8(l)
			fl := float32(l)
			sumL += w[i] * fl
			sumL2 += w[i] * fl * fl
			sumXL += w[i] * fl * x[i]
		}
		D := sumW*sumL2 - sumL*sumL
		if D <= 0 {
			continue
		}
		thisScale := (sumW*sumXL - sumX*sumL) / D
		thisMin := (sumL2*sumX - sumL*sumXL) / D
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i := range n {
			cur += w[i] * errOf(thisScale*float32(laux[i])+thisMin-x[i])
		}
		if cur < best {
			copy(L[:n], laux[:n])
			best, scale, mn = cur, thisScale, thisMin
		}
	}
	return scale, -mn
}

// quantizeQ4_K appends the Q4_K blocks of x (a multiple of 256 values):
// quantize_row_q4_K_ref.
func quantizeQ4_K(out []byte, x []float32) []byte {
	var L [256]uint8
	for ; len(x) >= 256; x = x[256:] {
		out = kBlockHeader(out, x, 15, -1, 20, &L)
		for j := 0; j < 256; j += 64 {
			for l := range 32 {
				out = append(out, L[j+l]|L[j+l+32]<<4)
			}
		}
	}
	return out
}

// quantizeQ5_K appends the Q5_K blocks of x (a multiple of 256 values):
// quantize_row_q5_K_ref. Q4_K's header, then the fifth bits (qh: bit 2i
// of byte l for value 64i+l, bit 2i+1 for value 64i+32+l), then the low
// four bits as Q4_K's nibbles.
func quantizeQ5_K(out []byte, x []float32) []byte {
	var L [256]uint8
	for ; len(x) >= 256; x = x[256:] {
		out = kBlockHeader(out, x, 31, -0.5, 15, &L)
		var qh [32]byte
		for i, n := 0, 0; n < 256; i, n = i+1, n+64 {
			for l := range 32 {
				qh[l] |= (L[n+l]>>4)<<(2*i) | (L[n+l+32]>>4)<<(2*i+1)
			}
		}
		out = append(out, qh[:]...)
		for n := 0; n < 256; n += 64 {
			for l := range 32 {
				out = append(out, L[n+l]&0x0f|(L[n+l+32]&0x0f)<<4)
			}
		}
	}
	return out
}

// kBlockHeader appends the header of the Q4_K or Q5_K block of the 256
// values x (d and dmin in f16, the 8 sub-blocks' 6-bit scales and minimums
// packed in 12 bytes) and sets L to the values' levels in [0, nmax]:
// make_qkx2_quants per 32 values with weights rms+|x| (rmin, 0.1, nstep
// as ggml calls it for the type), the scales and minimums quantized to 6
// bits against the largest, then each value's level from the packed ones.
func kBlockHeader(out []byte, x []float32, nmax int, rmin float32, nstep int, L *[256]uint8) []byte {
	var laux [32]uint8
	var w [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		sub := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range sub {
			sumX2 += v * v
		}
		av := sqrtf(sumX2 / 32)
		for l, v := range sub {
			w[l] = av + absf(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, sub, w[:], L[32*j:], laux[:], rmin, 0.1, nstep, false)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var packed [12]byte
	for j := range 8 {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			packed[j], packed[j+4] = ls, lm
		} else {
			packed[j+4] = ls&0x0f | (lm&0x0f)<<4
			packed[j-4] |= (ls >> 4) << 6
			packed[j] |= (lm >> 4) << 6
		}
	}
	dh, mh := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
	d, dmin := F16ToF32(dh), F16ToF32(mh)
	for j := range 8 {
		sc, m := KScaleMin(j, packed[:])
		dj := d * float32(sc)
		if dj == 0 {
			continue
		}
		dm := dmin * float32(m)
		for i := range 32 {
			L[32*j+i] = uint8(max(0, min(nmax, nearestInt((x[32*j+i]+dm)/dj))))
		}
	}
	out = binary.LittleEndian.AppendUint16(out, dh)
	out = binary.LittleEndian.AppendUint16(out, mh)
	return append(out, packed[:]...)
}

// makeQX is ggml's make_qx_quants with rmse_type 1 and no importance
// weights (each value weighs x²): levels L in [0, 2·nmax) for x, searching
// 18 scales around -nmax/max for the least weighted squared error; it
// returns the scale.
func makeQX(nmax int, x []float32, L []int8) float32 {
	var mx, amax float32
	for _, v := range x {
		if a := absf(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	level := func(iscale, v float32) int { return max(-nmax, min(nmax-1, nearestInt(iscale*v))) }
	iscale := float32(-nmax) / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		l := level(iscale, v)
		L[i] = int8(l + nmax)
		w := v * v
		sumLX += w * v * float32(l)
		sumL2 += w * float32(l) * float32(l)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + 0.1*float32(is)) / mx
		sumLX, sumL2 = 0, 0
		for _, v := range x {
			l := float32(level(iscale, v))
			w := v * v
			sumLX += w * v * l
			sumL2 += w * l * l
		}
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			for i, v := range x {
				L[i] = int8(level(iscale, v) + nmax)
			}
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// quantizeQ6_K appends the Q6_K blocks of x (a multiple of 256 values).
func quantizeQ6_K(out []byte, x []float32) []byte {
	var L [256]int8
	var scales [16]float32
	for ; len(x) >= 256; x = x[256:] {
		var maxScale, maxAbs float32
		for ib := range 16 {
			scales[ib] = makeQX(32, x[16*ib:16*ib+16], L[16*ib:])
			if a := absf(scales[ib]); a > maxAbs {
				maxAbs, maxScale = a, scales[ib]
			}
		}
		if maxAbs < groupMaxEps {
			out = append(out, make([]byte, 210)...)
			continue
		}
		iscale := -128 / maxScale
		dh := F32ToF16(1 / iscale)
		var sc [16]int8
		for ib := range 16 {
			sc[ib] = int8(min(127, nearestInt(iscale*scales[ib])))
		}
		d := F16ToF32(dh)
		for j := range 16 {
			dj := d * float32(sc[j])
			if dj == 0 {
				continue
			}
			for i := range 16 {
				L[16*j+i] = int8(max(-32, min(31, nearestInt(x[16*j+i]/dj))) + 32)
			}
		}
		var ql [128]byte
		var qh [64]byte
		for j := 0; j < 256; j += 128 {
			for l := range 32 {
				q := func(o int) byte { return byte(L[j+l+o]) }
				ql[j/2+l] = q(0)&0x0f | (q(64)&0x0f)<<4
				ql[j/2+l+32] = q(32)&0x0f | (q(96)&0x0f)<<4
				qh[j/4+l] = q(0)>>4 | (q(32)>>4)<<2 | (q(64)>>4)<<4 | (q(96)>>4)<<6
			}
		}
		out = append(out, ql[:]...)
		out = append(out, qh[:]...)
		for _, s := range sc {
			out = append(out, byte(s))
		}
		out = binary.LittleEndian.AppendUint16(out, dh)
	}
	return out
}
