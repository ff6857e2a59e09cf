package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestE4M3 checks the 256 codes against their definition (known values:
// 448, 2⁻⁹, 1, NaN), that every finite code encodes back to itself, that
// random values round to the nearest code (ties to even), and saturation.
func TestE4M3(t *testing.T) {
	for b, want := range map[byte]float32{0x00: 0, 0x80: 0, 0x01: 1.0 / 512, 0x38: 1, 0xB8: -1, 0x7E: 448, 0xFE: -448, 0x08: 1.0 / 64, 0x07: 7.0 / 512} {
		if got := E4M3ToF32(b); got != want {
			t.Errorf("E4M3ToF32(%#02x) = %v, want %v", b, got, want)
		}
	}
	var finite []float32
	for i := 0; i < 256; i++ {
		b := byte(i)
		v := E4M3ToF32(b)
		if b&0x7F == 0x7F {
			if !math.IsNaN(float64(v)) || F32ToE4M3(v)&0x7F != 0x7F {
				t.Errorf("%#02x: %v, not a NaN that stays NaN", b, v)
			}
			continue
		}
		if got := F32ToE4M3(v); got != b && !(v == 0 && got&0x7F == 0) {
			t.Errorf("F32ToE4M3(%v) = %#02x, want %#02x", v, got, b)
		}
		if v >= 0 {
			finite = append(finite, v)
		}
	}
	// finite: the non-negative codes 0x00..0x7E in increasing order.
	r := rand.New(rand.NewPCG(7, 8))
	for range 100000 {
		x := float32(r.Float64() * 460)
		if r.IntN(2) == 0 {
			x = float32(math.Exp2(r.Float64()*20 - 12))
		}
		got := E4M3ToF32(F32ToE4M3(x))
		var want float32 = 448
		for i := 1; i < len(finite); i++ {
			lo, hi := finite[i-1], finite[i]
			if x >= lo && x <= hi {
				switch {
				case x-lo < hi-x:
					want = lo
				case x-lo > hi-x:
					want = hi
				case i%2 == 1: // a tie: lo's code i-1 is even
					want = lo
				default:
					want = hi
				}
				break
			}
		}
		if got != want {
			t.Fatalf("E4M3 of %v = %v, want %v", x, got, want)
		}
		if neg := E4M3ToF32(F32ToE4M3(-x)); neg != -want {
			t.Fatalf("E4M3 of %v = %v, want %v", -x, neg, -want)
		}
	}
	if F32ToE4M3(1e6) != 0x7E || F32ToE4M3(float32(math.Inf(-1))) != 0xFE {
		t.Error("no saturation at ±448")
	}
	// Every float32 bit pattern of 2²⁴ spread over the whole range, and all
	// of those within 2⁻¹² of 2⁻⁶ and of 448, against the definition.
	check := func(bits uint32) {
		f := math.Float32frombits(bits)
		if got, want := F32ToE4M3(f), e4m3Ref(f); got != want {
			t.Fatalf("F32ToE4M3(%v, bits %#08x) = %#02x, want %#02x", f, bits, got, want)
		}
	}
	for b := uint32(0); b < 1<<24; b++ {
		check(b<<8 | b&0xFF)
	}
	for _, c := range []float32{1.0 / 64, 448} {
		for d := -4096; d <= 4096; d++ {
			check(uint32(int32(math.Float32bits(c)) + int32(d)))
		}
	}
}

// e4m3Ref is F32ToE4M3 by its definition, on float64 arithmetic.
func e4m3Ref(f float32) byte {
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
	_, exp := math.Frexp(float64(f))
	e := max(exp-1, -6)
	step := math.Exp2(float64(e - 3))
	q := math.RoundToEven(float64(f) / step)
	v := q * step
	if v >= E4M3Max {
		return sign | 0x7E
	}
	if v < math.Exp2(-6) {
		return sign | byte(q)
	}
	_, exp = math.Frexp(v)
	e = exp - 1
	m := v/math.Exp2(float64(e))*8 - 8
	return sign | byte(e+7)<<3 | byte(m)
}
