// kiln CUDA kernels: tensor-core prefill attention (f16/bf16 activations).
// Appended after mma.cu (the mma.sync and ldmatrix helpers) by kernels.go
// (one NVRTC source).

#ifdef ACT_MMA
// Prefill on the tensor cores (f16/bf16 activations): mma.sync m16n8k16 with
// f32 accumulation, FlashAttention-2 style (prefill_fa below). One block
// takes one prefill tile (up to PF_BQ = 64 query tokens) for 4, 2 or 1 query
// heads of one kv head (as many as the GQA group allows): 4 warps per 2
// heads, warp w owning the tile's rows 16(w%4).. of its two heads, so that
// every K/V fragment serves both, and every K/V stage all the block's heads.
// K and V come in stages of BK keys through shared memory by cp.async (16
// bytes, .cg; rows padded by 16 bytes: no bank conflicts for ldmatrix),
// fragments by ldmatrix (V transposed). P is rounded to bf16 for the PV
// product, as FlashAttention does; f16 takes P as hi + lo parts.

extern __shared__ __align__(16) unsigned short pf_smem[];

// An FP8 cache (KV_F8) reaches the tensor cores widened: each stage's E4M3
// codes come into shared memory by cp.async as they are (half the bytes),
// then are widened to the activation dtype into the rows that ldmatrix
// reads. Every E4M3 value is exactly an f16 and a bf16.
//
// e4m3_float is code b as a float (NaN for ±0x7F): its exponent and
// mantissa bits placed as a float's, times 2^120 (exact, subnormals too).
__device__ __forceinline__ float e4m3_float(unsigned b) {
	if ((b & 0x7fu) == 0x7fu) return __uint_as_float(0x7fffffffu);
	return __uint_as_float((b & 0x80u) << 24 | (b & 0x7fu) << 20) * 0x1p120f;
}
// prmt is PTX's byte permutation: byte i of the result is byte sel's nibble
// i of {b, a} (a's bytes 0-3, then b's 4-7).
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
	unsigned r;
#if __CUDA_ARCH__
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
#else
	const unsigned long long x = (unsigned long long)b << 32 | a;
	r = 0;
	for (int i = 0; i < 4; i++) r |= (unsigned)(x >> (8 * ((sel >> (4 * i)) & 7)) & 0xff) << (8 * i);
#endif
	return r;
}
// e4m3x4_f16 widens the four codes of w (the low byte first) to f16 pairs:
// the hardware's conversion of two codes at a time.
__device__ __forceinline__ uint2 e4m3x4_f16(unsigned w) {
	uint2 r;
#if __CUDA_ARCH__ >= 890
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r.x) : "h"((unsigned short)(w & 0xffffu)));
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r.y) : "h"((unsigned short)(w >> 16)));
#else
	r.x = cvt2(e4m3_float(w & 0xffu), e4m3_float((w >> 8) & 0xffu), (const f16*)0);
	r.y = cvt2(e4m3_float((w >> 16) & 0xffu), e4m3_float(w >> 24), (const f16*)0);
#endif
	return r;
}
// e4m3x4_act widens the four codes of w (the low byte first) to activation
// elements packed as PK2 packs them (two to a word). f16: e4m3x4_f16. bf16
// by the bits (fewer instructions than converting through f16 and f32, and
// none on the conversion units): each code's sign, and its exponent and
// mantissa 4 bits lower, make a bf16 of the value 2^−120 times the code's
// (subnormals too), scaled back by one multiply-add of bf16 pairs (−0
// added, so that −0 stays −0). A NaN code (0x7F, 0xFF: the writers
// saturate, so only a NaN key or value makes one) widens to ±480 there.
__device__ __forceinline__ uint2 e4m3x4_act(unsigned w) {
	if (act_is_f16<T>::v) return e4m3x4_f16(w);
	uint2 r;
#if __CUDA_ARCH__ >= 890
	unsigned p[2] = {prmt(w, 0u, 0x1404u), prmt(w, 0u, 0x3424u)}; // codes 0, 1 (then 2, 3) in the halves' high bytes
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const unsigned b = (p[i] & 0x80008000u) | ((p[i] >> 4) & 0x07f007f0u);
		asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p[i]) : "r"(b), "r"(0x7b807b80u), "r"(0x80008000u)); // × 2^120
	}
	r.x = p[0];
	r.y = p[1];
#else
	r.x = PK2(e4m3_float(w & 0xffu), e4m3_float((w >> 8) & 0xffu));
	r.y = PK2(e4m3_float((w >> 16) & 0xffu), e4m3_float(w >> 24));
#endif
	return r;
}
// widen_rows widens ROWS rows of HD codes at src (rows srcRB bytes apart)
// into rows of HD activation elements at dst (dstStr elements apart), 8
// codes (8 bytes in, 16 out) at a time: thread i of N takes groups i,
// i + N, ..., all of them loaded before the first is widened and stored.
template <int HD, int ROWS, int N>
__device__ __forceinline__ void widen_rows(unsigned short* dst, int dstStr, const unsigned char* src, int srcRB, int i) {
	constexpr int G = HD / 8, U = ROWS * G, IT = (U + N - 1) / N;
	uint2 v[IT];
#pragma unroll
	for (int it = 0; it < IT; it++) {
		const int u = i + it * N;
		if (U % N == 0 || u < U) v[it] = *(const uint2*)(src + (u / G) * srcRB + (u % G) * 8);
	}
#pragma unroll
	for (int it = 0; it < IT; it++) {
		const int u = i + it * N;
		if (U % N == 0 || u < U) {
			const uint2 a = e4m3x4_act(v[it].x), b = e4m3x4_act(v[it].y);
			uint4 w;
			w.x = a.x, w.y = a.y, w.z = b.x, w.w = b.y;
			*(uint4*)(dst + (u / G) * dstStr + (u % G) * 8) = w;
		}
	}
}

// quad_sum is x summed over the four lanes of its quad (lanes 4g..4g+3,
// which hold a row of an mma tile's accumulators between them).
__device__ __forceinline__ float quad_sum(float x) {
	x += __shfl_xor_sync(FULL_MASK, x, 1);
	return x + __shfl_xor_sync(FULL_MASK, x, 2);
}

// kv_f8 is whether the cache holds E4M3 codes; KV_CE its elements per
// 16-byte copy.
#ifdef KV_F8
constexpr bool kv_f8 = true;
#else
constexpr bool kv_f8 = false;
#endif
#define KV_CE (16 / (int)sizeof(KV))

// TileKeys is a prefill tile's keys: [lo, hi] those some token of it sees,
// [fLo, fHi] those every token sees (a stage of keys inside needs no
// mask).
struct TileKeys {
	int lo, hi, fLo, fHi;
};
// tile_keys is the TileKeys of the tile of cnt tokens from tok0 (at most
// the block's threads), window 0 or the sliding window's length: a call of
// the whole block (two barriers), tid its thread.
__device__ __forceinline__ TileKeys tile_keys(const int* positions, int tok0, int cnt, int window, int tid) {
	__shared__ int sLo, sHi, sLoMax, sHiMin;
	if (tid == 0) {
		sLo = 0x7fffffff;
		sHi = -1;
		sLoMax = -1;
		sHiMin = 0x7fffffff;
	}
	__syncthreads();
	if (tid < cnt) {
		int pp = positions[tok0 + tid], w = window_start(pp, window);
		atomicMin(&sLo, w);
		atomicMax(&sHi, pp);
		atomicMax(&sLoMax, w);
		atomicMin(&sHiMin, pp);
	}
	__syncthreads();
	return TileKeys{sLo, sHi, sLoMax, sHiMin};
}

// prefill_fa: HD head dim, MB query heads per warp (of one kv head), WG groups
// of 4 warps per block (each its own MB heads: MB·WG heads per block, 128·WG
// threads), BK keys per stage, ST ≥ 2 stages of K and V in a ring (stage
// n+ST−1 loaded by cp.async during the whole of stage n), QREG: Q
// fragments held in registers (else reloaded from shared memory by ldmatrix
// each stage). Dynamic shared memory: ((QREG ? 0 : MB·WG·PF_BQ) +
// 2·ST·BK)·(HD+8)·2 bytes (pfCfg.shared in prefill.go); with an FP8 cache
// (KV_F8) one stage of widened rows, 2·BK instead of 2·ST·BK, then the ring
// of codes, 2·ST·BK rows of HD+16 bytes, each stage widened by the whole
// block between two barriers. Grid: tiles·heads/(MB·WG) blocks, the last
// tile (the most keys, causal) first.
//
// f16 splits P into f16 hi + lo parts for P·V (two products): P rounded to
// f16 alone costs single outputs up to ~2e-3 of the outputs' rms, the
// test's whole f16 limit. bf16 rounds P once, as FlashAttention does.
template <int HD, int MB, int WG, int BK, int ST, bool QREG>
__device__ __forceinline__ void prefill_fa(const T* q, const KV* kc, const KV* vc, T* out, const int* tileTok0,
                                           const int* tileCnt, const int* positions, const int* seqIndex,
                                           const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs,
                                           int window, float scale, float cap) {
	constexpr int STR = HD + 8; // shared row stride (elements)
	constexpr int CPR = HD / 8; // 16-byte chunks per row
	constexpr int KC = HD / 16; // k-chunks of Q·Kᵀ
	constexpr int NT = BK / 8;  // 8-key column tiles of S
	constexpr int OT = HD / 8;  // 8-wide column tiles of O
	constexpr int QROWS = QREG ? 0 : MB * WG * PF_BQ;
	constexpr int NTH = 128 * WG; // threads
	constexpr bool PSPLIT = act_is_f16<T>::v;
	constexpr int RB = STR * 2; // row bytes
	// An FP8 cache: one stage of widened K and V rows (KS), which the
	// stages of codes (rows of RB8 bytes) in the ring after them feed.
	constexpr int KS = kv_f8 ? 1 : ST, RB8 = HD + 16;
	static_assert(HD % 16 == 0 && BK % 16 == 0 && ST >= 2, "prefill_fa shape");
	unsigned short* Qs = pf_smem;
	unsigned short* Ks = pf_smem + QROWS * STR;
	unsigned short* Vs = Ks + KS * BK * STR;
	unsigned char* ring8 = (unsigned char*)(Vs + KS * BK * STR);

	const int hg = heads / (MB * WG);
	const int bid = blockIdx.x;
	const int tile = (int)gridDim.x / hg - 1 - bid / hg;
	const int h0 = (bid % hg) * MB * WG;
	const int tok0 = tileTok0[tile], cnt = tileCnt[tile];
	const int seqOff = seqBlockOff[seqIndex[tok0]];
	const int kvh = h0 / (heads / kvHeads);
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
	const int mi = lane >> 3, rr = lane & 7;
	const int wl = warp & 3, hw = h0 + (warp >> 2) * MB; // the warp's rows 16wl.., heads hw..hw+MB-1
	const int r0 = wl * 16 + g, r1 = r0 + 8;
	const bool v0 = r0 < cnt, v1 = r1 < cnt;

	if constexpr (!QREG) {
		for (int i = tid; i < MB * WG * PF_BQ * CPR; i += NTH) {
			int row = i / CPR, c = i % CPR, mb = row / PF_BQ, r = row % PF_BQ;
			bool in = r < cnt;
			const T* src = in ? q + ((long long)(tok0 + r) * heads + h0 + mb) * HD + c * 8 : q;
			cp16(smem_addr(Qs + row * STR + c * 8), src, in);
		}
	}
	const int p0 = v0 ? positions[tok0 + r0] : -1, p1 = v1 ? positions[tok0 + r1] : -1;
	const int lo0 = v0 ? window_start(p0, window) : 0, lo1 = v1 ? window_start(p1, window) : 0;
	// Keys [kLo, kHi] for the tile; a stage inside [fLo, fHi] needs no mask.
	const TileKeys tk = tile_keys(positions, tok0, cnt, window, tid);
	const int kLo = tk.lo, kHi = tk.hi, fLo = tk.fLo, fHi = tk.fHi;

	// load copies keys kb..kb+BK-1 of K and V into stage slot of the ring
	// (zeros past kHi: masked, and no NaN garbage in P·V).
	auto load = [&](int slot, int kb) {
		constexpr int CPRK = HD / KV_CE, N = BK * CPRK; // 16-byte chunks a row, a stage
		constexpr int RBK = kv_f8 ? RB8 : RB;          // the ring's row bytes
		unsigned char* kd = kv_f8 ? ring8 + slot * 2 * BK * RBK : (unsigned char*)(Ks + slot * BK * STR);
		unsigned char* vd = kv_f8 ? kd + BK * RBK : (unsigned char*)(Vs + slot * BK * STR);
#pragma unroll
		for (int i0 = 0; i0 < N; i0 += NTH) {
			int i = i0 + tid;
			if (N % NTH == 0 || i < N) {
				int row = i / CPRK, c = i % CPRK, j = kb + row;
				bool in = j <= kHi;
				long long at = in ? kv_row(bt, seqOff, bs, kvHeads, kvh, HD, j) + c * KV_CE : 0;
				cp16(smem_addr(kd + row * RBK + c * 16), kc + at, in);
				cp16(smem_addr(vd + row * RBK + c * 16), vc + at, in);
			}
		}
	};

	// Q fragments (A operand, row-major 16×16 per k-chunk) in registers.
	unsigned qf[QREG ? MB : 1][QREG ? KC : 1][4];
	if constexpr (QREG) {
#pragma unroll
		for (int mb = 0; mb < MB; mb++) {
			const unsigned* q0 = (const unsigned*)(q + ((long long)(tok0 + (v0 ? r0 : 0)) * heads + hw + mb) * HD);
			const unsigned* q1 = (const unsigned*)(q + ((long long)(tok0 + (v1 ? r1 : 0)) * heads + hw + mb) * HD);
#pragma unroll
			for (int c = 0; c < KC; c++) {
				int w = c * 8 + tq; // 32-bit word of elements c*16 + 2tq, +1
				qf[mb][c][0] = v0 ? q0[w] : 0u;
				qf[mb][c][1] = v1 ? q1[w] : 0u;
				qf[mb][c][2] = v0 ? q0[w + 4] : 0u;
				qf[mb][c][3] = v1 ? q1[w + 4] : 0u;
			}
		}
	}

	const unsigned sQ = smem_addr(Qs) + (((warp >> 2) * MB * PF_BQ + wl * 16 + (mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;
	const unsigned sK = smem_addr(Ks) + (((mi >> 1) * 8 + rr) * STR + (mi & 1) * 8) * 2;
	const unsigned sV = smem_addr(Vs) + (((mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;

	float o[MB][OT][4];
	float m[MB][2], l[MB][2];
#pragma unroll
	for (int mb = 0; mb < MB; mb++) {
#pragma unroll
		for (int i = 0; i < OT; i++) o[mb][i][0] = o[mb][i][1] = o[mb][i][2] = o[mb][i][3] = 0.f;
		m[mb][0] = m[mb][1] = NEG_INF;
		l[mb][0] = l[mb][1] = 0.f;
	}
	const float sl2 = scale * LOG2E; // scale > 0 (PrefillAttention)
	const int nblk = (kHi - kLo) / BK + 1;
	const bool wact = wl * 16 < cnt; // the warp has a row of the tile

	load(0, kLo);
	cp_commit();
#pragma unroll
	for (int i = 1; i < ST - 1; i++) {
		if (i < nblk) load(i, kLo + i * BK);
		cp_commit();
	}

	for (int n = 0; n < nblk; n++) {
		const int kb = kLo + n * BK;
		const int buf = n % ST;
		cp_wait<ST - 2>(); // stage n is in (the later ones may not be)
		__syncthreads();                  // and every warp is done with stage n−1
		if constexpr (kv_f8) {
			// K's rows then V's, in both places one after the other.
			widen_rows<HD, 2 * BK, NTH>(Ks, STR, ring8 + buf * 2 * BK * RB8, RB8, tid);
		}
		if (n + ST - 1 < nblk) load((n + ST - 1) % ST, kb + (ST - 1) * BK);
		cp_commit();
		if constexpr (kv_f8) __syncthreads(); // the widened stage is whole
		const int sb = kv_f8 ? 0 : buf;        // the stage of rows ldmatrix reads

		float s[MB][NT][4];
		if (wact) {
#pragma unroll
			for (int mb = 0; mb < MB; mb++)
#pragma unroll
				for (int nt = 0; nt < NT; nt++) s[mb][nt][0] = s[mb][nt][1] = s[mb][nt][2] = s[mb][nt][3] = 0.f;
			const unsigned kbase = sK + sb * BK * RB;
#pragma unroll
			for (int c = 0; c < KC; c++) {
				unsigned qa[MB][4];
#pragma unroll
				for (int mb = 0; mb < MB; mb++) {
					if constexpr (QREG) {
						qa[mb][0] = qf[mb][c][0];
						qa[mb][1] = qf[mb][c][1];
						qa[mb][2] = qf[mb][c][2];
						qa[mb][3] = qf[mb][c][3];
					} else {
						ldsm4(qa[mb], sQ + mb * PF_BQ * RB + c * 32);
					}
				}
#pragma unroll
				for (int nt = 0; nt < NT; nt += 2) {
					unsigned b[4];
					ldsm4(b, kbase + nt * 8 * RB + c * 32);
#pragma unroll
					for (int mb = 0; mb < MB; mb++) {
						mma16816(s[mb][nt], qa[mb], b[0], b[1], q);
						mma16816(s[mb][nt + 1], qa[mb], b[2], b[3], q);
					}
				}
			}
		}
		if (wact) {
			if (cap > 0.f) { // soft-capped scores (Gemma 2), back in the domain sl2 scales
				const SoftcapRaw sc(sl2, cap * LOG2E);
#pragma unroll
				for (int mb = 0; mb < MB; mb++)
#pragma unroll
					for (int nt = 0; nt < NT; nt++)
#pragma unroll
						for (int e = 0; e < 4; e++) s[mb][nt][e] = sc(s[mb][nt][e]);
			}
			if (!(kb >= fLo && kb + BK - 1 <= fHi)) {
#pragma unroll
				for (int nt = 0; nt < NT; nt++) {
#pragma unroll
					for (int e = 0; e < 2; e++) {
						int j = kb + nt * 8 + 2 * tq + e;
						bool in0 = j >= lo0 && j <= p0, in1 = j >= lo1 && j <= p1;
#pragma unroll
						for (int mb = 0; mb < MB; mb++) {
							if (!in0) s[mb][nt][e] = NEG_INF;
							if (!in1) s[mb][nt][2 + e] = NEG_INF;
						}
					}
				}
			}
#pragma unroll
			for (int mb = 0; mb < MB; mb++) {
				float mx0 = m[mb][0], mx1 = m[mb][1];
#pragma unroll
				for (int nt = 0; nt < NT; nt++) {
					mx0 = fmaxf(mx0, fmaxf(s[mb][nt][0], s[mb][nt][1]));
					mx1 = fmaxf(mx1, fmaxf(s[mb][nt][2], s[mb][nt][3]));
				}
				mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
				mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
				mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
				mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
				// Scores in the log2 domain: p = 2^(s·sl2 − m·sl2).
				const float b0 = mx0 == NEG_INF ? 0.f : mx0 * sl2, b1 = mx1 == NEG_INF ? 0.f : mx1 * sl2;
				const float c0 = ex2f(fmaf(m[mb][0], sl2, -b0)), c1 = ex2f(fmaf(m[mb][1], sl2, -b1));
				m[mb][0] = mx0;
				m[mb][1] = mx1;
				float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
				for (int nt = 0; nt < NT; nt++) {
					s[mb][nt][0] = ex2f(fmaf(s[mb][nt][0], sl2, -b0));
					s[mb][nt][1] = ex2f(fmaf(s[mb][nt][1], sl2, -b0));
					s[mb][nt][2] = ex2f(fmaf(s[mb][nt][2], sl2, -b1));
					s[mb][nt][3] = ex2f(fmaf(s[mb][nt][3], sl2, -b1));
					ls0 += s[mb][nt][0] + s[mb][nt][1];
					ls1 += s[mb][nt][2] + s[mb][nt][3];
				}
				l[mb][0] = l[mb][0] * c0 + ls0;
				l[mb][1] = l[mb][1] * c1 + ls1;
#pragma unroll
				for (int i = 0; i < OT; i++) {
					o[mb][i][0] *= c0;
					o[mb][i][1] *= c0;
					o[mb][i][2] *= c1;
					o[mb][i][3] *= c1;
				}
			}
			const unsigned vbase = sV + sb * BK * RB;
#pragma unroll
			for (int kk = 0; kk < BK / 16; kk++) {
				unsigned pa[MB][4], pl[MB][PSPLIT ? 4 : 1];
#pragma unroll
				for (int mb = 0; mb < MB; mb++) {
#pragma unroll
					for (int i = 0; i < 4; i++) {
						// i: (row g, keys 2tq..), (row g+8, ..), (row g, keys 8+2tq..), (row g+8, ..)
						float x = s[mb][2 * kk + (i >> 1)][(i & 1) * 2], y = s[mb][2 * kk + (i >> 1)][(i & 1) * 2 + 1];
						pa[mb][i] = PK2(x, y);
						if constexpr (PSPLIT) pl[mb][i] = PK2(x - lo16(pa[mb][i], (f16*)0), y - hi16(pa[mb][i], (f16*)0));
					}
				}
#pragma unroll
				for (int ot = 0; ot < OT; ot += 2) {
					unsigned b[4];
					ldsm4t(b, vbase + kk * 16 * RB + ot * 16);
#pragma unroll
					for (int mb = 0; mb < MB; mb++) {
						mma16816(o[mb][ot], pa[mb], b[0], b[1], q);
						mma16816(o[mb][ot + 1], pa[mb], b[2], b[3], q);
						if constexpr (PSPLIT) {
							mma16816(o[mb][ot], pl[mb], b[0], b[1], q);
							mma16816(o[mb][ot + 1], pl[mb], b[2], b[3], q);
						}
					}
				}
			}
		}
	}
#pragma unroll
	for (int mb = 0; mb < MB; mb++) {
		const float l0 = quad_sum(l[mb][0]), l1 = quad_sum(l[mb][1]);
		if (v0) {
			unsigned* op = (unsigned*)(out + ((long long)(tok0 + r0) * heads + hw + mb) * HD + 2 * tq);
			float inv = 1.0f / l0;
#pragma unroll
			for (int ot = 0; ot < OT; ot++) op[ot * 4] = PK2(o[mb][ot][0] * inv, o[mb][ot][1] * inv);
		}
		if (v1) {
			unsigned* op = (unsigned*)(out + ((long long)(tok0 + r1) * heads + hw + mb) * HD + 2 * tq);
			float inv = 1.0f / l1;
#pragma unroll
			for (int ot = 0; ot < OT; ot++) op[ot * 4] = PK2(o[mb][ot][2] * inv, o[mb][ot][3] * inv);
		}
	}
}

#define PF_PARAMS                                                                                                     \
	const T *q, const KV *kc, const KV *vc, T *out, const int *tileTok0, const int *tileCnt, const int *positions,    \
	    const int *seqIndex, const int *seqBlockOff, const int *bt, int heads, int kvHeads, int bs, int window,       \
	    float scale, float cap
#define PF_ARGS                                                                                                       \
	q, kc, vc, out, tileTok0, tileCnt, positions, seqIndex, seqBlockOff, bt, heads, kvHeads, bs, window, scale, cap
#define PF_KERNEL(NAME, HD, MB, WG, BK, ST, QREG)                                                                    \
	extern "C" __global__ void __launch_bounds__(128 * WG) NAME(PF_PARAMS) {                                          \
		prefill_fa<HD, MB, WG, BK, ST, QREG>(PF_ARGS);                                                                 \
	}
// prefill_mma_<HD>: four heads per block, 8 warps (GQA groups of a multiple
// of 4); prefill_mma2_<HD>: two heads per block, 4 warps (even groups);
// prefill_mma1_<HD>: one head per block. Their shapes are pfMMA in prefill.go.
// Past head dim 128 (256) one head a block alone: more would pass the
// shared memory and registers a block has.
#define MMA_KERNEL1(HD) PF_KERNEL(prefill_mma1_##HD, HD, 1, 1, 64, 2, true)
#define MMA_KERNELS(HD)                                                                                              \
	PF_KERNEL(prefill_mma_##HD, HD, 2, 2, 64, 2, (2 * HD <= 128))                                                   \
	PF_KERNEL(prefill_mma2_##HD, HD, 2, 1, (2 * HD <= 128 ? 64 : 32), 2, (2 * HD <= 128))                          \
	MMA_KERNEL1(HD)
// Part 1 of the kernels module (KILN_PART_IS).
#if KILN_PART_IS(1)
#ifdef KILN_HD
#if KILN_HD > 128
#define MMA_KERNEL1_X(HD) MMA_KERNEL1(HD)
MMA_KERNEL1_X(KILN_HD)
#elif KILN_HD >= 16
#define MMA_KERNELS_X(HD) MMA_KERNELS(HD)
MMA_KERNELS_X(KILN_HD)
#endif
#else
MMA_KERNELS(16)
MMA_KERNELS(32)
MMA_KERNELS(64)
MMA_KERNELS(80)
MMA_KERNELS(96)
MMA_KERNELS(128)
MMA_KERNEL1(256)
#endif
#endif // KILN_PART_IS(1)

#endif // ACT_MMA
