//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// The integer row kernels of quant.go (AVX2), written by hand. Each computes
// out[r] = row r · x for nrows rows of stride bytes starting at w, x being
// one token quantized (xq, its scales xd: one a block of 32 16-bit values
// for Q8_0, of 256 8-bit values for the k-quants; xs the sums of each 32 of
// xq). The integer products are exact: VPMADDUBSW multiplies unsigned by
// signed bytes and adds pairs into int16 (no pair here can reach 32767),
// VPMADDWD multiplies int16 pairs (by x, or by the sub-blocks' scales) into
// int32, and a block's int32 sums are converted to float32 once and scaled
// by d(weights)·d(x).
// Go's operand order is Intel's reversed: VPMADDUBSW signed, unsigned, dst.

// q4kScale<>+32k: VPSHUFB controls that spread byte k of each 128-bit lane
// (the scales of a Q4_K block, 8 bytes) into all 16 int16 lanes.
DATA q4kScale<>+0(SB)/8, $0x8000800080008000
DATA q4kScale<>+8(SB)/8, $0x8000800080008000
DATA q4kScale<>+16(SB)/8, $0x8000800080008000
DATA q4kScale<>+24(SB)/8, $0x8000800080008000
DATA q4kScale<>+32(SB)/8, $0x8001800180018001
DATA q4kScale<>+40(SB)/8, $0x8001800180018001
DATA q4kScale<>+48(SB)/8, $0x8001800180018001
DATA q4kScale<>+56(SB)/8, $0x8001800180018001
DATA q4kScale<>+64(SB)/8, $0x8002800280028002
DATA q4kScale<>+72(SB)/8, $0x8002800280028002
DATA q4kScale<>+80(SB)/8, $0x8002800280028002
DATA q4kScale<>+88(SB)/8, $0x8002800280028002
DATA q4kScale<>+96(SB)/8, $0x8003800380038003
DATA q4kScale<>+104(SB)/8, $0x8003800380038003
DATA q4kScale<>+112(SB)/8, $0x8003800380038003
DATA q4kScale<>+120(SB)/8, $0x8003800380038003
DATA q4kScale<>+128(SB)/8, $0x8004800480048004
DATA q4kScale<>+136(SB)/8, $0x8004800480048004
DATA q4kScale<>+144(SB)/8, $0x8004800480048004
DATA q4kScale<>+152(SB)/8, $0x8004800480048004
DATA q4kScale<>+160(SB)/8, $0x8005800580058005
DATA q4kScale<>+168(SB)/8, $0x8005800580058005
DATA q4kScale<>+176(SB)/8, $0x8005800580058005
DATA q4kScale<>+184(SB)/8, $0x8005800580058005
DATA q4kScale<>+192(SB)/8, $0x8006800680068006
DATA q4kScale<>+200(SB)/8, $0x8006800680068006
DATA q4kScale<>+208(SB)/8, $0x8006800680068006
DATA q4kScale<>+216(SB)/8, $0x8006800680068006
DATA q4kScale<>+224(SB)/8, $0x8007800780078007
DATA q4kScale<>+232(SB)/8, $0x8007800780078007
DATA q4kScale<>+240(SB)/8, $0x8007800780078007
DATA q4kScale<>+248(SB)/8, $0x8007800780078007
GLOBL q4kScale<>(SB), RODATA|NOPTR, $256

// q6kScale<>+16m: VPSHUFB controls giving 8 copies of byte 2m, then 8 of
// byte 2m+1 (a Q6_K block's int8 scales of the two sub-blocks of 16 that a
// group of 32 values spans).
DATA q6kScale<>+0(SB)/8, $0x0000000000000000
DATA q6kScale<>+8(SB)/8, $0x0101010101010101
DATA q6kScale<>+16(SB)/8, $0x0202020202020202
DATA q6kScale<>+24(SB)/8, $0x0303030303030303
DATA q6kScale<>+32(SB)/8, $0x0404040404040404
DATA q6kScale<>+40(SB)/8, $0x0505050505050505
DATA q6kScale<>+48(SB)/8, $0x0606060606060606
DATA q6kScale<>+56(SB)/8, $0x0707070707070707
DATA q6kScale<>+64(SB)/8, $0x0808080808080808
DATA q6kScale<>+72(SB)/8, $0x0909090909090909
DATA q6kScale<>+80(SB)/8, $0x0a0a0a0a0a0a0a0a
DATA q6kScale<>+88(SB)/8, $0x0b0b0b0b0b0b0b0b
DATA q6kScale<>+96(SB)/8, $0x0c0c0c0c0c0c0c0c
DATA q6kScale<>+104(SB)/8, $0x0d0d0d0d0d0d0d0d
DATA q6kScale<>+112(SB)/8, $0x0e0e0e0e0e0e0e0e
DATA q6kScale<>+120(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q6kScale<>(SB), RODATA|NOPTR, $128

// QPF: how far ahead (bytes) the kernels prefetch the weights they stream.
#define QPF 1024

// SCALE(off, r, X) leaves f16 at off(BX) times the float32 at (DX) in X's low
// lane (clobbers r).
#define SCALE(off, r, X) \
	MOVWLZX   off(BX), r; \
	VMOVD     r, X; \
	VCVTPH2PS X, X; \
	VMULSS    (DX), X, X

// Q40BLOCK8(b, acc): block b of a group of 8 Q4_0 blocks at BX (x's
// values at DI, the block's d·d(x) at 4b(SP)) into acc: the nibbles'
// products (VPMADDUBSW, then VPMADDWD by ones) times the scale.
#define Q40BLOCK8(b, acc) \
	VMOVDQU      (18*b+2)(BX), X1; \
	VPSRLW       $4, X1, X2; \
	VINSERTI128  $1, X2, Y1, Y1; \
	VPAND        Y15, Y1, Y1; \
	VPMADDUBSW   (32*b)(DI), Y1, Y1; \
	VPMADDWD     Y14, Y1, Y1; \
	VCVTDQ2PS    Y1, Y1; \
	VBROADCASTSS (4*b)(SP), Y3; \
	VFMADD231PS  Y3, Y1, acc

// The k-quants with 6-bit scales and minimums (Q4_K, Q5_K) share a block
// head (d, dmin, 12 bytes of scales and minimums at 0, 2, 4) and the
// bookkeeping below; only the loads of their values differ.

// KQ_INIT: SI the first row, Y15 the nibble mask.
#define KQ_INIT \
	MOVQ         w+0(FP), SI; \
	SPLAT(0x0f0f0f0f, X15, Y15)

// ROW_PTRS: a row's pointers (for kernels taking w, stride, xq, xd, xs,
// nb, nrows, out): BX the row's first block, DI, DX, R12 x's values,
// scales and sums, CX the blocks left.
#define ROW_PTRS \
	MOVQ SI, BX; \
	MOVQ xq+16(FP), DI; \
	MOVQ xd+24(FP), DX; \
	MOVQ xs+32(FP), R12; \
	MOVQ nb+40(FP), CX

// KQ_ROW: a row's pointers, and its sums reset.
#define KQ_ROW \
	ROW_PTRS; \
	VXORPS Y0, Y0, Y0; \
	VXORPS X13, X13, X13

// KQ_HEAD: a block's scales and minimums unpacked as ggml's utmp (u0..u2
// the 12 bytes; AX = scales = u0&k1 | (u2&k2 | ((u0>>6)&k3)<<4)<<32,
// R8 = mins = u1&k1 | ((u2>>4)&k2 | ((u1>>6)&k3)<<4)<<32), the minimums'
// term added to X13 (X13 += dmin·d(x)·(m[j]·xs[j])), d·d(x) broadcast in
// Y6, the scales in both lanes of Y14 (for VPSHUFB by q4kScale<>), Y9
// zeroed for the scaled sums.
#define KQ_HEAD \
	PREFETCHT0   QPF(BX); \
	PREFETCHT0   QPF+64(BX); \
	PREFETCHT0   QPF+128(BX); \
	MOVL         4(BX), AX; \
	MOVL         8(BX), R8; \
	MOVL         12(BX), R9; \
	MOVL         R9, R10; \
	SHRL         $4, R10; \
	ANDL         $0x0f0f0f0f, R10; \
	MOVL         R8, R11; \
	SHRL         $6, R11; \
	ANDL         $0x03030303, R11; \
	SHLL         $4, R11; \
	ORL          R11, R10; \
	ANDL         $0x0f0f0f0f, R9; \
	MOVL         AX, R11; \
	SHRL         $6, R11; \
	ANDL         $0x03030303, R11; \
	SHLL         $4, R11; \
	ORL          R11, R9; \
	ANDL         $0x3f3f3f3f, R8; \
	ANDL         $0x3f3f3f3f, AX; \
	SHLQ         $32, R9; \
	ORQ          R9, AX; \
	SHLQ         $32, R10; \
	ORQ          R10, R8; \
	MOVL         (BX), R9; \
	VMOVD        R9, X6; \
	VCVTPH2PS    X6, X6; \
	VBROADCASTSS (DX), X7; \
	VMULPS       X7, X6, X6; \
	VMOVQ        R8, X8; \
	VPMOVZXBW    X8, X8; \
	VPMADDWD     (R12), X8, X8; \
	VCVTDQ2PS    X8, X8; \
	VMOVSHDUP    X6, X7; \
	VBROADCASTSS X7, X7; \
	VFMADD231PS  X7, X8, X13; \
	VBROADCASTSS X6, Y6; \
	VMOVQ        AX, X14; \
	VPBROADCASTQ X14, Y14; \
	VPXOR        Y9, Y9, Y9

// KQ_NIBBLES(off, j): the 32 bytes at off+32j(BX) split into their low
// nibbles (Y2: sub-block 2j) and high ones (Y3: sub-block 2j+1).
#define KQ_NIBBLES(off, j) \
	VMOVDQU (off+32*j)(BX), Y1; \
	VPSRLW  $4, Y1, Y3; \
	VPAND   Y15, Y1, Y2; \
	VPAND   Y15, Y3, Y3

// KQ_PRODUCTS(j): sub-blocks 2j (Y2) and 2j+1 (Y3) times x's values
// (VPMADDUBSW pairs), times their scales, added to Y9.
#define KQ_PRODUCTS(j) \
	VPMADDUBSW (64*j)(DI), Y2, Y2; \
	VPMADDUBSW (64*j+32)(DI), Y3, Y3; \
	VPSHUFB    q4kScale<>+(64*j)(SB), Y14, Y4; \
	VPSHUFB    q4kScale<>+(64*j+32)(SB), Y14, Y5; \
	VPMADDWD   Y4, Y2, Y2; \
	VPMADDWD   Y5, Y3, Y3; \
	VPADDD     Y2, Y9, Y9; \
	VPADDD     Y3, Y9, Y9

// KQ_NEXT(size): Y9's int32 sums times d·d(x) into Y0; on to the next
// block of size bytes.
#define KQ_NEXT(size) \
	VCVTDQ2PS   Y9, Y9; \
	VFMADD231PS Y6, Y9, Y0; \
	ADDQ        $size, BX; \
	ADDQ        $256, DI; \
	ADDQ        $4, DX; \
	ADDQ        $16, R12; \
	DECQ        CX

// KQ_STORE: the row's dot product (Y0 less X13) to out; on to the next
// row.
#define KQ_STORE \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS       X1, X0, X0; \
	VSUBPS       X13, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VHADDPS      X0, X0, X0; \
	MOVQ         out+56(FP), AX; \
	VMOVSS       X0, (AX); \
	ADDQ         $4, AX; \
	MOVQ         AX, out+56(FP); \
	ADDQ         stride+8(FP), SI; \
	DECQ         nrows+48(FP)

// func rowsQ8_0(w unsafe.Pointer, stride uintptr, xq *int16, xd *float32, nb, nrows int, out *float32)
// Blocks of 34 bytes: d (f16), 32 int8, widened to int16 and multiplied
// with x's 16-bit values by VPMADDWD (a pair at most 2·128·32767).
TEXT ·rowsQ8_0(SB), NOSPLIT, $0-56
	MOVQ w+0(FP), SI
	MOVQ nrows+40(FP), R10
	MOVQ out+48(FP), R11

q80row:
	MOVQ   SI, BX
	MOVQ   xq+16(FP), DI
	MOVQ   xd+24(FP), DX
	MOVQ   nb+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y7, Y7, Y7
	SHRQ   $1, CX
	JZ     q80one

q80pair:
	PREFETCHT0 QPF(BX)
	PREFETCHT0 QPF+64(BX)
	VPMOVSXBW 2(BX), Y1
	VPMOVSXBW 18(BX), Y2
	VPMOVSXBW 36(BX), Y8
	VPMOVSXBW 52(BX), Y9
	VPMADDWD  (DI), Y1, Y1
	VPMADDWD  32(DI), Y2, Y2
	VPMADDWD  64(DI), Y8, Y8
	VPMADDWD  96(DI), Y9, Y9
	VPADDD    Y2, Y1, Y1
	VPADDD    Y9, Y8, Y8
	VCVTDQ2PS Y1, Y1
	VCVTDQ2PS Y8, Y8
	SCALE(0, AX, X6)
	VBROADCASTSS X6, Y6
	VFMADD231PS  Y6, Y1, Y0
	ADDQ         $4, DX
	SCALE(34, AX, X13)
	VBROADCASTSS X13, Y13
	VFMADD231PS  Y13, Y8, Y7
	ADDQ         $68, BX
	ADDQ         $128, DI
	ADDQ         $4, DX
	DECQ         CX
	JNZ          q80pair

q80one:
	TESTQ $1, nb+32(FP)
	JZ    q80done
	VPMOVSXBW 2(BX), Y1
	VPMOVSXBW 18(BX), Y2
	VPMADDWD  (DI), Y1, Y1
	VPMADDWD  32(DI), Y2, Y2
	VPADDD    Y2, Y1, Y1
	VCVTDQ2PS Y1, Y1
	SCALE(0, AX, X6)
	VBROADCASTSS X6, Y6
	VFMADD231PS  Y6, Y1, Y0

q80done:
	VADDPS Y7, Y0, Y0
	HSUM
	VMOVSS X0, (R11)
	ADDQ   $4, R11
	ADDQ   stride+8(FP), SI
	DECQ   R10
	JNZ    q80row
	VZEROUPPER
	RET

// func rowsQ4K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)
// Blocks of 144 bytes: d, dmin (f16), 12 bytes of 6-bit scales and
// minimums, 128 bytes of nibbles. Per block: the minimums' term
// dmin·Σ m[j]·xs[j] goes to X13 (subtracted at the end), the
// scaled nibble products Σ sc[j]·Σ q·xq (int32) times d to Y0.
TEXT ·rowsQ4K(SB), NOSPLIT, $0-64
	KQ_INIT

q4krow:
	KQ_ROW

q4kblock:
	KQ_HEAD

#define Q4KPAIR(j) \
	KQ_NIBBLES(16, j); \
	KQ_PRODUCTS(j)

	Q4KPAIR(0)
	Q4KPAIR(1)
	Q4KPAIR(2)
	Q4KPAIR(3)
	KQ_NEXT(144)
	JNZ q4kblock
	KQ_STORE
	JNZ q4krow
	VZEROUPPER
	RET

// func rowsQ5K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)
// Blocks of 176 bytes: Q4_K's head, 32 bytes of high bits (qh), 128 bytes
// of nibbles: value l of sub-block 2j is its low nibble plus 16·bit 2j of
// qh[l], of sub-block 2j+1 its high nibble plus 16·bit 2j+1. VPMADDUBSW
// pairs reach 2·31·127.
TEXT ·rowsQ5K(SB), NOSPLIT, $0-64
	KQ_INIT
	SPLAT(0x01010101, X11, Y11)

q5krow:
	KQ_ROW

q5kblock:
	KQ_HEAD
	VMOVDQU 16(BX), Y10

#define Q5KPAIR(j) \
	KQ_NIBBLES(48, j); \
	VPSRLW     $(2*j), Y10, Y7; \
	VPAND      Y11, Y7, Y8; \
	VPSLLW     $4, Y8, Y8; \
	VPOR       Y8, Y2, Y2; \
	VPSRLW     $1, Y7, Y7; \
	VPAND      Y11, Y7, Y7; \
	VPSLLW     $4, Y7, Y7; \
	VPOR       Y7, Y3, Y3; \
	KQ_PRODUCTS(j)

	Q5KPAIR(0)
	Q5KPAIR(1)
	Q5KPAIR(2)
	Q5KPAIR(3)
	KQ_NEXT(176)
	JNZ q5kblock
	KQ_STORE
	JNZ q5krow
	VZEROUPPER
	RET

// func rowsQ4_0(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)
// Blocks of 18 bytes: d (f16), 16 bytes whose low nibbles are values 0..15
// and high nibbles 16..31, each q−8. Σ (q−8)·x = Σ q·x − 8·xs: the nibbles
// (unsigned) go to VPMADDUBSW, the offset's terms d·d(x)·xs to Y11 (8
// times them subtracted at the end). Blocks go 8 at a time, their scales
// d·d(x) made together (VPINSRW, VCVTPH2PS, VMULPS) and kept at 0(SP) for
// VBROADCASTSS, the offsets' terms in one VFMADD; the last nb%8 blocks one
// by one.
TEXT ·rowsQ4_0(SB), NOSPLIT, $32-64
	MOVQ         w+0(FP), SI
	SPLAT(0x0f0f0f0f, X15, Y15)
	VPCMPEQW     Y14, Y14, Y14
	VPSRLW       $15, Y14, Y14 // int16 ones
	MOVL         $0x41000000, AX // 8.0
	VMOVD        AX, X12

q40row:
	ROW_PTRS
	VXORPS Y0, Y0, Y0
	VXORPS Y5, Y5, Y5
	VXORPS Y11, Y11, Y11
	VXORPS X10, X10, X10
	SHRQ   $3, CX
	JZ     q40tail

q40group:
	PREFETCHT0   QPF(BX)
	PREFETCHT0   QPF+64(BX)
	PREFETCHT0   QPF+128(BX)
	MOVWLZX      (BX), AX
	VMOVD        AX, X6
	VPINSRW      $1, 18(BX), X6, X6
	VPINSRW      $2, 36(BX), X6, X6
	VPINSRW      $3, 54(BX), X6, X6
	VPINSRW      $4, 72(BX), X6, X6
	VPINSRW      $5, 90(BX), X6, X6
	VPINSRW      $6, 108(BX), X6, X6
	VPINSRW      $7, 126(BX), X6, X6
	VCVTPH2PS    X6, Y6
	VMULPS       (DX), Y6, Y6
	VMOVUPS      Y6, 0(SP)
	VPMOVSXWD    (R12), Y7
	VCVTDQ2PS    Y7, Y7
	VFMADD231PS  Y6, Y7, Y11
	Q40BLOCK8(0, Y0)
	Q40BLOCK8(1, Y5)
	Q40BLOCK8(2, Y0)
	Q40BLOCK8(3, Y5)
	Q40BLOCK8(4, Y0)
	Q40BLOCK8(5, Y5)
	Q40BLOCK8(6, Y0)
	Q40BLOCK8(7, Y5)
	ADDQ         $144, BX
	ADDQ         $256, DI
	ADDQ         $32, DX
	ADDQ         $16, R12
	DECQ         CX
	JNZ          q40group

q40tail:
	MOVQ nb+40(FP), CX
	ANDQ $7, CX
	JZ   q40done

q40one:
	VMOVDQU      2(BX), X1
	VPSRLW       $4, X1, X2
	VINSERTI128  $1, X2, Y1, Y1
	VPAND        Y15, Y1, Y1
	VPMADDUBSW   (DI), Y1, Y1
	VPMADDWD     Y14, Y1, Y1
	VCVTDQ2PS    Y1, Y1
	SCALE(0, AX, X6)
	VBROADCASTSS X6, Y6
	VFMADD231PS  Y6, Y1, Y0
	MOVWLSX      (R12), AX
	VCVTSI2SSL   AX, X7, X7
	VFMADD231SS  X6, X7, X10 // a scalar op would clear Y11's upper half
	ADDQ         $18, BX
	ADDQ         $32, DI
	ADDQ         $4, DX
	ADDQ         $2, R12
	DECQ         CX
	JNZ          q40one

q40done:
	VADDPS       Y5, Y0, Y0
	VEXTRACTF128 $1, Y11, X1
	VADDPS       X1, X11, X11
	VHADDPS      X11, X11, X11
	VHADDPS      X11, X11, X11
	VADDSS       X10, X11, X11
	VMULSS       X12, X11, X11
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VSUBSS       X11, X0, X0
	MOVQ         out+56(FP), AX
	VMOVSS       X0, (AX)
	ADDQ         $4, AX
	MOVQ         AX, out+56(FP)
	ADDQ         stride+8(FP), SI
	DECQ         nrows+48(FP)
	JNZ          q40row
	VZEROUPPER
	RET

// func rowsQ6K(w unsafe.Pointer, stride uintptr, xq *int8, xd *float32, xs *int16, nb, nrows int, out *float32)
// Blocks of 210 bytes: ql[128], qh[64], 16 int8 scales, d (f16). Values
// q−32 with q the 6 bits: VPMADDUBSW of q (unsigned, < 64) with x, then
// VPMADDWD with the two sub-blocks' scales; the offsets' term
// 32·Σ sc[s]·xs[s] (xs the sums of each 16) is taken off once a block.
TEXT ·rowsQ6K(SB), NOSPLIT, $0-64
	MOVQ w+0(FP), SI
	MOVQ nrows+48(FP), R10
	MOVQ out+56(FP), R11
	SPLAT(0x0f0f0f0f, X15, Y15)
	SPLAT(0x03030303, X10, Y10)
	SPLAT(0x0c0c0c0c, X11, Y11)
	SPLAT(0x30303030, X12, Y12)
	SPLAT(0xc0c0c0c0, X13, Y13)

q6krow:
	ROW_PTRS
	VXORPS Y0, Y0, Y0

q6kblock:
	PREFETCHT0 QPF(BX)
	PREFETCHT0 QPF+64(BX)
	PREFETCHT0 QPF+128(BX)
	PREFETCHT0 QPF+192(BX)
	SCALE(208, AX, X6)
	VBROADCASTSS X6, Y6
	VMOVDQU      192(BX), X14
	VPMOVSXBW    X14, Y9
	VPMADDWD     (R12), Y9, Y9
	VPSLLD       $5, Y9, Y9
	VPXOR        Y8, Y8, Y8
	VPSUBD       Y9, Y8, Y9 // −32·Σ sc[s]·xs[s], in 8 lanes

// Q6KMAC(xo, m): Y9 += scales of group m · (Y4 · xq[xo:xo+32]) (the −32 is
// the block's offsets' term).
#define Q6KMAC(xo, m) \
	VMOVDQU    (xo)(DI), Y7; \
	VPMADDUBSW Y7, Y4, Y4; \
	VPSHUFB    q6kScale<>+(16*(m))(SB), X14, X5; \
	VPMOVSXBW  X5, Y5; \
	VPMADDWD   Y5, Y4, Y4; \
	VPADDD     Y4, Y9, Y9

// Q6KHALF(h): the 128 values of half h: ql at 64h, qh at 128+32h.
#define Q6KHALF(h) \
	VMOVDQU (64*h)(BX), Y1; \
	VMOVDQU (64*h+32)(BX), Y2; \
	VMOVDQU (128+32*h)(BX), Y3; \
	VPAND   Y15, Y1, Y4; \
	VPAND   Y10, Y3, Y5; \
	VPSLLW  $4, Y5, Y5; \
	VPOR    Y5, Y4, Y4; \
	Q6KMAC(128*h, 4*h); \
	VPAND   Y15, Y2, Y4; \
	VPAND   Y11, Y3, Y5; \
	VPSLLW  $2, Y5, Y5; \
	VPOR    Y5, Y4, Y4; \
	Q6KMAC(128*h+32, 4*h+1); \
	VPSRLW  $4, Y1, Y4; \
	VPAND   Y15, Y4, Y4; \
	VPAND   Y12, Y3, Y5; \
	VPOR    Y5, Y4, Y4; \
	Q6KMAC(128*h+64, 4*h+2); \
	VPSRLW  $4, Y2, Y4; \
	VPAND   Y15, Y4, Y4; \
	VPAND   Y13, Y3, Y5; \
	VPSRLW  $2, Y5, Y5; \
	VPOR    Y5, Y4, Y4; \
	Q6KMAC(128*h+96, 4*h+3)

	Q6KHALF(0)
	Q6KHALF(1)

	VCVTDQ2PS   Y9, Y9
	VFMADD231PS Y6, Y9, Y0
	ADDQ        $210, BX
	ADDQ        $256, DI
	ADDQ        $4, DX
	ADDQ        $32, R12
	DECQ        CX
	JNZ         q6kblock

	HSUM
	VMOVSS X0, (R11)
	ADDQ   $4, R11
	ADDQ   stride+8(FP), SI
	DECQ   R10
	JNZ    q6krow
	VZEROUPPER
	RET

// x's quantization (quant.go: qx.quantize).

// func absMax(x *float32, n8 int) float32
// The largest |x[i]| of 8·n8 values (n8 >= 1); NaN if one is NaN (VMAXPS
// would drop it: a separate unordered compare finds it).
TEXT ·absMax(SB), NOSPLIT, $0-20
	MOVQ     x+0(FP), SI
	MOVQ     n8+8(FP), CX
	VPCMPEQD Y15, Y15, Y15
	VPSRLD   $1, Y15, Y15 // 0x7fffffff
	VXORPS   Y0, Y0, Y0
	VXORPS   Y1, Y1, Y1

amloop:
	VANDPS  (SI), Y15, Y2
	VMAXPS  Y0, Y2, Y0
	VCMPPS  $3, Y2, Y2, Y3
	VORPS   Y3, Y1, Y1
	ADDQ    $32, SI
	DECQ    CX
	JNZ     amloop
	VEXTRACTF128 $1, Y0, X2
	VMAXPS       X2, X0, X0
	VPERMILPS    $0x4e, X0, X2
	VMAXPS       X2, X0, X0
	VPERMILPS    $0xb1, X0, X2
	VMAXPS       X2, X0, X0
	VPTEST       Y1, Y1
	JZ           amdone
	MOVL         $0x7fc00000, AX
	VMOVD        AX, X0

amdone:
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// permDwords<>: VPERMD indices 0,4,1,5,2,6,3,7 (undo the lane split of
// two VPACKSS steps).
DATA permDwords<>+0(SB)/4, $0
DATA permDwords<>+4(SB)/4, $4
DATA permDwords<>+8(SB)/4, $1
DATA permDwords<>+12(SB)/4, $5
DATA permDwords<>+16(SB)/4, $2
DATA permDwords<>+20(SB)/4, $6
DATA permDwords<>+24(SB)/4, $3
DATA permDwords<>+28(SB)/4, $7
GLOBL permDwords<>(SB), RODATA|NOPTR, $32

// func round8(x *float32, n32 int, id float32, q *int8, sums, sums16 *int16)
// q[i] = x[i]·id rounded to nearest even (VCVTPS2DQ under Go's MXCSR),
// saturated to int8, for 32·n32 values, sums[j] = Σ q[32j:32j+32] and
// sums16[j] = Σ q[16j:16j+16].
TEXT ·round8(SB), NOSPLIT, $0-48
	MOVQ         x+0(FP), SI
	MOVQ         n32+8(FP), CX
	VBROADCASTSS id+16(FP), Y14
	MOVQ         q+24(FP), DI
	MOVQ         sums+32(FP), DX
	MOVQ         sums16+40(FP), R8
	VMOVDQU      permDwords<>(SB), Y13
	SPLAT(0x01010101, X12, Y12)
	VPCMPEQW     Y11, Y11, Y11
	VPSRLW       $15, Y11, Y11

r8loop:
	VMULPS       (SI), Y14, Y0
	VMULPS       32(SI), Y14, Y1
	VMULPS       64(SI), Y14, Y2
	VMULPS       96(SI), Y14, Y3
	VCVTPS2DQ    Y0, Y0
	VCVTPS2DQ    Y1, Y1
	VCVTPS2DQ    Y2, Y2
	VCVTPS2DQ    Y3, Y3
	VPACKSSDW    Y1, Y0, Y0
	VPACKSSDW    Y3, Y2, Y2
	VPACKSSWB    Y2, Y0, Y0
	VPERMD       Y0, Y13, Y0
	VMOVDQU      Y0, (DI)
	VPMADDUBSW   Y0, Y12, Y1
	VPMADDWD     Y11, Y1, Y1
	VEXTRACTI128 $1, Y1, X2
	VPHADDD      X2, X1, X1 // [a0+a1, a2+a3, b0+b1, b2+b3]
	VPHADDD      X1, X1, X1 // [A, B, A, B]: the two sums of 16
	VPSHUFD      $1, X1, X2
	VPADDD       X2, X1, X2 // A+B
	VMOVD        X2, AX
	MOVW         AX, (DX)
	VPACKSSDW    X1, X1, X1
	VMOVD        X1, (R8)
	ADDQ         $128, SI
	ADDQ         $32, DI
	ADDQ         $2, DX
	ADDQ         $4, R8
	DECQ         CX
	JNZ          r8loop
	VZEROUPPER
	RET

// func round16(x *float32, n16 int, id float32, q *int16)
// q[i] = x[i]·id rounded to nearest even, saturated to int16, for 16·n16
// values.
TEXT ·round16(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), SI
	MOVQ         n16+8(FP), CX
	VBROADCASTSS id+16(FP), Y14
	MOVQ         q+24(FP), DI

r16loop:
	VMULPS    (SI), Y14, Y0
	VMULPS    32(SI), Y14, Y1
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VPACKSSDW Y1, Y0, Y0
	VPERMQ    $0xd8, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $64, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       r16loop
	VZEROUPPER
	RET
