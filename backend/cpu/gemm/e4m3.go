package gemm

import (
	"unsafe"

	"kiln/tensor"
)

// DotsE4M3 is Dots over rows of FP8 E4M3 codes: out[r] = Σ_k
// a[k]·E4M3(b[r·stride+k]) for the len(a) codes of row r < len(out), the
// codes widened in registers (the FP8 KV cache's keys).
func DotsE4M3(out, a []float32, b []byte, stride int) {
	n, k := len(out), len(a)
	if n == 0 {
		return
	}
	b = b[:(n-1)*stride+k]
	k8 := k &^ 7
	if SIMD() && k8 > 0 {
		dotsE4M3(unsafe.SliceData(a), unsafe.SliceData(b), uintptr(stride), n, k8/8, unsafe.SliceData(out))
	} else {
		clear(out)
		k8 = 0
	}
	for r := range out {
		row := b[r*stride : r*stride+k]
		var s float32
		for i := k8; i < k; i++ {
			s += a[i] * tensor.E4M3ToF32(row[i])
		}
		out[r] += s
	}
}

// AxpysE4M3 is Axpys over rows of FP8 E4M3 codes: y[k] += Σ_r
// w[r]·E4M3(x[r·stride+k]) for k < len(y) (the FP8 KV cache's values).
func AxpysE4M3(w []float32, x []byte, stride int, y []float32) {
	n, k := len(w), len(y)
	if n == 0 {
		return
	}
	x = x[:(n-1)*stride+k]
	k8 := 0
	if SIMD() && k >= 8 {
		k8 = k &^ 7
		axpysE4M3(unsafe.SliceData(w), unsafe.SliceData(x), uintptr(stride), n, k8/8, unsafe.SliceData(y))
	}
	for r, wr := range w {
		row := x[r*stride : r*stride+k]
		for i := k8; i < k; i++ {
			y[i] += wr * tensor.E4M3ToF32(row[i])
		}
	}
}
