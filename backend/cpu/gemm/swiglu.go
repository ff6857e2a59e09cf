package gemm

import "unsafe"

// SwiGLU sets out[i] = SiLU(g[i])·u[i] = g[i]/(1 + e^−g[i])·u[i] (g and u
// at least as long as out): whole groups of 8 by the AVX2 kernel
// (swigluF32, Expf's steps with fused multiply-adds, a few ulps from the
// scalar form), the rest with Expf.
func SwiGLU(out, g, u []float32) {
	n := len(out)
	g, u = g[:n], u[:n]
	i := 0
	if SIMD() && n >= 8 {
		swigluF32(unsafe.SliceData(out), unsafe.SliceData(g), unsafe.SliceData(u), n/8)
		i = n &^ 7
	}
	for ; i < n; i++ {
		out[i] = g[i] / (1 + Expf(-g[i])) * u[i]
	}
}
