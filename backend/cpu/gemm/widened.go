package gemm

import "unsafe"

// Rows of 8- and 16-bit codes (an FP8 or f16 KV cache) that the kernels
// widen to float32 in registers: DotsE4M3, AxpysE4M3, DotsF16 and AxpysF16
// share the frames below, each with its SIMD kernel (whole groups of 8
// values a row) and its scalar widening (the rest of a row, and every value
// without SIMD).

// rowsKernel is a SIMD kernel over n rows of codes stride bytes apart, n8
// groups of 8 values a row.
type rowsKernel[T ~byte | ~uint16] func(v *float32, rows *T, stride uintptr, n, n8 int, out *float32)

// dotsWidened sets out[r] = Σ_k a[k]·widen(b[r·stride+k]) for the len(a)
// values of row r < len(out).
func dotsWidened[T ~byte | ~uint16](out, a []float32, b []T, stride int, kernel rowsKernel[T], widen func(T) float32) {
	n, k := len(out), len(a)
	if n == 0 {
		return
	}
	b = b[:(n-1)*stride+k]
	k8 := k &^ 7
	if SIMD() && k8 > 0 {
		kernel(unsafe.SliceData(a), unsafe.SliceData(b), uintptr(stride)*unsafe.Sizeof(b[0]), n, k8/8, unsafe.SliceData(out))
	} else {
		clear(out)
		k8 = 0
	}
	for r := range out {
		row := b[r*stride : r*stride+k]
		var s float32
		for i := k8; i < k; i++ {
			s += a[i] * widen(row[i])
		}
		out[r] += s
	}
}

// axpysWidened adds Σ_r w[r]·widen(x[r·stride+k]) to y[k] for k < len(y).
func axpysWidened[T ~byte | ~uint16](w []float32, x []T, stride int, y []float32, kernel rowsKernel[T], widen func(T) float32) {
	n, k := len(w), len(y)
	if n == 0 {
		return
	}
	x = x[:(n-1)*stride+k]
	k8 := 0
	if SIMD() && k >= 8 {
		k8 = k &^ 7
		kernel(unsafe.SliceData(w), unsafe.SliceData(x), uintptr(stride)*unsafe.Sizeof(x[0]), n, k8/8, unsafe.SliceData(y))
	}
	for r, wr := range w {
		row := x[r*stride : r*stride+k]
		for i := k8; i < k; i++ {
			y[i] += wr * widen(row[i])
		}
	}
}
