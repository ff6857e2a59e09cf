//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// Dots and Axpys over rows at a stride (attention over the keys and values
// of consecutive cache slots): one call for a run of rows instead of one a
// row.

// func dotsF32(a, b *float32, stride uintptr, n, n8 int, out *float32)
// out[r] = Σ_{k<8·n8} a[k]·b[r·stride/4 + k] for r < n (n, n8 >= 1).
TEXT ·dotsF32(SB), NOSPLIT, $0-48
	MOVQ b+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ n+24(FP), R9
	MOVQ out+40(FP), R11

dsrow:
	MOVQ   a+0(FP), DI
	MOVQ   SI, BX
	MOVQ   n8+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	SHRQ   $1, CX
	JZ     dsone

dspair:
	VMOVUPS     (DI), Y2
	VMOVUPS     32(DI), Y3
	VFMADD231PS (BX), Y2, Y0
	VFMADD231PS 32(BX), Y3, Y1
	ADDQ        $64, DI
	ADDQ        $64, BX
	DECQ        CX
	JNZ         dspair

dsone:
	TESTQ       $1, n8+32(FP)
	JZ          dsdone
	VMOVUPS     (DI), Y2
	VFMADD231PS (BX), Y2, Y0

dsdone:
	VADDPS       Y1, Y0, Y0
	HSUM
	VMOVSS       X0, (R11)
	ADDQ         $4, R11
	ADDQ         R8, SI
	DECQ         R9
	JNZ          dsrow
	VZEROUPPER
	RET

// func axpysF32(w, x *float32, stride uintptr, n, n8 int, y *float32)
// y[k] += Σ_{r<n} w[r]·x[r·stride/4 + k] for k < 8·n8 (n, n8 >= 1): y is
// held in registers 32 values at a time while the rows stream past.
TEXT ·axpysF32(SB), NOSPLIT, $0-48
	MOVQ x+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ y+40(FP), DI
	MOVQ n8+32(FP), DX

axchunk:
	CMPQ DX, $4
	JB   axsingle
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

ax4row:
	VBROADCASTSS (AX), Y4
	VFMADD231PS  (BX), Y4, Y0
	VFMADD231PS  32(BX), Y4, Y1
	VFMADD231PS  64(BX), Y4, Y2
	VFMADD231PS  96(BX), Y4, Y3
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          ax4row
	VMOVUPS      Y0, (DI)
	VMOVUPS      Y1, 32(DI)
	VMOVUPS      Y2, 64(DI)
	VMOVUPS      Y3, 96(DI)
	ADDQ         $128, DI
	ADDQ         $128, SI
	SUBQ         $4, DX
	JMP          axchunk

axsingle:
	TESTQ DX, DX
	JZ    axdone
	VMOVUPS (DI), Y0
	MOVQ    w+0(FP), AX
	MOVQ    SI, BX
	MOVQ    n+24(FP), CX

ax1row:
	VBROADCASTSS (AX), Y4
	VFMADD231PS  (BX), Y4, Y0
	ADDQ         $4, AX
	ADDQ         R8, BX
	DECQ         CX
	JNZ          ax1row
	VMOVUPS      Y0, (DI)
	ADDQ         $32, DI
	ADDQ         $32, SI
	DECQ         DX
	JMP          axsingle

axdone:
	VZEROUPPER
	RET
