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
// Epilogues (the E of gemv_impl and gemv_mma_impl): what is done with the
// sums. OutStore stores them (the plain product). The paired epilogues give
// each warp (CUDA cores) or block (tensor cores) the two weight rows of
// every output it writes and round both sums to ACT, as the product's own
// store would, before combining them as the kernel of kernels.cu that
// would read that product does: SwiGLUOut (gemv_swiglu_*, the stacked
// gate/up product → SwiGLU, swiglu_packed) and RoPEOut (gemv_rope_*, the
// stacked Q/K/V product → q rotated, k rotated and v into the cache slots,
// rope_qkv_write). Fusing them saves a kernel a layer in decode steps.
//
// Both: K·sizeof(ACT) must be a multiple of 16 and x, w 16-byte aligned
// (checked by the Go wrapper); K need not be a multiple of a group of loads
// (tail loops). LM is the weight load flavour: 0 plain ld.global.nc, 1 +
// L1::no_allocate (every weight byte is read once), 2 + L2::256B prefetch.
// The module holds the kernels gemv.go uses (GEMV_CC and their epilogue
// variants GEMV_EPI, and gemv_mma_4_8_2 with its GEMV_MMA_EPI for
// f16/bf16); -DGEMV_SWEEP=1 adds the others that the benchmark compares.

// The tile kernels (gemv_tile.cu) take their tensor-core helpers from mma.cu.
#if defined(GEMV_MMA) && !defined(ACT_MMA)
#define ACT_MMA 1
#endif

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

// rnd rounds v to ACT and back (as the product's store and a reload would).
__device__ __forceinline__ float rnd(float v, const float*) { return v; }
__device__ __forceinline__ float rnd(float v, const bf16*) {
	unsigned short r;
	asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
	return __uint_as_float((unsigned)r << 16);
}
__device__ __forceinline__ float rnd(float v, const f16*) {
	unsigned short r;
	float f;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(r));
	return f;
}
__device__ __forceinline__ float rnd(float v) { return rnd(v, (const T*)0); }

// tof widens one element to a float (kernels.cu's, for this module).
__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ float tof(bf16 v) { return __uint_as_float((unsigned)v.x << 16); }
__device__ __forceinline__ float tof(f16 v) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
	return f;
}

// ---------------------------------------------------------------- epilogues

// Every epilogue E: ROWS weight rows an output; units(), its number of
// outputs; row(n, which), the weight row of output n (which < ROWS); pre(t,
// n), what the store of output n for token t needs from memory, loaded
// before the products (its operands are the step's packed batch and
// constants, never the previous kernel's output, so it may run before the
// PDL wait); put(pre, t, n, sum, partner's sum) stores it. LATE: the
// kernel lets the next one launch after its products rather than at its
// start. The SwiGLU epilogue's reader is the down projection's GEMV, whose
// blocks, launched early, would fill the first multiprocessors to free up
// rather than spread over all of them: with the early launch the SwiGLU
// epilogue gained nothing (the measurements are in docs/PERF.md).

// OutStore: out[t·N + n] = sum (of ACT, or f32 when outF32); one row an output.
struct OutStore {
	void* out;
	int N, outF32;
	static constexpr int ROWS = 1;
	static constexpr bool LATE = false, GATHER = false;
	struct Pre {};
	__device__ __forceinline__ int units() const { return N; }
	__device__ __forceinline__ long long row(int n, int) const { return n; }
	__device__ __forceinline__ Pre pre(int, int) const { return Pre{}; }
	__device__ __forceinline__ void put(const Pre&, int t, int n, float s, float) const {
		long long o = (long long)t * N + n;
		if (outF32) store((float*)out + o, s);
		else store((T*)out + o, s);
	}
};

// AddStore: out[t·N + n] = sum + add[t·N + n] (of ACT), rounded once: a
// folded norm's residual added by the product before it (GEMV.RunFolded).
struct AddStore {
	T* out;
	int N;
	const T* add;
	static constexpr int ROWS = 1;
	static constexpr bool LATE = false, GATHER = false;
	struct Pre {};
	__device__ __forceinline__ int units() const { return N; }
	__device__ __forceinline__ long long row(int n, int) const { return n; }
	__device__ __forceinline__ Pre pre(int, int) const { return Pre{}; }
	__device__ __forceinline__ void put(const Pre&, int t, int n, float s, float) const {
		const long long o = (long long)t * N + n;
		store(out + o, s + tof(add[o]));
	}
};

// SwiGLUOut: w is the stacked [gate; up] weight (2F rows); output j of
// token t is out[t·F + j] = SiLU(gate_j)·up_j, from rows j and F + j.
struct SwiGLUOut {
	T* out;
	int F;
	static constexpr int ROWS = 2;
	static constexpr bool LATE = true, GATHER = false;
	struct Pre {};
	__device__ __forceinline__ int units() const { return F; }
	__device__ __forceinline__ long long row(int j, int which) const { return j + (long long)which * F; }
	__device__ __forceinline__ Pre pre(int, int) const { return Pre{}; }
	__device__ __forceinline__ void put(const Pre&, int t, int j, float g, float u) const {
		store(out + (long long)t * F + j, silu_f(rnd(g)) * rnd(u));
	}
};

// RoPEOut: w is the stacked [q; k; v] weight ((heads + 2·kvHeads)·hd
// rows); each output is one rotated pair (a, b) of a head: rows (i,
// i + hd/2), or (2i, 2i+1) when interleaved. Query heads are rotated by
// token t's position into q[t, heads·hd], key heads rotated and value heads
// stored into the layer's caches at token t's slot.
struct RoPEOut {
	T *q, *kc, *vc;
	const int *pos, *slots;
	const float* table; // [maxPos, hd]: cos, then sin
	int heads, kvHeads, hd, interleaved;
	static constexpr int ROWS = 2;
	static constexpr bool LATE = false, GATHER = false;
	struct Pre {
		T* dst;     // the head's first element
		float c, s; // its rotation (value heads: none, c = 1, s = 0)
	};
	__device__ __forceinline__ int units() const { return (heads + 2 * kvHeads) * (hd / 2); }
	__device__ __forceinline__ int elem(int i, int which) const {
		return interleaved ? 2 * i + which : i + which * (hd / 2);
	}
	__device__ __forceinline__ long long row(int j, int which) const {
		const int half = hd / 2;
		return (long long)(j / half) * hd + elem(j % half, which);
	}
	__device__ __forceinline__ Pre pre(int t, int j) const {
		const int half = hd / 2, h = j / half, i = j % half;
		const long long width = (long long)kvHeads * hd;
		if (h >= heads + kvHeads) return Pre{vc + slots[t] * width + (long long)(h - heads - kvHeads) * hd, 1.f, 0.f};
		const long long p = pos[t];
		T* dst = h < heads ? q + ((long long)t * heads + h) * hd : kc + slots[t] * width + (long long)(h - heads) * hd;
		return Pre{dst, table[p * hd + i], table[p * hd + half + i]};
	}
	__device__ __forceinline__ void put(const Pre& pr, int, int j, float x1, float x2) const {
		const int i = j % (hd / 2);
		x1 = rnd(x1);
		x2 = rnd(x2);
		if (j / (hd / 2) >= heads + kvHeads) { // values: stored as they are
			store(pr.dst + elem(i, 0), x1);
			store(pr.dst + elem(i, 1), x2);
			return;
		}
		store(pr.dst + elem(i, 0), rot1(x1, x2, pr.c, pr.s));
		store(pr.dst + elem(i, 1), rot2(x1, x2, pr.c, pr.s));
	}
};

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
// (wv[r]: the rows' raw weights there) to acc[t][r], and with NORM the
// squares of x[t][k] to ss[t].
template <int TT, int R, bool NORM>
__device__ __forceinline__ void dot(float (&acc)[TT][R], float (&ss)[TT], const uint4 (&wv)[R], const uint4* x, int kv, int k) {
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
		if (NORM)
#pragma unroll
			for (int e = 0; e < VEC; e++) ss[t] = fmaf(xf[e], xf[e], ss[t]);
	}
}

// gemv_impl: every warp computes the outputs n0 .. n0 + R/E::ROWS - 1 of
// epilogue e from their R weight rows (output n0 + r is row r, paired with
// row r + R/2 when E::ROWS is 2). NORM: a norm folded in (its gain in w, x
// its input rows), each warp also sums the squares of the x rows it
// streams whole and multiplies its sums by each row's 1/rms, 1/sqrt(Σx²/K
// + eps), before the epilogue.
template <int TT, int R, int U, int LM, bool NORM = false, class E>
__device__ __forceinline__ void gemv_impl(const T* x, const T* w, int K, const E& e, float eps = 0.f) {
	static_assert(R % E::ROWS == 0, "rows per warp");
	constexpr int OUTS = R / E::ROWS; // outputs per warp
	if (!E::LATE) pdl_trigger();
	const int lane = threadIdx.x & 31;
	const int N = e.units();
	const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * OUTS;
	if (n0 >= N) return; // the whole warp
	const int kv = K / VEC; // 16-byte columns per row
	const uint4* xv = (const uint4*)x;
	const uint4* wr[R];
#pragma unroll
	for (int r = 0; r < R; r++) wr[r] = (const uint4*)w + e.row(imin(n0 + r % OUTS, N - 1), r / OUTS) * kv + lane;

	float acc[TT][R], ss[TT];
#pragma unroll
	for (int t = 0; t < TT; t++) {
		ss[t] = 0.f;
#pragma unroll
		for (int r = 0; r < R; r++) acc[t][r] = 0.f;
	}

	constexpr int STEP = 32 * U;
	const int full = kv / STEP; // groups of U columns per lane without bounds checks
	uint4 cur[U][R];
	if (full > 0) {
#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int r = 0; r < R; r++) cur[u][r] = ldw<LM>(wr[r] + u * 32);
	}
	// Lane t·OUTS+r stores output (t, n0+r) (TT·OUTS ≤ 32): what it needs
	// comes in with the first weights.
	static_assert(TT * OUTS <= 32, "one store a lane");
	typename E::Pre pre{};
	if (lane < TT * OUTS && n0 + lane % OUTS < N) pre = e.pre(lane / OUTS, n0 + lane % OUTS);
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
			for (int u = 0; u < U; u++) dot<TT, R, NORM>(acc, ss, cur[u], xv, kv, base + u * 32 + lane);
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
		dot<TT, R, NORM>(acc, ss, cur, xv, kv, k + lane);
	}
	if (E::LATE) pdl_trigger();

#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++) {
			float v = acc[t][r];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
			acc[t][r] = v;
		}
	if (NORM)
#pragma unroll
		for (int t = 0; t < TT; t++) {
			float v = ss[t];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
			const float inv = 1.f / sqrtf(v / (float)K + eps);
#pragma unroll
			for (int r = 0; r < R; r++) acc[t][r] *= inv;
		}
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < OUTS; r++) {
			const int n = n0 + r;
			if (lane == t * OUTS + r && n < N) e.put(pre, t, n, acc[t][r], acc[t][(r + OUTS) % R]);
		}
}

// The CUDA-core kernels: the plain product, and the two paired epilogues
// (R even).
#define GEMV(TT, R, U, LM)                                                                                         \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                 \
	    gemv_##TT##_##R##_##U##_##LM(const T* x, const T* w, void* out, int K, int N, int outF32) {           \
		gemv_impl<TT, R, U, LM>(x, w, K, OutStore{out, N, outF32});                                        \
	}
#define GEMV_EPI(TT, R, U, LM)                                                                                     \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                 \
	    gemv_swiglu_##TT##_##R##_##U##_##LM(const T* x, const T* w, T* out, int K, int F) {                   \
		gemv_impl<TT, R, U, LM>(x, w, K, SwiGLUOut{out, F});                                               \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_rope_##TT##_##R##_##U##_##LM(             \
	    const T* x, const T* w, int K, T* q, T* kc, T* vc, const int* pos, const int* slots, const float* table, \
	    int heads, int kvHeads, int hd, int interleaved) {                                                     \
		gemv_impl<TT, R, U, LM>(x, w, K, RoPEOut{q, kc, vc, pos, slots, table, heads, kvHeads, hd, interleaved}); \
	}
// The same with a norm folded in (GEMV.RunFolded): gemv_add_… adds the
// norm's residual (AddStore), gemv_norm_…, gemv_swiglu_norm_… and
// gemv_rope_norm_… apply its 1/rms. Kernels of their own: one kernel with
// both forms behind a run-time branch slowed the plain form (docs/PERF.md,
// issue 15, session 36).
#define GEMV_FOLD(TT, R, U, LM)                                                                                    \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                 \
	    gemv_add_##TT##_##R##_##U##_##LM(const T* x, const T* w, T* out, int K, int N, const T* add) {        \
		gemv_impl<TT, R, U, LM>(x, w, K, AddStore{out, N, add});                                           \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_norm_##TT##_##R##_##U##_##LM(             \
	    const T* x, const T* w, void* out, int K, int N, int outF32, float eps) {                             \
		gemv_impl<TT, R, U, LM, true>(x, w, K, OutStore{out, N, outF32}, eps);                             \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                                 \
	    gemv_swiglu_norm_##TT##_##R##_##U##_##LM(const T* x, const T* w, T* out, int K, int F, float eps) {   \
		gemv_impl<TT, R, U, LM, true>(x, w, K, SwiGLUOut{out, F}, eps);                                    \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_rope_norm_##TT##_##R##_##U##_##LM(        \
	    const T* x, const T* w, int K, T* q, T* kc, T* vc, const int* pos, const int* slots, const float* table, \
	    int heads, int kvHeads, int hd, int interleaved, float eps) {                                          \
		gemv_impl<TT, R, U, LM, true>(x, w, K, RoPEOut{q, kc, vc, pos, slots, table, heads, kvHeads, hd, interleaved}, eps); \
	}

// ---------------------------------------------------------------- FP8 weights
// gemv_f8_<TT>_<R>_<U>_<LM>: w is E4M3 [N,K] with a float32 scale a row
// (wscale[N]), out[t,n] = wscale[n]·Σ_k x[t,k]·w[n,k], x of ACT; the CUDA-core
// kernel's layout (a warp per R rows, U 16-byte weight loads per row and
// lane in flight, double buffered in registers, the plain store), with 16
// weights a load, decoded by cvt.rn.f16x2.e4m3x2 (compute capability 8.9
// on: the Go side refuses older devices) and matched with the 16 x values
// of 16/VEC loads. K must be a multiple of 16.

// unpack_e4m3 widens the 16 E4M3 bytes of v (element j at byte j) to floats.
__device__ __forceinline__ void unpack_e4m3(uint4 v, float* f) {
	const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float lo = 0.f, hi = 0.f;
#if __CUDA_ARCH__ >= 890
			const unsigned short pair = (unsigned short)(w[i] >> (16 * h));
			asm("{.reg .b32 pk;\n\t.reg .f16 l16, h16;\n\tcvt.rn.f16x2.e4m3x2 pk, %2;\n\tmov.b32 {l16, h16}, pk;\n\t"
			    "cvt.f32.f16 %0, l16;\n\tcvt.f32.f16 %1, h16;}"
			    : "=f"(lo), "=f"(hi) : "h"(pair));
#endif
			f[4 * i + 2 * h] = lo;
			f[4 * i + 2 * h + 1] = hi;
		}
}

// dot_f8 adds x[·][16c..16c+15]·w[r][16c..16c+15] to acc[t][r] (wv[r]: the
// rows' 16 weights at chunk c; x rows of K elements).
template <int TT, int R>
__device__ __forceinline__ void dot_f8(float (&acc)[TT][R], const uint4 (&wv)[R], const uint4* x, int kv, int c) {
	constexpr int XL = 16 / VEC; // x loads a chunk
	float wf[R][16];
#pragma unroll
	for (int r = 0; r < R; r++) unpack_e4m3(wv[r], wf[r]);
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int j = 0; j < XL; j++) {
			float xf[VEC];
			unpack(ldx(x + t * kv + c * XL + j), xf, (const T*)0);
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int e = 0; e < VEC; e++) acc[t][r] = fmaf(xf[e], wf[r][j * VEC + e], acc[t][r]);
		}
}

template <int TT, int R, int U, int LM>
__device__ __forceinline__ void gemv_f8_impl(const T* x, const unsigned char* w, const float* wscale, int K, const OutStore& e) {
	pdl_trigger();
	const int lane = threadIdx.x & 31;
	const int N = e.units();
	const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
	if (n0 >= N) return; // the whole warp
	const int kw = K / 16;  // 16-byte weight chunks a row
	const int kv = K / VEC; // 16-byte x columns a row
	const uint4* xv = (const uint4*)x;
	const uint4* wr[R];
#pragma unroll
	for (int r = 0; r < R; r++) wr[r] = (const uint4*)w + (long long)imin(n0 + r, N - 1) * kw + lane;
	float scale[R]; // constants of the weights: read before the PDL wait
#pragma unroll
	for (int r = 0; r < R; r++) scale[r] = wscale[imin(n0 + r, N - 1)];

	float acc[TT][R];
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++) acc[t][r] = 0.f;
	constexpr int STEP = 32 * U;
	const int full = kw / STEP;
	uint4 cur[U][R];
	if (full > 0) {
#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int r = 0; r < R; r++) cur[u][r] = ldw<LM>(wr[r] + u * 32);
	}
	pdl_wait(); // x is the previous kernel's output
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
		for (int u = 0; u < U; u++) dot_f8<TT, R>(acc, cur[u], xv, kv, base + u * 32 + lane);
		if (i + 1 < full) {
#pragma unroll
			for (int u = 0; u < U; u++)
#pragma unroll
				for (int r = 0; r < R; r++) cur[u][r] = nxt[u][r];
		}
	}
	for (int c = full * STEP; c + lane < kw; c += 32) { // the tail, a chunk a lane at a time
		uint4 one[R];
#pragma unroll
		for (int r = 0; r < R; r++) one[r] = ldw<LM>(wr[r] + c);
		dot_f8<TT, R>(acc, one, xv, kv, c + lane);
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
	typename OutStore::Pre pre{};
#pragma unroll
	for (int t = 0; t < TT; t++)
#pragma unroll
		for (int r = 0; r < R; r++)
			if (lane == t * R + r && n0 + r < N) e.put(pre, t, n0 + r, acc[t][r] * scale[r], 0.f);
}

#define GEMV_F8(TT, R, U, LM)                                                                                      \
	extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f8_##TT##_##R##_##U##_##LM(                \
	    const T* x, const unsigned char* w, const float* wscale, void* out, int K, int N, int outF32) {        \
		gemv_f8_impl<TT, R, U, LM>(x, w, wscale, K, OutStore{out, N, outF32});                             \
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

// gemv_mma: block 32·WARPS; the block owns 16 rows of w, those of
// outputs n0..n0+15 of epilogue e (grid ceil(N/16)), or, paired
// (E::ROWS 2), both rows of outputs n0..n0+7 (grid ceil(N/8)), the first
// rows at tile rows 0-7, their partners at 8-15 (outputs past N re-read
// output N-1's rows, not stored); its warps split K:
// warp v takes the groups v, v+WARPS, ... of U·32 columns (per row, lane
// (g, q) loads 16 bytes at column 8q of each 32), double buffered in
// registers, and a last partial group 32 columns at a time. x rows past T
// re-read row T-1 (their output columns are dropped). The warps' 16×8
// accumulators are summed through shared memory.
template <int U, int WARPS, int LM, class E>
__device__ __forceinline__ void gemv_mma_impl(const T* x, const T* w, int K, int TT, const E& e) {
	__shared__ float red[WARPS][128];
	if (!E::LATE) pdl_trigger();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int g = lane >> 2, q = lane & 3;
	const int N = e.units();
	constexpr int OUTS = 16 / E::ROWS; // outputs per block
	const int n0 = blockIdx.x * OUTS;
	// Thread i < 8·OUTS stores (token i%8, output n0 + i/8).
	typename E::Pre pre{};
	const int pt = threadIdx.x & 7, pn = n0 + (threadIdx.x >> 3);
	const bool stores = threadIdx.x < 8 * OUTS && pt < TT && pn < N;
	if (stores) pre = e.pre(pt, pn);
	const int k8 = K / 8; // 16-byte columns per row
	const long long r0 = e.row(imin(n0 + g, N - 1), 0);
	const long long r1 = E::ROWS == 1 ? e.row(imin(n0 + g + 8, N - 1), 0) : e.row(imin(n0 + g, N - 1), 1);
	const uint4* w0 = (const uint4*)w + r0 * k8 + q;
	const uint4* w1 = (const uint4*)w + r1 * k8 + q;
	const uint4* xr = (const uint4*)x + imin(g, TT - 1) * k8 + q;
	float c[4] = {0.f, 0.f, 0.f, 0.f};

	constexpr int GS = 4 * U; // 16-byte columns per group
	const int gfull = k8 / GS;
	// A warp's first group of weights is loaded before the wait, as the
	// CUDA-core kernels do: in a step the kernel before is often bound by
	// latency (attention, a norm, an all-reduce), and these loads then use
	// the memory it leaves idle.
	uint4 a[U], b[U], xv[U];
	if (warp < gfull) {
#pragma unroll
		for (int j = 0; j < U; j++) {
			const int col = warp * GS + 4 * j;
			a[j] = ldw<LM>(w0 + col);
			b[j] = ldw<LM>(w1 + col);
		}
	}
	pdl_wait(); // x is the previous kernel's output
	if (warp < gfull) {
#pragma unroll
		for (int j = 0; j < U; j++) xv[j] = ldx(xr + warp * GS + 4 * j);
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

	if (E::LATE) pdl_trigger();
	// c: (row g, col 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1); row = n - n0, col = t.
	red[warp][g * 8 + 2 * q] = c[0];
	red[warp][g * 8 + 2 * q + 1] = c[1];
	red[warp][(g + 8) * 8 + 2 * q] = c[2];
	red[warp][(g + 8) * 8 + 2 * q + 1] = c[3];
	__syncthreads();
	// Thread i sums (tile row i/8, token i%8) and, paired, its partner
	// row's (tile row i/8 + 8).
	if (stores) {
		const int i = threadIdx.x;
		float s = 0.f, s2 = 0.f;
#pragma unroll
		for (int v = 0; v < WARPS; v++) {
			s += red[v][i];
			if (E::ROWS == 2) s2 += red[v][i + 64];
		}
		e.put(pre, pt, pn, s, s2);
	}
}

#define GEMV_MMA_K(U, WARPS, LM)                                                                                   \
	extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                   \
	    gemv_mma_##U##_##WARPS##_##LM(const T* x, const T* w, void* out, int K, int N, int TT, int outF32) { \
		gemv_mma_impl<U, WARPS, LM>(x, w, K, TT, OutStore{out, N, outF32});                                \
	}
#define GEMV_MMA_EPI(U, WARPS, LM)                                                                                 \
	extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                   \
	    gemv_mma_swiglu_##U##_##WARPS##_##LM(const T* x, const T* w, T* out, int K, int F, int TT) {          \
		gemv_mma_impl<U, WARPS, LM>(x, w, K, TT, SwiGLUOut{out, F});                                       \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(32 * WARPS) gemv_mma_rope_##U##_##WARPS##_##LM(              \
	    const T* x, const T* w, int K, int TT, T* q, T* kc, T* vc, const int* pos, const int* slots,          \
	    const float* table, int heads, int kvHeads, int hd, int interleaved) {                                 \
		gemv_mma_impl<U, WARPS, LM>(x, w, K, TT, RoPEOut{q, kc, vc, pos, slots, table, heads, kvHeads, hd, interleaved}); \
	}
#endif // GEMV_MMA

// The kernels gemv.go uses (gemvProd): CUDA cores for every T (f32; T = 1
// for f16/bf16), tensor cores for f16/bf16.
#define GEMV_CC(LM)                                                                 \
	GEMV(1, 2, 4, LM) GEMV(2, 2, 4, LM) GEMV(3, 2, 4, LM) GEMV(4, 2, 4, LM) \
	GEMV(5, 4, 4, LM) GEMV(6, 4, 4, LM) GEMV(7, 4, 4, LM) GEMV(8, 4, 4, LM)
// They are part 0 of the GEMV module (KILN_PART_IS).
#if KILN_PART_IS(0)
GEMV_CC(1)
GEMV_EPI(1, 2, 4, 1) GEMV_EPI(2, 2, 4, 1) GEMV_EPI(3, 2, 4, 1) GEMV_EPI(4, 2, 4, 1)
GEMV_EPI(5, 4, 4, 1) GEMV_EPI(6, 4, 4, 1) GEMV_EPI(7, 4, 4, 1) GEMV_EPI(8, 4, 4, 1)
GEMV_FOLD(1, 2, 4, 1) GEMV_FOLD(2, 2, 4, 1) GEMV_FOLD(3, 2, 4, 1) GEMV_FOLD(4, 2, 4, 1)
GEMV_FOLD(5, 4, 4, 1) GEMV_FOLD(6, 4, 4, 1) GEMV_FOLD(7, 4, 4, 1) GEMV_FOLD(8, 4, 4, 1)
// FP8 weights (gemvF8Cfg in gemv.go).
GEMV_F8(1, 2, 4, 1) GEMV_F8(2, 2, 4, 1) GEMV_F8(3, 2, 4, 1) GEMV_F8(4, 2, 4, 1)
GEMV_F8(5, 2, 4, 1) GEMV_F8(6, 2, 4, 1) GEMV_F8(7, 2, 4, 1) GEMV_F8(8, 2, 4, 1)
#ifdef GEMV_MMA
GEMV_MMA_K(4, 8, 2)
GEMV_MMA_EPI(4, 8, 2)
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
#endif // KILN_PART_IS(0)
