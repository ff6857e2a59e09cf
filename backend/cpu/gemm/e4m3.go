package gemm

import "kiln/tensor"

// E4M3ToF32 widens the FP8 E4M3 codes src to float32 in dst (at least
// len(src) long), as tensor.E4M3ToF32 does each: the CPU's FP8 KV cache
// reads its keys and values through it. AVX2 eight at a time where the
// CPU has it.
func E4M3ToF32(dst []float32, src []byte) {
	dst = dst[:len(src)]
	n := 0
	if haveSIMD && len(src) >= 8 {
		n = len(src) &^ 7
		e4m3ToF32AVX2(&dst[0], &src[0], n)
	}
	for i := n; i < len(src); i++ {
		dst[i] = tensor.E4M3ToF32(src[i])
	}
}
