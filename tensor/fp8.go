package tensor

import "math"

// FP8 E4M3 as OCP's 8-bit floating point specification defines it (PyTorch's
// float8_e4m3fn, safetensors' F8_E4M3): a sign, 4 exponent bits (bias 7)
// and 3 mantissa bits; exponent 0 holds the subnormals m/8·2⁻⁶; no
// infinities, and S.1111.111 is NaN, so the largest value is 448
// (S.1111.110).

// E4M3Max is the largest finite E4M3 value.
const E4M3Max = 448

var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = e4m3Decode(byte(i))
	}
	return
}()

func e4m3Decode(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e, m := int(b>>3&0xF), float64(b&7)
	switch {
	case e == 15 && m == 7:
		return float32(math.NaN())
	case e == 0:
		return sign * float32(m/8*math.Exp2(-6))
	}
	return sign * float32((1+m/8)*math.Exp2(float64(e-7)))
}

// E4M3ToF32 widens an E4M3 value.
func E4M3ToF32(b byte) float32 { return e4m3Table[b] }

// F32ToE4M3 rounds f to the nearest E4M3 value, ties to even, saturating
// at ±448 (as the FP8 quantizers of llm-compressor and vLLM clamp before
// the cast); NaN stays NaN.
func F32ToE4M3(f float32) byte {
	if f != f {
		return 0x7F
	}
	var sign byte
	if math.Signbit(float64(f)) {
		sign, f = 0x80, -f
	}
	if f >= E4M3Max {
		return sign | 0x7E
	}
	// The spacing of E4M3 values around f: 2^(e-3) for normal f of
	// exponent e ≥ -6, 2^-9 below (subnormals).
	_, exp := math.Frexp(float64(f)) // f = frac·2^exp, frac in [0.5, 1)
	e := max(exp-1, -6)
	step := math.Exp2(float64(e - 3))
	q := math.RoundToEven(float64(f) / step) // exact: f/step has few bits
	v := q * step
	if v >= E4M3Max {
		return sign | 0x7E
	}
	// Encode v, a multiple of step in [0, 448).
	if v < math.Exp2(-6) {
		return sign | byte(q) // subnormal: m = v / 2^-9 (q, with e = -6)
	}
	_, exp = math.Frexp(v)
	e = exp - 1
	m := v/math.Exp2(float64(e))*8 - 8
	return sign | byte(e+7)<<3 | byte(m)
}
