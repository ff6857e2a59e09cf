//go:build amd64 && !purego

package gemm

// This file binds the AVX2/FMA/F16C assembly kernels of gemm_amd64.s (see
// internal/asmgen for their contracts) and detects whether the CPU has them.

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveSIMD: the assembly kernels need AVX2 and FMA (all dtypes) and F16C
// (F16 weights); require all three rather than mixing paths.
var haveSIMD = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C

// haveAVX512: the AVX-512 decode kernel krBF16z needs AVX512F only.
var haveAVX512 = haveSIMD && cpu.X86.HasAVX512F

// Kernels in gemm_amd64.s; see internal/asmgen for their contracts.

//go:noescape
func k4x1F32(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32)

//go:noescape
func k4x1BF16(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32)

//go:noescape
func k4x1F16(w0, w1, w2, w3 unsafe.Pointer, x *float32, k8 int, pf uintptr, out *[4]float32)

//go:noescape
func k4x3F32(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32)

//go:noescape
func k4x3BF16(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32)

//go:noescape
func k4x3F16(w0, w1, w2, w3 unsafe.Pointer, x0, x1, x2 *float32, k8 int, pf uintptr, out *[12]float32)

//go:noescape
func dotF32(a, b *float32, n8 int) float32

//go:noescape
func krBF16z(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr)

//go:noescape
func krF32(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr)

//go:noescape
func krBF16(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr)

//go:noescape
func krF16(w unsafe.Pointer, stride uintptr, x *float32, k8, nrows int, out *float32, pf uintptr)

// Integer row kernels in quant_amd64.s (see quant.go).

//go:noescape
func rowsQ8_0(w unsafe.Pointer, stride uintptr, xq *int16, xd *float32, nb, nrows int, out *float32)

//go:noescape
func rowsQ4K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)

//go:noescape
func rowsQ6K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)

//go:noescape
func absMax(x *float32, n8 int) float32

//go:noescape
func round8(x *float32, n32 int, id float32, q *int8, sums, sums16 *int16)

//go:noescape
func round16(x *float32, n16 int, id float32, q *int16)

// Row kernels in rows_amd64.s (Dots, Axpys).

//go:noescape
func dotsF32(a, b *float32, stride uintptr, n, n8 int, out *float32)

//go:noescape
func axpysF32(w, x *float32, stride uintptr, n, n8 int, y *float32)

//go:noescape
func rowsQ5K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)

//go:noescape
func rowsQ4_0(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)

// swigluF32 is in swiglu_amd64.s (SwiGLU).
//
//go:noescape
func swigluF32(out, gate, up *float32, n8 int)

// dotsE4M3 and axpysE4M3 are in e4m3_amd64.s (DotsE4M3, AxpysE4M3).

//go:noescape
func dotsE4M3(a *float32, b *byte, stride uintptr, n, n8 int, out *float32)

//go:noescape
func axpysE4M3(w *float32, x *byte, stride uintptr, n, n8 int, y *float32)

// dotsF16 and axpysF16 are in f16_amd64.s (DotsF16, AxpysF16).

//go:noescape
func dotsF16(a *float32, b *uint16, stride uintptr, n, n8 int, out *float32)

//go:noescape
func axpysF16(w *float32, x *uint16, stride uintptr, n, n8 int, y *float32)

//go:noescape
func rowsQ4K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)

//go:noescape
func rowsQ8_08(p unsafe.Pointer, xq *int16, xd *float32, nb, groups int, out *float32)

//go:noescape
func rowsQ4_08(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)

//go:noescape
func rowsQ6K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)
