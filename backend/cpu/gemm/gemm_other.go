//go:build !amd64 || purego

package gemm

// This file stands in for the assembly kernels on platforms without them;
// MatMul, Dot, Dots and Axpys then always take the pure Go path.

import "unsafe"

// haveSIMD is false: only the pure Go kernels exist on this platform.
const haveSIMD = false

// haveAVX512 is false: no AVX-512 kernels either.
const haveAVX512 = false

// The SIMD entry points are never reached when haveSIMD is false.

func k4x1F32(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32) {
	panic("unreachable")
}
func k4x1BF16(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32) {
	panic("unreachable")
}
func k4x1F16(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32) {
	panic("unreachable")
}
func k4x3F32(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32) {
	panic("unreachable")
}
func k4x3BF16(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32) {
	panic("unreachable")
}
func k4x3F16(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32) {
	panic("unreachable")
}
func dotF32(a, b *float32, n8 int) float32 { panic("unreachable") }
func krBF16z(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr) {
	panic("unreachable")
}
func krF32(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr) {
	panic("unreachable")
}
func krBF16(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr) {
	panic("unreachable")
}
func krF16(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr) {
	panic("unreachable")
}
func rowsQ8_0(w unsafe.Pointer, stride uintptr, xq *int16, xd *float32, nb, nrows int, out *float32) {
	panic("unreachable")
}
func rowsQ4K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32) {
	panic("unreachable")
}
func rowsQ6K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32) {
	panic("unreachable")
}
func absMax(x *float32, n8 int) float32                                    { panic("unreachable") }
func round8(x *float32, n32 int, id float32, q *int8, sums, sums16 *int16) { panic("unreachable") }
func round16(x *float32, n16 int, id float32, q *int16)                    { panic("unreachable") }
func dotsF32(a, b *float32, stride uintptr, n, n8 int, out *float32)       { panic("unreachable") }
func axpysF32(w, x *float32, stride uintptr, n, n8 int, y *float32)        { panic("unreachable") }
func rowsQ5K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32) {
	panic("unreachable")
}
func rowsQ4_0(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32) {
	panic("unreachable")
}

func dotsE4M3(a *float32, b *byte, stride uintptr, n, n8 int, out *float32)  { panic("unreachable") }
func axpysE4M3(w *float32, x *byte, stride uintptr, n, n8 int, y *float32)   { panic("unreachable") }
func dotsF16(a *float32, b *uint16, stride uintptr, n, n8 int, out *float32) { panic("unreachable") }
func axpysF16(w *float32, x *uint16, stride uintptr, n, n8 int, y *float32)  { panic("unreachable") }
func swigluF32(out, gate, up *float32, n8 int)                               { panic("unreachable") }
func rowsQ4K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32) {
	panic("unreachable")
}
func rowsQ8_08(p unsafe.Pointer, xq *int16, xd *float32, nb, groups int, out *float32) {
	panic("unreachable")
}
func rowsQ4_08(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32) {
	panic("unreachable")
}
func rowsQ6K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32) {
	panic("unreachable")
}
