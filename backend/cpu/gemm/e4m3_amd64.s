//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// FP8 E4M3 codes widened through F16C: E4M3's 7 magnitude bits shifted into
// place (bits 7-13) are an f16 whose value is the code's times 2^-8,
// subnormals included (f16's subnormals scale as E4M3's do), so VCVTPH2PS
// and a product by 2^8 give the code's value exactly; the code shifted to
// the word's top and back by one, arithmetically, puts the sign at bit 15
// and the magnitude at 7-13 (bit 14, the sign's copy, masked off); 0x7F
// (NaN in E4M3, 480 read so) becomes a NaN.

// E4M3_CONSTS loads the constants E4M3X8 uses into Y10, Y12, Y13, Y14
// (E4M3X8 reads X10 and X13, their low halves; AX clobbered).
#define E4M3_CONSTS \
	SPLAT(0xbf80bf80, X10, Y10); \
	SPLAT(0x43800000, X12, Y12); \
	SPLAT(0x007f007f, X13, Y13); \
	SPLAT(0x7fc00000, X14, Y14)

// E4M3X8(addr, XR, YR, XT, XU, YU): the 8 codes at addr as floats in YR
// (XR its low half); XT, XU/YU scratch.
#define E4M3X8(addr, XR, YR, XT, XU, YU) \
	VPMOVZXBW addr, XT; \
	VPSLLW    $8, XT, XR; \
	VPSRAW    $1, XR, XR; \
	VPAND     X10, XR, XR; \
	VCVTPH2PS XR, YR; \
	VMULPS    Y12, YR, YR; \
	VPAND     X13, XT, XU; \
	VPCMPEQW  X13, XU, XU; \
	VPMOVSXWD XU, YU; \
	VPAND     Y14, YU, YU; \
	VPOR      YU, YR, YR

// func dotsE4M3(a *float32, b *byte, stride uintptr, n, n8 int, out *float32)
// out[r] = Σ_{k<8·n8} a[k]·E4M3(b[r·stride + k]) for r < n (n, n8 >= 1):
// dotsF32's order of sums, on the codes widened in registers.
TEXT ·dotsE4M3(SB), NOSPLIT, $0-48
	MOVQ b+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ n+24(FP), R9
	MOVQ out+40(FP), R11
	E4M3_CONSTS

qdrow:
	MOVQ   a+0(FP), DI
	MOVQ   SI, BX
	MOVQ   n8+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	SHRQ   $1, CX
	JZ     qdone

qdpair:
	E4M3X8((BX), X4, Y4, X6, X7, Y7)
	E4M3X8(8(BX), X5, Y5, X6, X7, Y7)
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	ADDQ        $64, DI
	ADDQ        $16, BX
	DECQ        CX
	JNZ         qdpair

qdone:
	TESTQ       $1, n8+32(FP)
	JZ          qddone
	E4M3X8((BX), X4, Y4, X6, X7, Y7)
	VFMADD231PS (DI), Y4, Y0

qddone:
	VADDPS       Y1, Y0, Y0
	HSUM
	VMOVSS       X0, (R11)
	ADDQ         $4, R11
	ADDQ         R8, SI
	DECQ         R9
	JNZ          qdrow
	VZEROUPPER
	RET

// func axpysE4M3(w *float32, x *byte, stride uintptr, n, n8 int, y *float32)
// y[k] += Σ_{r<n} w[r]·E4M3(x[r·stride + k]) for k < 8·n8 (n, n8 >= 1):
// axpysF32's order, y held in registers 32 values at a time.
TEXT ·axpysE4M3(SB), NOSPLIT, $0-48
	MOVQ x+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ y+40(FP), DI
	MOVQ n8+32(FP), DX
	E4M3_CONSTS

qachunk:
	CMPQ DX, $4
	JB   qasingle
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

qa4row:
	VBROADCASTSS (AX), Y4
	E4M3X8((BX), X5, Y5, X8, X9, Y9)
	VFMADD231PS  Y5, Y4, Y0
	E4M3X8(8(BX), X5, Y5, X8, X9, Y9)
	VFMADD231PS  Y5, Y4, Y1
	E4M3X8(16(BX), X5, Y5, X8, X9, Y9)
	VFMADD231PS  Y5, Y4, Y2
	E4M3X8(24(BX), X5, Y5, X8, X9, Y9)
	VFMADD231PS  Y5, Y4, Y3
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          qa4row
	VMOVUPS      Y0, (DI)
	VMOVUPS      Y1, 32(DI)
	VMOVUPS      Y2, 64(DI)
	VMOVUPS      Y3, 96(DI)
	ADDQ         $128, DI
	ADDQ         $32, SI
	SUBQ         $4, DX
	JMP          qachunk

qasingle:
	TESTQ DX, DX
	JZ    qadone
	VMOVUPS (DI), Y0
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

qa1row:
	VBROADCASTSS (AX), Y4
	E4M3X8((BX), X5, Y5, X8, X9, Y9)
	VFMADD231PS  Y5, Y4, Y0
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          qa1row
	VMOVUPS      Y0, (DI)
	ADDQ         $32, DI
	ADDQ         $8, SI
	DECQ         DX
	JMP          qasingle

qadone:
	VZEROUPPER
	RET
