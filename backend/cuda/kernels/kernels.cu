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

__device__ __forceinline__ float4 f4(float x, float y, float z, float w) {
	float4 v;
	v.x = x; v.y = y; v.z = z; v.w = w;
	return v;
}
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

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

// block_sum: every thread gets the block's sum. blockDim.x is a multiple of 32.
__device__ float block_sum(float v, float* sh) {
	v = warp_sum(v);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.f;
	return warp_sum(v);
}

__device__ __forceinline__ int window_start(int p, int window) {
	return (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
}

// ---------------------------------------------------------------- embed

// grid (rows), block 256: out[r,:] = table[ids[r],:]; an id out of range gives NaN.
template <typename W>
__device__ void embed_impl(const W* table, const int* ids, T* out, int rows, int vocab, int dim) {
	int r = blockIdx.x;
	if (r >= rows) return;
	int id = ids[r];
	T* dst = out + (long long)r * dim;
	if (id < 0 || id >= vocab) {
		for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = fromf<T>(__int_as_float(0x7fc00000));
		return;
	}
	const W* src = table + (long long)id * dim;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = fromf<T>(tof(src[c]));
}

// ---------------------------------------------------------------- rmsnorm

// grid (rows), block 256: out = x / sqrt(mean(x²)+eps) · w.
template <typename W>
__device__ void rmsnorm_impl(const T* x, const W* w, T* out, int rows, int dim, float eps) {
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
template <typename W>
__device__ void add_rmsnorm_impl(const T* x, const T* r, const W* w, T* sum, T* normed, int rows, int dim, float eps) {
	__shared__ float sh[32];
	long long base = (long long)blockIdx.x * dim;
	float ss = 0.f;
	for (int c = threadIdx.x; c < dim; c += blockDim.x) {
		T s = fromf<T>(tof(x[base + c]) + tof(r[base + c]));
		sum[base + c] = s;
		float v = tof(s);
		ss += v * v;
	}
	ss = block_sum(ss, sh);
	float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int c = threadIdx.x; c < dim; c += blockDim.x) normed[base + c] = fromf<T>(tof(sum[base + c]) * scale * tof(w[c]));
}

// ---------------------------------------------------------------- add_bias

template <typename W>
__device__ void add_bias_impl(const T* x, const W* b, T* out, int rows, int cols) {
	long long n = (long long)rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = fromf<T>(tof(x[i]) + tof(b[i % cols]));
}

#define WEIGHT_KERNELS(W)                                                                                        \
	extern "C" __global__ void embed_w##W(const W* table, const int* ids, T* out, int rows, int vocab, int dim) { \
		embed_impl<W>(table, ids, out, rows, vocab, dim);                                                          \
	}                                                                                                              \
	extern "C" __global__ void rmsnorm_w##W(const T* x, const W* w, T* out, int rows, int dim, float eps) {       \
		rmsnorm_impl<W>(x, w, out, rows, dim, eps);                                                                \
	}                                                                                                              \
	extern "C" __global__ void add_rmsnorm_w##W(const T* x, const T* r, const W* w, T* sum, T* normed, int rows, \
	                                            int dim, float eps) {                                            \
		add_rmsnorm_impl<W>(x, r, w, sum, normed, rows, dim, eps);                                                 \
	}                                                                                                              \
	extern "C" __global__ void add_bias_w##W(const T* x, const W* b, T* out, int rows, int cols) {               \
		add_bias_impl<W>(x, b, out, rows, cols);                                                                   \
	}

WEIGHT_KERNELS(f32)
WEIGHT_KERNELS(f16)
WEIGHT_KERNELS(bf16)

// ---------------------------------------------------------------- elementwise

#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

extern "C" __global__ void add(const T* a, const T* b, T* out, long long n) {
	GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) + tof(b[i]));
}
extern "C" __global__ void mul(const T* a, const T* b, T* out, long long n) {
	GRID_STRIDE(i, n) out[i] = fromf<T>(tof(a[i]) * tof(b[i]));
}
extern "C" __global__ void silu(const T* a, T* out, long long n) {
	GRID_STRIDE(i, n) out[i] = fromf<T>(silu_f(tof(a[i])));
}
extern "C" __global__ void swiglu(const T* g, const T* u, T* out, long long n) {
	GRID_STRIDE(i, n) out[i] = fromf<T>(silu_f(tof(g[i])) * tof(u[i]));
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
		out[base + a] = fromf<T>(x1 * c - x2 * s);
		out[base + b] = fromf<T>(x2 * c + x1 * s);
	}
}

// kc, vc: one layer's cache [slots][width]; k, v: [rows][width]; slots[t] is token t's cache slot.
extern "C" __global__ void kv_write(const T* k, const T* v, T* kc, T* vc, const int* slots, int rows, int width) {
	long long n = (long long)rows * width;
	GRID_STRIDE(idx, n) {
		int t = (int)(idx / width), e = (int)(idx % width);
		long long at = (long long)slots[t] * width + e;
		kc[at] = k[idx];
		vc[at] = v[idx];
	}
}

// RoPE on k (kvHeads heads of hd), then k and v into their cache slots.
extern "C" __global__ void rope_kv_write(const T* k, const T* v, T* kc, T* vc, const int* pos, const int* slots,
                                         const float* table, int rows, int kvHeads, int hd, int interleaved) {
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
		kc[dst + a] = fromf<T>(x1 * c - x2 * s);
		kc[dst + b] = fromf<T>(x2 * c + x1 * s);
		vc[dst + a] = v[src + a];
		vc[dst + b] = v[src + b];
	}
}

// ---------------------------------------------------------------- split, select_rows

// Columns [off, off+span) of x[rows, cols] go to up to four outputs of widths w0..w3 (summing to span).
extern "C" __global__ void split(const T* x, int rows, int cols, int off, int span, T* o0, int w0, T* o1, int w1, T* o2,
                                 int w2, T* o3, int w3) {
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
	long long n = (long long)nrows * cols;
	GRID_STRIDE(idx, n) {
		long long r = idx / cols;
		int c = (int)(idx % cols);
		out[idx] = x[(long long)rowIdx[r] * cols + c];
	}
}

// ---------------------------------------------------------------- attention
//
// Cache layout per layer: [blocks][blockSize][kvHeads][hd]. Token at position p
// of sequence s attends to keys j, window_start(p) <= j <= p, stored at slot
// bt[seqOff[s] + j/bs]*bs + j%bs. Scores are kept in the log2 domain (q is
// pre-scaled by scale·log2 e) and exponentiated with exp2f.

#define PF_BQ 64  // queries per prefill tile (the Go packer's PrefillTile)
#define PF_BK 32  // keys per shared-memory stage
#define PF_THREADS 128

__device__ __forceinline__ long long kv_row(const int* bt, int seqOff, int bs, int kvHeads, int kvh, int hd, int j) {
	long long slot = (long long)bt[seqOff + j / bs] * bs + j % bs;
	return (slot * kvHeads + kvh) * hd;
}

// Prefill: grid (tiles, heads), block 128. Tile i covers tokens
// [tileTok0[i], tileTok0[i]+tileCnt[i]), all of one sequence. Two threads per
// query; thread half h owns the float4 chunks c of the head with c%2 == h.
template <int HD>
__device__ void prefill_impl(const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt,
                             const int* positions, const int* seqIndex, const int* seqBlockOff, const int* bt, int heads,
                             int kvHeads, int bs, int window, float scale) {
	constexpr int NC = HD / 4;    // float4 chunks per row
	constexpr int NCH = NC / 2;   // per thread
	constexpr int CPR = HD / VEC; // 16-byte chunks per cache row
	__shared__ float4 Ks[PF_BK][NC];
	__shared__ float4 Vs[PF_BK][NC];
	__shared__ int sLo, sHi;

	int tile = blockIdx.x, h = blockIdx.y;
	int tok0 = tileTok0[tile], cnt = tileCnt[tile];
	int seq = seqIndex[tok0];
	int seqOff = seqBlockOff[seq];
	int kvh = h / (heads / kvHeads);
	int tid = threadIdx.x, qi = tid >> 1, hf = tid & 1;
	bool valid = qi < cnt;
	int tok = tok0 + (valid ? qi : 0);
	int p = valid ? positions[tok] : -1;
	int lo = valid ? window_start(p, window) : 0;

	if (tid == 0) {
		sLo = 0x7fffffff;
		sHi = -1;
	}
	__syncthreads();
	if (valid) {
		atomicMin(&sLo, lo);
		atomicMax(&sHi, p);
	}
	__syncthreads();
	int kLo = sLo, kHi = sHi;

	float4 qv[NCH], acc[NCH];
	float qs = scale * LOG2E;
	const T* qr = q + ((long long)tok * heads + h) * HD;
#pragma unroll
	for (int i = 0; i < NCH; i++) {
		int c = (2 * i + hf) * 4;
		qv[i] = f4(tof(qr[c]) * qs, tof(qr[c + 1]) * qs, tof(qr[c + 2]) * qs, tof(qr[c + 3]) * qs);
		acc[i] = f4(0.f, 0.f, 0.f, 0.f);
	}
	float m = NEG_INF, l = 0.f;

	for (int kb = kLo; kb <= kHi; kb += PF_BK) {
		__syncthreads();
		for (int i = tid; i < PF_BK * CPR; i += PF_THREADS) {
			int row = i / CPR, cc = i % CPR;
			int j = kb + row;
			float fk[VEC], fv[VEC];
			if (j <= kHi) {
				long long at = kv_row(bt, seqOff, bs, kvHeads, kvh, HD, j) + cc * VEC;
				load16(kc + at, fk);
				load16(vc + at, fv);
			} else {
#pragma unroll
				for (int e = 0; e < VEC; e++) fk[e] = fv[e] = 0.f;
			}
			float* kd = (float*)&Ks[row][0] + cc * VEC;
			float* vd = (float*)&Vs[row][0] + cc * VEC;
#pragma unroll
			for (int e = 0; e < VEC; e++) {
				kd[e] = fk[e];
				vd[e] = fv[e];
			}
		}
		__syncthreads();

		float s[PF_BK];
		float mt = NEG_INF;
#pragma unroll
		for (int j = 0; j < PF_BK; j++) {
			float d = 0.f;
#pragma unroll
			for (int i = 0; i < NCH; i++) {
				float4 k = Ks[j][2 * i + hf];
				d += qv[i].x * k.x + qv[i].y * k.y + qv[i].z * k.z + qv[i].w * k.w;
			}
			d += __shfl_xor_sync(FULL_MASK, d, 1);
			int kp = kb + j;
			s[j] = (kp >= lo && kp <= p) ? d : NEG_INF;
			mt = fmaxf(mt, s[j]);
		}
		float mn = fmaxf(m, mt);
		if (mn != NEG_INF) {
			float corr = exp2f(m - mn);
			l *= corr;
#pragma unroll
			for (int i = 0; i < NCH; i++) {
				acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
			}
#pragma unroll
			for (int j = 0; j < PF_BK; j++) {
				float pj = exp2f(s[j] - mn);
				l += pj;
#pragma unroll
				for (int i = 0; i < NCH; i++) {
					float4 v = Vs[j][2 * i + hf];
					acc[i].x += pj * v.x; acc[i].y += pj * v.y; acc[i].z += pj * v.z; acc[i].w += pj * v.w;
				}
			}
			m = mn;
		}
	}
	if (valid) {
		float inv = 1.0f / l;
		T* o = out + ((long long)tok * heads + h) * HD;
#pragma unroll
		for (int i = 0; i < NCH; i++) {
			int c = (2 * i + hf) * 4;
			o[c] = fromf<T>(acc[i].x * inv);
			o[c + 1] = fromf<T>(acc[i].y * inv);
			o[c + 2] = fromf<T>(acc[i].z * inv);
			o[c + 3] = fromf<T>(acc[i].w * inv);
		}
	}
}

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

// Decode (flash-decoding): grid (maxSplits, kvHeads, tokens), block 128.
// Block (sp, kvh, t) covers keys [lo + sp*chunk, min(lo+(sp+1)*chunk, p+1)) of
// token t (chunk <= 128) for the group of query heads sharing kv head kvh, and
// writes per head the partial max m (log2 domain), sum l and unnormalised
// acc[hd] into ws at index (t*heads + h)*maxSplits + sp. Dynamic shared memory
// (floats): qs[group*hd] sc[group*chunk] slots[chunk] red[NS*4*hd] sm[group] sl[group].
// Each thread loads its key's K row (phase 1) and its share of V rows (phase
// 2, prefetched into registers at the start) so that all loads are in flight
// at once.
#define DC_THREADS 128

template <int HD>
__device__ void decode_impl(const T* q, const T* kc, const T* vc, float* wsM, float* wsL, float* wsAcc,
                            const int* positions, const int* seqIndex, const int* seqBlockOff, const int* bt, int heads,
                            int kvHeads, int bs, int window, float scale, int chunk, int maxSplits) {
	constexpr int CPR = HD / VEC;                       // 16-byte chunks per row
	constexpr int NS = DC_THREADS / CPR;                // row slices in the PV phase
	constexpr int PVI = (DC_THREADS + NS - 1) / NS;     // rows per thread in the PV phase
	constexpr bool PRE = PVI <= 16;                     // prefetch V into registers
	int sp = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
	int p = positions[t];
	int lo = window_start(p, window);
	int nsplit = (p - lo + chunk) / chunk;
	if (sp >= nsplit) return; // uniform over the block
	int k0 = lo + sp * chunk;
	int nk = imin(chunk, p + 1 - k0);
	int seqOff = seqBlockOff[seqIndex[t]];
	int group = heads / kvHeads, h0 = kvh * group;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

	extern __shared__ float smem[];
	float* qs = smem;
	float* sc = qs + group * HD;
	int* slots = (int*)(sc + group * chunk);
	float* red = (float*)(slots + chunk);
	float* sm = red + NS * 4 * HD;
	float* sl = sm + group;

	const T* kr = kc;
	if (tid < nk) {
		int kp = k0 + tid;
		int sl0 = bt[seqOff + kp / bs] * bs + kp % bs;
		slots[tid] = sl0;
		kr = kc + ((long long)sl0 * kvHeads + kvh) * HD;
	}
	uint4 kraw[CPR];
	if (tid < nk) {
#pragma unroll
		for (int c = 0; c < CPR; c++) kraw[c] = ((const uint4*)kr)[c];
	}
	float qscale = scale * LOG2E;
	const T* qr = q + ((long long)t * heads + h0) * HD;
	for (int i = tid; i < group * HD; i += DC_THREADS) qs[i] = tof(qr[i]) * qscale;
	__syncthreads();

	int r = tid / CPR, cc = tid % CPR;
	uint4 vpre[PRE ? PVI : 1];
	if constexpr (PRE) {
		if (r < NS) {
#pragma unroll
			for (int i = 0; i < PVI; i++) {
				int j = r + i * NS;
				if (j < nk) vpre[i] = *(const uint4*)(vc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC);
			}
		}
	}

	// Scores: one thread per key, four heads at a time.
	if (tid < nk) {
		for (int g0 = 0; g0 < group; g0 += 4) {
			float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
			for (int c = 0; c < CPR; c++) {
				float f[VEC];
				unpack16(kraw[c], f, kc);
#pragma unroll
				for (int gg = 0; gg < 4; gg++) {
					if (g0 + gg < group) {
						const float* qh = qs + (g0 + gg) * HD + c * VEC;
#pragma unroll
						for (int e = 0; e < VEC; e++) d[gg] += qh[e] * f[e];
					}
				}
			}
#pragma unroll
			for (int gg = 0; gg < 4; gg++)
				if (g0 + gg < group) sc[(g0 + gg) * chunk + tid] = d[gg];
		}
	}
	__syncthreads();

	// Softmax statistics per head: one warp per head.
	for (int g = warp; g < group; g += DC_THREADS / 32) {
		float* s = sc + g * chunk;
		float mx = NEG_INF;
		for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, s[j]);
		mx = warp_max(mx);
		float sum = 0.f;
		for (int j = lane; j < nk; j += 32) {
			float e = exp2f(s[j] - mx);
			s[j] = e;
			sum += e;
		}
		sum = warp_sum(sum);
		if (lane == 0) {
			sm[g] = mx;
			sl[g] = sum;
		}
	}
	__syncthreads();

	// PV: thread (r, cc) sums rows r, r+NS, ... of its 16-byte column chunk.
	for (int g0 = 0; g0 < group; g0 += 4) {
		float acc[4][VEC];
#pragma unroll
		for (int gg = 0; gg < 4; gg++)
#pragma unroll
			for (int e = 0; e < VEC; e++) acc[gg][e] = 0.f;
		if (r < NS) {
			if constexpr (PRE) {
#pragma unroll
				for (int i = 0; i < PVI; i++) {
					int j = r + i * NS;
					if (j < nk) {
						float f[VEC];
						unpack16(vpre[i], f, vc);
#pragma unroll
						for (int gg = 0; gg < 4; gg++) {
							if (g0 + gg < group) {
								float pj = sc[(g0 + gg) * chunk + j];
#pragma unroll
								for (int e = 0; e < VEC; e++) acc[gg][e] += pj * f[e];
							}
						}
					}
				}
			} else {
				for (int j = r; j < nk; j += NS) {
					float f[VEC];
					load16(vc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC, f);
#pragma unroll
					for (int gg = 0; gg < 4; gg++) {
						if (g0 + gg < group) {
							float pj = sc[(g0 + gg) * chunk + j];
#pragma unroll
							for (int e = 0; e < VEC; e++) acc[gg][e] += pj * f[e];
						}
					}
				}
			}
#pragma unroll
			for (int gg = 0; gg < 4; gg++)
#pragma unroll
				for (int e = 0; e < VEC; e++) red[(r * 4 + gg) * HD + cc * VEC + e] = acc[gg][e];
		}
		__syncthreads();
		for (int i = tid; i < 4 * HD; i += DC_THREADS) {
			int gg = i / HD, d = i % HD;
			if (g0 + gg < group) {
				float v = 0.f;
				for (int rr = 0; rr < NS; rr++) v += red[(rr * 4 + gg) * HD + d];
				long long w = ((long long)t * heads + h0 + g0 + gg) * maxSplits + sp;
				wsAcc[w * HD + d] = v;
			}
		}
		__syncthreads();
	}
	if (tid < group) {
		long long w = ((long long)t * heads + h0 + tid) * maxSplits + sp;
		wsM[w] = sm[tid];
		wsL[w] = sl[tid];
	}
}

__device__ float block_max(float v, float* sh) {
	v = warp_max(v);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : NEG_INF;
	return warp_max(v);
}

// Merge: grid (heads, tokens), block MG_THREADS (hd <= MG_THREADS):
// out = Σ 2^(m_s-M) acc_s / Σ 2^(m_s-M) l_s, the splits shared among
// MG_THREADS/hd thread groups.
#define MG_THREADS 512
extern "C" __global__ void __launch_bounds__(MG_THREADS) decode_merge(const float* wsM, const float* wsL,
                                                                      const float* wsAcc, T* out, const int* positions,
                                                                      int heads, int hd, int window, int chunk,
                                                                      int maxSplits) {
	__shared__ float sh[32];
	__shared__ float part[MG_THREADS];
	int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
	int p = positions[t];
	int lo = window_start(p, window);
	int nsplit = (p - lo + chunk) / chunk;
	long long w0 = ((long long)t * heads + h) * maxSplits;
	float M = NEG_INF;
	for (int s = tid; s < nsplit; s += MG_THREADS) M = fmaxf(M, wsM[w0 + s]);
	M = block_max(M, sh);
	float L = 0.f;
	for (int s = tid; s < nsplit; s += MG_THREADS) L += exp2f(wsM[w0 + s] - M) * wsL[w0 + s];
	L = block_sum(L, sh);
	int G = MG_THREADS / hd, sg = tid / hd, d = tid % hd;
	float v = 0.f;
	if (sg < G) {
#pragma unroll 4
		for (int s = sg; s < nsplit; s += G) v += exp2f(wsM[w0 + s] - M) * wsAcc[(w0 + s) * hd + d];
	}
	part[tid] = v;
	__syncthreads();
	if (tid < hd) {
		float o = 0.f;
		for (int g = 0; g < G; g++) o += part[g * hd + tid];
		out[((long long)t * heads + h) * hd + tid] = fromf<T>(o / L);
	}
}

#define ATTN_KERNELS(HD)                                                                                             \
	extern "C" __global__ void __launch_bounds__(PF_THREADS) prefill_attn_##HD(                                       \
	    const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt, const int* positions,  \
	    const int* seqIndex, const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs, int window,        \
	    float scale) {                                                                                                 \
		prefill_impl<HD>(q, kc, vc, out, tileTok0, tileCnt, positions, seqIndex, seqBlockOff, bt, heads, kvHeads, bs, \
		                 window, scale);                                                                               \
	}                                                                                                                  \
	extern "C" __global__ void __launch_bounds__(DC_THREADS) decode_attn_##HD(                                        \
	    const T* q, const T* kc, const T* vc, float* wsM, float* wsL, float* wsAcc, const int* positions,              \
	    const int* seqIndex, const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs, int window,        \
	    float scale, int chunk, int maxSplits) {                                                                       \
		decode_impl<HD>(q, kc, vc, wsM, wsL, wsAcc, positions, seqIndex, seqBlockOff, bt, heads, kvHeads, bs, window,  \
		                scale, chunk, maxSplits);                                                                      \
	}

ATTN_KERNELS(8)
ATTN_KERNELS(16)
ATTN_KERNELS(32)
ATTN_KERNELS(64)
ATTN_KERNELS(80)
ATTN_KERNELS(96)
ATTN_KERNELS(128)
