// kiln CUDA kernels. Compiled by NVRTC once per activation dtype with
// -DACT=f32|f16|bf16 (no CUDA headers needed). Activations are ACT, math and
// accumulation are f32; weights (norm weights, biases, embedding tables) are
// f32, f16 or bf16, picked by the kernel name's suffix (_wf32, _wf16,
// _wbf16). Semantics follow backend/cpu/ref.go.

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };
typedef float f32;
typedef ACT T;

#define NEG_INF (__int_as_float(0xff800000))
#define LOG2E 1.4426950408889634f
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ float tof(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float tof(f16 v) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
	return f;
}

template <typename X> __device__ __forceinline__ X fromf(float v);
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 fromf<bf16>(float v) {
	bf16 r;
	asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
	return r;
}
template <> __device__ __forceinline__ f16 fromf<f16>(float v) {
	f16 r;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
	return r;
}

__device__ __forceinline__ float lo16(unsigned w, bf16*) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi16(unsigned w, bf16*) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float lo16(unsigned w, f16*) { f16 h; h.x = (unsigned short)(w & 0xffffu); return tof(h); }
__device__ __forceinline__ float hi16(unsigned w, f16*) { f16 h; h.x = (unsigned short)(w >> 16); return tof(h); }

// unpack16 widens 16 raw bytes of X elements (the null pointer picks X) to floats.
__device__ __forceinline__ void unpack16(uint4 v, float* f, const float*) {
	f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y); f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
template <typename H> __device__ __forceinline__ void unpack16h(uint4 v, float* f) {
	unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		f[2 * i] = lo16(w[i], (H*)0);
		f[2 * i + 1] = hi16(w[i], (H*)0);
	}
}
__device__ __forceinline__ void unpack16(uint4 v, float* f, const bf16*) { unpack16h<bf16>(v, f); }
__device__ __forceinline__ void unpack16(uint4 v, float* f, const f16*) { unpack16h<f16>(v, f); }

// load16 reads 16 bytes (16/sizeof(X) elements) at p, 16-byte aligned, as floats.
template <typename X> __device__ __forceinline__ void load16(const X* p, float* f) {
	unpack16(*(const uint4*)p, f, p);
}

#define VEC (16 / (int)sizeof(T))

// load_wvec reads the VEC weights of type W at w (16-byte aligned) as
// floats: by 16-byte loads where they fill whole ones, else one at a time
// (f32 activations' VEC of 16-bit weights).
template <typename W> __device__ __forceinline__ void load_wvec(const W* w, float* f) {
	constexpr int per = 16 / (int)sizeof(W);
	if constexpr (VEC % per == 0) {
#pragma unroll
		for (int b = 0; b < VEC; b += per) load16(w + b, f + b);
	} else {
#pragma unroll
		for (int j = 0; j < VEC; j++) f[j] = tof(w[j]);
	}
}

// e4m3x2 packs E4M3(hi) into the high byte and E4M3(lo) into the low one,
// rounded to nearest even and saturated at ±448 (NaN stays NaN), as
// tensor.F32ToE4M3 (compute capability 8.9 on; the Go side refuses older
// devices).
__device__ __forceinline__ unsigned short e4m3x2(float lo, float hi) {
	unsigned short r = 0;
#if __CUDA_ARCH__ >= 890
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#endif
	return r;
}

// KV is the KV cache's element: the activation dtype, or E4M3 codes (scale
// 1, as tensor.F32ToE4M3 and the CPU's FP8 cache) in the module built with
// -DKV_F8 (kernels.NewFP8KV). kv_of stores a float as a cache element,
// kv_from an activation (bit for bit unless the cache is FP8).
#ifdef KV_F8
struct e4m3 { unsigned char x; };
typedef e4m3 KV;
__device__ __forceinline__ KV kv_of(float v) {
	KV r;
	r.x = (unsigned char)e4m3x2(v, 0.f);
	return r;
}
__device__ __forceinline__ KV kv_from(T v) { return kv_of(tof(v)); }
#else
typedef T KV;
__device__ __forceinline__ KV kv_of(float v) { return fromf<T>(v); }
__device__ __forceinline__ KV kv_from(T v) { return v; }
#endif

// pdl_enter starts a kernel that may have been launched as a programmatic
// dependent launch (Kernels.launchDep): it waits until the previous kernel
// in the stream has finished and its writes are visible, then lets the next
// kernel launch early (that one waits in turn). Every kernel launched that
// way calls it before touching memory that an earlier kernel may write;
// what no kernel writes (weights, tables, the step's batch uploaded before
// its first kernel) may be read before it. Before compute capability 9.0,
// or after a plain launch, it costs nothing.
__device__ __forceinline__ void pdl_enter() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}


__device__ __forceinline__ float4 f4(float x, float y, float z, float w) {
	float4 v;
	v.x = x; v.y = y; v.z = z; v.w = w;
	return v;
}
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// store16 rounds VEC floats to T and writes them as 16 bytes at p (16-byte aligned).
template <typename H> __device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
	return (unsigned)fromf<H>(lo).x | ((unsigned)fromf<H>(hi).x << 16);
}
// pack16 is VEC floats rounded to the type its second argument points to,
// as the 16 bytes store16 writes (a vector kept in registers: taking the
// address of one to store16 into puts it in local memory).
__device__ __forceinline__ uint4 pack16(const float* f, const float*) {
	uint4 w;
	w.x = __float_as_uint(f[0]), w.y = __float_as_uint(f[1]), w.z = __float_as_uint(f[2]), w.w = __float_as_uint(f[3]);
	return w;
}
template <typename H> __device__ __forceinline__ uint4 pack16(const float* f, const H*) {
	uint4 v;
	v.x = pack_h2<H>(f[0], f[1]);
	v.y = pack_h2<H>(f[2], f[3]);
	v.z = pack_h2<H>(f[4], f[5]);
	v.w = pack_h2<H>(f[6], f[7]);
	return v;
}
template <typename H> __device__ __forceinline__ void store16(H* p, const float* f) { *(uint4*)p = pack16(f, (const H*)0); }
// round_t is v rounded to T and back.
__device__ __forceinline__ float round_t(float v) { return tof(fromf<T>(v)); }

// The scales of an FP8 product (Kernels.QuantizeRowsE4M3, cuBLASLt with unit
// scales): sr[r] each row's (the activation's, per token), sc[c] each
// column's (the weight's, a scale a row of it); either may be null (1).
// scaled_of is the product's element x at (r, c) times both, rounded to T:
// what scale_rows_cols writes and what the kernels that read a product
// (swiglu_packed, rope_qkv_write) take when given the scales instead. With
// neither scale, x as it is. The multiplication is never contracted into
// a reader's next addition (__fmul_rn), so that f32 rounds as in two kernels.
// scale_round is that product and rounding for the two scales' product f.
__device__ __forceinline__ float scale_round(float x, float f) { return tof(fromf<T>(__fmul_rn(x, f))); }
__device__ __forceinline__ float scaled_of(float x, const float* sr, const float* sc, long long r, long long c) {
	if (!sr && !sc) return x;
	return scale_round(x, (sr ? sr[r] : 1.f) * (sc ? sc[c] : 1.f));
}

// col_scales16 is the VEC column scales of an FP8 product at columns c..
// (sc 16-byte aligned; null: ones).
__device__ __forceinline__ void col_scales16(const float* sc, int c, float* f) {
#pragma unroll
	for (int j = 0; j < VEC; j += 4) {
		float4 s4 = sc ? *(const float4*)(sc + c + j) : f4(1.f, 1.f, 1.f, 1.f);
		f[j] = s4.x, f[j + 1] = s4.y, f[j + 2] = s4.z, f[j + 3] = s4.w;
	}
}
// scale16 is load_scaled16's arithmetic on VEC loaded elements f of a row
// whose scale is fr, the columns' scales cs.
__device__ __forceinline__ void scale16(float* f, float fr, const float* cs) {
#pragma unroll
	for (int j = 0; j < VEC; j++) f[j] = scale_round(f[j], fr * cs[j]);
}

// load_scaled16 is load16 of VEC elements of an FP8 product at row r,
// columns c.. (sc, when not null, 16-byte aligned), each as scaled_of reads it.
__device__ __forceinline__ void load_scaled16(const T* p, const float* sr, const float* sc, long long r, int c, float* f) {
	load16(p, f);
	if (!sr && !sc) return;
	float cs[VEC];
	col_scales16(sc, c, cs);
	scale16(f, sr ? sr[r] : 1.f, cs);
}


__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

// block_reduce: every thread gets the block's sum (MAX: maximum), through
// sh[32]. blockDim.x is a multiple of 32.
template <bool MAX> __device__ __forceinline__ float warp_reduce(float v) { return MAX ? warp_max(v) : warp_sum(v); }
template <bool MAX> __device__ float block_reduce(float v, float* sh) {
	v = warp_reduce<MAX>(v);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.f;
	return warp_reduce<MAX>(v);
}
__device__ float block_sum(float v, float* sh) { return block_reduce<false>(v, sh); }
__device__ float block_max(float v, float* sh) { return block_reduce<true>(v, sh); }
// block_reduce_rows is block_reduce of R values at once through sh[32·R]:
// each value reduced in the same order as alone (the same bits), with one
// pair of barriers for all R instead of a pair each.
template <bool MAX, int R> __device__ __forceinline__ void block_reduce_rows(float (&v)[R], float* sh) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
	for (int k = 0; k < R; k++) v[k] = warp_reduce<MAX>(v[k]);
	__syncthreads();
	if (lane == 0) {
#pragma unroll
		for (int k = 0; k < R; k++) sh[32 * k + w] = v[k];
	}
	__syncthreads();
#pragma unroll
	for (int k = 0; k < R; k++) v[k] = warp_reduce<MAX>(lane < nw ? sh[32 * k + lane] : 0.f);
}

// The FP8 (E4M3) form of an activation's row for cuBLASLt's FP8 products
// (Kernels.QuantizeRowsE4M3 and the kernels that write their output that
// way): e4m3_scale is the row's scale for its max|x| m (m/448; 1 for an
// all-zero row), store_e4m3 writes VEC values divided by it as VEC bytes
// at q (VEC-byte aligned).
__device__ __forceinline__ float e4m3_scale(float m) { return m > 0.f ? __fdiv_rn(m, 448.f) : 1.f; }

// The division is x/s correctly rounded, as __fdiv_rn's, in a multiply and
// two FMAs a value, without __fdiv_rn's reciprocal, refinement and range
// check for each (an FP8 prefill's writers were bound by issue,
// docs/PERF.md, issue 16, session 40): with y = 1/s correctly
// rounded (a call's, once for its VEC values; s is the same over a row's
// calls, so the compiler may hoist it, which the SASS was not read to
// confirm), q = x·y is within an ulp of x/s, and Markstein's correction
// q − (q·s − x)·y, the remainder exact in an FMA, is x/s correctly
// rounded, for s within [2^-60, 2^60] (no remainder in the subnormals for
// any quotient E4M3 tells apart; other scales divide). The remainder is
// taken as q·s − x, not x − q·s, so that −0 stays −0 (an exact remainder
// is +0, and −(+0)·y + q keeps q's sign). Checked against __fdiv_rn on
// 4·10^8 random pairs, scales of every mantissa extreme (session 40), in
// TestFP8WritersEmulated, and on the GPU by TestQuantizeRowsE4M3 against
// Go's x/s.
__device__ __forceinline__ float e4m3_div(float x, float s, float y) {
	const float q = __fmul_rn(x, y);
	return __fmaf_rn(-__fmaf_rn(q, s, -x), y, q);
}
// store_codes writes VEC E4M3 codes, two to an element of p (e4m3x2's),
// as VEC bytes at q (VEC-byte aligned).
__device__ __forceinline__ void store_codes(unsigned char* q, const unsigned short* p) {
	if (VEC == 8) {
		uint2 w;
		w.x = p[0] | (unsigned)p[1] << 16;
		w.y = p[2] | (unsigned)p[3] << 16;
		*(uint2*)q = w;
	} else {
		*(unsigned*)q = p[0] | (unsigned)p[1] << 16;
	}
}
__device__ __forceinline__ void store_e4m3(unsigned char* q, const float* f, float s) {
	const bool fast = s >= 0x1p-60f && s <= 0x1p60f;
	const float y = __frcp_rn(s);
	unsigned short p[VEC / 2];
#pragma unroll
	for (int j = 0; j < VEC / 2; j++)
		p[j] = fast ? e4m3x2(e4m3_div(f[2 * j], s, y), e4m3_div(f[2 * j + 1], s, y))
		            : e4m3x2(__fdiv_rn(f[2 * j], s), __fdiv_rn(f[2 * j + 1], s));
	store_codes(q, p);
}

// block_rows starts the FP8-form writers that take R rows a block from
// row r0: each row's index (a last block's spare rows repeat the last row)
// and scale (sr's; 1 without).
template <int R>
__device__ __forceinline__ void block_rows(long long r0, int rows, const float* sr, long long (&rk)[R], float (&fr)[R]) {
#pragma unroll
	for (int k = 0; k < R; k++) {
		rk[k] = r0 + k < rows ? r0 + k : rows - 1;
		fr[k] = sr ? sr[rk[k]] : 1.f;
	}
}

// store_held_e4m3 ends the FP8-form writers that take R rows a block (rows
// r0.. of nv 16-byte vectors, those past rows spare): each row's scale from
// the block's maximum m[k] of it into qs (sh: 32·R floats), and its
// values, rounded to T, as E4M3 codes into q. The values wait in shared
// memory at held[k·hv ..], vectors i < hv of each row; a thread's vector
// from hv on (its last; hv is nv less the block's threads, or nv) in its
// registers, last[k].
template <int R>
__device__ __forceinline__ void store_held_e4m3(const uint4* held, int hv, const uint4 (&last)[R], const float (&m)[R], float* sh,
                                                unsigned char* q, float* qs, long long r0, int rows, int nv) {
	float s[R];
#pragma unroll
	for (int k = 0; k < R; k++) s[k] = m[k];
	block_reduce_rows<true>(s, sh);
#pragma unroll
	for (int k = 0; k < R; k++) s[k] = e4m3_scale(s[k]);
#pragma unroll
	for (int k = 0; k < R; k++) {
		if (r0 + k >= rows) break;
		if (threadIdx.x == 0) qs[r0 + k] = s[k];
		const uint4 kept = last[k]; // a value: selecting between last[k] and held's lvalues put last in local memory
		for (int i = threadIdx.x; i < nv; i += blockDim.x) {
			uint4 w = kept;
			if (i < hv) w = held[k * hv + i];
			float v[VEC];
			unpack16(w, v, (const T*)0);
			store_e4m3(q + ((r0 + k) * nv + i) * VEC, v, s[k]);
		}
	}
}

__device__ __forceinline__ int window_start(int p, int window) {
	return (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
}

// ---------------------------------------------------------------- embed

// grid (rows), block 256: out[r,:] = table[ids[r]-start,:]; the table holds
// rows [start, start+vocab) of a vocabulary of total (a tensor-parallel
// shard when start > 0 or vocab < total): an id of another shard gives
// zeros, one out of [0, total) NaN. Rows are times scale (Gemma's √dim).
template <typename W>
__device__ void embed_impl(const W* table, const int* ids, T* out, int rows, int vocab, int dim, int start, int total,
                           float scale) {
	pdl_enter();
	int r = blockIdx.x;
	if (r >= rows) return;
	int id = ids[r];
	T* dst = out + (long long)r * dim;
	if (id < 0 || id >= total) {
		for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = fromf<T>(__int_as_float(0x7fc00000));
		return;
	}
	id -= start;
	if (id < 0 || id >= vocab) {
		for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = fromf<T>(0.f);
		return;
	}
	const W* src = table + (long long)id * dim;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = fromf<T>(tof(src[c]) * scale);
}

// ---------------------------------------------------------------- rmsnorm

// grid (rows), block 256: out = x / sqrt(mean(x²)+eps) · w.
template <typename W>
__device__ void rmsnorm_impl(const T* x, const W* w, T* out, int rows, int dim, float eps) {
	pdl_enter();
	__shared__ float sh[32];
	const T* xr = x + (long long)blockIdx.x * dim;
	T* o = out + (long long)blockIdx.x * dim;
	float ss = 0.f;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) {
		float v = tof(xr[c]);
		ss += v * v;
	}
	ss = block_sum(ss, sh);
	float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = fromf<T>(tof(xr[c]) * scale * tof(w[c]));
}

// grid (rows), block 256: sum = x + r (stored as T); normed = RMSNorm(sum as stored, w).
// sum may alias x or r.
// x may be an FP8 product's with its scales sr and sc (scaled_of; null: none).
template <typename W>
__device__ void add_rmsnorm_impl(const T* x, const T* r, const float* sr, const float* sc, const W* w, T* sum, T* normed,
                                 int rows, int dim, float eps) {
	pdl_enter();
	__shared__ float sh[32];
	long long base = (long long)blockIdx.x * dim;
	float ss = 0.f;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) {
		T s = fromf<T>(scaled_of(tof(x[base + c]), sr, sc, blockIdx.x, c) + tof(r[base + c]));
		sum[base + c] = s;
		float v = tof(s);
		ss += v * v;
	}
	ss = block_sum(ss, sh);
	float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int c = threadIdx.x; c < dim; c += blockDim.x) normed[base + c] = fromf<T>(tof(sum[base + c]) * scale * tof(w[c]));
}

// row_inv_rms is 1/sqrt(mean(x²)+eps) of the row x[0, dim), as the norms
// compute their scale, every thread of the block taking part and getting
// it; x 16-byte aligned when dim is a multiple of VEC. The readers of a
// product whose input was a norm's unscaled row (its gain folded into the
// product's weights, Kernels.FoldGain) scale the product's rows by it.
__device__ float row_inv_rms(const T* x, int dim, float eps, float* sh) {
	float ss = 0.f;
	if (dim % VEC == 0) {
		for (int c = threadIdx.x * VEC; c < dim; c += blockDim.x * VEC) {
			float v[VEC];
			load16(x + c, v);
#pragma unroll
			for (int j = 0; j < VEC; j++) ss += v[j] * v[j];
		}
	} else {
		for (int c = threadIdx.x; c < dim; c += blockDim.x) {
			float v = tof(x[c]);
			ss += v * v;
		}
	}
	ss = block_sum(ss, sh);
	return 1.0f / sqrtf(ss / (float)dim + eps);
}

// The register path of rmsnorm and add_rmsnorm, for rows whose dim is a
// multiple of VEC and at most NORM_MAXV·VEC·blockDim: each thread loads its
// 16-byte vectors once (all the loads in flight together), keeps them in
// registers over the block's sum, and writes them scaled. With PREW its
// weights are loaded too, before the wait for the previous kernel (no kernel
// writes them): for the few rows of decode steps, where the norm's latency
// counts (the registers they take halve the blocks a multiprocessor holds:
// prefill's many rows take the plain variant). r null: plain
// rmsnorm (sum unused). sum may alias x or r: every thread reads its own
// elements before the block's sum and writes them after.
#define NORM_MAXV 8
// With Q the normalized row is written in its FP8 form instead (q, the
// row's scale into qs[row]; out unused): each value rounded to T, then as
// fp8_quant_rows would write that row.
// x may be an FP8 product's with its scales sr and sc (scaled_of; null:
// none).
template <typename W, bool PREW, bool Q = false>
__device__ void norm_vec_impl(const T* x, const T* r, const W* w, T* sum, T* out, int dim, float eps,
                              unsigned char* q = 0, float* qs = 0, const float* sr = 0, const float* sc = 0) {
	__shared__ float sh[32];
	long long base = (long long)blockIdx.x * dim;
	float wv[PREW ? NORM_MAXV : 1][VEC];
	if constexpr (PREW) {
#pragma unroll
		for (int i = 0; i < NORM_MAXV; i++) {
			int c = (threadIdx.x + i * blockDim.x) * VEC;
			if (c < dim) {
#pragma unroll
				for (int j = 0; j < VEC; j++) wv[i][j] = tof(w[c + j]);
			}
		}
	}
	pdl_enter();
	float v[NORM_MAXV][VEC];
	float ss = 0.f;
#pragma unroll
	for (int i = 0; i < NORM_MAXV; i++) {
		int c = (threadIdx.x + i * blockDim.x) * VEC;
		if (c < dim) {
			load_scaled16(x + base + c, sr, sc, blockIdx.x, c, v[i]);
			if (r) {
				float b[VEC];
				load16(r + base + c, b);
#pragma unroll
				for (int j = 0; j < VEC; j++) v[i][j] = round_t(v[i][j] + b[j]);
			}
#pragma unroll
			for (int j = 0; j < VEC; j++) ss += v[i][j] * v[i][j];
		}
	}
	ss = block_sum(ss, sh);
	float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	float m = 0.f;
#pragma unroll
	for (int i = 0; i < NORM_MAXV; i++) {
		int c = (threadIdx.x + i * blockDim.x) * VEC;
		if (c < dim) {
			if (r) store16(sum + base + c, v[i]);
			float o[VEC];
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				float wj;
				if constexpr (PREW) wj = wv[i][j];
				else wj = tof(w[c + j]);
				o[j] = v[i][j] * scale * wj;
			}
			if constexpr (Q) {
#pragma unroll
				for (int j = 0; j < VEC; j++) {
					v[i][j] = round_t(o[j]);
					m = fmaxf(m, fabsf(v[i][j]));
				}
			} else {
				store16(out + base + c, o);
			}
		}
	}
	if constexpr (Q) {
		const float s = e4m3_scale(block_max(m, sh));
		if (threadIdx.x == 0) qs[blockIdx.x] = s;
#pragma unroll
		for (int i = 0; i < NORM_MAXV; i++) {
			int c = (threadIdx.x + i * blockDim.x) * VEC;
			if (c < dim) store_e4m3(q + base + c, v[i], s);
		}
	}
}

// add_rmsnorm_vq for the many rows of a prefill: ROWS_N rows a block (grid
// ⌈rows/ROWS_N⌉, the block norm_vec_impl's), a thread the same 16-byte
// columns of each row as norm_vec_impl's thread, so that a column's scales
// and weights are loaded once for the block's rows and all its rows' loads
// are in flight together; the sums, then the normalized values, rounded to
// T, wait in shared memory (ROWS_N·dim elements of T, dynamic). The same
// bytes as norm_vec_impl's add and FP8 form: each row's squares summed in
// the same order over the same threads. sum may alias x or r (each thread
// reads its own elements before writing them); qs may be sr. Two rows:
// four rows' loads spilled 48 bytes a thread under the kernel's 64
// registers (bf16; 57 registers and none with two), and the FP8 prefill's
// norm took 26.3–28.2 µs a layer so against 25.3–26.5 (H200, session 42).
#define ROWS_N 2
// ROWS_NU: a thread's vectors of each row whose loads are issued together
// (the compiler may not move a later vector's loads above an earlier one's
// stores: sum may alias x or r). Two spilled 24 bytes (bf16) or 40 (f16)
// under the 64 registers and took 27–29 µs a call against one's 23.6–24.5
// in an FP8 prefill (H200, session 43).
#ifndef ROWS_NU
#define ROWS_NU 1
#endif
// ROWS_NB: the blocks a multiprocessor holds, in __launch_bounds__ (four:
// 64 registers a thread).
#ifndef ROWS_NB
#define ROWS_NB 4
#endif
template <typename W>
__device__ void add_norm_rows_q(const T* x, const T* r, const float* sr, const float* sc, const W* w, T* sum, unsigned char* q,
                                float* qs, int rows, int dim, float eps) {
	extern __shared__ uint4 held[]; // [ROWS_N][dim/VEC]
	__shared__ float sh[32 * ROWS_N];
	pdl_enter();
	const int nv = dim / VEC;
	const long long r0 = (long long)blockIdx.x * ROWS_N;
	long long base[ROWS_N];
	float fr[ROWS_N], ss[ROWS_N];
	block_rows<ROWS_N>(r0, rows, sr, base, fr);
#pragma unroll
	for (int k = 0; k < ROWS_N; k++) base[k] *= dim, ss[k] = 0.f;
	const bool scaled = sr || sc;
	for (int i0 = threadIdx.x; i0 < nv; i0 += ROWS_NU * blockDim.x) {
		uint4 xa[ROWS_NU][ROWS_N], ra[ROWS_NU][ROWS_N];
#pragma unroll
		for (int u = 0; u < ROWS_NU; u++) {
			const int c = (i0 + u * blockDim.x) * VEC;
			if (c < dim) {
#pragma unroll
				for (int k = 0; k < ROWS_N; k++) {
					xa[u][k] = *(const uint4*)(x + base[k] + c);
					ra[u][k] = *(const uint4*)(r + base[k] + c);
				}
			}
		}
#pragma unroll
		for (int u = 0; u < ROWS_NU; u++) {
			const int i = i0 + u * blockDim.x, c = i * VEC;
			if (c >= dim) break;
			float cs[VEC];
			col_scales16(sc, c, cs);
#pragma unroll
			for (int k = 0; k < ROWS_N; k++) {
				float v[VEC], b[VEC];
				unpack16(xa[u][k], v, (const T*)0);
				unpack16(ra[u][k], b, (const T*)0);
				if (scaled) scale16(v, fr[k], cs);
#pragma unroll
				for (int j = 0; j < VEC; j++) {
					v[j] = round_t(v[j] + b[j]);
					ss[k] += v[j] * v[j];
				}
				if (r0 + k < rows) store16(sum + base[k] + c, v);
				store16((T*)&held[k * nv + i], v);
			}
		}
	}
	float scale[ROWS_N], m[ROWS_N];
	block_reduce_rows<false>(ss, sh);
#pragma unroll
	for (int k = 0; k < ROWS_N; k++) {
		scale[k] = 1.0f / sqrtf(ss[k] / (float)dim + eps);
		m[k] = 0.f;
	}
	for (int i = threadIdx.x; i < nv; i += blockDim.x) {
		const int c = i * VEC;
		float wj[VEC];
		load_wvec(w + c, wj);
#pragma unroll
		for (int k = 0; k < ROWS_N; k++) {
			float v[VEC];
			unpack16(held[k * nv + i], v, (const T*)0);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				v[j] = round_t(v[j] * scale[k] * wj[j]);
				m[k] = fmaxf(m[k], fabsf(v[j]));
			}
			store16((T*)&held[k * nv + i], v);
		}
	}
	const uint4 none[ROWS_N] = {};
	store_held_e4m3<ROWS_N>(held, nv, none, m, sh, q, qs, r0, rows, nv);
}

// ---------------------------------------------------------------- add_bias

template <typename W>
__device__ void add_bias_impl(const T* x, const W* b, T* out, int rows, int cols) {
	pdl_enter();
	long long n = (long long)rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = fromf<T>(tof(x[i]) + tof(b[i % cols]));
}

// ---------------------------------------------------------------- fold_gain

// w[r, c] = w[r, c]·g[c] rounded to T, in place: a norm's gain folded into
// the weights [rows, cols] of the product that reads the norm.
template <typename W>
__device__ void fold_gain_impl(T* w, const W* g, int rows, int cols) {
	long long n = (long long)rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		w[i] = fromf<T>(tof(w[i]) * tof(g[i % cols]));
}

// The kernels below are part 0 of the kernels module (KILN_PART_IS).
#if KILN_PART_IS(0)

// The register-path norms of weight dtype W: rmsnorm_<V>_w<W> and
// add_rmsnorm_<V>_w<W>, PREW as norm_vec_impl's; the <V>q variants write
// the normalized rows in their FP8 form.
#define NORM_VEC_KERNELS(W, V, PREW)                                                                             \
	extern "C" __global__ void rmsnorm_##V##_w##W(const T* x, const W* w, T* out, int rows, int dim, float eps) {  \
		norm_vec_impl<W, PREW>(x, (const T*)0, w, (T*)0, out, dim, eps);                                            \
	}                                                                                                               \
	extern "C" __global__ void add_rmsnorm_##V##_w##W(const T* x, const T* r, const float* sr, const float* sc,    \
	                                                  const W* w, T* sum, T* normed, int rows, int dim, float eps) { \
		norm_vec_impl<W, PREW>(x, r, w, sum, normed, dim, eps, 0, 0, sr, sc);                                       \
	}                                                                                                               \
	extern "C" __global__ void rmsnorm_##V##q_w##W(const T* x, const W* w, unsigned char* q, float* qs, int rows,  \
	                                               int dim, float eps) {                                          \
		norm_vec_impl<W, PREW, true>(x, (const T*)0, w, (T*)0, (T*)0, dim, eps, q, qs);                             \
	}                                                                                                               \
	extern "C" __global__ void add_rmsnorm_##V##q_w##W(const T* x, const T* r, const float* sr, const float* sc,   \
	                                                   const W* w, T* sum, unsigned char* q, float* qs, int rows,    \
	                                                   int dim, float eps) {                                        \
		norm_vec_impl<W, PREW, true>(x, r, w, sum, (T*)0, dim, eps, q, qs, sr, sc);                                 \
	}

#define WEIGHT_KERNELS(W)                                                                                        \
	extern "C" __global__ void embed_w##W(const W* table, const int* ids, T* out, int rows, int vocab, int dim,   \
	                                      int start, int total, float scale) {                                     \
		embed_impl<W>(table, ids, out, rows, vocab, dim, start, total, scale);                                     \
	}                                                                                                              \
	extern "C" __global__ void rmsnorm_w##W(const T* x, const W* w, T* out, int rows, int dim, float eps) {       \
		rmsnorm_impl<W>(x, w, out, rows, dim, eps);                                                                \
	}                                                                                                              \
	extern "C" __global__ void add_rmsnorm_w##W(const T* x, const T* r, const float* sr, const float* sc,        \
	                                            const W* w, T* sum, T* normed, int rows, int dim, float eps) {   \
		add_rmsnorm_impl<W>(x, r, sr, sc, w, sum, normed, rows, dim, eps);                                         \
	}                                                                                                              \
	NORM_VEC_KERNELS(W, v, false)                                                                                  \
	extern "C" __global__ void __launch_bounds__(256, ROWS_NB) add_rmsnorm_rq_w##W(                                 \
	    const T* x, const T* r, const float* sr, const float* sc, const W* w, T* sum, unsigned char* q, float* qs,  \
	    int rows, int dim, float eps) {                                                                              \
		add_norm_rows_q<W>(x, r, sr, sc, w, sum, q, qs, rows, dim, eps);                                            \
	}                                                                                                              \
	NORM_VEC_KERNELS(W, vp, true)                                                                                  \
	extern "C" __global__ void add_bias_w##W(const T* x, const W* b, T* out, int rows, int cols) {               \
		add_bias_impl<W>(x, b, out, rows, cols);                                                                   \
	}                                                                                                              \
	extern "C" __global__ void fold_gain_w##W(T* w, const W* g, int rows, int cols) {                            \
		fold_gain_impl<W>(w, g, rows, cols);                                                                       \
	}

WEIGHT_KERNELS(f32)
WEIGHT_KERNELS(f16)
WEIGHT_KERNELS(bf16)

// scale_rows_cols: out[r, c] = x[r, c]·sr[r]·sc[c] (scaled_of).
extern "C" __global__ void scale_rows_cols(const T* x, const float* sr, const float* sc, T* out, int rows, int cols) {
	pdl_enter();
	long long n = (long long)rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = fromf<T>(scaled_of(tof(x[i]), sr, sc, i / cols, i % cols));
}

// ---------------------------------------------------------------- elementwise

#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// spin_ns holds its stream for ns nanoseconds of the device's global timer
// (profiled steps queue their kernels meanwhile).
extern "C" __global__ void spin_ns(unsigned long long ns) {
	unsigned long long t0, t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	} while (t - t0 < ns);
}

// grid (rows, ranks), block 256: out[r, k·n + c] = in[k, r, c] (f32): a
// tensor-parallel all-gather's rank-major logits laid out by rows.
extern "C" __global__ void interleave_ranks(const float* in, float* out, int rows, int n, int ranks) {
	pdl_enter();
	int r = blockIdx.x, k = blockIdx.y;
	const float* src = in + ((long long)k * rows + r) * n;
	float* dst = out + (long long)r * ranks * n + (long long)k * n;
	for (int c = threadIdx.x; c < n; c += blockDim.x) dst[c] = src[c];
}

extern "C" __global__ void add(const T* a, const T* b, T* out, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) + tof(b[i]));
}
extern "C" __global__ void mul(const T* a, const T* b, T* out, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) * tof(b[i]));
}
extern "C" __global__ void silu(const T* a, T* out, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) out[i] = fromf<T>(silu_f(tof(a[i])));
}
// x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GELU's tanh approximation
// (Gemma's GeGLU, ir.GELUTanh).
extern "C" __global__ void gelu_tanh(const T* a, T* out, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) {
		float x = tof(a[i]);
		out[i] = fromf<T>(0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))));
	}
}
// cap·tanh(x/cap) over f32 values: the logits' soft cap (Gemma 2,
// ir.SoftCap).
extern "C" __global__ void softcap_f32(const float* a, float* out, float cap, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) out[i] = cap * tanhf(a[i] / cap);
}
extern "C" __global__ void swiglu(const T* g, const T* u, T* out, long long n) {
	pdl_enter();
	GRID_STRIDE(i, n) out[i] = fromf<T>(silu_f(tof(g[i])) * tof(u[i]));
}
// swiglu over nv 16-byte vectors (16-byte aligned operands).
extern "C" __global__ void swiglu_v(const T* g, const T* u, T* out, long long nv) {
	pdl_enter();
	GRID_STRIDE(i, nv) {
		float a[VEC], b[VEC];
		load16(g + i * VEC, a);
		load16(u + i * VEC, b);
#pragma unroll
		for (int j = 0; j < VEC; j++) a[j] = silu_f(a[j]) * b[j];
		store16(out + i * VEC, a);
	}
}
// gu[rows, 2n] (gate columns, then up) → out[rows, n] = SiLU(gate)·up; gu
// an FP8 product's with its scales sr and sc (scaled_of; null: none).
extern "C" __global__ void swiglu_packed(const T* gu, const float* sr, const float* sc, T* out, int rows, int n) {
	pdl_enter();
	long long total = (long long)rows * n;
	GRID_STRIDE(i, total) {
		long long r = i / n;
		int c = (int)(i % n);
		const T* row = gu + r * 2 * n;
		out[i] = fromf<T>(silu_f(scaled_of(tof(row[c]), sr, sc, r, c)) * scaled_of(tof(row[n + c]), sr, sc, r, n + c));
	}
}
// scale_rows_cols by 16-byte vectors: cols = cvs·VEC, x, out and sc
// 16-byte aligned.
extern "C" __global__ void scale_rows_cols_v(const T* x, const float* sr, const float* sc, T* out, int rows, int cvs) {
	pdl_enter();
	long long total = (long long)rows * cvs;
	GRID_STRIDE(i, total) {
		long long r = i / cvs;
		float a[VEC];
		load_scaled16(x + i * VEC, sr, sc, r, (int)(i - r * cvs) * VEC, a);
		store16(out + i * VEC, a);
	}
}
// swiglu_vec writes the VEC outputs at column c of a row of n:
// SiLU(gate)·up from row (gate columns, then up), load(p, col, f) reading
// the VEC elements at p (columns col..) as the kernel sees them.
template <class L>
__device__ __forceinline__ void swiglu_vec(const T* row, int n, int c, T* out, L load) {
	float a[VEC], b[VEC];
	load(row + c, c, a);
	load(row + n + c, n + c, b);
#pragma unroll
	for (int j = 0; j < VEC; j++) a[j] = silu_f(a[j]) * b[j];
	store16(out + c, a);
}
// swiglu_packed for n = nv·VEC, by 16-byte vectors (16-byte aligned operands).
extern "C" __global__ void swiglu_packed_v(const T* gu, const float* sr, const float* sc, T* out, int rows, int nv) {
	pdl_enter();
	long long total = (long long)rows * nv;
	int n = nv * VEC;
	GRID_STRIDE(i, total) {
		long long r = i / nv;
		swiglu_vec(gu + r * 2 * n, n, (int)(i - r * nv) * VEC, out + r * n,
		           [&](const T* p, int col, float* f) { load_scaled16(p, sr, sc, r, col, f); });
	}
}
// swiglu_packed_v of a product whose rows are still to be divided by the
// rms of nx's rows (row_inv_rms; nx[rows, dim]): each element x read as
// x·inv rounded to T, as scaled_of reads a scaled product. Grid (chunks of
// a row, rows); 16-byte aligned operands, n = nv·VEC.
extern "C" __global__ void swiglu_packed_n(const T* gu, const T* nx, int dim, float eps, T* out, int nv) {
	__shared__ float sh[32];
	pdl_enter();
	const long long r = blockIdx.y;
	const float inv = row_inv_rms(nx + r * dim, dim, eps, sh);
	const int n = nv * VEC;
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += gridDim.x * blockDim.x)
		swiglu_vec(gu + r * 2 * n, n, i * VEC, out + r * n, [&](const T* p, int, float* f) {
			load16(p, f);
#pragma unroll
			for (int j = 0; j < VEC; j++) f[j] = round_t(__fmul_rn(f[j], inv));
		});
}
// swiglu_packed_v with its output in FP8 form, a block a row: each value
// rounded to T, then the row as fp8_quant_rows would write it (q, its scale
// into qs[row]). nv at most NORM_MAXV·blockDim.
extern "C" __global__ void swiglu_packed_q(const T* gu, const float* sr, const float* sc, unsigned char* q, float* qs, int nv) {
	__shared__ float sh[32];
	pdl_enter();
	const long long r = blockIdx.x;
	const int n = nv * VEC;
	const T* row = gu + r * 2 * n;
	float v[NORM_MAXV][VEC];
	float m = 0.f;
#pragma unroll
	for (int i = 0; i < NORM_MAXV; i++) {
		int c = (threadIdx.x + i * blockDim.x) * VEC;
		if (c < n) {
			float b[VEC];
			load_scaled16(row + c, sr, sc, r, c, v[i]);
			load_scaled16(row + n + c, sr, sc, r, n + c, b);
#pragma unroll
			for (int j = 0; j < VEC; j++) {
				v[i][j] = round_t(silu_f(v[i][j]) * b[j]);
				m = fmaxf(m, fabsf(v[i][j]));
			}
		}
	}
	const float s = e4m3_scale(block_max(m, sh));
	if (threadIdx.x == 0) qs[r] = s;
#pragma unroll
	for (int i = 0; i < NORM_MAXV; i++) {
		int c = (threadIdx.x + i * blockDim.x) * VEC;
		if (c < n) store_e4m3(q + r * n + c, v[i], s);
	}
}

// swiglu_packed_q for the many rows of a prefill: ROWS_Q rows a block
// (grid ⌈rows/ROWS_Q⌉, a thread a 16-byte column of the output at a time),
// so that a column's scales are loaded once for the block's rows, and all
// its rows' loads are in flight together; each value, rounded to T, waits
// for its row's maximum: in shared memory (ROWS_Q·hv vectors, dynamic,
// hv = nv less the block's threads), except a thread's last vector of each
// row, which waits in its registers. So Llama-3-8B's rows of 14,336 take
// 48 KB a block and four blocks fit on a multiprocessor (57 KB and three
// when every vector waited in shared memory: 2.6 waves of 1,024 blocks, at
// 1.5 TB/s on an FP8 prefill's 2,048 rows; docs/PERF.md, issue 16,
// session 40). The same bytes as swiglu_packed_q (every value and maximum
// computed alike; qs may be sr, each row's read before it is written).
#define ROWS_Q 2
// ROWS_QU: a thread's vectors of each row whose loads are issued
// together. Two spilled 120 bytes (bf16) under the 64 registers and took
// 111 µs a call against one's 66 (H200, session 43). In this form one
// spills nothing (the loop over i alone spilled 8 bytes in bf16).
#ifndef ROWS_QU
#define ROWS_QU 1
#endif
// ROWS_QB: the blocks a multiprocessor holds, in __launch_bounds__.
#ifndef ROWS_QB
#define ROWS_QB 4
#endif
extern "C" __global__ void __launch_bounds__(256, ROWS_QB) swiglu_packed_qr(const T* gu, const float* sr, const float* sc,
                                                                     unsigned char* q, float* qs, int rows, int nv) {
	extern __shared__ uint4 held[]; // [ROWS_Q][hv]
	__shared__ float sh[32 * ROWS_Q];
	pdl_enter();
	const int n = nv * VEC, hv = nv > (int)blockDim.x ? nv - (int)blockDim.x : 0;
	const long long r0 = (long long)blockIdx.x * ROWS_Q;
	long long rk[ROWS_Q];
	const T* row[ROWS_Q];
	float fr[ROWS_Q], m[ROWS_Q];
	uint4 last[ROWS_Q] = {};
	block_rows<ROWS_Q>(r0, rows, sr, rk, fr);
#pragma unroll
	for (int k = 0; k < ROWS_Q; k++) row[k] = gu + rk[k] * 2 * n, m[k] = 0.f;
	const bool scaled = sr || sc;
	for (int i0 = threadIdx.x; i0 < nv; i0 += ROWS_QU * blockDim.x) {
		uint4 g[ROWS_QU][ROWS_Q], u[ROWS_QU][ROWS_Q];
#pragma unroll
		for (int t = 0; t < ROWS_QU; t++) {
			const int c = (i0 + t * blockDim.x) * VEC;
			if (c < n) {
#pragma unroll
				for (int k = 0; k < ROWS_Q; k++) {
					g[t][k] = *(const uint4*)(row[k] + c);
					u[t][k] = *(const uint4*)(row[k] + n + c);
				}
			}
		}
#pragma unroll
		for (int t = 0; t < ROWS_QU; t++) {
			const int i = i0 + t * blockDim.x, c = i * VEC;
			if (i >= nv) break;
			float cg[VEC], cu[VEC];
			col_scales16(sc, c, cg);
			col_scales16(sc, n + c, cu);
#pragma unroll
			for (int k = 0; k < ROWS_Q; k++) {
				float a[VEC], b[VEC];
				unpack16(g[t][k], a, (const T*)0);
				unpack16(u[t][k], b, (const T*)0);
				if (scaled) {
					scale16(a, fr[k], cg);
					scale16(b, fr[k], cu);
				}
#pragma unroll
				for (int j = 0; j < VEC; j++) {
					a[j] = round_t(silu_f(a[j]) * b[j]);
					m[k] = fmaxf(m[k], fabsf(a[j]));
				}
				const uint4 v = pack16(a, (const T*)0);
				if (i < hv) {
					held[k * hv + i] = v;
				} else {
					last[k] = v;
				}
			}
		}
	}
	store_held_e4m3<ROWS_Q>(held, hv, last, m, sh, q, qs, r0, rows, nv);
}

// ---------------------------------------------------------------- FP8 activations
// Per-token dynamic FP8 (E4M3) quantization of an activation for cuBLASLt's
// FP8 products (Kernels.QuantizeRowsE4M3), one block a row of x[rows,
// cvs·VEC]: q = E4M3(x/s) with s = max|x|/448 of the row (1 for an all-zero
// row), rounded to nearest even and saturated at ±448, and s into
// scales[row]. The row is read once from memory (the second pass finds it
// in the cache). NaNs are not propagated into the maximum (fmaxf).
extern "C" __global__ void fp8_quant_rows(const T* x, unsigned char* q, float* scales, int cvs) {
	__shared__ float sh[32];
	pdl_enter();
	const long long r = blockIdx.x;
	const T* xr = x + r * cvs * VEC;
	unsigned char* qr = q + r * cvs * VEC;
	float m = 0.f;
	for (int i = threadIdx.x; i < cvs; i += blockDim.x) {
		float f[VEC];
		load16(xr + i * VEC, f);
#pragma unroll
		for (int j = 0; j < VEC; j++) m = fmaxf(m, fabsf(f[j]));
	}
	const float s = e4m3_scale(block_max(m, sh));
	if (threadIdx.x == 0) scales[r] = s;
	for (int i = threadIdx.x; i < cvs; i += blockDim.x) {
		float f[VEC];
		load16(xr + i * VEC, f);
		store_e4m3(qr + i * VEC, f, s);
	}
}

// ---------------------------------------------------------------- dequantization
// dequant_<format>: GGUF blocks of a matrix kept quantized on the device,
// widened to the activation dtype (Kernels.Dequantize) for a product
// through cuBLASLt. A thread per group of 32 values (a Q8_0 or Q4_0 block;
// an eighth of a K-quant super-block), computing each value with the float
// operations, in the order, of tensor's reference decoders (ggml.go),
// unfused (__fmul_rn, __fsub_rn), so that the widened values are those the
// host's conversion gives, rounded the same way.

__device__ __forceinline__ float f16_at(const unsigned char* p) {
	f16 h;
	h.x = (unsigned short)(p[0] | p[1] << 8);
	return tof(h);
}

__device__ __forceinline__ void dq_store(T* out, const float* y) {
#pragma unroll
	for (int i = 0; i < 32; i += VEC) store16(out + i, y + i);
}

// dequant_run widens the groups of 32 values, a thread a group: decode(b,
// i, y) writes group i of the block at b (GPB groups of 32 values a block
// of BYTES bytes) into y. With srcs, each row of blocks of the grid widens
// matrix blockIdx.y of a table instead (groups each: a mixture's experts,
// Kernels.DequantizeExperts): srcs[y] into dsts[y], skipped where count,
// when given, counts no entry for its expert y % experts.
#define DQ_PARAMS                                                                                                    \
	const unsigned char *w, T *out, long long groups, const unsigned long long *srcs, const unsigned long long *dsts, \
	    const int *count, int experts
#define DQ_ARGS w, out, groups, srcs, dsts, count, experts
template <int BYTES, int GPB, class F>
__device__ __forceinline__ void dequant_run(DQ_PARAMS, F decode) {
	pdl_enter();
	if (srcs) {
		const int j = blockIdx.y;
		if (count && count[j % experts] == 0) return;
		w = (const unsigned char*)srcs[j];
		out = (T*)dsts[j];
	}
	GRID_STRIDE(g, groups) {
		float y[32];
		decode(w + g / GPB * BYTES, (int)(g % GPB), y);
		dq_store(out + g * 32, y);
	}
}

// u32_at is the little-endian uint32 at p (any alignment).
__device__ __forceinline__ unsigned u32_at(const unsigned char* p) {
	return (unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24;
}

extern "C" __global__ void dequant_q8_0(DQ_PARAMS) {
	dequant_run<34, 1>(DQ_ARGS, [](const unsigned char* b, int, float* y) {
		const float d = f16_at(b);
#pragma unroll
		for (int j = 0; j < 32; j++) y[j] = __fmul_rn((float)(signed char)b[2 + j], d);
	});
}

// Q4_0 and IQ4_NL: d, 16 bytes; byte j holds element j (low nibble) and
// j + 16 (high): y = (q − 8)·d, or d·v[q] for IQ4_NL's levels v (ggml's
// kvalues_iq4nl).
__device__ const signed char iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
template <bool NL>
__device__ __forceinline__ void dequant_nib4(DQ_PARAMS) {
	dequant_run<18, 1>(DQ_ARGS, [](const unsigned char* b, int, float* y) {
		const float d = f16_at(b);
#pragma unroll
		for (int j = 0; j < 16; j++) {
			const int q = b[2 + j], lo = NL ? iq4nl_values[q & 15] : (q & 15) - 8, hi = NL ? iq4nl_values[q >> 4] : (q >> 4) - 8;
			y[j] = __fmul_rn((float)lo, d);
			y[j + 16] = __fmul_rn((float)hi, d);
		}
	});
}
extern "C" __global__ void dequant_q4_0(DQ_PARAMS) { dequant_nib4<false>(DQ_ARGS); }
extern "C" __global__ void dequant_iq4_nl(DQ_PARAMS) { dequant_nib4<true>(DQ_ARGS); }

// Q4_1: d, m, nibbles as Q4_0's: y = q·d + m.
extern "C" __global__ void dequant_q4_1(DQ_PARAMS) {
	dequant_run<20, 1>(DQ_ARGS, [](const unsigned char* b, int, float* y) {
		const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
		for (int j = 0; j < 16; j++) {
			const int q = b[4 + j];
			y[j] = __fadd_rn(__fmul_rn((float)(q & 15), d), m);
			y[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
		}
	});
}

// Q5_0 and Q5_1: d (and m), 32 high bits, low nibbles as Q4_0's: y =
// (q − 16)·d, or q·d + m.
template <bool Q51>
__device__ __forceinline__ void dequant_q5(DQ_PARAMS) {
	dequant_run<Q51 ? 24 : 22, 1>(DQ_ARGS, [](const unsigned char* b, int, float* y) {
		constexpr int QH = Q51 ? 4 : 2;
		const float d = f16_at(b), m = Q51 ? f16_at(b + 2) : 0.f;
		const unsigned qh = u32_at(b + QH);
		const unsigned char* q = b + QH + 4;
#pragma unroll
		for (int j = 0; j < 16; j++) {
			const int lo = (q[j] & 15) | ((qh >> j) << 4 & 0x10), hi = (q[j] >> 4) | (qh >> (j + 12) & 0x10);
			if (Q51) {
				y[j] = __fadd_rn(__fmul_rn((float)lo, d), m);
				y[j + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
			} else {
				y[j] = __fmul_rn((float)(lo - 16), d);
				y[j + 16] = __fmul_rn((float)(hi - 16), d);
			}
		}
	});
}
extern "C" __global__ void dequant_q5_0(DQ_PARAMS) { dequant_q5<false>(DQ_ARGS); }
extern "C" __global__ void dequant_q5_1(DQ_PARAMS) { dequant_q5<true>(DQ_ARGS); }

// Q2_K and Q3_K: group i (0..7) of a super-block is pass i%4 (shift 2·(i%4))
// over the 32 quant bytes of half i/4: its sub-blocks 2i and 2i+1 take
// bytes 0..15 and 16..31 (tensor's decodeQ2_K, decodeQ3_K).
extern "C" __global__ void dequant_q2_k(DQ_PARAMS) {
	dequant_run<84, 8>(DQ_ARGS, [](const unsigned char* b, int i, float* y) {
		const int shift = 2 * (i & 3);
		const unsigned char* q = b + 16 + 32 * (i >> 2);
		const float d = f16_at(b + 80), dmin = f16_at(b + 82);
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int s = b[2 * i + h];
			const float dl = __fmul_rn(d, (float)(s & 15)), ml = __fmul_rn(dmin, (float)(s >> 4));
#pragma unroll
			for (int l = 0; l < 16; l++) y[16 * h + l] = __fsub_rn(__fmul_rn(dl, (float)((q[16 * h + l] >> shift) & 3)), ml);
		}
	});
}

// Q3_K's 16 6-bit scales are unpacked from 12 bytes as ggml does (kmask1,
// kmask2); a value is its 2 low bits, less 4 unless its hmask bit (bit
// 4·(i/4) + i%4 of the 32 hmask bytes) is set, times d·(scale − 32).
extern "C" __global__ void dequant_q3_k(DQ_PARAMS) {
	dequant_run<110, 8>(DQ_ARGS, [](const unsigned char* b, int i, float* y) {
		const int shift = 2 * (i & 3);
		const unsigned char* hm = b;
		const unsigned char* q = b + 32 + 32 * (i >> 2);
		const unsigned mb = 1u << (4 * (i >> 2) + (i & 3));
		const float d = f16_at(b + 108);
		const unsigned kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu;
		const unsigned a0 = u32_at(b + 96), a1 = u32_at(b + 100), tmp = u32_at(b + 104);
		unsigned aux[4];
		aux[0] = (a0 & kmask2) | ((tmp & kmask1) << 4);
		aux[1] = (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4);
		aux[2] = ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
		aux[3] = ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int is = 2 * i + h;
			const int sc = (signed char)(aux[is >> 2] >> (8 * (is & 3)));
			const float dl = __fmul_rn(d, (float)(sc - 32));
#pragma unroll
			for (int l = 0; l < 16; l++) {
				int v = (q[16 * h + l] >> shift) & 3;
				if (!(hm[16 * h + l] & mb)) v -= 4;
				y[16 * h + l] = __fmul_rn(dl, (float)v);
			}
		}
	});
}

// k_scale_min is ggml's get_scale_min_k4 (tensor.KScaleMin).
__device__ __forceinline__ void k_scale_min(int j, const unsigned char* q, int& sc, int& m) {
	if (j < 4) {
		sc = q[j] & 63, m = q[j + 4] & 63;
	} else {
		sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4), m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

// Q4_K and Q5_K: group i (0..7) of a super-block is sub-block i: the low
// (i even) or high (i odd) nibbles of bytes 32·(i/2).. of the quants, plus
// bit i of qh (Q5_K).
template <bool Q5>
__device__ __forceinline__ void dequant_k45(DQ_PARAMS) {
	dequant_run<Q5 ? 176 : 144, 8>(DQ_ARGS, [](const unsigned char* b, int i, float* y) {
		const float d = f16_at(b), dmin = f16_at(b + 2);
		int sc, m;
		k_scale_min(i, b + 4, sc, m);
		const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
		const unsigned char* q = b + (Q5 ? 48 : 16) + 32 * (i >> 1);
		const unsigned char* qh = b + 16;
#pragma unroll
		for (int l = 0; l < 32; l++) {
			int v = (i & 1) ? q[l] >> 4 : q[l] & 15;
			if (Q5 && (qh[l] >> i) & 1) v += 16;
			y[l] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
		}
	});
}
extern "C" __global__ void dequant_q4_k(DQ_PARAMS) { dequant_k45<false>(DQ_ARGS); }
extern "C" __global__ void dequant_q5_k(DQ_PARAMS) { dequant_k45<true>(DQ_ARGS); }

// Q6_K: group i (0..7) is elements 32i.. of the super-block: pass n = i/4
// of 128, run r = i%4 (q1..q4 of tensor's decodeQ6_K).
extern "C" __global__ void dequant_q6_k(DQ_PARAMS) {
	dequant_run<210, 8>(DQ_ARGS, [](const unsigned char* b, int i, float* y) {
		const int n = i >> 2, r = i & 3;
		const unsigned char* ql = b + 64 * n;
		const unsigned char* qh = b + 128 + 32 * n;
		const signed char* sc = (const signed char*)(b + 192 + 8 * n);
		const float d = f16_at(b + 208);
#pragma unroll
		for (int l = 0; l < 32; l++) {
			const int lo = (r & 1) ? ql[l + 32] : ql[l];
			const int nib = (r & 2) ? lo >> 4 : lo & 15;
			const int q = (nib | ((qh[l] >> (2 * r)) & 3) << 4) - 32;
			y[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16 + 2 * r]), (float)q);
		}
	});
}

// ---------------------------------------------------------------- rope, kv write

// rotate_pair rotates the pair (a, b) of head vector v (of x) by the table row of p.
__device__ __forceinline__ void rope_pair(int i, int half, int interleaved, int* a, int* b) {
	if (interleaved) {
		*a = 2 * i;
		*b = 2 * i + 1;
	} else {
		*a = i;
		*b = i + half;
	}
}

// out may equal x. One thread per rotated pair.
extern "C" __global__ void rope(const T* x, T* out, const int* pos, const float* table, int rows, int heads, int hd,
                                int interleaved) {
	pdl_enter();
	int half = hd / 2;
	long long n = (long long)rows * heads * half;
	GRID_STRIDE(idx, n) {
		int i = (int)(idx % half);
		long long rh = idx / half;
		int t = (int)(rh / heads);
		int p = pos[t];
		float c = table[(long long)p * hd + i], s = table[(long long)p * hd + half + i];
		int a, b;
		rope_pair(i, half, interleaved, &a, &b);
		long long base = rh * hd;
		float x1 = tof(x[base + a]), x2 = tof(x[base + b]);
		out[base + a] = fromf<T>(rot1(x1, x2, c, s));
		out[base + b] = fromf<T>(rot2(x1, x2, c, s));
	}
}

// kc, vc: one layer's cache [slots][width]; k, v: [rows][width]; slots[t] is token t's cache slot.
extern "C" __global__ void kv_write(const T* k, const T* v, KV* kc, KV* vc, const int* slots, int rows, int width) {
	pdl_enter();
	long long n = (long long)rows * width;
	GRID_STRIDE(idx, n) {
		int t = (int)(idx / width), e = (int)(idx % width);
		long long at = (long long)slots[t] * width + e;
		kc[at] = kv_from(k[idx]);
		vc[at] = kv_from(v[idx]);
	}
}

// RoPE on k (kvHeads heads of hd), then k and v into their cache slots.
extern "C" __global__ void rope_kv_write(const T* k, const T* v, KV* kc, KV* vc, const int* pos, const int* slots,
                                         const float* table, int rows, int kvHeads, int hd, int interleaved) {
	pdl_enter();
	int half = hd / 2, width = kvHeads * hd;
	long long n = (long long)rows * kvHeads * half;
	GRID_STRIDE(idx, n) {
		int i = (int)(idx % half);
		long long rh = idx / half;
		int t = (int)(rh / kvHeads), h = (int)(rh % kvHeads);
		int p = pos[t];
		float c = table[(long long)p * hd + i], s = table[(long long)p * hd + half + i];
		int a, b;
		rope_pair(i, half, interleaved, &a, &b);
		long long src = rh * hd;
		long long dst = (long long)slots[t] * width + (long long)h * hd;
		float x1 = tof(k[src + a]), x2 = tof(k[src + b]);
		kc[dst + a] = kv_of(rot1(x1, x2, c, s));
		kc[dst + b] = kv_of(rot2(x1, x2, c, s));
		vc[dst + a] = kv_from(v[src + a]);
		vc[dst + b] = kv_from(v[src + b]);
	}
}

// rope_qkv_pair takes apart pair i of head h (of heads + 2·kvHeads) of a
// token's stacked Q, K and V: x(c) is the head's element c as read (a
// product's, scaled or not), v(c) that element as a cache element. A query
// head's pair is rotated into qt (the token's queries), a key head's into
// its cache slot's row ks, a value head's two elements stored into vs; cs
// is the token's table row (cosines, then sines).
template <class X, class V>
__device__ __forceinline__ void rope_qkv_pair(X x, V v, int h, int i, T* qt, KV* ks, KV* vs, const float* cs, int heads, int kvHeads,
                                              int hd, int interleaved) {
	const int half = hd / 2;
	if (h >= heads + kvHeads) {
		KV* dst = vs + (long long)(h - heads - kvHeads) * hd;
		dst[2 * i] = v(2 * i);
		dst[2 * i + 1] = v(2 * i + 1);
		return;
	}
	float c = cs[i], s = cs[half + i];
	int a, b;
	rope_pair(i, half, interleaved, &a, &b);
	float x1 = x(a), x2 = x(b);
	if (h < heads) {
		T* dst = qt + (long long)h * hd;
		dst[a] = fromf<T>(rot1(x1, x2, c, s));
		dst[b] = fromf<T>(rot2(x1, x2, c, s));
	} else {
		KV* dst = ks + (long long)(h - heads) * hd;
		dst[a] = kv_of(rot1(x1, x2, c, s));
		dst[b] = kv_of(rot2(x1, x2, c, s));
	}
}

// qkv[rows, (heads+2·kvHeads)·hd], the stacked Q, K and V of each token:
// q heads rotated into q[rows, heads·hd], k heads rotated and v heads stored
// into the cache slots. One thread per rotated pair (q and k) or per pair of
// v elements. qkv may be an FP8 product's with its scales sr and sc
// (scaled_of; null: none).
extern "C" __global__ void rope_qkv_write(const T* qkv, const float* sr, const float* sc, T* q, KV* kc, KV* vc,
                                          const int* pos, const int* slots, const float* table, int rows, int heads,
                                          int kvHeads, int hd, int interleaved) {
	pdl_enter();
	int half = hd / 2, nh = heads + 2 * kvHeads, width = kvHeads * hd;
	long long n = (long long)rows * nh * half;
	GRID_STRIDE(idx, n) {
		int i = (int)(idx % half);
		long long rh = idx / half;
		int t = (int)(rh / nh), h = (int)(rh % nh);
		const T* src = qkv + rh * hd;
		const long long col = (long long)h * hd, slot = (long long)slots[t] * width;
		rope_qkv_pair([&](int c) { return scaled_of(tof(src[c]), sr, sc, t, col + c); },
		              [&](int c) { return sr || sc ? kv_of(scaled_of(tof(src[c]), sr, sc, t, col + c)) : kv_from(src[c]); }, h, i,
		              q + (long long)t * heads * hd, kc + slot, vc + slot, table + (long long)pos[t] * hd, heads, kvHeads, hd, interleaved);
	}
}

// rope_qkv_write by rows: grid (chunks of a row's pairs, rows), the token's
// slot and position read once a block and no 64-bit division a pair (the
// grid-stride form streamed an FP8 prefill's 2,048 rows at 0.56 TB/s,
// docs/PERF.md issue 16, session 32). The same values as rope_qkv_write.
#define ROPE_P 4
extern "C" __global__ void rope_qkv_write_r(const T* qkv, const float* sr, const float* sc, T* q, KV* kc, KV* vc,
                                            const int* pos, const int* slots, const float* table, int heads, int kvHeads,
                                            int hd, int interleaved) {
	pdl_enter();
	const int t = blockIdx.y;
	const int half = hd / 2, nh = heads + 2 * kvHeads, width = kvHeads * hd, pairs = nh * half;
	const long long slot = (long long)slots[t] * width;
	const float* cs = table + (long long)pos[t] * hd;
	const T* row = qkv + (long long)t * nh * hd;
	const float fr = sr ? sr[t] : 1.f;
	const int stride = blockDim.x * ROPE_P;
	// ROPE_P pairs a thread, their elements (a spare pair repeats the last)
	// and column scales loaded before any is used: the two elements a pair
	// of rope_qkv_pair reads, (a, b) of a query or key head, (2i, 2i+1) of
	// a value head.
	for (int j0 = blockIdx.x * stride + threadIdx.x; j0 < pairs; j0 += gridDim.x * stride) {
		T e[ROPE_P][2];
		float f[ROPE_P][2];
		int ca[ROPE_P];
#pragma unroll
		for (int p = 0; p < ROPE_P; p++) {
			const int j = imin(j0 + p * blockDim.x, pairs - 1), h = j / half, i = j % half;
			int a = 2 * i, b = 2 * i + 1;
			if (h < heads + kvHeads) rope_pair(i, half, interleaved, &a, &b);
			ca[p] = a;
			const int col = h * hd;
			e[p][0] = row[col + a];
			e[p][1] = row[col + b];
			f[p][0] = fr * (sc ? sc[col + a] : 1.f);
			f[p][1] = fr * (sc ? sc[col + b] : 1.f);
		}
#pragma unroll
		for (int p = 0; p < ROPE_P; p++) {
			const int j = j0 + p * blockDim.x, h = j / half;
			if (j >= pairs) break;
			// scaled_of with the loaded scales. The element and scale are
			// chosen as values: indexing e[p] and f[p] by c != ca[p] put them
			// in local memory (session 41, TestKernelResources).
			auto el = [&](int c) { return c != ca[p] ? e[p][1] : e[p][0]; };
			auto x = [&](int c) {
				const float fc = c != ca[p] ? f[p][1] : f[p][0];
				return sr || sc ? scale_round(tof(el(c)), fc) : tof(el(c));
			};
			rope_qkv_pair(x, [&](int c) { return sr || sc ? kv_of(x(c)) : kv_from(el(c)); }, h, j % half,
			              q + (long long)t * heads * hd, kc + slot, vc + slot, cs, heads, kvHeads, hd, interleaved);
		}
	}
}

// store_kv16 stores VEC floats at p as cache elements (kv_of each): 16
// bytes of T, or VEC E4M3 codes (VEC-byte aligned).
__device__ __forceinline__ void store_kv16(KV* p, const float* f) {
#ifdef KV_F8
	unsigned short c[VEC / 2];
#pragma unroll
	for (int j = 0; j < VEC / 2; j++) c[j] = e4m3x2(f[2 * j], f[2 * j + 1]);
	store_codes((unsigned char*)p, c);
#else
	store16(p, f);
#endif
}

// rope_qkv_write_r in 16-byte vectors: a thread takes a unit of a head,
// VEC of a query or key head's pairs (the vector of their first elements
// and the vector of their second: i.. and half+i.., or 2i.. interleaved,
// two vectors in a row) or 2·VEC elements of a value head, and loads its
// column scales, cosines and sines as vectors too, so that the index
// arithmetic and the loads are a unit's, not a pair's (rope_qkv_write_r
// was bound by instruction issue at 1.0 TB/s on an FP8 prefill's 2,048
// rows: docs/PERF.md, issue 16, session 40). half a multiple of VEC, rows,
// table rows and operands 16-byte aligned (Kernels.RoPEQKVWrite checks).
// Grid (chunks of a row's units, blockDim·ROPE_UNITS a block, rows). The same
// values as rope_qkv_write.
//
// rope_unit is unit j of a token's row: head h, the head's unit u, its two
// vectors at elements e0 and e1 of the head; rotated for a query or key
// head.
struct rope_unit {
	int h, u, e0, e1;
	bool rotated;
};
__device__ __forceinline__ rope_unit rope_unit_of(int j, int per, int half, int heads, int kvHeads, int interleaved) {
	rope_unit w;
	w.h = j / per;
	w.u = j - w.h * per;
	w.rotated = w.h < heads + kvHeads;
	const bool apart = w.rotated && !interleaved;
	w.e0 = apart ? w.u * VEC : 2 * w.u * VEC;
	w.e1 = apart ? half + w.u * VEC : w.e0 + VEC;
	return w;
}
// rope_row is what a token t's units share: the units a row, the token's
// stacked Q, K and V (src), its queries (qt), its cache slot's rows (ks,
// vs) and its table row (cs).
struct rope_row {
	int half, per, units;
	const T* src;
	T* qt;
	KV *ks, *vs;
	const float* cs;
};
__device__ __forceinline__ rope_row rope_row_of(int t, const T* qkv, T* q, KV* kc, KV* vc, const int* pos, const int* slots,
                                                const float* table, int heads, int kvHeads, int hd) {
	rope_row r;
	r.half = hd / 2;
	r.per = r.half / VEC;
	const int nh = heads + 2 * kvHeads;
	r.units = nh * r.per;
	const long long slot = (long long)slots[t] * kvHeads * hd;
	r.src = qkv + (long long)t * nh * hd;
	r.qt = q + (long long)t * heads * hd;
	r.ks = kc + slot;
	r.vs = vc + slot;
	r.cs = table + (long long)pos[t] * hd;
	return r;
}
// rope_unit_load loads unit w's two vectors of row r (as stored).
__device__ __forceinline__ void rope_unit_load(const rope_row& r, const rope_unit& w, int hd, float* x) {
	load16(r.src + w.h * hd + w.e0, x);
	load16(r.src + w.h * hd + w.e1, x + VEC);
}
// rope_unit_store ends a unit whose 2·VEC elements x are read (scaled or
// divided, rounded to T): a value head's stored into its cache row vs, a
// query or key head's pairs rotated by the token's table row cs (pair k
// is (x[k], x[VEC+k]), or (x[2k], x[2k+1]) interleaved; its results go
// where its elements came from) into its queries qt or its cache row ks.
__device__ __forceinline__ void rope_unit_store(const rope_unit& w, const float* x, const float* cs, int half, int heads, int kvHeads,
                                                int hd, int interleaved, T* qt, KV* ks, KV* vs) {
	if (!w.rotated) {
		KV* dst = vs + (long long)(w.h - heads - kvHeads) * hd;
		store_kv16(dst + w.e0, x);
		store_kv16(dst + w.e1, x + VEC);
		return;
	}
	float c[VEC], s[VEC], o[2 * VEC];
	col_scales16(cs, w.u * VEC, c);
	col_scales16(cs, half + w.u * VEC, s);
	// Two loops, so that every index is known at compile time: one loop
	// choosing a and b by interleaved put x and o in local memory (116
	// registers and local loads, session 41's profile).
	if (interleaved) {
#pragma unroll
		for (int k = 0; k < VEC; k++) {
			o[2 * k] = rot1(x[2 * k], x[2 * k + 1], c[k], s[k]);
			o[2 * k + 1] = rot2(x[2 * k], x[2 * k + 1], c[k], s[k]);
		}
	} else {
#pragma unroll
		for (int k = 0; k < VEC; k++) {
			o[k] = rot1(x[k], x[VEC + k], c[k], s[k]);
			o[VEC + k] = rot2(x[k], x[VEC + k], c[k], s[k]);
		}
	}
	if (w.h < heads) {
		T* dst = qt + (long long)w.h * hd;
		store16(dst + w.e0, o);
		store16(dst + w.e1, o + VEC);
	} else {
		KV* dst = ks + (long long)(w.h - heads) * hd;
		store_kv16(dst + w.e0, o);
		store_kv16(dst + w.e1, o + VEC);
	}
}

// ROPE_UNITS is the units a thread of rope_qkv_write_v takes: a block
// covers blockDim·ROPE_UNITS units of a row (Llama-3-8B's 384 in one
// block; kernels.go's ropeUnits). ROPE_U of them are loaded before the
// first is used, so that every thread has several loads in flight: two
// (64 registers on the H200's NVRTC 13.0; all four took 114, and the
// kernel 23.6 µs a layer of an FP8 prefill against 16.9 with two, session
// 42). The host emulation also builds it with four.
#define ROPE_UNITS 4
#ifndef ROPE_U
#define ROPE_U 2
#endif
static_assert(ROPE_UNITS % ROPE_U == 0, "ROPE_U divides ROPE_UNITS");
extern "C" __global__ void rope_qkv_write_v(const T* qkv, const float* sr, const float* sc, T* q, KV* kc, KV* vc,
                                            const int* pos, const int* slots, const float* table, int heads, int kvHeads,
                                            int hd, int interleaved) {
	pdl_enter();
	const int t = blockIdx.y;
	const rope_row r = rope_row_of(t, qkv, q, kc, vc, pos, slots, table, heads, kvHeads, hd);
	const float fr = sr ? sr[t] : 1.f;
	for (int u0 = 0; u0 < ROPE_UNITS; u0 += ROPE_U) {
		const int j0 = (blockIdx.x * ROPE_UNITS + u0) * blockDim.x + threadIdx.x;
		if (j0 >= r.units) break;
		float x[ROPE_U][2 * VEC];
#pragma unroll
		for (int i = 0; i < ROPE_U; i++) {
			const int j = j0 + i * blockDim.x;
			if (j < r.units) rope_unit_load(r, rope_unit_of(j, r.per, r.half, heads, kvHeads, interleaved), hd, x[i]);
		}
#pragma unroll
		for (int i = 0; i < ROPE_U; i++) {
			const int j = j0 + i * blockDim.x;
			if (j >= r.units) break;
			const rope_unit w = rope_unit_of(j, r.per, r.half, heads, kvHeads, interleaved);
			if (sr || sc) {
				// scaled_of with the column scales loaded as vectors.
				const int col = w.h * hd;
				float f[2 * VEC];
				col_scales16(sc, col + w.e0, f);
				col_scales16(sc, col + w.e1, f + VEC);
#pragma unroll
				for (int k = 0; k < 2 * VEC; k++) x[i][k] = scale_round(x[i][k], fr * f[k]);
			}
			rope_unit_store(w, x[i], r.cs, r.half, heads, kvHeads, hd, interleaved, r.qt, r.ks, r.vs);
		}
	}
}

// rope_qkv_write of a product whose rows are still to be divided by the
// rms of nx's rows (row_inv_rms; nx[rows, dim]): each element x read as
// x·inv rounded to T, as scaled_of reads a scaled product. Grid (chunks of
// a row's pairs, rows).
extern "C" __global__ void rope_qkv_write_n(const T* qkv, const T* nx, int dim, float eps, T* q, KV* kc, KV* vc,
                                            const int* pos, const int* slots, const float* table, int heads, int kvHeads,
                                            int hd, int interleaved) {
	__shared__ float sh[32];
	pdl_enter();
	const int t = blockIdx.y;
	const float inv = row_inv_rms(nx + (long long)t * dim, dim, eps, sh);
	const int half = hd / 2, nh = heads + 2 * kvHeads, width = kvHeads * hd;
	const long long slot = (long long)slots[t] * width;
	const float* cs = table + (long long)pos[t] * hd;
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nh * half; j += gridDim.x * blockDim.x) {
		const int h = j / half;
		const T* src = qkv + ((long long)t * nh + h) * hd;
		auto x = [&](int c) { return round_t(__fmul_rn(tof(src[c]), inv)); };
		rope_qkv_pair(x, [&](int c) { return kv_of(x(c)); }, h, j % half, q + (long long)t * heads * hd, kc + slot, vc + slot, cs, heads,
		              kvHeads, hd, interleaved);
	}
}

// ---------------------------------------------------------------- split, select_rows

// Columns [off, off+span) of x[rows, cols] go to up to four outputs of widths w0..w3 (summing to span).
extern "C" __global__ void split(const T* x, int rows, int cols, int off, int span, T* o0, int w0, T* o1, int w1, T* o2,
                                 int w2, T* o3, int w3) {
	pdl_enter();
	long long n = (long long)rows * span;
	GRID_STRIDE(idx, n) {
		long long r = idx / span;
		int c = (int)(idx % span);
		T v = x[r * cols + off + c];
		if (c < w0) { o0[r * w0 + c] = v; continue; }
		c -= w0;
		if (c < w1) { o1[r * w1 + c] = v; continue; }
		c -= w1;
		if (c < w2) { o2[r * w2 + c] = v; continue; }
		c -= w2;
		o3[r * w3 + c] = v;
	}
}

extern "C" __global__ void select_rows(const T* x, T* out, const int* rowIdx, int nrows, int cols) {
	pdl_enter();
	long long n = (long long)nrows * cols;
	GRID_STRIDE(idx, n) {
		long long r = idx / cols;
		int c = (int)(idx % cols);
		out[idx] = x[(long long)rowIdx[r] * cols + c];
	}
}

#endif // KILN_PART_IS(0)
