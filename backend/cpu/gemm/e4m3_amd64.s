//go:build amd64 && !purego

#include "textflag.h"

// e4m3ToF32AVX2 widens n FP8 E4M3 bytes at src to float32 at dst (n a
// positive multiple of 8), 8 a round, through F16C: E4M3's 7 magnitude bits
// shifted into place (bits 7-13) are an f16 whose value is the code's times
// 2^-8, subnormals included (f16's subnormals scale as E4M3's do), so
// VCVTPH2PS and a product by 2^8 give the code's value exactly; the sign
// moves to bit 15 first; 0x7F (NaN in E4M3, 480 read so) becomes a NaN.
//
// func e4m3ToF32AVX2(dst *float32, src *byte, n, rows int, stride uintptr)
// widens rows rows of n codes, stride bytes apart at src, to rows·n
// consecutive floats at dst.
TEXT ·e4m3ToF32AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), R8
	MOVQ rows+24(FP), R9
	MOVL $0x3f803f80, AX
	VMOVD AX, X10
	VPBROADCASTD X10, X10 // the magnitude's bits, shifted
	MOVL $0x80008000, AX
	VMOVD AX, X11
	VPBROADCASTD X11, X11 // the sign, shifted
	MOVL $0x43800000, AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12 // 2^8
	MOVL $0x007f007f, AX
	VMOVD AX, X13
	VPBROADCASTD X13, X13 // the magnitude, and NaN's
	MOVL $0x7fc00000, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14 // a quiet NaN

row:
	MOVQ R8, SI
	MOVQ n+16(FP), CX

loop:
	VPMOVZXBW (SI), X0      // 8 codes as words
	VPSLLW    $7, X0, X1
	VPAND     X10, X1, X1   // magnitude to f16's exponent and mantissa
	VPSLLW    $8, X0, X2
	VPAND     X11, X2, X2   // sign to bit 15
	VPOR      X2, X1, X1
	VCVTPH2PS X1, Y1
	VMULPS    Y12, Y1, Y1
	VPAND     X13, X0, X3
	VPCMPEQW  X13, X3, X3   // NaN codes
	VPMOVSXWD X3, Y3
	VPAND     Y14, Y3, Y3
	VPOR      Y3, Y1, Y1
	VMOVUPS   Y1, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	ADDQ      stride+32(FP), R8
	DECQ      R9
	JNZ       row
	VZEROUPPER
	RET
