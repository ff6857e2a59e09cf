//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// IEEE half-precision values widened by F16C (VCVTPH2PS, exact): the f16
// KV cache's keys and values.

// func dotsF16(a *float32, b *uint16, stride uintptr, n, n8 int, out *float32)
// out[r] = Σ_{k<8·n8} a[k]·F16(b[r·stride/2 + k]) for r < n (n, n8 >= 1;
// stride in bytes): dotsF32's order of sums, on the values widened in
// registers.
TEXT ·dotsF16(SB), NOSPLIT, $0-48
	MOVQ b+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ n+24(FP), R9
	MOVQ out+40(FP), R11

hdrow:
	MOVQ   a+0(FP), DI
	MOVQ   SI, BX
	MOVQ   n8+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	SHRQ   $1, CX
	JZ     hdone

hdpair:
	VCVTPH2PS   (BX), Y4
	VCVTPH2PS   16(BX), Y5
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	ADDQ        $64, DI
	ADDQ        $32, BX
	DECQ        CX
	JNZ         hdpair

hdone:
	TESTQ       $1, n8+32(FP)
	JZ          hddone
	VCVTPH2PS   (BX), Y4
	VFMADD231PS (DI), Y4, Y0

hddone:
	VADDPS       Y1, Y0, Y0
	HSUM
	VMOVSS       X0, (R11)
	ADDQ         $4, R11
	ADDQ         R8, SI
	DECQ         R9
	JNZ          hdrow
	VZEROUPPER
	RET

// func axpysF16(w *float32, x *uint16, stride uintptr, n, n8 int, y *float32)
// y[k] += Σ_{r<n} w[r]·F16(x[r·stride/2 + k]) for k < 8·n8 (n, n8 >= 1;
// stride in bytes): axpysF32's order, y held in registers 32 values at a
// time.
TEXT ·axpysF16(SB), NOSPLIT, $0-48
	MOVQ x+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ y+40(FP), DI
	MOVQ n8+32(FP), DX

hachunk:
	CMPQ DX, $4
	JB   hasingle
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

ha4row:
	VBROADCASTSS (AX), Y4
	VCVTPH2PS    (BX), Y5
	VFMADD231PS  Y5, Y4, Y0
	VCVTPH2PS    16(BX), Y5
	VFMADD231PS  Y5, Y4, Y1
	VCVTPH2PS    32(BX), Y5
	VFMADD231PS  Y5, Y4, Y2
	VCVTPH2PS    48(BX), Y5
	VFMADD231PS  Y5, Y4, Y3
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          ha4row
	VMOVUPS      Y0, (DI)
	VMOVUPS      Y1, 32(DI)
	VMOVUPS      Y2, 64(DI)
	VMOVUPS      Y3, 96(DI)
	ADDQ         $128, DI
	ADDQ         $64, SI
	SUBQ         $4, DX
	JMP          hachunk

hasingle:
	TESTQ DX, DX
	JZ    hadone
	VMOVUPS (DI), Y0
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

ha1row:
	VBROADCASTSS (AX), Y4
	VCVTPH2PS    (BX), Y5
	VFMADD231PS  Y5, Y4, Y0
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          ha1row
	VMOVUPS      Y0, (DI)
	ADDQ         $32, DI
	ADDQ         $16, SI
	DECQ         DX
	JMP          hasingle

hadone:
	VZEROUPPER
	RET
