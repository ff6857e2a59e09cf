//go:build amd64 && !purego

#include "textflag.h"

// e4m3ToF32AVX2 widens n FP8 E4M3 bytes at src to float32 at dst (n a
// positive multiple of 8), 8 a round: the magnitude's 7 bits shifted to a
// float32's exponent and mantissa (bits 20-26) times 2^120 rebias the
// exponent from 7 to 127; the subnormals (magnitude < 8) are magnitude·2^-9
// instead (their shifted bits would be float32 denormals, which some CPUs
// multiply slowly, so those lanes are zeroed before the product); 0x7F is
// NaN; the sign bit moves to bit 31.
//
// func e4m3ToF32AVX2(dst *float32, src *byte, n int)
TEXT ·e4m3ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7f, AX
	VMOVD AX, X4
	VPBROADCASTD X4, Y4 // 0x7f: the magnitude, and NaN's
	MOVL $0x80, AX
	VMOVD AX, X5
	VPBROADCASTD X5, Y5 // the sign
	MOVL $0x7b800000, AX
	VMOVD AX, X6
	VPBROADCASTD X6, Y6 // 2^120
	MOVL $0x3b000000, AX
	VMOVD AX, X7
	VPBROADCASTD X7, Y7 // 2^-9
	MOVL $8, AX
	VMOVD AX, X8
	VPBROADCASTD X8, Y8 // the first normal magnitude
	MOVL $0x7fc00000, AX
	VMOVD AX, X9
	VPBROADCASTD X9, Y9 // a quiet NaN

loop:
	VPMOVZXBD (SI), Y0          // 8 codes as dwords
	VPAND     Y4, Y0, Y1        // magnitudes
	VPCMPGTD  Y1, Y8, Y10       // subnormal lanes: 8 > magnitude
	VPSLLD    $20, Y1, Y2
	VPANDN    Y2, Y10, Y2       // their shifted bits cleared
	VMULPS    Y6, Y2, Y2        // normals
	VCVTDQ2PS Y1, Y3
	VMULPS    Y7, Y3, Y3        // magnitude·2^-9
	VBLENDVPS Y10, Y3, Y2, Y2   // subnormal lanes from Y3
	VPCMPEQD  Y4, Y1, Y11       // NaN lanes
	VPAND     Y9, Y11, Y11
	VPOR      Y11, Y2, Y2
	VPAND     Y5, Y0, Y3
	VPSLLD    $24, Y3, Y3       // sign to bit 31
	VPOR      Y3, Y2, Y2
	VMOVUPS   Y2, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET
