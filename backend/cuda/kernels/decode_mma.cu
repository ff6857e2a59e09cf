// kiln CUDA kernels: tensor-core decode attention (f16/bf16 activations).
// Appended after prefill_mma.cu by kernels.go (one NVRTC source); uses the
// helpers of mma.cu and attention.cu (cp16, kv_row, decode_merge).

#ifdef ACT_MMA
// Decode attention for batches on the tensor cores (decode_mma_<HD>, GQA
// groups up to 16; decode_mma32_<HD>, groups of 17 to 32), FlashInfer's
// "tensor cores for GQA decode" idea: the query heads sharing a kv head are
// the M rows of m16n8k16 tiles (rows past the group are zeros, never
// written), so that each K and V element read from memory serves the whole
// group through mma.sync, and the kernel is bound by the bandwidth of the
// K/V reads rather than by the CUDA cores' dot products.
//
// Grid (maxSplits, kvHeads / HG, tokens) and block DC_THREADS, as the split
// kernel decode_impl with HG = 1: block (sp, y, t) takes keys [k0, k0 + nk)
// of token t, k0 = lo + sp·chunk, nk = min(chunk, p + 1 − k0) (lo the window
// start, p the token's position), for the query heads of kv heads HG·y to
// HG·y + HG − 1, one after the other; chunk is any number of keys (the
// plans offer 128 to 4096). With HG > 1 (the _h2 and _h4 kernels) the
// heads' stages are one pipeline: the next head's first keys load while a
// head's last ones are computed, so that a block pays the latency of the
// token's metadata, block table and first keys once, not once a head
// (measured in docs/PERF.md, session 27). A token whose keys fit one split
// is finished by its block; otherwise each block writes its partials (m in the
// log2 domain, l, acc) to the workspace and the last to finish merges them
// (decode_merge: the same workspace layout and counters as decode_impl).
//
// The keys stream through shared memory in stages of DM_BK = 64 keys (K and
// V rows, padded by 16 bytes: ldmatrix without bank conflicts), a ring of
// ST stages (DM_ST = 3, or 2 for the _s2 kernels) loaded by 16-byte
// cp.async.cg (stage n + ST − 1 in flight during stage n; one barrier a
// stage), gathered through the block table: the cache rows of a stage's 64
// keys are computed a stage before its copies are issued (threads 0-63, one
// block-table load and division a key, the load issued before a stage's
// math and used after it) into tab[2][64], so that the copies take one
// shared load per 16-byte chunk (dm_load_tab). The prologue's stages use
// dm_load (a lookup per chunk, as they must be split at the PDL wait).
// Warp w takes keys 16w..16w+15 of every stage: S = Q·Kᵀ for its 16 keys
// (Q fragments by ldmatrix, kept in registers from the first stage when
// the group fits one m-tile; K fragments by ldmatrix, K row-major as the B
// operand; even and odd k-chunks into two accumulators, halving the mma
// chain), an online softmax of its own (scores in the log2 domain, one
// FFMA and ex2 an element, as prefill_fa), P rounded to the activation
// dtype (f16: hi + lo parts) as the A operand of O += P·V (V by
// ldmatrix.trans). At the end the four warps' (m, l, O) are merged through
// shared memory (over the ring).
//
// PDL: positions, the split's keys and the K/V rows of keys before the
// sequence's first position in the batch (seqFresh; written by earlier
// steps) of the first two stages are loaded before pdl_enter; Q and this
// step's rows after it, and every store comes after it.
//
// Dynamic shared memory (decodeMMAShared in kernels.go): floats wm[4][ROWS]
// and wl[4][ROWS] (the warps' row maxima and sums), int tab[2][64] (the
// rows of the next stages to load), Q[ROWS][HD+8], then the ring: stage s
// holds K[64][HD+8] then V[64][HD+8] (as many stages as the split has, up
// to ST), overlaid at the end by the warps' accumulators
// red[4][ROWS][HD+8] (f32); ROWS = 16·MT.
//
// An FP8 cache (KV_F8): the ring's rows are HD codes padded by 16 bytes,
// and each thread loads the codes of its K and V fragments from them and
// widens them in registers (see qfrag below).

#define DM_WARPS 4
#define DM_THREADS (32 * DM_WARPS)
#define DM_KW 16                   // keys of a warp in a stage
#define DM_BK (DM_WARPS * DM_KW)   // keys per stage (decodeMMAKeys in kernels.go)
// Stages in the ring (decodeMMAStages in kernels.go), and in the _s2
// kernels' ring, with the blocks an SM their registers are bounded for
// (DM_MINB, DM_MINB2). An FP8 cache's stages hold half the bytes and its
// kernels widen the codes, so that more blocks an SM pay more than deeper
// rings (measured: kernels/NOTES.md, the FP8 KV cache's attention).
#ifdef KV_F8
#define DM_ST 3
#define DM_MINB 3
#define DM_ST2 2
#define DM_MINB2 4
#else
#define DM_ST 3
#define DM_MINB 1
#define DM_ST2 2
#define DM_MINB2 3
#endif

extern __shared__ __align__(16) unsigned short dm_smem[];

// st_f2 stores x, y at p (8-byte aligned) as one 8-byte store.
__device__ __forceinline__ void st_f2(float* p, float x, float y) {
	float2 v;
	v.x = x;
	v.y = y;
	*(float2*)p = v;
}

// dm_rb is the bytes of a ring row: HD cache elements padded by 16 bytes
// (HD + 8 elements as ldmatrix wants them; an FP8 cache's codes, which the
// fragments' 16-byte loads then read without bank conflicts).
template <int HD> __device__ constexpr int dm_rb() { return HD * (int)sizeof(KV) + 16; }

// dm_load copies the K and V rows of stage s of a split (keys k0 + 64s..,
// of the nk keys k0..) into ring slot n % ST (n the stage's place in the
// block's pipeline: s, or s after the earlier kv heads' stages of a block
// of several kv heads), each thread its share of
// the rows' 16-byte chunks: WHICH 0 every row, 1 only the rows of keys
// before fresh (before the PDL wait), 2 the other rows (this step's keys,
// and zeros past the split's end, so that P·V meets no garbage).
template <int HD, int ST, int WHICH>
__device__ __forceinline__ void dm_load(unsigned char* ring, const KV* kc, const KV* vc, const int* bt, int seqOff, int bs,
                                        int kvHeads, int kvh, int k0, int nk, int fresh, int n, int s) {
	constexpr int RRB = dm_rb<HD>(), CPR = HD / KV_CE, N = DM_BK * CPR;
	unsigned char* kd = ring + (n % ST) * 2 * DM_BK * RRB;
	unsigned char* vd = kd + DM_BK * RRB;
#pragma unroll
	for (int i0 = 0; i0 < N; i0 += DM_THREADS) {
		int i = i0 + (int)threadIdx.x;
		if (N % DM_THREADS != 0 && i >= N) continue;
		int row = i / CPR, c = i % CPR;
		int kk = s * DM_BK + row; // key index in the split
		int j = k0 + kk;
		bool in = kk < nk, old = in && j < fresh;
		if ((WHICH == 1 && !old) || (WHICH == 2 && old)) continue;
		long long at = in ? kv_row(bt, seqOff, bs, kvHeads, kvh, HD, j) + c * KV_CE : 0;
		cp16(smem_addr(kd + row * RRB + c * 16), kc + at, in);
		cp16(smem_addr(vd + row * RRB + c * 16), vc + at, in);
	}
}

// dm_row is the cache row (slot·kvHeads + kvh; the element offset is
// row·HD) of key kk of the split, −1 past its end (nk keys). The block
// table is read by dm_bt (issued early) and combined by dm_rowof (late), so
// that the load's latency hides behind a stage's math.
__device__ __forceinline__ int dm_bt(const int* bt, int seqOff, int bs, int k0, int nk, int kk) {
	return kk < nk ? bt[seqOff + kv_page(k0 + kk, bs)] : -1;
}
__device__ __forceinline__ int dm_rowof(int b, int bs, int kvHeads, int kvh, int k0, int kk) {
	return b < 0 ? -1 : kv_slot(b, k0 + kk, bs) * kvHeads + kvh;
}

// dm_load_tab copies stage n's K and V rows into ring slot n % ST as
// dm_load<HD, ST, 0> would, the rows taken from tab (the stage's 64 dm_row
// values in shared memory): one table read per 16-byte chunk, all of them
// before the copies, and no block-table lookup or division.
template <int HD, int ST>
__device__ __forceinline__ void dm_load_tab(unsigned char* ring, const KV* kc, const KV* vc, const int* tab, int n) {
	constexpr int RRB = dm_rb<HD>(), CPR = HD / KV_CE, N = DM_BK * CPR, NI = (N + DM_THREADS - 1) / DM_THREADS;
	unsigned char* kd = ring + (n % ST) * 2 * DM_BK * RRB;
	unsigned char* vd = kd + DM_BK * RRB;
	int r[NI];
#pragma unroll
	for (int it = 0; it < NI; it++) {
		int i = it * DM_THREADS + (int)threadIdx.x;
		r[it] = N % DM_THREADS == 0 || i < N ? tab[i / CPR] : -2;
	}
#pragma unroll
	for (int it = 0; it < NI; it++) {
		int i = it * DM_THREADS + (int)threadIdx.x;
		if (N % DM_THREADS != 0 && r[it] == -2) continue;
		int row = i / CPR, c = i % CPR;
		bool in = r[it] >= 0;
		long long at = in ? (long long)r[it] * HD + c * KV_CE : 0;
		cp16(smem_addr(kd + row * RRB + c * 16), kc + at, in);
		cp16(smem_addr(vd + row * RRB + c * 16), vc + at, in);
	}
}

// ld_seg loads the BYTES bytes at p (aligned to BYTES' largest power-of-two
// divisor, at most 16; BYTES even) into words w, the last one's high half
// zero when BYTES is not a multiple of 4.
template <int BYTES>
__device__ __forceinline__ void ld_seg(unsigned* w, const unsigned char* p) {
	static_assert(BYTES % 2 == 0, "ld_seg: even bytes");
	constexpr int A = BYTES % 16 == 0 ? 16 : BYTES % 8 == 0 ? 8 : BYTES % 4 == 0 ? 4 : 2;
#pragma unroll
	for (int i = 0; i < BYTES / A; i++) {
		if constexpr (A == 16) {
			const uint4 v = *(const uint4*)(p + 16 * i);
			w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
		} else if constexpr (A == 8) {
			const uint2 v = *(const uint2*)(p + 8 * i);
			w[2 * i] = v.x, w[2 * i + 1] = v.y;
		} else if constexpr (A == 4) {
			w[i] = *(const unsigned*)(p + 4 * i);
		} else {
			const unsigned h = *(const unsigned short*)(p + 2 * i);
			if (i % 2 == 0) w[i / 2] = h;
			else w[i / 2] |= h << 16;
		}
	}
}

// dm_mmat<F8>::type is the dtype decode_mma's products take: the
// activation dtype, or over an FP8 cache f16 (E4M3's codes widen to f16 in
// one conversion a pair; Q is scaled by a power of two into f16's range).
template <bool F8> struct dm_mmat { typedef T type; };
template <> struct dm_mmat<true> { typedef f16 type; };

// dm_qshift is the power of two, 2^−shift, that brings the largest |q| of
// rows × HD query elements at Qs (rows STR apart) into [2^14, 2^15), f16's
// range with a binade to spare (0 for all-zero rows): every thread of the
// block calls it; red (DM_WARPS floats) is scratch.
template <int HD>
__device__ __forceinline__ int dm_qshift(const unsigned short* Qs, int STR, int rows, float* red) {
	float mx = 0.f;
	for (int i = threadIdx.x; i < rows * HD; i += DM_THREADS) mx = fmaxf(mx, fabsf(tof(*(const T*)(Qs + (i / HD) * STR + i % HD))));
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
	if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
	__syncthreads();
#pragma unroll
	for (int w = 0; w < DM_WARPS; w++) mx = fmaxf(mx, red[w]);
	const int e = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 127; // ⌊log2 mx⌋ (normal mx)
	return mx > 0.f ? imin(100, e > -100 ? e - 14 : -100) : 0;
}

template <int HD, int MT, int ST, int HG>
__device__ __forceinline__ void decode_mma(DC_PARAMS) {
	constexpr int STR = HD + 8;   // shared row stride (elements)
	constexpr int RB = STR * 2;   // row bytes
	constexpr int CPR = HD / 8;   // 16-byte chunks per row
	constexpr int KC = HD / 16;   // k-chunks of Q·Kᵀ
	constexpr int OT = HD / 8;    // 8-wide column tiles of O
	constexpr int ROWS = 16 * MT; // query rows: the group's heads, zero-padded
	constexpr int RS = HD + 8;    // floats per row of red (2-way bank conflicts at most)
	constexpr int RRB = dm_rb<HD>();  // ring row bytes (RB unless the cache is FP8)
	constexpr int SB = 2 * DM_BK * RRB; // ring bytes per stage (K then V)
	constexpr int VW = (OT + 3) / 4;         // an FP8 cache: the words of a thread's OT codes of a V row
	constexpr bool PSPLIT = act_is_f16<T>::v;
	constexpr bool QREG = MT == 1; // Q's fragments kept in registers (one m-tile: 4·KC registers)
	typedef typename dm_mmat<kv_f8>::type MMT;
	const MMT* const mmt = nullptr; // picks the products' dtype
	static_assert(HD % 16 == 0 && DM_THREADS == DC_THREADS && (DM_BK * CPR) % DM_THREADS == 0 && DM_BK <= DM_THREADS && ST >= 2,
	              "decode_mma shape");
	static_assert(kv_f8 || RRB == RB, "decode_mma ring rows");
	static_assert(kv_f8 || ST <= 3, "decode_mma ring of the activation dtype");
	// Several kv heads a block (HG > 1): the warps' partials of a head overlay
	// the ring slot of its last stage, which must hold them.
	static_assert(HG == 1 || (!kv_f8 && MT == 1 && 4 * DM_WARPS * ROWS * RS <= SB), "decode_mma heads a block");

	// Block (sp, y, t) takes kv heads HG·y .. HG·y + HG − 1 (gridDim.y =
	// kvHeads / HG) one after the other, their stages one pipeline.
	const int sp = blockIdx.x, kvh0 = blockIdx.y * HG, t = blockIdx.z;
	const int group = heads / kvHeads;
	int kvh = kvh0, h0 = kvh * group; // the head whose stages are computed
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tq = lane & 3, g = lane >> 2;
	const int mi = lane >> 3, rr = lane & 7; // ldmatrix: the matrix and row this lane addresses

	float* wm = (float*)dm_smem;
	float* wl = wm + DM_WARPS * ROWS;
	int* tab = (int*)(wl + DM_WARPS * ROWS); // tab[2][DM_BK]: the rows of the next stages to load (dm_row)
	unsigned short* Qs = (unsigned short*)(tab + 2 * DM_BK);
	unsigned char* ring = (unsigned char*)(Qs + ROWS * STR);

	// Before the wait: the split's keys, and the older keys' rows.
	const int p = positions[t];
	const int lo = window_start(p, window);
	const int nsplit = (p - lo + chunk) / chunk;
	if (sp >= nsplit) return; // uniform over the block
	const int k0 = lo + sp * chunk;
	const int nk = imin(chunk, p + 1 - k0);
	const int seq = seqIndex[t];
	const int seqOff = seqBlockOff[seq];
	const int fresh = seqFresh[seq];
	const int nblk = (nk + DM_BK - 1) / DM_BK; // stages a head
	const int nst = HG * nblk;                 // stages of the block: n = j·nblk + s for stage s of its head j

#pragma unroll
	for (int i = 0; i < ST - 1; i++)
		if (i < nst) dm_load<HD, ST, 1>(ring, kc, vc, bt, seqOff, bs, kvHeads, kvh0 + i / nblk, k0, nk, fresh, i, i % nblk);
	pdl_enter();
	// Q rows (zeros past the group), in the first group of copies.
	for (int i = tid; i < ROWS * CPR; i += DM_THREADS) {
		int r = i / CPR, c = i % CPR;
		bool in = r < group;
		cp16(smem_addr(Qs + r * STR + c * 8), in ? q + ((long long)t * heads + h0 + r) * HD + c * 8 : q, in);
	}
#pragma unroll
	for (int i = 0; i < ST - 1; i++) {
		if (i < nst) dm_load<HD, ST, 2>(ring, kc, vc, bt, seqOff, bs, kvHeads, kvh0 + i / nblk, k0, nk, fresh, i, i % nblk);
		cp_commit();
	}
	// The rows of stage ST − 1 (the first loaded in the loop) into tab[(ST − 1) & 1].
	if (tid < DM_BK && ST - 1 < nst) {
		const int kk = (ST - 1) % nblk * DM_BK + tid;
		tab[((ST - 1) & 1) * DM_BK + tid] = dm_rowof(dm_bt(bt, seqOff, bs, k0, nk, kk), bs, kvHeads, kvh0 + (ST - 1) / nblk, k0, kk);
	}

	// ldmatrix lane addresses (as prefill_fa): Q as the A operand (matrices:
	// rows 0-7 / 8-15 × columns 0-7, then 8-15), K as the B operand (keys
	// 0-7 × dims 0-7, 8-15, then keys 8-15: b0, b1 of key tiles 0 and 1),
	// V transposed (keys 0-7 / 8-15 × dims 0-7, then dims 8-15: b0, b1 of
	// dim tiles 0 and 1), each at the warp's 16 keys of stage 0.
	const unsigned sQ = smem_addr(Qs) + (((mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;
	const unsigned sK = smem_addr(ring) + ((warp * DM_KW + (mi >> 1) * 8 + rr) * STR + (mi & 1) * 8) * 2;
	const unsigned sV = smem_addr(ring) + DM_BK * RB + ((warp * DM_KW + (mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;
	// An FP8 cache: no ldmatrix (its rows are codes); each thread loads the
	// codes of its fragments and widens them in registers. Q·Kᵀ sums over
	// the dims in any order, so they are taken permuted, Q's and K's alike,
	// for each thread's codes of a key to be one run of HD/4 bytes: in
	// k-chunk c, k-positions 2tq + e and 2tq + 8 + e are dims tq·HD/4 + 4c
	// + e and + 2 + e (Q's A fragments by qfrag). P·V's output columns are
	// permuted too, for each thread's codes of a V row to be one run of OT
	// bytes: the column of lanes g in tile ot is dim g·OT + ot. The
	// products are f16's: K's and V's codes widen to f16 in one conversion
	// a pair, P is rounded to f16, and Q, times 2^−qshift (dm_qshift; the
	// softmax's scale times 2^qshift undoes it), to f16 as qfrag loads it.
	int qshift = 0;
	auto qfrag = [&](unsigned* qa, int mt, int c) {
		const unsigned short* r0 = Qs + (16 * mt + g) * STR + tq * (HD / 4) + 4 * c;
		const unsigned short* r1 = r0 + 8 * STR;
		const float f = __uint_as_float((unsigned)(127 - qshift) << 23); // 2^−qshift
		const unsigned short* at[4] = {r0, r1, r0 + 2, r1 + 2};
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const unsigned w = *(const unsigned*)at[i];
			qa[i] = cvt2(lo16(w, (T*)0) * f, hi16(w, (T*)0) * f, mmt);
		}
	};

	float o[MT][OT][4];
	float m[MT][2], l[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
#pragma unroll
		for (int i = 0; i < OT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
		m[mt][0] = m[mt][1] = NEG_INF;
		l[mt][0] = l[mt][1] = 0.f;
	}
	float sl2 = scale * LOG2E; // scale > 0 (decodeMMAOK); over an FP8 cache times 2^qshift
	unsigned qr[QREG ? KC : 1][4];   // QREG: Q's A fragments, loaded at the first stage

	// finish ends head kvh (rows h0..) after stage n, its last: the warps'
	// partials merged over the ring, then the output or the split's
	// partials. With one head a block, or after a block's last head (more
	// false), no copy is in flight after the barrier; before another, the
	// partials overlay the slot of stage n, whose copies are in, while the
	// next head's first stages are in flight to the others.
	auto finish = [&](int n, bool more) {
		if (!more) cp_wait<0>();
		__syncthreads();
		float* red = (float*)(ring + (HG > 1 ? (n % ST) * SB : 0));
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			const float l0 = quad_sum(l[mt][0]), l1 = quad_sum(l[mt][1]);
			// Half h of the tile: row mt·16 + g + 8h, accumulators 2h and 2h+1.
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int r = mt * 16 + g + 8 * h;
				if (r >= group) continue;
				if (tq == 0) {
					wm[warp * ROWS + r] = m[mt][h];
					wl[warp * ROWS + r] = h ? l1 : l0;
				}
				if constexpr (kv_f8) { // columns 2tq, 2tq + 1 of tile ot: dims (2tq)·OT + ot, (2tq + 1)·OT + ot
					float* dst = red + (warp * ROWS + r) * RS + 2 * tq * OT;
#pragma unroll
					for (int ot = 0; ot < OT; ot++) {
						dst[ot] = o[mt][ot][2 * h];
						dst[OT + ot] = o[mt][ot][2 * h + 1];
					}
				} else {
					float* dst = red + (warp * ROWS + r) * RS + 2 * tq;
#pragma unroll
					for (int ot = 0; ot < OT; ot++) st_f2(dst + ot * 8, o[mt][ot][2 * h], o[mt][ot][2 * h + 1]);
				}
			}
		}
		__syncthreads();

		// Thread i takes four dims of one head: out = Σ_w 2^((m_w−M)·sl2) O_w /
		// Σ_w 2^((m_w−M)·sl2) l_w (warp 0 has keys, so M is finite; a warp
		// without keys has m_w = −inf and weighs 0), or the split's partials.
		const bool single = nsplit == 1;
		constexpr int Q4 = HD / 4;
		for (int i = tid; i < group * Q4; i += DM_THREADS) {
			const int r = i / Q4, d = (i % Q4) * 4;
			float M = NEG_INF;
#pragma unroll
			for (int w = 0; w < DM_WARPS; w++) M = fmaxf(M, wm[w * ROWS + r]);
			float L = 0.f;
			float4 a = f4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
			for (int w = 0; w < DM_WARPS; w++) {
				float e = ex2f((wm[w * ROWS + r] - M) * sl2);
				float4 v = *(const float4*)(red + (w * ROWS + r) * RS + d);
				L += e * wl[w * ROWS + r];
				a.x += e * v.x; a.y += e * v.y; a.z += e * v.z; a.w += e * v.w;
			}
			const long long row = (long long)t * heads + h0 + r;
			if (single) {
				float inv = 1.0f / L;
				uint2 v;
				v.x = PK2(a.x * inv, a.y * inv);
				v.y = PK2(a.z * inv, a.w * inv);
				*(uint2*)(out + row * HD + d) = v;
			} else {
				long long w = row * maxSplits + sp;
				*(float4*)(wsAcc + w * HD + d) = a;
				if (d == 0) {
					wsM[w] = M * sl2;
					wsL[w] = L;
				}
			}
		}
		if (!single) decode_merge<HD>(out, wsAcc, wsM, wsL, counters, t, kvh, h0, group, heads, kvHeads, maxSplits, nsplit);
	};

	for (int n = 0, sh = 0; n < nst; n++) {
		const int s = HG == 1 ? n : sh; // stage n's place in its head's stages
		cp_wait<ST - 2>(); // stage n is in (the later ones may not be)
		__syncthreads();   // every warp is done with stage n − 1, and tab holds stage n + ST − 1's rows
		if constexpr (kv_f8) {
			if (n == 0) { // Q is in (the first group of copies)
				qshift = dm_qshift<HD>(Qs, STR, ROWS, wm);
				sl2 *= __uint_as_float((unsigned)(127 + qshift) << 23);
			}
		}
		// The block-table entry of key tid of stage n + ST, loaded now and
		// made a row (into tab) after the math; then the copies of stage
		// n + ST − 1 from the rows in tab.
		const bool tabNext = tid < DM_BK && n + ST < nst;
		const int sNext = HG == 1 ? n + ST : (n + ST) % nblk; // stage n + ST's place in its head's
		const int kvhNext = HG == 1 ? kvh : kvh0 + (n + ST) / nblk;
		const int kkNext = sNext * DM_BK + tid;
		const int btNext = tabNext ? dm_bt(bt, seqOff, bs, k0, nk, kkNext) : -1;
		if (n + ST - 1 < nst) dm_load_tab<HD, ST>(ring, kc, vc, tab + ((n + ST - 1) & 1) * DM_BK, n + ST - 1);
		cp_commit();
		const int kw = s * DM_BK + warp * DM_KW; // the warp's first key in the split
		if (kw < nk) {                           // some of its keys left (uniform over the warp)
		const unsigned kbase = sK + (n % ST) * SB, vbase = sV + (n % ST) * SB;
		if constexpr (QREG) {
			if (s == 0) {
#pragma unroll
				for (int c = 0; c < KC; c++) {
					if constexpr (kv_f8) qfrag(qr[c], 0, c);
					else ldsm4(qr[c], sQ + c * 32);
				}
			}
		}
		// An FP8 cache: the codes of this thread's fragments, K's (keys g
		// and 8 + g of the warp's 16, dims from tq·HD/4) and V's (keys 2tq,
		// 2tq + 1, 8 + 2tq, 9 + 2tq, dims from g·OT), all loaded now.
		unsigned kq[kv_f8 ? 2 : 1][kv_f8 ? KC : 1], vq[kv_f8 ? 4 : 1][kv_f8 ? VW : 1];
		if constexpr (kv_f8) {
			const unsigned char* st8 = ring + (n % ST) * SB + warp * DM_KW * RRB;
#pragma unroll
			for (int nt = 0; nt < 2; nt++) ld_seg<HD / 4>(kq[nt], st8 + (8 * nt + g) * RRB + tq * (HD / 4));
#pragma unroll
			for (int j = 0; j < 4; j++) ld_seg<OT>(vq[j], st8 + (DM_BK + (j >> 1) * 8 + 2 * tq + (j & 1)) * RRB + g * OT);
		}

		// S = Q·Kᵀ: s[mt][nt] is rows 16mt.. × keys kw + 8nt.. (even and
		// odd k-chunks in separate accumulators: two mma chains of KC/2).
		float s[MT][2][4], s2[MT][2][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) s[mt][nt][e] = s2[mt][nt][e] = 0.f;
#pragma unroll
		for (int c = 0; c < KC; c++) {
			unsigned b[4];
			if constexpr (kv_f8) {
				const uint2 b0 = e4m3x4_f16(kq[0][c]), b1 = e4m3x4_f16(kq[1][c]);
				b[0] = b0.x, b[1] = b0.y, b[2] = b1.x, b[3] = b1.y;
			} else {
				ldsm4(b, kbase + c * 32);
			}
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				unsigned qa[4];
				if constexpr (QREG) {
					qa[0] = qr[c][0];
					qa[1] = qr[c][1];
					qa[2] = qr[c][2];
					qa[3] = qr[c][3];
				} else if constexpr (kv_f8) {
					qfrag(qa, mt, c);
				} else {
					ldsm4(qa, sQ + mt * 16 * RB + c * 32);
				}
				if (c & 1) {
					mma16816(s2[mt][0], qa, b[0], b[1], mmt);
					mma16816(s2[mt][1], qa, b[2], b[3], mmt);
				} else {
					mma16816(s[mt][0], qa, b[0], b[1], mmt);
					mma16816(s[mt][1], qa, b[2], b[3], mmt);
				}
			}
		}
		if constexpr (KC > 1) {
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 4; e++) s[mt][nt][e] += s2[mt][nt][e];
		}
		if (cap > 0.f) { // soft-capped scores (Gemma 2), back in the domain sl2 scales
			const SoftcapRaw sc(sl2, cap * LOG2E);
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 4; e++) s[mt][nt][e] = sc(s[mt][nt][e]);
		}
		if (kw + DM_KW > nk) { // the split's last keys: those past its end are out
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int e = 0; e < 2; e++)
					if (kw + nt * 8 + 2 * tq + e >= nk) {
#pragma unroll
						for (int mt = 0; mt < MT; mt++) s[mt][nt][e] = s[mt][nt][2 + e] = NEG_INF;
					}
		}

		// Online softmax: this thread's rows g and g + 8 of each m-tile, the
		// quad (lanes 4g..4g+3) holding the rest of them.
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			float mx0 = fmaxf(m[mt][0], fmaxf(fmaxf(s[mt][0][0], s[mt][0][1]), fmaxf(s[mt][1][0], s[mt][1][1])));
			float mx1 = fmaxf(m[mt][1], fmaxf(fmaxf(s[mt][0][2], s[mt][0][3]), fmaxf(s[mt][1][2], s[mt][1][3])));
			mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
			mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
			mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
			mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
			const float b0 = mx0 == NEG_INF ? 0.f : mx0 * sl2, b1 = mx1 == NEG_INF ? 0.f : mx1 * sl2;
			const float c0 = ex2f(fmaf(m[mt][0], sl2, -b0)), c1 = ex2f(fmaf(m[mt][1], sl2, -b1));
			m[mt][0] = mx0;
			m[mt][1] = mx1;
			float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
				s[mt][nt][0] = ex2f(fmaf(s[mt][nt][0], sl2, -b0));
				s[mt][nt][1] = ex2f(fmaf(s[mt][nt][1], sl2, -b0));
				s[mt][nt][2] = ex2f(fmaf(s[mt][nt][2], sl2, -b1));
				s[mt][nt][3] = ex2f(fmaf(s[mt][nt][3], sl2, -b1));
				ls0 += s[mt][nt][0] + s[mt][nt][1];
				ls1 += s[mt][nt][2] + s[mt][nt][3];
			}
			l[mt][0] = l[mt][0] * c0 + ls0;
			l[mt][1] = l[mt][1] * c1 + ls1;
#pragma unroll
			for (int i = 0; i < OT; i++) {
				o[mt][i][0] *= c0;
				o[mt][i][1] *= c0;
				o[mt][i][2] *= c1;
				o[mt][i][3] *= c1;
			}
		}

		// O += P·V over the warp's 16 keys: P (rows × keys) is one A
		// fragment per m-tile, i: (row g, keys 2tq..), (row g+8, ..),
		// (row g, keys 8+2tq..), (row g+8, ..).
		unsigned pa[MT][4], pl[MT][PSPLIT ? 4 : 1];
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
#pragma unroll
			for (int i = 0; i < 4; i++) {
				float x = s[mt][i >> 1][(i & 1) * 2], y = s[mt][i >> 1][(i & 1) * 2 + 1];
				pa[mt][i] = cvt2(x, y, mmt);
				if constexpr (PSPLIT) pl[mt][i] = PK2(x - lo16(pa[mt][i], (f16*)0), y - hi16(pa[mt][i], (f16*)0));
			}
		}
#pragma unroll
		for (int ot = 0; ot < OT; ot += 2) {
			unsigned b[4];
			if constexpr (kv_f8) {
				// Tiles ot, ot + 1: bytes ot, ot + 1 of the four rows,
				// paired key by key (2tq with 2tq + 1: b0; 8 + 2tq with
				// 9 + 2tq: b1).
				const unsigned sel = ot % 4 == 0 ? 0x5140u : 0x7362u;
				const uint2 lo = e4m3x4_f16(prmt(vq[0][ot / 4], vq[1][ot / 4], sel));
				const uint2 hi = e4m3x4_f16(prmt(vq[2][ot / 4], vq[3][ot / 4], sel));
				b[0] = lo.x, b[1] = hi.x, b[2] = lo.y, b[3] = hi.y;
			} else {
				ldsm4t(b, vbase + ot * 16);
			}
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				mma16816(o[mt][ot], pa[mt], b[0], b[1], mmt);
				mma16816(o[mt][ot + 1], pa[mt], b[2], b[3], mmt);
				if constexpr (PSPLIT) {
					mma16816(o[mt][ot], pl[mt], b[0], b[1], mmt);
					mma16816(o[mt][ot + 1], pl[mt], b[2], b[3], mmt);
				}
			}
		}
		} // kw < nk
		if (tabNext) tab[((n + ST) & 1) * DM_BK + tid] = dm_rowof(btNext, bs, kvHeads, kvhNext, k0, kkNext);
		if constexpr (HG > 1) {
			if (++sh == nblk) { // head kvh's keys are done
				sh = 0;
				const bool more = kvh + 1 < kvh0 + HG;
				// The next head's Q rows, loaded now and stored into Qs
				// (read only at a head's first stage) after finish.
				constexpr int QN = (ROWS * CPR + DM_THREADS - 1) / DM_THREADS;
				uint4 qn[QN];
#pragma unroll
				for (int u = 0; u < QN; u++) {
					const int i = u * DM_THREADS + tid, r = i / CPR, c = i % CPR;
					if (more && r < group) qn[u] = *(const uint4*)(q + ((long long)t * heads + h0 + group + r) * HD + c * 8);
				}
				finish(n, more);
				if (more) { // the next head from scratch; the loop's barrier orders Qs's stores before its reads
#pragma unroll
					for (int u = 0; u < QN; u++) {
						const int i = u * DM_THREADS + tid, r = i / CPR, c = i % CPR;
						if (r < group) *(uint4*)(Qs + r * STR + c * 8) = qn[u];
					}
#pragma unroll
					for (int mt = 0; mt < MT; mt++) {
#pragma unroll
						for (int i = 0; i < OT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
						m[mt][0] = m[mt][1] = NEG_INF;
						l[mt][0] = l[mt][1] = 0.f;
					}
					kvh++;
					h0 += group;
				}
			}
		}
	}
	if constexpr (HG == 1) finish(nst - 1, false);
}

// decode_mma_<HD> and decode_mma32_<HD>: the 3-stage ring (DM_ST);
// decode_mma_s2_<HD> and decode_mma32_s2_<HD> (DecodePlan.Stages 2): a ring
// of 2, 74 KiB at head dim 128 and groups ≤ 16, so three blocks an SM
// (registers bounded for them: 170 a thread). Over an FP8 cache the rings
// are of 3 and 2 stages (61 and 42 KiB at head dim 128), registers bounded
// for three and four blocks an SM. Over a cache of the activation dtype,
// groups ≤ 16 also have 3-stage kernels taking 2 and 4 kv heads a block
// (decode_mma_h<G>_<HD>; DecodePlan.Heads).
#define DECODE_MMA(HD)                                                                                               \
	extern "C" __global__ void __launch_bounds__(DM_THREADS, DM_MINB) decode_mma_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST, 1>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_mma32_##HD(DC_PARAMS) { decode_mma<HD, 2, DM_ST, 1>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS, DM_MINB2) decode_mma_s2_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST2, 1>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_mma32_s2_##HD(DC_PARAMS) { decode_mma<HD, 2, DM_ST2, 1>(DC_ARGS); }
// DECODE_MMA_HEADS(HD): the kernels of 2 and 4 kv heads a block, for head
// dims up to 128 over a cache of the activation dtype (decodeMMAHeadsOK).
#ifdef KV_F8
#define DECODE_MMA_HEADS(HD)
#else
#define DECODE_MMA_HEADS(HD)                                                                                         \
	extern "C" __global__ void __launch_bounds__(DM_THREADS, DM_MINB) decode_mma_h2_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST, 2>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS, DM_MINB) decode_mma_h4_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST, 4>(DC_ARGS); }
#endif
// Part 3 of the kernels module (KILN_PART_IS).
#if KILN_PART_IS(3)
#ifdef KILN_HD
#if KILN_HD >= 16
#define DECODE_MMA_X(HD) DECODE_MMA(HD)
DECODE_MMA_X(KILN_HD)
#endif
#if KILN_HD >= 16 && KILN_HD <= 128
#define DECODE_MMA_HEADS_X(HD) DECODE_MMA_HEADS(HD)
DECODE_MMA_HEADS_X(KILN_HD)
#endif
#else
DECODE_MMA(16)
DECODE_MMA(32)
DECODE_MMA(64)
DECODE_MMA(80)
DECODE_MMA(96)
DECODE_MMA(128)
DECODE_MMA(256)
DECODE_MMA_HEADS(16)
DECODE_MMA_HEADS(32)
DECODE_MMA_HEADS(64)
DECODE_MMA_HEADS(80)
DECODE_MMA_HEADS(96)
DECODE_MMA_HEADS(128)
#endif
#endif // KILN_PART_IS(3)

#endif // ACT_MMA
