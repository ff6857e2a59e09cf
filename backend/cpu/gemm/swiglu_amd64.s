//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// func swigluF32(out, gate, up *float32, n8 int)
// out[i] = g[i]/(1 + e^−g[i])·u[i] for 8·n8 values (SwiGLU): Expf's steps
// 8 lanes at a time with fused multiply-adds. x = −g clamped to Expf's
// range [−87.3, 88.7] (below it e^x adds nothing to 1; at its top 2^128 is
// +Inf, as Expf gives), n = floor(x·log2e + 1/2), r = x − n·ln2 (ln2 in
// two parts), e^r = 1 + r + r²·p(r) (Cephes' degree-5 p, its last
// coefficient 1/2 in float32), and 2^n = (n << 23) + the bits of 1.0.
// Go's operand order is Intel's reversed: VFMADD213PS c, b, a sets a =
// b·a + c; VFNMADD231PS c, b, a sets a = a − b·c.
TEXT ·swigluF32(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n8+24(FP), CX
	SPLAT(0x3fb8aa3b, X15, Y15) // log2e
	SPLAT(0x3f318000, X14, Y14) // ln2, high part
	SPLAT(0xb95e8083, X13, Y13) // ln2, low part
	SPLAT(0x3f000000, X12, Y12) // 1/2 (and p's last coefficient)
	SPLAT(0x3f800000, X11, Y11) // 1.0 (127 << 23)
	SPLAT(0xc2ae999a, X10, Y10) // −87.3
	SPLAT(0x42b16666, X9, Y9)   // 88.7
	SPLAT(0x39506967, X8, Y8)   // p's coefficients, highest degree first
	SPLAT(0x3ab743ce, X7, Y7)
	SPLAT(0x3c088908, X6, Y6)
	SPLAT(0x3d2aa9c1, X5, Y5)
	SPLAT(0x3e2aaaaa, X4, Y4)

swiglu8:
	VXORPS       Y1, Y1, Y1
	VSUBPS       (SI), Y1, Y1 // x = −g
	VMAXPS       Y10, Y1, Y1
	VMINPS       Y9, Y1, Y1
	VMOVAPS      Y12, Y2
	VFMADD231PS  Y15, Y1, Y2  // x·log2e + 1/2
	VROUNDPS     $1, Y2, Y2   // n (floor)
	VMOVAPS      Y1, Y3
	VFNMADD231PS Y14, Y2, Y3
	VFNMADD231PS Y13, Y2, Y3  // r
	VMOVAPS      Y8, Y1
	VFMADD213PS  Y7, Y3, Y1
	VFMADD213PS  Y6, Y3, Y1
	VFMADD213PS  Y5, Y3, Y1
	VFMADD213PS  Y4, Y3, Y1
	VFMADD213PS  Y12, Y3, Y1  // p(r)
	VMULPS       Y3, Y3, Y0
	VFMADD213PS  Y3, Y0, Y1   // r + r²·p
	VADDPS       Y11, Y1, Y1  // e^r
	VCVTPS2DQ    Y2, Y2
	VPSLLD       $23, Y2, Y2
	VPADDD       Y11, Y2, Y2  // 2^n
	VMULPS       Y2, Y1, Y1   // e^x = e^−g
	VADDPS       Y11, Y1, Y1
	VMOVUPS      (SI), Y0
	VDIVPS       Y1, Y0, Y0   // g/(1 + e^−g)
	VMULPS       (DX), Y0, Y0
	VMOVUPS      Y0, (DI)
	ADDQ         $32, SI
	ADDQ         $32, DX
	ADDQ         $32, DI
	DECQ         CX
	JNZ          swiglu8
	VZEROUPPER
	RET
