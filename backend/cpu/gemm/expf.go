package gemm

import "math"

// Expf is a float32 exp accurate to about 1 ulp over the range softmax needs
// (x ≤ 0), several times faster than math.Exp: x = n·ln2 + r with |r| ≤ ln2/2
// (ln2 split in two parts so r is exact), exp(r) by Cephes' degree-6
// polynomial, and 2ⁿ put into the exponent bits.
func Expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2Hi = 0.693359375
		ln2Lo = -2.12194440e-4
	)
	if x < -87.3 {
		return 0
	}
	if x > 88.7 {
		return float32(math.Inf(1))
	}
	z := x * log2e
	n := float32(int32(z + 0.5))
	if z+0.5 < 0 && n != z+0.5 {
		n-- // int32 truncates toward zero: make it a floor
	}
	r := x - n*ln2Hi - n*ln2Lo
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	return y * math.Float32frombits(uint32(int32(n)+127)<<23)
}
