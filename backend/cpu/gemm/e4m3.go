package gemm

import "kiln/tensor"

// DotsE4M3 is Dots over rows of FP8 E4M3 codes: out[r] = Σ_k
// a[k]·E4M3(b[r·stride+k]) for the len(a) codes of row r < len(out), the
// codes widened in registers (the FP8 KV cache's keys).
func DotsE4M3(out, a []float32, b []byte, stride int) {
	dotsWidened(out, a, b, stride, dotsE4M3, tensor.E4M3ToF32)
}

// AxpysE4M3 is Axpys over rows of FP8 E4M3 codes: y[k] += Σ_r
// w[r]·E4M3(x[r·stride+k]) for k < len(y) (the FP8 KV cache's values).
func AxpysE4M3(w []float32, x []byte, stride int, y []float32) {
	axpysWidened(w, x, stride, y, axpysE4M3, tensor.E4M3ToF32)
}
