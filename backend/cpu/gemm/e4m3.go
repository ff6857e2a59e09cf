package gemm

import "kiln/tensor"

// E4M3ToF32 widens the FP8 E4M3 codes src to float32 in dst (at least
// len(src) long), as tensor.E4M3ToF32 does each, with F16C eight at a time
// where the CPU has it.
func E4M3ToF32(dst []float32, src []byte) {
	E4M3RowsToF32(dst, src, len(src), 1, len(src))
}

// E4M3RowsToF32 widens rows rows of n FP8 E4M3 codes, stride bytes apart
// in src, to rows·n consecutive float32s in dst: the CPU's FP8 KV cache
// reads a run of slots' keys or values of one head through it, in one
// call.
func E4M3RowsToF32(dst []float32, src []byte, n, rows, stride int) {
	if rows <= 0 || n <= 0 {
		return
	}
	src = src[:(rows-1)*stride+n]
	dst = dst[:rows*n]
	if haveSIMD && n%8 == 0 {
		e4m3ToF32AVX2(&dst[0], &src[0], n, rows, uintptr(stride))
		return
	}
	for r := 0; r < rows; r++ {
		row, out := src[r*stride:r*stride+n], dst[r*n:(r+1)*n]
		n8 := 0
		if haveSIMD && n >= 8 {
			n8 = n &^ 7
			e4m3ToF32AVX2(&out[0], &row[0], n8, 1, 0)
		}
		for i := n8; i < n; i++ {
			out[i] = tensor.E4M3ToF32(row[i])
		}
	}
}
