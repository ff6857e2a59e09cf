package gemm

import "kiln/tensor"

// DotsF16 is Dots over rows of IEEE half-precision values: out[r] = Σ_k
// a[k]·F16(b[r·stride+k]) for the len(a) values of row r < len(out), widened
// in registers (the f16 KV cache's keys).
func DotsF16(out, a []float32, b []uint16, stride int) {
	dotsWidened(out, a, b, stride, dotsF16, tensor.F16ToF32)
}

// AxpysF16 is Axpys over rows of half-precision values: y[k] += Σ_r
// w[r]·F16(x[r·stride+k]) for k < len(y) (the f16 KV cache's values).
func AxpysF16(w []float32, x []uint16, stride int, y []float32) {
	axpysWidened(w, x, stride, y, axpysF16, tensor.F16ToF32)
}
