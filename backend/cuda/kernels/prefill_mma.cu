// kiln CUDA kernels: tensor-core prefill attention (f16/bf16 activations).
// Appended to kernels.cu and attention.cu by kernels.go (one NVRTC source).

#ifdef ACT_MMA
// Prefill on the tensor cores (f16/bf16 activations): mma.sync m16n8k16 with
// f32 accumulation, FlashAttention-2 style. grid (tiles, heads), block 128:
// warp w owns query rows 16w..16w+15 of the tile; keys come in stages of
// FA_BK through shared memory (rows padded by 16 bytes: no bank conflicts).
// P is rounded to the activation dtype for the PV product.
#define FA_BK 64

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
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
	return (unsigned)fromf<T>(lo).x | ((unsigned)fromf<T>(hi).x << 16);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	return a;
}
// ldsm4 loads four 8×8 b16 matrices (lane i gives the row address of row i%8 of matrix i/8).
__device__ __forceinline__ void ldsm4(unsigned* r, const void* p) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4t(unsigned* r, const void* p) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(smem_addr(p)));
}


// LDM: fragments of K and V through ldmatrix (else plain shared loads; LDM
// only in the experimental module, built with -DKILN_EXP).
template <int HD, bool LDM>
__device__ void prefill_mma_impl(const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt,
                                 const int* positions, const int* seqIndex, const int* seqBlockOff, const int* bt,
                                 int heads, int kvHeads, int bs, int window, float scale) {
	constexpr int STR = HD + 8;   // shared row stride (elements)
	constexpr int CPR = HD / 8;   // 16-byte chunks per row
	constexpr int KC = HD / 16;   // k-chunks of Q·Kᵀ
	constexpr int NT = FA_BK / 8; // 8-key column tiles of S
	constexpr int OT = HD / 8;    // 8-wide column tiles of O
	__shared__ __align__(16) unsigned short Ks[FA_BK * STR];
	__shared__ __align__(16) unsigned short Vs[FA_BK * STR];
	__shared__ int sLo, sHi;

	int tile = blockIdx.x, h = blockIdx.y;
	int tok0 = tileTok0[tile], cnt = tileCnt[tile];
	int seqOff = seqBlockOff[seqIndex[tok0]];
	int kvh = h / (heads / kvHeads);
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
	int r0 = warp * 16 + g, r1 = r0 + 8;
	bool v0 = r0 < cnt, v1 = r1 < cnt;
	int p0 = v0 ? positions[tok0 + r0] : -1, p1 = v1 ? positions[tok0 + r1] : -1;
	int lo0 = v0 ? window_start(p0, window) : 0, lo1 = v1 ? window_start(p1, window) : 0;

	if (tid == 0) {
		sLo = 0x7fffffff;
		sHi = -1;
	}
	__syncthreads();
	if (tid < cnt) {
		int pp = positions[tok0 + tid];
		atomicMin(&sLo, window_start(pp, window));
		atomicMax(&sHi, pp);
	}
	__syncthreads();
	int kLo = sLo, kHi = sHi;

	// Q fragments (A operand, row-major 16×16 per k-chunk), straight from global memory.
	unsigned qf[KC][4];
	const unsigned* q0 = (const unsigned*)(q + ((long long)(tok0 + (v0 ? r0 : 0)) * heads + h) * HD);
	const unsigned* q1 = (const unsigned*)(q + ((long long)(tok0 + (v1 ? r1 : 0)) * heads + h) * HD);
#pragma unroll
	for (int c = 0; c < KC; c++) {
		int w = c * 8 + tq; // 32-bit word of elements c*16 + 2tq, +1
		qf[c][0] = v0 ? q0[w] : 0u;
		qf[c][1] = v1 ? q1[w] : 0u;
		qf[c][2] = v0 ? q0[w + 4] : 0u;
		qf[c][3] = v1 ? q1[w + 4] : 0u;
	}

	float o[OT][4];
#pragma unroll
	for (int i = 0; i < OT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
	float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
	const float sl2 = scale * LOG2E;

	for (int kb = kLo; kb <= kHi; kb += FA_BK) {
		__syncthreads();
		for (int i = tid; i < FA_BK * CPR; i += 128) {
			int row = i / CPR, c = i % CPR;
			int j = kb + row;
			uint4 kv, vv;
			kv.x = kv.y = kv.z = kv.w = 0u;
			vv = kv;
			if (j <= kHi) {
				long long at = kv_row(bt, seqOff, bs, kvHeads, kvh, HD, j) + c * 8;
				kv = *(const uint4*)(kc + at);
				vv = *(const uint4*)(vc + at);
			}
			*(uint4*)&Ks[row * STR + c * 8] = kv;
			*(uint4*)&Vs[row * STR + c * 8] = vv;
		}
		__syncthreads();

		float s[NT][4];
#pragma unroll
		for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
		for (int c = 0; c < KC; c++) {
			if constexpr (LDM) {
				int mi = lane >> 3, rr = lane & 7;
#pragma unroll
				for (int nt = 0; nt < NT; nt += 2) {
					unsigned b[4];
					ldsm4(b, Ks + ((nt + (mi >> 1)) * 8 + rr) * STR + c * 16 + (mi & 1) * 8);
					mma16816(s[nt], qf[c], b[0], b[1], q);
					mma16816(s[nt + 1], qf[c], b[2], b[3], q);
				}
			} else {
#pragma unroll
				for (int nt = 0; nt < NT; nt++) {
					const unsigned short* kr = Ks + (nt * 8 + g) * STR + c * 16 + 2 * tq;
					mma16816(s[nt], qf[c], *(const unsigned*)kr, *(const unsigned*)(kr + 8), q);
				}
			}
		}
		float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
		for (int nt = 0; nt < NT; nt++) {
#pragma unroll
			for (int e = 0; e < 2; e++) {
				int j = kb + nt * 8 + 2 * tq + e;
				s[nt][e] = (j >= lo0 && j <= p0) ? s[nt][e] * sl2 : NEG_INF;
				s[nt][2 + e] = (j >= lo1 && j <= p1) ? s[nt][2 + e] * sl2 : NEG_INF;
				mx0 = fmaxf(mx0, s[nt][e]);
				mx1 = fmaxf(mx1, s[nt][2 + e]);
			}
		}
		mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
		mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
		mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
		mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
		float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
		float b0 = mn0 == NEG_INF ? 0.f : mn0, b1 = mn1 == NEG_INF ? 0.f : mn1;
		float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
		m0 = mn0;
		m1 = mn1;
		l0 *= c0;
		l1 *= c1;
#pragma unroll
		for (int i = 0; i < OT; i++) {
			o[i][0] *= c0; o[i][1] *= c0; o[i][2] *= c1; o[i][3] *= c1;
		}
#pragma unroll
		for (int nt = 0; nt < NT; nt++) {
			s[nt][0] = exp2f(s[nt][0] - b0);
			s[nt][1] = exp2f(s[nt][1] - b0);
			s[nt][2] = exp2f(s[nt][2] - b1);
			s[nt][3] = exp2f(s[nt][3] - b1);
			l0 += s[nt][0] + s[nt][1];
			l1 += s[nt][2] + s[nt][3];
		}
#pragma unroll
		for (int kk = 0; kk < FA_BK / 16; kk++) {
			unsigned a[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
			                 pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
			if constexpr (LDM) {
				int mi = lane >> 3, rr = lane & 7;
#pragma unroll
				for (int ot = 0; ot < OT; ot += 2) {
					unsigned b[4];
					ldsm4t(b, Vs + (kk * 16 + (mi & 1) * 8 + rr) * STR + (ot + (mi >> 1)) * 8);
					mma16816(o[ot], a, b[0], b[1], q);
					mma16816(o[ot + 1], a, b[2], b[3], q);
				}
			} else {
#pragma unroll
				for (int ot = 0; ot < OT; ot++) {
					const unsigned short* vr = Vs + (kk * 16 + 2 * tq) * STR + ot * 8 + g;
					unsigned vb0 = (unsigned)vr[0] | ((unsigned)vr[STR] << 16);
					unsigned vb1 = (unsigned)vr[8 * STR] | ((unsigned)vr[9 * STR] << 16);
					mma16816(o[ot], a, vb0, vb1, q);
				}
			}
		}
	}
	l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
	l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
	l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
	l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
	if (v0) {
		T* op = out + ((long long)(tok0 + r0) * heads + h) * HD;
		float inv = 1.0f / l0;
#pragma unroll
		for (int ot = 0; ot < OT; ot++) {
			op[ot * 8 + 2 * tq] = fromf<T>(o[ot][0] * inv);
			op[ot * 8 + 2 * tq + 1] = fromf<T>(o[ot][1] * inv);
		}
	}
	if (v1) {
		T* op = out + ((long long)(tok0 + r1) * heads + h) * HD;
		float inv = 1.0f / l1;
#pragma unroll
		for (int ot = 0; ot < OT; ot++) {
			op[ot * 8 + 2 * tq] = fromf<T>(o[ot][2] * inv);
			op[ot * 8 + 2 * tq + 1] = fromf<T>(o[ot][3] * inv);
		}
	}
}

#define MMA_KERNELS(HD)                                                                                              \
	extern "C" __global__ void __launch_bounds__(128) prefill_mma_##HD(                                               \
	    const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt, const int* positions,  \
	    const int* seqIndex, const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs, int window,        \
	    float scale) {                                                                                                 \
		prefill_mma_impl<HD, false>(q, kc, vc, out, tileTok0, tileCnt, positions, seqIndex, seqBlockOff, bt, heads,    \
		                            kvHeads, bs, window, scale);                                                       \
	}                                                                                                                  \
	MMA_EXP_KERNELS(HD)
#ifdef KILN_EXP
#define MMA_EXP_KERNELS(HD)                                                                                          \
	extern "C" __global__ void __launch_bounds__(128) prefill_ldm_##HD(                                               \
	    const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt, const int* positions,  \
	    const int* seqIndex, const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs, int window,        \
	    float scale) {                                                                                                 \
		prefill_mma_impl<HD, true>(q, kc, vc, out, tileTok0, tileCnt, positions, seqIndex, seqBlockOff, bt, heads,     \
		                           kvHeads, bs, window, scale);                                                        \
	}
#else
#define MMA_EXP_KERNELS(HD)
#endif
MMA_KERNELS(16)
MMA_KERNELS(32)
MMA_KERNELS(64)
MMA_KERNELS(80)
MMA_KERNELS(96)
MMA_KERNELS(128)
#endif // ACT_MMA
