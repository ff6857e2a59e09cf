// Macros the hand-written AVX2 kernels share (quant_amd64.s, rows_amd64.s,
// e4m3_amd64.s).

// SPLAT(imm, X, Y): the 32-bit constant imm in every lane of Y (X its low
// half; clobbers AX).
#define SPLAT(imm, X, Y) \
	MOVL         $imm, AX; \
	VMOVD        AX, X; \
	VPBROADCASTD X, Y

// HSUM leaves the sum of Y0's 8 floats in X0's low lane (clobbers X1).
#define HSUM \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS       X1, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VHADDPS      X0, X0, X0
