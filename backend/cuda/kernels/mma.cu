// kiln CUDA kernels: the tensor-core helpers (f16/bf16 activations) of the
// tensor-core attention (prefill_mma.cu, decode_mma.cu) and of the GEMV's tile kernels
// (gemv_tile.cu). Appended after async.cu (the cp.async helpers cp16,
// cp_commit, cp_wait and smem_addr) in both modules (kernels.go, gemv.go).

#ifdef ACT_MMA
// mma16816 is mma.sync m16n8k16 with f32 accumulation, c += a·b, for the
// activation dtype (the null pointer's type picks it). Fragments (g = lane/4,
// tq = lane%4): a[0] row g, columns 2tq and 2tq+1; a[1] row g+8, the same
// columns; a[2], a[3] the same rows, columns 8+2tq, 9+2tq; b0 rows 2tq,
// 2tq+1 of column g, b1 rows 8+2tq, 9+2tq; c[0], c[1] row g, columns 2tq,
// 2tq+1; c[2], c[3] row g+8.
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1, const bf16*) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1, const f16*) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// cvt2 rounds two floats to the activation dtype and packs them (lo in the low half).
__device__ __forceinline__ unsigned cvt2(float lo, float hi, const bf16*) {
	unsigned r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}
__device__ __forceinline__ unsigned cvt2(float lo, float hi, const f16*) {
	unsigned r;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}
#define PK2(lo, hi) cvt2((lo), (hi), (const T*)0)

__device__ __forceinline__ float ex2f(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

// ldsm4 loads four 8×8 b16 matrices (lane i gives the shared address of row
// i%8 of matrix i/8); ldsm4t loads them transposed.
__device__ __forceinline__ void ldsm4(unsigned* r, unsigned a) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(a));
}
__device__ __forceinline__ void ldsm4t(unsigned* r, unsigned a) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(a));
}

// act_is_f16<X>::v: X is f16 (whose P·V takes P as hi + lo parts).
template <typename X> struct act_is_f16 { static constexpr bool v = false; };
template <> struct act_is_f16<f16> { static constexpr bool v = true; };

#endif // ACT_MMA
