// kiln skinny GEMV for decode: out[T,N] = x[T,K]·w[N,K]ᵀ for 1 ≤ T ≤ 8,
// x and w of the activation dtype ACT, out of ACT or f32, accumulated in f32.
// Compiled by NVRTC once per activation dtype with -DACT=f32|f16|bf16 (no
// CUDA headers: conversions are PTX cvt), as a module of its own;
// -DGEMV_MMA=1 (f16, bf16) adds the tensor-core kernels.
//
// CUDA cores (gemv_<T>_<R>_<U>_<LM>): every warp owns R consecutive rows of
// w and computes their T outputs. It streams the rows with 16-byte loads,
// U loads per row and lane in flight, the next group of loads issued before
// the current one is used (double buffering in registers). x (T×K, small,
// shared by every warp) goes through the L1. Lanes accumulate in f32, a
// warp shuffle sums them. N need not be a multiple of R (the last warp's
// spare rows re-read row N-1 and are not stored).
//
// Tensor cores (gemv_mma_<U>_<WARPS>_<LM>, T at run time): a block of WARPS
// warps owns 16 rows of w and splits K among its warps; mma.sync m16n8k16
// with x as the 8 columns of B, f32 accumulation.
//
// Both: K·sizeof(ACT) must be a multiple of 16 and x, w 16-byte aligned
// (checked by the Go wrapper); K need not be a multiple of a group of loads
// (tail loops). LM is the weight load flavour: 0 plain ld.global.nc, 1 +
// L1::no_allocate (every weight byte is read once), 2 + L2::256B prefetch.
// The module holds the kernels gemv.go uses (GEMV_CC, and gemv_mma_4_8_2
// for f16/bf16); -DGEMV_SWEEP=1 adds the others that the benchmark compares.

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };
typedef float f32;
typedef ACT T;

#define FULL_MASK 0xffffffffu
#define VEC (16 / (int)sizeof(T))
#define GEMV_THREADS 128

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// Programmatic dependent launches (GEMV.Run launches that way on compute
// capability 9.0+): pdl_trigger lets the next kernel launch early;
// pdl_wait waits until the previous kernel has finished and its writes are
// visible. The weights are read before the wait (no kernel writes them),
// the activations after it. Both cost nothing after a plain launch.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// unpack widens 16 raw bytes of X elements (the null pointer picks X) to floats.
__device__ __forceinline__ void unpack(uint4 v, float* f, const float*) {
	f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y); f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
__device__ __forceinline__ void unpack(uint4 v, float* f, const bf16*) {
	unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		f[2 * i] = __uint_as_float(w[i] << 16);
		f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
	}
}
__device__ __forceinline__ void unpack(uint4 v, float* f, const f16*) {
	unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float a, b;
		asm("{.reg .f16 low, high;\n\tmov.b32 {low, high}, %2;\n\tcvt.f32.f16 %0, low;\n\tcvt.f32.f16 %1, high;}"
		    : "=f"(a), "=f"(b) : "r"(w[i]));
		f[2 * i] = a;
		f[2 * i + 1] = b;
	}
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) {
	unsigned short r;
	asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
	p->x = r;
}
__device__ __forceinline__ void store(f16* p, float v) {
	unsigned short r;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
	p->x = r;
}

// ldw loads 16 bytes of weights (read once: streamed).
template <int LM> __device__ __forceinline__ uint4 ldw(const uint4* p);
template <> __device__ __forceinline__ uint4 ldw<0>(const uint4* p) {
	uint4 v;
	asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}
template <> __device__ __forceinline__ uint4 ldw<1>(const uint4* p) {
	uint4 v;
	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}
template <> __device__ __forceinline__ uint4 ldw<2>(const uint4* p) {
	uint4 v;
	asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// ldx loads 16 bytes of activations (read by every warp: kept in L1).
__device__ __forceinline__ uint4 ldx(const uint4* p) {
	uint4 v;
	asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// dot adds x[·][k]·w[r][k] over the VEC elements of one 16-byte column k
// (wv[r]: the rows' raw weights there) to acc[t][r].
template <int TT, int R>
__device__ __forceinline__ void dot(float (&acc)[TT][R], const uint4 (&wv)[R], const uint4* x, int kv, int k) {
	float wf[R][VEC];
#pragma unroll
	for (int r = 0; r < R; r++) unpack(wv[r], wf[r], (const T*)0);
#pragma unroll
	for (int t = 0; t < TT; t++) {
		float xf[VEC];
		unpack(ldx(x + t * kv + k), xf, (const T*)0);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int e = 0; e < VEC; e++) acc[t][r] = fmaf(xf[e], wf[r][e], acc[t][r]);
	}
}

template <int TT, int R, int U, int LM>
__device__ __forceinline__ void gemv_impl(const T* x, const T* w, void* out, int K, int N, int outF32) {
	pdl_trigger();
	const int lane = threadIdx.x & 31;
	const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
	if (n0 >= N) return; // the whole warp
	const int kv = K / VEC; // 16-byte columns per row
	const uint4* xv = (const uint4*)x;
	const uint4* wr[R];
#pragma unroll
	for (int r = 0; r < R; r++) wr[r] = (const uint4*)w + (long long)imin(n0 + r, N - 1) * kv + lane;

	float acc[TT][R];
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++) acc[t][r] = 0.f;

	constexpr int STEP = 32 * U;
	const int full = kv / STEP; // groups of U columns per lane without bounds checks
	uint4 cur[U][R];
	if (full > 0) {
#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int r = 0; r < R; r++) cur[u][r] = ldw<LM>(wr[r] + u * 32);
	}
	pdl_wait(); // x is the previous kernel's output
	if (full > 0) {
		for (int i = 0; i < full; i++) {
			const int base = i * STEP;
			uint4 nxt[U][R];
			if (i + 1 < full) {
#pragma unroll
				for (int u = 0; u < U; u++)
#pragma unroll
					for (int r = 0; r < R; r++) nxt[u][r] = ldw<LM>(wr[r] + base + STEP + u * 32);
			}
#pragma unroll
			for (int u = 0; u < U; u++) dot<TT, R>(acc, cur[u], xv, kv, base + u * 32 + lane);
			if (i + 1 < full) {
#pragma unroll
				for (int u = 0; u < U; u++)
#pragma unroll
					for (int r = 0; r < R; r++) cur[u][r] = nxt[u][r];
			}
		}
	}
	// Tail: the last kv % STEP columns, one per lane at a time.
	for (int k = full * STEP; k + lane < kv; k += 32) {
		uint4 cur[R];
#pragma unroll
		for (int r = 0; r < R; r++) cur[r] = ldw<LM>(wr[r] + k);
		dot<TT, R>(acc, cur, xv, kv, k + lane);
	}

#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++) {
			float v = acc[t][r];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
			acc[t][r] = v;
		}
	// Lane t·R+r stores output (t, n0+r).
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++) {
			const int n = n0 + r;
			if (lane == ((t * R + r) & 31) && n < N) {
				long long o = (long long)t * N + n;
				if (outF32) store((float*)out + o, acc[t][r]);
				else store((T*)out + o, acc[t][r]);
			}
		}
}

#define GEMV(TT, R, U, LM)                                                                                         \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                 \
	    gemv_##TT##_##R##_##U##_##LM(const T* x, const T* w, void* out, int K, int N, int outF32) {           \
		gemv_impl<TT, R, U, LM>(x, w, out, K, N, outF32);                                                  \
	}

#ifdef GEMV_MMA
// ---------------------------------------------------------------- tensor cores (f16/bf16)

// mma: c += A·B, m16n8k16, f32 accumulation; a0..a3 and b0, b1 as in the
// PTX fragment layout.
__device__ __forceinline__ void mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1,
                                    const bf16*) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1,
                                    const f16*) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// mma2 multiplies 8 columns of k: lane (g, q) = (lane/4, lane%4) brings
// the 16 bytes at the same k of w row g (a), w row g+8 (b) and x row g (x).
// The sum over k does not care which k sits in which fragment slot, so each
// 16-byte load feeds the fragments directly: the first mma takes elements
// 0-3 (slots 2q, 2q+1, 2q+8, 2q+9), the second elements 4-7.
__device__ __forceinline__ void mma2(float (&c)[4], uint4 a, uint4 b, uint4 x) {
	mma(c, a.x, b.x, a.y, b.y, x.x, x.y, (const T*)0);
	mma(c, a.z, b.z, a.w, b.w, x.z, x.w, (const T*)0);
}

// gemv_mma: grid ceil(N/16), block 32·WARPS; the block owns w rows
// n0..n0+15 (rows past N re-read row N-1, not stored) and its warps split K:
// warp v takes the groups v, v+WARPS, ... of U·32 columns (per row, lane
// (g, q) loads 16 bytes at column 8q of each 32), double buffered in
// registers, and a last partial group 32 columns at a time. x rows past T
// re-read row T-1 (their output columns are dropped). The warps' 16×8
// accumulators are summed through shared memory.
template <int U, int WARPS, int LM>
__device__ __forceinline__ void gemv_mma_impl(const T* x, const T* w, void* out, int K, int N, int TT, int outF32) {
	__shared__ float red[WARPS][128];
	pdl_trigger();
	pdl_wait();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int g = lane >> 2, q = lane & 3;
	const int n0 = blockIdx.x * 16;
	const int k8 = K / 8; // 16-byte columns per row
	const uint4* w0 = (const uint4*)w + (long long)imin(n0 + g, N - 1) * k8 + q;
	const uint4* w1 = (const uint4*)w + (long long)imin(n0 + g + 8, N - 1) * k8 + q;
	const uint4* xr = (const uint4*)x + imin(g, TT - 1) * k8 + q;
	float c[4] = {0.f, 0.f, 0.f, 0.f};

	constexpr int GS = 4 * U; // 16-byte columns per group
	const int gfull = k8 / GS;
	if (warp < gfull) {
		uint4 a[U], b[U], xv[U];
#pragma unroll
		for (int j = 0; j < U; j++) {
			const int col = warp * GS + 4 * j;
			a[j] = ldw<LM>(w0 + col);
			b[j] = ldw<LM>(w1 + col);
			xv[j] = ldx(xr + col);
		}
		for (int gi = warp; gi < gfull; gi += WARPS) {
			const int ng = gi + WARPS;
			uint4 na[U], nb[U], nx[U];
			if (ng < gfull) {
#pragma unroll
				for (int j = 0; j < U; j++) {
					const int col = ng * GS + 4 * j;
					na[j] = ldw<LM>(w0 + col);
					nb[j] = ldw<LM>(w1 + col);
					nx[j] = ldx(xr + col);
				}
			}
#pragma unroll
			for (int j = 0; j < U; j++) mma2(c, a[j], b[j], xv[j]);
			if (ng < gfull) {
#pragma unroll
				for (int j = 0; j < U; j++) {
					a[j] = na[j];
					b[j] = nb[j];
					xv[j] = nx[j];
				}
			}
		}
	}
	for (int col = gfull * GS + warp * 4; col < k8; col += WARPS * 4) { // warp-uniform
		uint4 a, b, xv;
		a.x = a.y = a.z = a.w = 0u;
		b = a;
		xv = a;
		if (col + q < k8) {
			a = ldw<LM>(w0 + col);
			b = ldw<LM>(w1 + col);
			xv = ldx(xr + col);
		}
		mma2(c, a, b, xv);
	}

	// c: (row g, col 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1); row = n - n0, col = t.
	red[warp][g * 8 + 2 * q] = c[0];
	red[warp][g * 8 + 2 * q + 1] = c[1];
	red[warp][(g + 8) * 8 + 2 * q] = c[2];
	red[warp][(g + 8) * 8 + 2 * q + 1] = c[3];
	__syncthreads();
	if (threadIdx.x < 128) {
		const int i = threadIdx.x, t = i & 7, n = n0 + (i >> 3);
		float s = 0.f;
#pragma unroll
		for (int v = 0; v < WARPS; v++) s += red[v][i];
		if (t < TT && n < N) {
			long long o = (long long)t * N + n;
			if (outF32) store((float*)out + o, s);
			else store((T*)out + o, s);
		}
	}
}

#define GEMV_MMA_K(U, WARPS, LM)                                                                                   \
	extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                   \
	    gemv_mma_##U##_##WARPS##_##LM(const T* x, const T* w, void* out, int K, int N, int TT, int outF32) { \
		gemv_mma_impl<U, WARPS, LM>(x, w, out, K, N, TT, outF32);                                          \
	}
#endif // GEMV_MMA

// The kernels gemv.go uses (gemvProd): CUDA cores for every T (f32; T = 1
// for f16/bf16), tensor cores for f16/bf16.
#define GEMV_CC(LM)                                                                 \
	GEMV(1, 2, 4, LM) GEMV(2, 2, 4, LM) GEMV(3, 2, 4, LM) GEMV(4, 2, 4, LM) \
	GEMV(5, 4, 4, LM) GEMV(6, 4, 4, LM) GEMV(7, 4, 4, LM) GEMV(8, 4, 4, LM)
GEMV_CC(1)
#ifdef GEMV_MMA
GEMV_MMA_K(4, 8, 2)
#endif

#ifdef GEMV_SWEEP
// The benchmark's other configurations (gemvSweep in gemv_test.go).
#define GEMV_EXTRA(LM)                                                                                        \
	GEMV(1, 1, 4, LM) GEMV(1, 1, 8, LM) GEMV(1, 2, 2, LM) GEMV(1, 2, 8, LM) GEMV(1, 4, 2, LM) GEMV(1, 4, 4, LM) \
	GEMV(4, 1, 4, LM) GEMV(4, 1, 8, LM) GEMV(4, 2, 2, LM) GEMV(4, 2, 8, LM) GEMV(4, 4, 2, LM) GEMV(4, 4, 4, LM) \
	GEMV(8, 4, 2, LM) GEMV(8, 2, 4, LM)
GEMV_CC(0)
GEMV_CC(2)
GEMV_EXTRA(0)
GEMV_EXTRA(1)
GEMV_EXTRA(2)
#ifdef GEMV_MMA
#define GEMV_MMA_EXTRA(LM) GEMV_MMA_K(2, 4, LM) GEMV_MMA_K(4, 4, LM) GEMV_MMA_K(2, 8, LM) GEMV_MMA_K(8, 4, LM) GEMV_MMA_K(4, 16, LM)
GEMV_MMA_K(4, 8, 0)
GEMV_MMA_K(4, 8, 1)
GEMV_MMA_EXTRA(0)
GEMV_MMA_EXTRA(1)
GEMV_MMA_EXTRA(2)
#endif
#endif
