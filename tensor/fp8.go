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
// the cast); NaN stays NaN. On the bits: below 2⁻⁶ the code is the
// subnormal count of 2⁻⁹ (f·512 rounded to even); above, the float32's
// mantissa rounded to 3 bits at bit 20, ties to even, and the exponent
// rebiased from 127 to 7 (TestE4M3 checks it against the definition).
func F32ToE4M3(f float32) byte {
	bits := math.Float32bits(f)
	sign := byte(bits>>24) & 0x80
	abs := bits &^ (1 << 31)
	switch {
	case abs > 0x7F800000: // NaN
		return 0x7F
	case abs >= 0x43E00000: // ≥ 448, infinity included
		return sign | 0x7E
	case abs < 0x3C800000: // < 2⁻⁶: subnormal (or 2⁻⁶ itself once rounded)
		return sign | byte(math.RoundToEven(float64(math.Float32frombits(abs))*512))
	}
	r := (abs + 0x7FFFF + (abs>>20)&1) >> 20 // exponent and 3 mantissa bits, rounded
	if v := r - 120<<3; v < 0x7F {
		return sign | byte(v)
	}
	return sign | 0x7E // rounded past 448
}
