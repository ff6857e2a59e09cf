// kiln GEMV on GGUF K-quant weights (Q4_K, Q6_K) for decode steps:
// out[T,N] = x[T,K]·w[N,K]ᵀ for 1 ≤ T ≤ 8, w in its blocks, as llama.cpp's
// MMVQ computes it: x rounded to int8 per group of 32 values (q =
// rint(x·127/max|x|), its scale s = max|x|/127, and s·Σq for the weights'
// minimums), each block's values multiplied by dp4a and scaled once per 16
// or 32 values.
// Part of the gemv module (gemv.go), after async.cu (cp16).
//
// One kernel frame (gemv_kq_impl) for both formats, a format functor (KQ4K,
// KQ6K) for what a lane does with its share of one super-block:
// - Every block first quantizes all of x (T·K values) into its shared
//   memory: x is small, read from the L2, and the separate quantization
//   kernel (and its launch, a dependent step of every product) is gone.
//   The int8 values of each super-block of 256 sit 272 bytes apart, their
//   groups' (s, s·Σq) 80 bytes apart: the 16-byte pads spread the lanes'
//   reads of 8 consecutive super-blocks over all banks.
// - Every warp owns rows n = gw, gw + NW, ... (gw its index in the grid, NW
//   the grid's warps; the grid is sized to stay resident) and streams them
//   in units of 8 super-blocks (a "group" of a row: 1152 bytes of Q4_K,
//   1680 of Q6_K) through a ring of KQ_STAGES units in its own shared
//   memory, by cp.async (16 bytes a lane, L1 bypassed): KQ_STAGES − 1 units
//   stay in flight while it multiplies one, across the ends of rows. The
//   first units are issued before the PDL wait (no kernel writes weights).
// - Lane l takes super-block l%8 of a unit and quarter l/8 of it; at a
//   row's last unit the warp sums its lanes and lane t stores output t.
// Rows end in a partial unit when K is not a multiple of 2048. A Q6_K
// unit (210-byte super-blocks) starts 16-byte aligned only where the row
// length is a multiple of 8 super-blocks; otherwise its copy starts at the
// 16-byte boundary below it, reads only the unit's bytes past that
// (cp16n), and the lanes read the unit at its offset in the stage (KQ_UNIT
// leaves 16 bytes for it).

#define KQ_WARPS 8
#define KQ_STAGES 4
#define KQ_XSB 272 // bytes of x's int8 values a super-block, padded
#define KQ_SSB 20  // floats of x's group scales a super-block, padded

// ---- PTX helpers (the host emulator has its own: testdata/emu/kq.h)

// half_f is the f16 bits h as a float.
__device__ __forceinline__ float half_f(unsigned short h) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}
// shf_r is the 32 bits at bit s of the 64-bit hi:lo (s < 32).
__device__ __forceinline__ unsigned shf_r(unsigned lo, unsigned hi, unsigned s) {
	unsigned r;
	asm("shf.r.wrap.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(s));
	return r;
}
// ld8 loads 8 values of x (16-byte aligned), raw; unpack8 widens them.
__device__ __forceinline__ void ld8(const T* p, uint4 (&r)[8 / VEC]) {
#pragma unroll
	for (int h = 0; h < 8 / VEC; h++) r[h] = ldx((const uint4*)p + h);
}
__device__ __forceinline__ void unpack8(const uint4 (&r)[8 / VEC], float (&v)[8]) {
#pragma unroll
	for (int h = 0; h < 8 / VEC; h++) unpack(r[h], v + h * VEC, (const T*)0);
}
// dp4a is the sum of the 4 byte products of a and b (signed) plus c.
__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// ---- KQ_BEGIN: the frame and the formats (what the emulator runs)

// ld16u reads the 16 bytes at p, which is 2-byte aligned (a Q6_K block is
// 210 bytes), by aligned 4-byte words and funnel shifts.
__device__ __forceinline__ uint4 ld16u(const unsigned char* p) {
	const unsigned off = (unsigned)((unsigned long long)p & 3u); // 0 or 2
	const unsigned* a = (const unsigned*)(p - off);
	const unsigned w[5] = {a[0], a[1], a[2], a[3], off ? a[4] : 0u};
	uint4 v;
	v.x = shf_r(w[0], w[1], 8 * off);
	v.y = shf_r(w[1], w[2], 8 * off);
	v.z = shf_r(w[2], w[3], 8 * off);
	v.w = shf_r(w[3], w[4], 8 * off);
	return v;
}

// q4k_scales_mins is the 6-bit scales (low byte: sub-block 2j, high byte:
// 2j + 1) and minimums of sub-blocks 2j and 2j + 1 (j < 4) from the 12
// packed bytes s (tensor.KScaleMin), two bytes at a time: with w(k) the
// 16-bit word k of s, for j < 2 the scales are w(j) & 0x3f3f and the
// minimums w(j + 2) & 0x3f3f; for j ≥ 2 the low 4 bits come from w(j + 2)
// (scales its low nibbles, minimums its high ones) and the top 2 from the
// top bits of w(j − 2) (scales) and w(j) (minimums).
__device__ __forceinline__ void q4k_scales_mins(const unsigned (&s)[3], int j, unsigned& sc, unsigned& m) {
	auto w = [&](int k) { return (s[k >> 1] >> (16 * (k & 1))) & 0xffffu; };
	const unsigned lo = w(j & 1), mid = w((j & 1) + 2), hi = w((j & 1) + 4);
	if (j < 2) {
		sc = lo & 0x3f3fu;
		m = mid & 0x3f3fu;
	} else {
		sc = (hi & 0x0f0fu) | (lo & 0xc0c0u) >> 2;
		m = (hi >> 4 & 0x0f0fu) | (mid & 0xc0c0u) >> 2;
	}
}

// dot16 is Σ of the 16 products of the nibbles of q (lo: the low ones,
// else the high ones) with the 16 int8 values of x, by dp4a.
__device__ __forceinline__ int dot16(const uint4& q, const uint4& x, bool lo) {
	const int qw[4] = {(int)q.x, (int)q.y, (int)q.z, (int)q.w}, xw[4] = {(int)x.x, (int)x.y, (int)x.z, (int)x.w};
	int s = 0;
#pragma unroll
	for (int i = 0; i < 4; i++) s = dp4a((lo ? qw[i] : qw[i] >> 4) & 0x0f0f0f0f, xw[i], s);
	return s;
}

// q6_m32 is four Q6_K values q (0..63, a byte each) less 32, as int8 bytes:
// q ^ 32, with the sign bits set where q < 32.
__device__ __forceinline__ int q6_m32(unsigned q) {
	const unsigned lo = ~q & 0x20202020u;
	return (int)((q ^ 0x20202020u) | lo << 1 | lo << 2);
}

// A format F: BB bytes a super-block of 256 weights; F::dot<TT>(blk, sub,
// xq, xs, xrow, srow, acc) adds quarter sub (0..3) of super-block blk's
// products with x's rows (int8 values xq, their groups' (s, s·Σq) pairs
// xs, both at the super-block; row t at xq + t·xrow, xs + t·srow) to
// acc[t].

// KQ4K: GGUF's Q4_K (tensor.Q4_K, ggml's block_q4_K: f16 d and dmin, 12
// bytes of 6-bit sub-block scales and minimums, 128 bytes of nibbles: each
// 64 values are 32 low nibbles, then the same bytes' high nibbles); weight
// = d·sc·q − dmin·m. Quarter j: values 64j.. (the 32 bytes at 16 + 32j),
// sub-blocks 2j and 2j + 1.
struct KQ4K {
	static constexpr int BB = 144;
	template <int TT>
	__device__ static __forceinline__ void dot(const unsigned char* blk, int j, const signed char* xq, const float* xs, int xrow,
	                                           int srow, float (&acc)[TT]) {
		const uint4 hd = *(const uint4*)blk;
		const uint4 q0 = *(const uint4*)(blk + 16 + 32 * j), q1 = *(const uint4*)(blk + 32 + 32 * j);
		const float d = half_f((unsigned short)hd.x), dmin = half_f((unsigned short)(hd.x >> 16));
		const unsigned sb[3] = {hd.y, hd.z, hd.w};
		unsigned sc, m;
		q4k_scales_mins(sb, j, sc, m);
		const float ds1 = d * (float)(sc & 0xff), ds2 = d * (float)(sc >> 8), dm1 = dmin * (float)(m & 0xff), dm2 = dmin * (float)(m >> 8);
#pragma unroll
		for (int t = 0; t < TT; t++) {
			const uint4* x = (const uint4*)(xq + t * xrow + 64 * j);
			const int dl = dot16(q0, x[0], true) + dot16(q1, x[1], true);
			const int dh = dot16(q0, x[2], false) + dot16(q1, x[3], false);
			const float4 s = *(const float4*)(xs + t * srow + 4 * j); // s, s·Σq of groups 2j and 2j+1
			acc[t] += ds1 * s.x * (float)dl - dm1 * s.y + ds2 * s.z * (float)dh - dm2 * s.w;
		}
	}
};

// KQ6K: GGUF's Q6_K (tensor.Q6_K, ggml's block_q6_K: ql[128] low nibbles,
// qh[64] high 2 bits, 16 int8 scales, d as f16; 210 bytes, so a block sits
// at 2-byte alignment). Quarter sub: half h = sub/2 of the block (128
// values) and the 16 positions p0 = 16·(sub%2).. of each of the half's
// four 32-value quads (values 128h + 32quad + p: ql at 64h + p, or + 32,
// low or high nibble, qh at 128 + 32h + p, bits 2quad), each quad's 16
// values under one scale (8h + sub%2 + 2quad) and in one group of x.
struct KQ6K {
	static constexpr int BB = 210;
	template <int TT>
	__device__ static __forceinline__ void dot(const unsigned char* blk, int sub, const signed char* xq, const float* xs, int xrow,
	                                           int srow, float (&acc)[TT]) {
		const int h = sub >> 1, p0 = 16 * (sub & 1);
		const uint4 qa = ld16u(blk + 64 * h + p0), qb = ld16u(blk + 64 * h + 32 + p0), qh = ld16u(blk + 128 + 32 * h + p0);
		const float d = half_f(*(const unsigned short*)(blk + 208));
		const signed char* sc = (const signed char*)(blk + 192 + 8 * h + (sub & 1));
		const unsigned hw[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
		for (int quad = 0; quad < 4; quad++) {
			const uint4 src = quad & 1 ? qb : qa;
			const unsigned lw[4] = {src.x, src.y, src.z, src.w};
			int v[4];
#pragma unroll
			for (int i = 0; i < 4; i++) v[i] = q6_m32((lw[i] >> (4 * (quad >> 1)) & 0x0f0f0f0fu) | (hw[i] >> (2 * quad) & 0x03030303u) << 4);
			const float ds = d * (float)sc[2 * quad];
			const int off = 128 * h + 32 * quad + p0, g = 4 * h + quad;
#pragma unroll
			for (int t = 0; t < TT; t++) {
				const uint4 x = *(const uint4*)(xq + t * xrow + off);
				const int dot = dp4a(v[0], (int)x.x, dp4a(v[1], (int)x.y, dp4a(v[2], (int)x.z, dp4a(v[3], (int)x.w, 0))));
				acc[t] += ds * xs[t * srow + 2 * g] * (float)dot;
			}
		}
	}
};

// kq_round8 rounds piece i of x (8 values v; 4 consecutive lanes a group
// of 32) to int8 into xq, and the group's (s, s·Σq) into xs (kq_quantize).
__device__ __forceinline__ void kq_round8(const float (&v)[8], int i, int rowPieces, signed char* xq, float* xs, int xrow, int srow) {
	float a = 0.f;
#pragma unroll
	for (int k = 0; k < 8; k++) a = fmaxf(a, fabsf(v[k]));
	a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, 1));
	a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, 2));
	const float s = a > 0.f ? __fdiv_rn(a, 127.f) : 0.f, is = a > 0.f ? __fdiv_rn(127.f, a) : 0.f;
	unsigned lo = 0, hi = 0;
	int sum = 0;
#pragma unroll
	for (int k = 0; k < 8; k++) {
		int q = (int)rintf(v[k] * is);
		q = q > 127 ? 127 : q < -127 ? -127 : q;
		sum += q;
		if (k < 4) lo |= (unsigned)(q & 0xff) << (8 * k);
		else hi |= (unsigned)(q & 0xff) << (8 * (k - 4));
	}
	sum += __shfl_xor_sync(FULL_MASK, sum, 1);
	sum += __shfl_xor_sync(FULL_MASK, sum, 2);
	const int t = i / rowPieces, e = (i - t * rowPieces) * 8, b = e >> 8, o = e & 255;
	uint2 pair;
	pair.x = lo, pair.y = hi;
	*(uint2*)(xq + t * xrow + b * KQ_XSB + o) = pair;
	if ((i & 3) == 0) {
		float2 ss;
		ss.x = s, ss.y = s * (float)sum;
		*(float2*)(xs + t * srow + b * KQ_SSB + 2 * (o >> 5)) = ss;
	}
}

// kq_quantize rounds x[TT·K] into the block's shared memory (xq, xs: rows
// xrow bytes and srow floats apart, a super-block KQ_XSB bytes and KQ_SSB
// floats apart), as llama.cpp's quantize_q8_1 does: a thread 8 values (a
// piece), 4 threads a group of 32. Each round loads KQ_XP pieces a thread
// before it rounds any, so that their L2 round trips overlap (TT·K/8 is a
// multiple of 32: every warp runs a piece's shuffles whole).
// With a gain g (a folded norm's, K values; null: none) each value is
// multiplied by its column's gain, in float, before it is rounded.
#define KQ_XP 4
__device__ __forceinline__ void kq_quantize(const T* x, const T* g, int TT, int K, signed char* xq, float* xs, int xrow, int srow) {
	const int pieces = TT * K / 8, rowPieces = K / 8, nt = blockDim.x;
	for (int base = threadIdx.x; base < pieces; base += KQ_XP * nt) {
		uint4 raw[KQ_XP][8 / VEC];
#pragma unroll
		for (int p = 0; p < KQ_XP; p++)
			if (base + p * nt < pieces) ld8(x + 8LL * (base + p * nt), raw[p]);
#pragma unroll
		for (int p = 0; p < KQ_XP; p++) {
			if (base + p * nt >= pieces) break;
			const int i = base + p * nt;
			float v[8];
			unpack8(raw[p], v);
			if (g) {
				uint4 graw[8 / VEC];
				float gv[8];
				ld8(g + 8LL * (i % rowPieces), graw);
				unpack8(graw, gv);
#pragma unroll
				for (int k = 0; k < 8; k++) v[k] *= gv[k];
			}
			kq_round8(v, i, rowPieces, xq, xs, xrow, srow);
		}
	}
}

// The dynamic shared memory of gemv_kq_impl (kqShared in gemv.go): the
// warps' rings (KQ_RING for super-blocks of BB bytes), then x's int8
// values and its groups' scales.
#define KQ_UNIT(BB) (8 * (BB) + ((BB) % 16 ? 16 : 0))
#define KQ_RING(BB) (KQ_WARPS * KQ_STAGES * KQ_UNIT(BB))

// E stores the sums: OutStore, or AddStore (a folded norm's residual
// added); gain, when set, is a folded norm's gain (kq_quantize).
template <class F, int TT, class E>
__device__ __forceinline__ void gemv_kq_impl(const T* x, const T* gain, const unsigned char* w, int K, const E& e) {
	extern __shared__ __align__(16) unsigned char kq_smem[];
	pdl_trigger();
	constexpr int UNIT = 8 * F::BB, STAGE = KQ_UNIT(F::BB);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, bl = lane & 7, sub = lane >> 3;
	const int N = e.units(), nb = K / 256, ng = (nb + 7) / 8;
	const long long rowBytes = (long long)nb * F::BB;
	const int xrow = nb * KQ_XSB, srow = nb * KQ_SSB;
	unsigned char* ring = kq_smem + warp * KQ_STAGES * STAGE;
	signed char* xq = (signed char*)(kq_smem + KQ_RING(F::BB));
	float* xs = (float*)(kq_smem + KQ_RING(F::BB) + TT * xrow);
	const int gw = blockIdx.x * KQ_WARPS + warp, nw = gridDim.x * KQ_WARPS;
	const int units = gw < N ? ((N - 1 - gw) / nw + 1) * ng : 0;
	// The unit issued next: its row, group and ring slot.
	int in = 0, inRow = gw, inG = 0;
	auto issue = [&]() {
		if (in < units) {
			const int count = imin(8, nb - 8 * inG);
			const unsigned char* src = w + inRow * rowBytes + (long long)inG * UNIT;
			const unsigned dst = smem_addr(ring + (in % KQ_STAGES) * STAGE);
			const int off = (int)((unsigned long long)src & 15);
			if (count == 8 && off == 0) {
#pragma unroll
				for (int c = lane; c < UNIT / 16; c += 32) cp16(dst + 16 * c, src + 16 * c, true);
			} else { // a partial unit, or a Q6_K unit off the 16-byte grid
				const int bytes = off + count * F::BB;
				for (int c = lane; c < (bytes + 15) / 16; c += 32) cp16n(dst + 16 * c, src - off + 16 * c, imin(16, bytes - 16 * c));
			}
			if (++inG == ng) inG = 0, inRow += nw;
		}
		in++;
		cp_commit();
	};
#pragma unroll
	for (int u = 0; u < KQ_STAGES - 1; u++) issue();
	pdl_wait(); // x is the previous kernel's output
	kq_quantize(x, gain, TT, K, xq, xs, xrow, srow);
	__syncthreads();
	float acc[TT];
#pragma unroll
	for (int t = 0; t < TT; t++) acc[t] = 0.f;
	int n = gw, g = 0;
	for (int u = 0; u < units; u++) {
		issue();
		cp_wait<KQ_STAGES - 1>();
		__syncwarp(); // every lane's copies of unit u have landed
		const int b = 8 * g + bl, off = (int)((n * rowBytes + (long long)g * UNIT) & 15); // its offset in the stage (w is 16-byte aligned)
		if (b < nb)
			F::template dot<TT>(ring + (u % KQ_STAGES) * STAGE + off + bl * F::BB, sub, xq + b * KQ_XSB, xs + b * KQ_SSB, xrow, srow, acc);
		if (++g == ng) { // the end of a row: the warp's sums, lane t stores output t
#pragma unroll
			for (int t = 0; t < TT; t++) {
				float v = acc[t];
#pragma unroll
				for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
				if (lane == t) e.put(typename E::Pre{}, t, n, v, 0.f);
				acc[t] = 0.f;
			}
			g = 0, n += nw;
		}
		__syncwarp(); // unit u's slot is refilled by the next issue
	}
	cp_wait<0>();
}

// ---- KQ_END

// The kernels gemv.go launches: gemv_<format>_<T> for the formats q4k
// (KQ4K) and q6k (KQ6K); gemv_<format>_add_<T> adds a folded norm's
// residual to the sums (AddStore), gemv_<format>_gain_<T> multiplies x by a
// folded norm's gain before rounding it (GEMV.RunBlocksFolded).
#define GEMV_KQ(NAME, FMT, TT)                                                                                  \
	extern "C" __global__ void __launch_bounds__(32 * KQ_WARPS)                                                    \
	    gemv_##NAME##_##TT(const T* x, const unsigned char* w, void* out, int K, int N, int outF32) {              \
		gemv_kq_impl<FMT, TT>(x, nullptr, w, K, OutStore{out, N, outF32});                                        \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(32 * KQ_WARPS)                                                    \
	    gemv_##NAME##_add_##TT(const T* x, const unsigned char* w, T* out, int K, int N, const T* add) {           \
		gemv_kq_impl<FMT, TT>(x, nullptr, w, K, AddStore{out, N, add});                                           \
	}                                                                                                              \
	extern "C" __global__ void __launch_bounds__(32 * KQ_WARPS)                                                    \
	    gemv_##NAME##_gain_##TT(const T* x, const unsigned char* w, void* out, int K, int N, int outF32, const T* g) { \
		gemv_kq_impl<FMT, TT>(x, g, w, K, OutStore{out, N, outF32});                                              \
	}
#define GEMV_KQ_ALL(NAME, FMT) \
	GEMV_KQ(NAME, FMT, 1) GEMV_KQ(NAME, FMT, 2) GEMV_KQ(NAME, FMT, 3) GEMV_KQ(NAME, FMT, 4) \
	GEMV_KQ(NAME, FMT, 5) GEMV_KQ(NAME, FMT, 6) GEMV_KQ(NAME, FMT, 7) GEMV_KQ(NAME, FMT, 8)
// Part 1 of the GEMV module (KILN_PART_IS).
#if KILN_PART_IS(1)
GEMV_KQ_ALL(q4k, KQ4K)
GEMV_KQ_ALL(q6k, KQ6K)
#endif
