package gemm

import (
	"unsafe"

	"kiln/tensor"
)

// DotsF16 and AxpysF16 have DotsE4M3's and AxpysE4M3's frame (e4m3.go)
// around their own kernels. One generic frame for both made the callers'
// stack buffers escape to the heap (the shape-instantiated call is opaque
// to escape analysis: 8 allocations a decode step, TestDecodeAllocatesNothing),
// so each type keeps its copy.

// DotsF16 is Dots over rows of IEEE half-precision values: out[r] = Σ_k
// a[k]·F16(b[r·stride+k]) for the len(a) values of row r < len(out), widened
// in registers (the f16 KV cache's keys).
func DotsF16(out, a []float32, b []uint16, stride int) {
	n, k := len(out), len(a)
	if n == 0 {
		return
	}
	b = b[:(n-1)*stride+k]
	k8 := k &^ 7
	if SIMD() && k8 > 0 {
		dotsF16(unsafe.SliceData(a), unsafe.SliceData(b), uintptr(2*stride), n, k8/8, unsafe.SliceData(out))
	} else {
		clear(out)
		k8 = 0
	}
	for r := range out {
		row := b[r*stride : r*stride+k]
		var s float32
		for i := k8; i < k; i++ {
			s += a[i] * tensor.F16ToF32(row[i])
		}
		out[r] += s
	}
}

// AxpysF16 is Axpys over rows of half-precision values: y[k] += Σ_r
// w[r]·F16(x[r·stride+k]) for k < len(y) (the f16 KV cache's values).
func AxpysF16(w []float32, x []uint16, stride int, y []float32) {
	n, k := len(w), len(y)
	if n == 0 {
		return
	}
	x = x[:(n-1)*stride+k]
	k8 := 0
	if SIMD() && k >= 8 {
		k8 = k &^ 7
		axpysF16(unsafe.SliceData(w), unsafe.SliceData(x), uintptr(2*stride), n, k8/8, unsafe.SliceData(y))
	}
	for r, wr := range w {
		row := x[r*stride : r*stride+k]
		for i := k8; i < k; i++ {
			y[i] += wr * tensor.F16ToF32(row[i])
		}
	}
}
