// kiln skinny GEMM on the tensor cores for 9 to 64 rows (batched decode
// steps): out[T,N] = x[T,K]·w[N,K]ᵀ with the epilogues of gemv.cu
// (OutStore, SwiGLUOut, RoPEOut). Appended to the gemv module after
// async.cu and mma.cu when it is built with -DGEMV_MMA (f16, bf16).
//
// At 64 rows a decode product is still bound by the streaming of w (64
// multiply-adds per weight), but each weight row is now used by many
// rows of x, so x must be staged once per block rather than read per
// warp as gemv_mma does. A block of 4 warps owns R = GT_ROWS = 128 rows
// of w (warp v: rows 32v..32v+31, two m16 tiles; the sweep's tiles of R =
// 64 rows: 16v..16v+15, one) and the first TT ≤ 8·NT rows of x (NT n8
// tiles), and streams a range of K through ST-deep cp.async stages of BK
// columns (w 2·R·BK bytes, x 16·NT·BK), read by
// ldmatrix from 2·BK-byte rows whose 16-byte chunks are swizzled (chunk c
// of row r stored at c ^ (r & 7)) so that the 8 rows of each ldmatrix
// matrix fall in distinct banks. PF 1 asks the L2 to fetch 256 bytes
// around each weight copy (the next stage's, for BK 64).
//
// Split K: the `splits` consecutive blocks of a thread-block cluster share
// one tile of outputs, each taking an equal range of K; after the products
// each block writes its f32 partial tile into its own shared memory and,
// after a cluster barrier, each block sums its share of the tile's
// outputs over every block's partials (distributed shared memory, in rank
// order, so the sums do not depend on timing; gt_store) and stores them
// through the epilogue. No workspace, nothing left in global memory between
// launches. With splits = 1 (no cluster) the same code reads its own
// shared memory.
//
// Hopper (-DGEMV_WGMMA, sm_90a): with BK 64 a stage's rows are 128 bytes
// and the swizzle above is wgmma's 128-byte swizzle (16-byte chunk bits 4-6
// of an address XORed with its bits 7-9, 1024-byte atoms of 8 rows), so the
// warpgroup (the block's 4 warps) multiplies the stages in place with
// wgmma m64n(8·NT)k16 straight from shared memory (wg_desc: K-major
// descriptors, the next 16 columns 32 bytes on): two instructions a 16
// columns for the 128 rows of w, no ldmatrix, a quarter of the
// instructions mma.sync takes. The stages start on a 1024-byte boundary
// (the dynamic shared memory holds 1 KB more for it). Other BK, and other
// GPUs, use mma.sync.
//
// PDL: the weights of the first ST-1 stages are requested before
// the wait for the previous kernel (no kernel writes them), x after it.
//
// A folded norm (GEMV.RunFolded, as the CUDA-core kernels take it): the
// residual added by the epilogue (AddStore, gemv_tile_add_…), or, NORM,
// x the norm's input rows and its gain in w: each block also sums the
// squares of the x rows of its range of K as their stages land, the
// cluster's partial sums are added as the products' are, and the sums are
// multiplied by each row's 1/rms, 1/sqrt(Σx²/K + eps), before the
// epilogue (gemv_tile_norm_…, gemv_tile_swiglu_norm_…,
// gemv_tile_rope_norm_…).
//
// Tile rows and outputs: OutStore's output n0 + r is tile row r; a paired
// epilogue's (E::ROWS 2) outputs j0..j0+R/2−1 take tile rows 0..R/2−1 and
// their partner rows R/2..R−1. Rows past the epilogue's outputs are zero-filled
// and not stored; x rows past TT are zero-filled (their columns dropped).
// K must be a multiple of BK (the Go wrapper checks).

#ifdef GEMV_MMA
#define GT_ROWS 128
#define GT_THREADS 128

// gt_off is the byte offset of 16-byte chunk c of row r in a stage tile of
// BK columns.
template <int BK> __device__ __forceinline__ unsigned gt_off(int r, int c) {
	return (unsigned)(r * 2 * BK + ((c ^ (r & 7)) << 4));
}

// gt_partial4 loads partial sums i..i+3 (i a multiple of 4) of cluster
// block rank r; gt_partial one.
__device__ __forceinline__ float4 gt_partial4(const float* red, int i, int r, int splits) {
	if (splits == 1) return *(const float4*)(red + i);
	return lds_cluster4(dsmem(red + i, r));
}
__device__ __forceinline__ float gt_partial(const float* red, int i, int r, int splits) {
	if (splits == 1) return red[i];
	return lds_cluster(dsmem(red + i, r));
}

// gt_store sums each output's partials over the cluster's splits blocks (at
// most 8, a portable cluster; red[token·RS + tile row] in each, summed in
// rank order, so the sums do not depend on timing) and stores them through
// the epilogue. Block rank r takes groups of 4 consecutive outputs of one
// token, r·threads + tid, then every splits·threads further; a group's
// partials from every rank (and their partner rows') are requested before
// any is summed, so the latency of distributed shared memory is paid once
// a group, not once a partial. NORM: ssq[t] are the partial sums of the
// squares of x row t, summed over the splits in rank order too, and the
// sums are multiplied by 1/sqrt(Σx²/K + eps).
template <int OUTS, bool NORM, class E>
__device__ __forceinline__ void gt_store(const float* red, int RS, int rank, int splits, int tid, int threads, int TT, int n0,
                                         int units, const E& e, const float* ssq, int K, float eps) {
	constexpr int G = OUTS / 4;
	for (int idx = rank * threads + tid; idx < G * TT; idx += splits * threads) {
		const int t = idx / G, o = 4 * (idx % G);
		if (n0 + o >= units) continue;
		float4 a[8], b[8];
		float q[8];
#pragma unroll
		for (int r = 0; r < 8; r++)
			if (r < splits) {
				a[r] = gt_partial4(red, t * RS + o, r, splits);
				if (E::ROWS == 2) b[r] = gt_partial4(red, t * RS + o + OUTS, r, splits);
				if (NORM) q[r] = gt_partial(ssq, t, r, splits);
			}
		float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int r = 0; r < 8; r++)
			if (r < splits) {
				s[0] += a[r].x, s[1] += a[r].y, s[2] += a[r].z, s[3] += a[r].w;
				if (E::ROWS == 2) s2[0] += b[r].x, s2[1] += b[r].y, s2[2] += b[r].z, s2[3] += b[r].w;
			}
		if (NORM) {
			float v = 0.f;
#pragma unroll
			for (int r = 0; r < 8; r++)
				if (r < splits) v += q[r];
			const float inv = 1.f / sqrtf(v / (float)K + eps);
#pragma unroll
			for (int j = 0; j < 4; j++) s[j] *= inv, s2[j] *= inv;
		}
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const int n = n0 + o + j;
			if (n < units) e.put(e.pre(t, n), t, n, s[j], s2[j]);
		}
	}
}

// gt_wrow is the first element of weight row n (which: 0, or 1 for a
// paired epilogue's partner row) and gt_xrow of x row r: rows of w and x
// in order, or wherever a gathering epilogue (E::GATHER, moe_tile.cu's)
// says.
template <class E> __device__ __forceinline__ const T* gt_wrow(const E& e, const T* w, int n, int which, int K) {
	if constexpr (E::GATHER) return e.wrow(w, n, which, K);
	else return w + e.row(n, which) * (long long)K;
}
template <class E> __device__ __forceinline__ const T* gt_xrow(const E& e, const T* x, int r, int K) {
	if constexpr (E::GATHER) return e.xrow(x, r, K);
	else return x + (long long)r * K;
}

// R is the tile's weight rows: GT_ROWS, or 64 (the sweep's tiles of half
// the rows, twice as many tiles for a product, so fewer splits of K to fill
// the device): MT = R/64 m64 tiles for wgmma, MT m16 tiles a warp for
// mma.sync (warp v: rows 16·MT·v on).
template <int NT, int BK, int ST, int PF, class E, int R = GT_ROWS, bool NORM = false>
__device__ __forceinline__ void gemv_tile_impl(const T* x, const T* w, int K, int TT, int splits, const E& e, float eps = 0.f) {
	extern __shared__ __align__(128) unsigned char gt_smem[];
	static_assert(R == 64 || R == 128, "tiles of 64 or 128 rows");
	constexpr int MT = R / 64;
	constexpr int XROWS = 8 * NT, CH = BK / 8; // x rows, 16-byte chunks a row
	constexpr int WBYTES = R * 2 * BK, SBYTES = WBYTES + XROWS * 2 * BK;
	constexpr int OUTS = R / E::ROWS;      // outputs a tile
	constexpr int RSTEP = GT_THREADS / CH; // rows a round of copies covers
	constexpr int WLOADS = R / RSTEP, XLOADS = XROWS / RSTEP;
	static_assert(XLOADS >= 1 && XROWS % RSTEP == 0 && R % RSTEP == 0 && GT_THREADS % CH == 0, "w and x chunks a thread");
	// NORM: thread tid sums the squares of x row tid / XT, XC of its chunks
	// a stage (XT threads a row, adjacent lanes).
	constexpr int XT = GT_THREADS / XROWS, XC = CH / XT;
	static_assert(!NORM || (GT_THREADS % XROWS == 0 && XT <= 32 && CH % XT == 0), "x chunks a thread for the squares");
	float ss = 0.f;
	if (!E::LATE) pdl_trigger();
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int rank = blockIdx.x % splits, tile = blockIdx.x / splits;
	const int units = e.units(), n0 = tile * OUTS;
#ifdef GEMV_WGMMA
	constexpr bool WG = BK == 64; // the stages as wgmma reads them
#else
	constexpr bool WG = false;
#endif
	// The stages (and then the partial tile) from the first 1024-byte
	// boundary of the dynamic shared memory.
	const unsigned sb = (smem_addr(gt_smem) + 1023u) & ~1023u;
	unsigned char* const smem = gt_smem + (sb - smem_addr(gt_smem));

	// Thread tid copies chunk tid % CH of tile rows tid/CH + RSTEP·j (w)
	// and of x rows tid/CH + RSTEP·j.
	const int cc = tid % CH, cr = tid / CH;
	const T* wsrc[WLOADS];
	bool win[WLOADS];
#pragma unroll
	for (int j = 0; j < WLOADS; j++) {
		const int r = cr + RSTEP * j;
		const int n = n0 + (E::ROWS == 1 ? r : r % OUTS);
		win[j] = n < units;
		wsrc[j] = gt_wrow(e, w, imin(n, units - 1), E::ROWS == 1 ? 0 : r / OUTS, K) + cc * 8;
	}
	const T* xsrc[XLOADS];
	bool xin[XLOADS];
#pragma unroll
	for (int j = 0; j < XLOADS; j++) {
		const int r = cr + RSTEP * j;
		xin[j] = r < TT;
		xsrc[j] = gt_xrow(e, x, imin(r, TT - 1), K) + cc * 8;
	}
	auto load_w = [&](int stage, int ks) {
		const unsigned b = sb + stage * SBYTES;
#pragma unroll
		for (int j = 0; j < WLOADS; j++) {
			if (PF) cp16_l2(b + gt_off<BK>(cr + RSTEP * j, cc), wsrc[j] + ks * BK, win[j]);
			else cp16(b + gt_off<BK>(cr + RSTEP * j, cc), wsrc[j] + ks * BK, win[j]);
		}
	};
	auto load_x = [&](int stage, int ks) {
		const unsigned b = sb + stage * SBYTES + WBYTES;
#pragma unroll
		for (int j = 0; j < XLOADS; j++) cp16(b + gt_off<BK>(cr + RSTEP * j, cc), xsrc[j] + ks * BK, xin[j]);
	};

	const int kt = K / BK;
	const int ks0 = (int)((long long)kt * rank / splits), nk = (int)((long long)kt * (rank + 1) / splits) - ks0;
#pragma unroll
	for (int s = 0; s < ST - 1; s++)
		if (s < nk) load_w(s, ks0 + s);
	pdl_wait(); // x is the previous kernel's output
#pragma unroll
	for (int s = 0; s < ST - 1; s++) {
		if (s < nk) load_x(s, ks0 + s);
		cp_commit();
	}

	// mma.sync: acc[m][n] is the m16n8 tile of w rows 16·MT·warp + 16m and x
	// rows 8n. wgmma: acc[m] (as 4·NT floats) is the m64n(8·NT) tile of w
	// rows 64m (wg_mma's layout).
	float acc[MT][NT][4];
#pragma unroll
	for (int m = 0; m < MT; m++)
#pragma unroll
		for (int n = 0; n < NT; n++)
#pragma unroll
			for (int i = 0; i < 4; i++) acc[m][n][i] = 0.f;
	// ldmatrix: lane l addresses row l%8 of matrix l/8.
	const int mi = lane & 7, mq = lane >> 3;
	for (int i = 0; i < nk; i++) {
		cp_wait<ST - 2>();
#ifdef GEMV_WGMMA
		if constexpr (WG) fence_async_smem(); // this thread's copies, for wgmma's reads
#endif
		__syncthreads(); // stage i is in; every warp is done with stage i-1
		const int nx = i + ST - 1;
		if (nx < nk) {
			load_w(nx % ST, ks0 + nx);
			load_x(nx % ST, ks0 + nx);
		}
		cp_commit();
		const unsigned wb = sb + (i % ST) * SBYTES, xb = wb + WBYTES;
		if constexpr (NORM) {
#pragma unroll
			for (int c = 0; c < XC; c++) {
				const uint4 v = *(const uint4*)(smem + (xb - sb) + gt_off<BK>(tid / XT, (tid % XT) * XC + c));
				const T* h = (const T*)&v;
#pragma unroll
				for (int j = 0; j < 8; j++) {
					const float f = tof(h[j]);
					ss += f * f;
				}
			}
		}
#ifdef GEMV_WGMMA
		if constexpr (WG) {
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
				for (int m = 0; m < MT; m++) wg_mma<8 * NT>(&acc[m][0][0], wg_desc(wb + m * 64 * 2 * BK + 32 * kk), wg_desc(xb + 32 * kk));
			wg_commit();
			wg_wait0(); // the stage is read before the next round of copies overwrites it
			continue;
		}
#endif
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk++) {
			// A (w rows, 16×16): matrices rows 0-7 / 8-15 × k 0-7 / 8-15 → a0..a3.
			unsigned a[MT][4];
#pragma unroll
			for (int m = 0; m < MT; m++) ldsm4(a[m], wb + gt_off<BK>(16 * MT * warp + 16 * m + mi + 8 * (mq & 1), 2 * kk + (mq >> 1)));
			// B (x rows as columns): matrices tokens 0-7 k 0-7, tokens 0-7 k 8-15,
			// tokens 8-15 k 0-7, 8-15 k 8-15 → b0, b1 of n-tiles 2p and 2p+1.
#pragma unroll
			for (int p = 0; p < NT / 2; p++) {
				unsigned b[4];
				ldsm4(b, xb + gt_off<BK>(16 * p + mi + 8 * (mq >> 1), 2 * kk + (mq & 1)));
#pragma unroll
				for (int m = 0; m < MT; m++) {
					mma16816(acc[m][2 * p], a[m], b[0], b[1], (const T*)0);
					mma16816(acc[m][2 * p + 1], a[m], b[2], b[3], (const T*)0);
				}
			}
		}
	}
	if (E::LATE) pdl_trigger();

	// The block's partial tile, red[token][row] (row stride R + 4), over the stages.
	cp_wait<0>();
	__syncthreads();
	constexpr int RS = R + 4;
	float* red = (float*)smem;
	float* const ssq = red + XROWS * RS; // NORM: x rows' partial sums of squares
	if constexpr (NORM) {
#pragma unroll
		for (int o = XT / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
		if (tid % XT == 0) ssq[tid / XT] = ss;
	}
	const int g = lane >> 2, q = lane & 3;
#pragma unroll
	for (int m = 0; m < MT; m++)
#pragma unroll
		for (int n = 0; n < NT; n++) {
			const int r = (WG ? 64 * m + 16 * warp : 16 * MT * warp + 16 * m) + g, t = 8 * n + 2 * q;
			red[t * RS + r] = acc[m][n][0];
			red[(t + 1) * RS + r] = acc[m][n][1];
			red[t * RS + r + 8] = acc[m][n][2];
			red[(t + 1) * RS + r + 8] = acc[m][n][3];
		}
	if (splits > 1) cluster_sync();
	else __syncthreads();
	gt_store<OUTS, NORM>(red, RS, rank, splits, tid, GT_THREADS, TT, n0, units, e, ssq, K, eps);
	if (splits > 1) cluster_sync(); // no block leaves while others read its partials
}

// gemv_tile_<nt>_<bk>_<st>_<pf> and its epilogue variants
// gemv_tile_swiglu_… and gemv_tile_rope_…; GEMV_TILE_PLAIN the plain
// product alone (the sweep's other configurations).
#define GEMV_TILE_PLAIN(NT, BK, ST, PF)                                                                            \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_##NT##_##BK##_##ST##_##PF(              \
	    const T* x, const T* w, void* out, int K, int N, int TT, int outF32, int splits) {                     \
		gemv_tile_impl<NT, BK, ST, PF>(x, w, K, TT, splits, OutStore{out, N, outF32});                      \
	}
#define GEMV_TILE(NT, BK, ST, PF)                                                                                  \
	GEMV_TILE_PLAIN(NT, BK, ST, PF)                                                                            \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_swiglu_##NT##_##BK##_##ST##_##PF(       \
	    const T* x, const T* w, T* out, int K, int F, int TT, int splits) {                                    \
		gemv_tile_impl<NT, BK, ST, PF>(x, w, K, TT, splits, SwiGLUOut{out, F});                             \
	}                                                                                                           \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_rope_##NT##_##BK##_##ST##_##PF(         \
	    const T* x, const T* w, int K, int TT, int splits, T* q, T* kc, T* vc, const int* pos, const int* slots, \
	    const float* table, int heads, int kvHeads, int hd, int interleaved) {                                  \
		gemv_tile_impl<NT, BK, ST, PF>(x, w, K, TT, splits,                                                 \
		                               RoPEOut{q, kc, vc, pos, slots, table, heads, kvHeads, hd, interleaved}); \
	}
// The same with a norm folded in (GEMV.RunFolded, RunSwiGLU and
// RunRoPEQKV with a norm's eps): gemv_tile_add_… adds the norm's residual
// (AddStore), gemv_tile_norm_…, gemv_tile_swiglu_norm_… and
// gemv_tile_rope_norm_… apply its 1/rms.
#define GEMV_TILE_FOLD(NT, BK, ST, PF)                                                                             \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_add_##NT##_##BK##_##ST##_##PF(          \
	    const T* x, const T* w, T* out, int K, int N, int TT, int splits, const T* add) {                      \
		gemv_tile_impl<NT, BK, ST, PF>(x, w, K, TT, splits, AddStore{out, N, add});                         \
	}                                                                                                           \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_norm_##NT##_##BK##_##ST##_##PF(         \
	    const T* x, const T* w, void* out, int K, int N, int TT, int outF32, int splits, float eps) {          \
		gemv_tile_impl<NT, BK, ST, PF, OutStore, GT_ROWS, true>(x, w, K, TT, splits, OutStore{out, N, outF32}, eps); \
	}                                                                                                           \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_swiglu_norm_##NT##_##BK##_##ST##_##PF(  \
	    const T* x, const T* w, T* out, int K, int F, int TT, int splits, float eps) {                         \
		gemv_tile_impl<NT, BK, ST, PF, SwiGLUOut, GT_ROWS, true>(x, w, K, TT, splits, SwiGLUOut{out, F}, eps); \
	}                                                                                                           \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_rope_norm_##NT##_##BK##_##ST##_##PF(    \
	    const T* x, const T* w, int K, int TT, int splits, T* q, T* kc, T* vc, const int* pos, const int* slots, \
	    const float* table, int heads, int kvHeads, int hd, int interleaved, float eps) {                       \
		gemv_tile_impl<NT, BK, ST, PF, RoPEOut, GT_ROWS, true>(                                             \
		    x, w, K, TT, splits, RoPEOut{q, kc, vc, pos, slots, table, heads, kvHeads, hd, interleaved}, eps); \
	}
// The configuration gemv.go uses (tileBK, tileStages, tilePF); the tile
// kernels are part 2 of the GEMV module (KILN_PART_IS).
#if KILN_PART_IS(2)
GEMV_TILE(2, 64, 4, 1)
GEMV_TILE(4, 64, 4, 1)
GEMV_TILE(8, 64, 4, 1)
GEMV_TILE_FOLD(2, 64, 4, 1)
GEMV_TILE_FOLD(4, 64, 4, 1)
GEMV_TILE_FOLD(8, 64, 4, 1)
#if defined(GEMV_SWEEP) || defined(GEMV_TILE_SWEEP)
// The others the benchmark compares (gemvSweep in gemv_test.go).
#define GEMV_TILE_OTHERS(NT)                                                                                       \
	GEMV_TILE_PLAIN(NT, 64, 4, 0) GEMV_TILE_PLAIN(NT, 64, 6, 1) GEMV_TILE_PLAIN(NT, 128, 3, 1) GEMV_TILE_PLAIN(NT, 128, 4, 1)
GEMV_TILE_OTHERS(2)
GEMV_TILE_OTHERS(4)
GEMV_TILE_OTHERS(8)
// Tiles of 64 weight rows (gemv_tile_r64_<nt>_<bk>_<st>_<pf>), the plain
// product.
#define GEMV_TILE_R64(NT, BK, ST, PF)                                                                              \
	extern "C" __global__ void __launch_bounds__(GT_THREADS) gemv_tile_r64_##NT##_##BK##_##ST##_##PF(          \
	    const T* x, const T* w, void* out, int K, int N, int TT, int outF32, int splits) {                     \
		gemv_tile_impl<NT, BK, ST, PF, OutStore, 64>(x, w, K, TT, splits, OutStore{out, N, outF32});       \
	}
GEMV_TILE_R64(2, 64, 4, 1)
GEMV_TILE_R64(4, 64, 4, 1)
GEMV_TILE_R64(8, 64, 4, 1)
GEMV_TILE_R64(8, 64, 6, 1)
#endif
#endif // KILN_PART_IS(2)
#endif // GEMV_MMA
