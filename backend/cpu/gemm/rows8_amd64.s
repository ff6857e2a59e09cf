//go:build amd64 && !purego

#include "textflag.h"
#include "simd_amd64.h"

// The Q4_K kernel of rows interleaved by eights (rows8.go): each vector of
// 32 bytes is 4 bytes of each of 8 rows, so that VPMADDUBSW against x's 4
// values broadcast leaves each row's products in its own lanes. A chunk's
// 8 vectors (64 values of each row: sub-blocks 2c, 2c+1) add up in int16
// (8 pairs of at most 2·15·128: no overflow), then VPMADDWD by ones gives
// each row's int32 sum, times its sub-block's scale (VPMULLD). The
// minimums' term takes pairs of sub-blocks by VPMADDWD against x's sums.
// Go's operand order is Intel's reversed: VPMADDUBSW signed, unsigned, dst.

// NIBVEC(w, lo, hi, L, H): the 32 bytes at w(BX) (4 of each of 8 rows),
// their low nibbles times x's 4 values at lo(DI) broadcast added to L, their
// high ones times those at hi(DI) to H (int16 pair sums, VPMADDUBSW).
#define NIBVEC(w, lo, hi, L, H) \
	VMOVDQU      w(BX), Y4; \
	VPSRLW       $4, Y4, Y5; \
	VPAND        Y15, Y4, Y4; \
	VPAND        Y15, Y5, Y5; \
	VPBROADCASTD lo(DI), Y6; \
	VPBROADCASTD hi(DI), Y7; \
	VPMADDUBSW   Y6, Y4, Y4; \
	VPMADDUBSW   Y7, Y5, Y5; \
	VPADDW       Y4, L, L; \
	VPADDW       Y5, H, H

// Q8VEC(c, u): vector u of chunk c, its low nibbles times x's values
// [64c+4u, +4) into Y2, its high ones times [64c+32+4u, +4) into Y3.
#define Q8VEC(c, u) NIBVEC((160+32*(8*c+u)), (64*c+4*u), (64*c+32+4*u), Y2, Y3)

// Q8CHUNK(c): chunk c's two sub-blocks, scaled, into Y1 (int32 a row).
#define Q8CHUNK(c) \
	VPXOR      Y2, Y2, Y2; \
	VPXOR      Y3, Y3, Y3; \
	Q8VEC(c, 0); \
	Q8VEC(c, 1); \
	Q8VEC(c, 2); \
	Q8VEC(c, 3); \
	Q8VEC(c, 4); \
	Q8VEC(c, 5); \
	Q8VEC(c, 6); \
	Q8VEC(c, 7); \
	VPMADDWD   Y14, Y2, Y2; \
	VPMADDWD   Y14, Y3, Y3; \
	VPMOVZXBD  (32+16*c)(BX), Y8; \
	VPMOVZXBD  (40+16*c)(BX), Y9; \
	VPMULLD    Y8, Y2, Y2; \
	VPMULLD    Y9, Y3, Y3; \
	VPADDD     Y2, Y1, Y1; \
	VPADDD     Y3, Y1, Y1

// Q8MIN(i): the minimums of sub-blocks 2i, 2i+1 times x's sums of them,
// into Y10 (int32 a row).
#define Q8MIN(i) \
	VPMOVZXBW    (96+16*i)(BX), Y8; \
	VPBROADCASTD (4*i)(R12), Y9; \
	VPMADDWD     Y9, Y8, Y8; \
	VPADDD       Y8, Y10, Y10

// The kernels taking (p, xq, xd, xs, nb, groups, out) share their frame:
// ROWS8_INIT sets BX to the first group, R13 to out, R14 to the groups, Y15
// to the nibble mask and Y14 to int16 ones; ROWS8_GROUP x's pointers (DI
// values, DX scales, R12 sums), CX a group's blocks and Y0's 8 sums to
// zero; ROWS8_STORE writes Y0 and counts the group (flags for JNZ).
#define ROWS8_INIT \
	MOVQ p+0(FP), BX; \
	MOVQ out+48(FP), R13; \
	MOVQ groups+40(FP), R14; \
	SPLAT(0x0f0f0f0f, X15, Y15); \
	SPLAT(0x00010001, X14, Y14)

#define ROWS8_GROUP \
	MOVQ   xq+8(FP), DI; \
	MOVQ   xd+16(FP), DX; \
	MOVQ   xs+24(FP), R12; \
	MOVQ   nb+32(FP), CX; \
	VXORPS Y0, Y0, Y0

// ROWS8_SCALE(acc): the block's int32 sums in acc (a row a lane) times
// the rows' d (f16 at 0(BX)) and x's scale (DX), into Y0 (clobbers Y8, Y9).
#define ROWS8_SCALE(acc) \
	VCVTDQ2PS    acc, acc; \
	VCVTPH2PS    (BX), Y8; \
	VBROADCASTSS (DX), Y9; \
	VMULPS       Y9, Y8, Y8; \
	VFMADD231PS  Y8, acc, Y0

#define ROWS8_STORE \
	VMOVUPS Y0, (R13); \
	ADDQ    $32, R13; \
	DECQ    R14

// func rowsQ4K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)
TEXT ·rowsQ4K8(SB), NOSPLIT, $0-56
	ROWS8_INIT

q4k8group:
	ROWS8_GROUP

q4k8block:
	VPXOR Y1, Y1, Y1
	Q8CHUNK(0)
	Q8CHUNK(1)
	Q8CHUNK(2)
	Q8CHUNK(3)
	VPXOR Y10, Y10, Y10
	Q8MIN(0)
	Q8MIN(1)
	Q8MIN(2)
	Q8MIN(3)
	ROWS8_SCALE(Y1)
	VCVTDQ2PS    Y10, Y10
	VCVTPH2PS    16(BX), Y8
	VMULPS       Y9, Y8, Y8
	VFNMADD231PS Y8, Y10, Y0
	ADDQ         $1184, BX
	ADDQ         $256, DI
	ADDQ         $4, DX
	ADDQ         $16, R12
	DECQ         CX
	JNZ          q4k8block
	ROWS8_STORE
	JNZ          q4k8group
	VZEROUPPER
	RET

// The Q8_0 kernel of rows interleaved by eights: VPMOVSXBW widens 2 values
// of each of 8 rows, VPMADDWD against x's 2 values (16 bits) broadcast
// leaves each row's pair sum in its own lane.
#define Q80PAIR(u) \
	VPMOVSXBW    (16+16*u)(BX), Y4; \
	VPMOVSXBW    (32+16*u)(BX), Y5; \
	VPBROADCASTD (4*u)(DI), Y6; \
	VPBROADCASTD (4+4*u)(DI), Y7; \
	VPMADDWD     Y6, Y4, Y4; \
	VPMADDWD     Y7, Y5, Y5; \
	VPADDD       Y4, Y1, Y1; \
	VPADDD       Y5, Y2, Y2

// func rowsQ8_08(p unsafe.Pointer, xq *int16, xd *float32, nb, groups int, out *float32)
TEXT ·rowsQ8_08(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), BX
	MOVQ out+40(FP), R13
	MOVQ groups+32(FP), R14

q808group:
	MOVQ   xq+8(FP), DI
	MOVQ   xd+16(FP), DX
	MOVQ   nb+24(FP), CX
	VXORPS Y0, Y0, Y0

q808block:
	VPXOR        Y1, Y1, Y1
	VPXOR        Y2, Y2, Y2
	Q80PAIR(0)
	Q80PAIR(2)
	Q80PAIR(4)
	Q80PAIR(6)
	Q80PAIR(8)
	Q80PAIR(10)
	Q80PAIR(12)
	Q80PAIR(14)
	VPADDD       Y2, Y1, Y1
	ROWS8_SCALE(Y1)
	ADDQ         $272, BX
	ADDQ         $64, DI
	ADDQ         $4, DX
	DECQ         CX
	JNZ          q808block
	ROWS8_STORE
	JNZ          q808group
	VZEROUPPER
	RET

// The Q4_0 kernel of rows interleaved by eights: Q8VEC's nibble products of
// 8 rows, the offsets −8·Σx after the block's int32 sums.
#define Q40VEC(u) NIBVEC((16+32*u), (4*u), (16+4*u), Y2, Y2)

// func rowsQ4_08(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)
TEXT ·rowsQ4_08(SB), NOSPLIT, $0-56
	ROWS8_INIT

q408group:
	ROWS8_GROUP

q408block:
	VPXOR        Y2, Y2, Y2
	Q40VEC(0)
	Q40VEC(1)
	Q40VEC(2)
	Q40VEC(3)
	VPMADDWD     Y14, Y2, Y2
	MOVWQSX      (R12), AX
	SHLQ         $3, AX
	VMOVD        AX, X3
	VPBROADCASTD X3, Y3
	VPSUBD       Y3, Y2, Y2
	ROWS8_SCALE(Y2)
	ADDQ         $144, BX
	ADDQ         $32, DI
	ADDQ         $4, DX
	ADDQ         $2, R12
	DECQ         CX
	JNZ          q408block
	ROWS8_STORE
	JNZ          q408group
	VZEROUPPER
	RET

// The Q6_K kernel of rows interleaved by eights (rows8.go): each vector of
// ql (and its qh) holds 4 values of each of 8 rows for two of a half's four
// groups of 32; the 6-bit values (< 64) times x's 4 values broadcast
// (VPMADDUBSW) add up in int16 over two vectors (at most 2·2·63·128),
// then VPMADDWD by ones gives each row's int32 sum. A sub-block's sum less
// 32·Σx of it (the −32 offsets) is multiplied by the rows' scales
// (VPMULLD). Y15 0x0f bytes, Y13 0x30 bytes, Y14 int16 ones. The block two
// ahead is prefetched a few lines a pass: without it the kernel streamed
// at a third of the row kernel's rate (the passes read the block out of
// order, which the hardware prefetcher does not follow).

// q6k32<>: int16 pairs (32, 0): VPMADDWD of a broadcast int16 by it is
// 32 times it in every int32 lane.
DATA q6k32<>+0(SB)/8, $0x0000002000000020
DATA q6k32<>+8(SB)/8, $0x0000002000000020
DATA q6k32<>+16(SB)/8, $0x0000002000000020
DATA q6k32<>+24(SB)/8, $0x0000002000000020
GLOBL q6k32<>(SB), RODATA|NOPTR, $32

// Q6V0(h, u): vector u of half h's ql[l] (l = 4u..4u+3) and its qh: groups
// 0 (low nibbles, qh bits 0-1) and 2 (high nibbles, qh bits 4-5), times
// x's values into Y2 and Y3.
#define Q6V0(h, u) \
	VMOVDQU      (144+32*(16*(h)+(u)))(BX), Y6; \
	VMOVDQU      (1168+32*(8*(h)+(u)))(BX), Y7; \
	VPAND        Y15, Y6, Y8; \
	VPSLLW       $4, Y7, Y9; \
	VPAND        Y13, Y9, Y9; \
	VPOR         Y9, Y8, Y8; \
	VPBROADCASTD (128*(h)+4*(u))(DI), Y9; \
	VPMADDUBSW   Y9, Y8, Y8; \
	VPADDW       Y8, Y2, Y2; \
	VPSRLW       $4, Y6, Y6; \
	VPAND        Y15, Y6, Y6; \
	VPAND        Y13, Y7, Y7; \
	VPOR         Y7, Y6, Y6; \
	VPBROADCASTD (128*(h)+64+4*(u))(DI), Y9; \
	VPMADDUBSW   Y9, Y6, Y6; \
	VPADDW       Y6, Y3, Y3

// Q6V1(h, u): the same for ql[l+32]: groups 1 (qh bits 2-3) and 3 (6-7).
#define Q6V1(h, u) \
	VMOVDQU      (144+32*(16*(h)+8+(u)))(BX), Y6; \
	VMOVDQU      (1168+32*(8*(h)+(u)))(BX), Y7; \
	VPAND        Y15, Y6, Y8; \
	VPSLLW       $2, Y7, Y9; \
	VPAND        Y13, Y9, Y9; \
	VPOR         Y9, Y8, Y8; \
	VPBROADCASTD (128*(h)+32+4*(u))(DI), Y9; \
	VPMADDUBSW   Y9, Y8, Y8; \
	VPADDW       Y8, Y2, Y2; \
	VPSRLW       $4, Y6, Y6; \
	VPAND        Y15, Y6, Y6; \
	VPSRLW       $2, Y7, Y7; \
	VPAND        Y13, Y7, Y7; \
	VPOR         Y7, Y6, Y6; \
	VPBROADCASTD (128*(h)+96+4*(u))(DI), Y9; \
	VPMADDUBSW   Y9, Y6, Y6; \
	VPADDW       Y6, Y3, Y3

// Q6SUB(s, acc): acc (sub-block s's Σ q·x, a row a lane) less 32·xs[s],
// times the rows' scales of s, into Y1.
#define Q6SUB(s, acc) \
	VPBROADCASTW (2*s)(R12), Y10; \
	VPMADDWD     q6k32<>(SB), Y10, Y10; \
	VPSUBD       Y10, acc, acc; \
	VPMOVSXBD    (16+8*s)(BX), Y10; \
	VPMULLD      Y10, acc, acc; \
	VPADDD       acc, Y1, Y1

// Q6PASS(V, h, is, lo, hi): vectors 4is..4is+3 of half h through V, whose
// two groups' sums are sub-blocks lo and hi.
#define Q6PASS(V, h, is, lo, hi) \
	VPXOR    Y2, Y2, Y2; \
	VPXOR    Y3, Y3, Y3; \
	V(h, 4*is); \
	V(h, 4*is+1); \
	VPMADDWD Y14, Y2, Y4; \
	VPMADDWD Y14, Y3, Y5; \
	VPXOR    Y2, Y2, Y2; \
	VPXOR    Y3, Y3, Y3; \
	V(h, 4*is+2); \
	V(h, 4*is+3); \
	VPMADDWD Y14, Y2, Y2; \
	VPMADDWD Y14, Y3, Y3; \
	VPADDD   Y2, Y4, Y4; \
	VPADDD   Y3, Y5, Y5; \
	Q6SUB(lo, Y4); \
	Q6SUB(hi, Y5)

// Q6PF(k): lines 4k..4k+3 of the block two ahead into the cache.
#define Q6PF(k) \
	PREFETCHT0 (3360+256*(k))(BX); \
	PREFETCHT0 (3424+256*(k))(BX); \
	PREFETCHT0 (3488+256*(k))(BX); \
	PREFETCHT0 (3552+256*(k))(BX)

// func rowsQ6K8(p unsafe.Pointer, xq *int8, xd *float32, xs *int16, nb, groups int, out *float32)
// xs: x's sums of each 16 values.
TEXT ·rowsQ6K8(SB), NOSPLIT, $0-56
	ROWS8_INIT
	SPLAT(0x30303030, X13, Y13)

q6k8group:
	ROWS8_GROUP

q6k8block:
	VPXOR        Y1, Y1, Y1
	Q6PF(0)
	Q6PASS(Q6V0, 0, 0, 0, 4)
	Q6PF(1)
	Q6PASS(Q6V0, 0, 1, 1, 5)
	Q6PF(2)
	Q6PASS(Q6V1, 0, 0, 2, 6)
	Q6PF(3)
	Q6PASS(Q6V1, 0, 1, 3, 7)
	Q6PF(4)
	Q6PASS(Q6V0, 1, 0, 8, 12)
	Q6PF(5)
	Q6PASS(Q6V0, 1, 1, 9, 13)
	Q6PF(6)
	Q6PASS(Q6V1, 1, 0, 10, 14)
	Q6PASS(Q6V1, 1, 1, 11, 15)
	ROWS8_SCALE(Y1)
	ADDQ         $1680, BX
	ADDQ         $256, DI
	ADDQ         $4, DX
	ADDQ         $32, R12
	DECQ         CX
	JNZ          q6k8block
	ROWS8_STORE
	JNZ          q6k8group
	VZEROUPPER
	RET
