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
// Grid (maxSplits, kvHeads, tokens) and block DC_THREADS, as the split
// kernel decode_impl: block (sp, kvh, t) takes keys [k0, k0 + nk) of token
// t, k0 = lo + sp·chunk, nk = min(chunk, p + 1 − k0) (lo the window start, p
// the token's position), for the group's heads; chunk is any number of keys
// (the plans offer 128 to 4096). A token whose keys fit one split is
// finished by its block; otherwise each block writes its partials (m in the
// log2 domain, l, acc) to the workspace and the last to finish merges them
// (decode_merge: the same workspace layout and counters as decode_impl).
//
// The keys stream through shared memory in stages of DM_BK = 64 keys (K and
// V rows, padded by 16 bytes: ldmatrix without bank conflicts), a ring of
// ST stages (DM_ST = 3, or 2 for the _s2 kernels; 5 and 3 over an FP8
// cache) loaded by 16-byte
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
// An FP8 cache (KV_F8): the ring's rows are HD codes (unpadded), and each
// warp loads its 16 keys' codes of a stage (K and V) into registers and
// widens them into 16 rows of its own, wide[4][16][HD+8] between Q and the
// ring, which its ldmatrix loads read: K's rows for S, then V's for P·V;
// red overlays wide and the ring.

#define DM_WARPS 4
#define DM_THREADS (32 * DM_WARPS)
#define DM_KW 16                   // keys of a warp in a stage
#define DM_BK (DM_WARPS * DM_KW)   // keys per stage (decodeMMAKeys in kernels.go)
// Stages in the ring (decodeMMAStages in kernels.go), and in the _s2
// kernels' ring: an FP8 cache's stages hold half the bytes, so that its
// rings are deeper for as many bytes in flight.
#ifdef KV_F8
#define DM_ST 5
#define DM_ST2 3
#else
#define DM_ST 3
#define DM_ST2 2
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
// (HD + 8 elements as ldmatrix wants them).
// (An FP8 cache's rows are not padded: they are widened by 8-byte loads, not
// read by ldmatrix.)
template <int HD> __device__ constexpr int dm_rb() { return kv_f8 ? HD : HD * (int)sizeof(KV) + 16; }

// dm_load copies the K and V rows of stage n of a split (keys k0 + 64n..,
// of the nk keys k0..) into ring slot n % DM_ST, each thread its share of
// the rows' 16-byte chunks: WHICH 0 every row, 1 only the rows of keys
// before fresh (before the PDL wait), 2 the other rows (this step's keys,
// and zeros past the split's end, so that P·V meets no garbage).
template <int HD, int ST, int WHICH>
__device__ __forceinline__ void dm_load(unsigned char* ring, const KV* kc, const KV* vc, const int* bt, int seqOff, int bs,
                                        int kvHeads, int kvh, int k0, int nk, int fresh, int n) {
	constexpr int RRB = dm_rb<HD>(), CPR = HD / KV_CE, N = DM_BK * CPR;
	unsigned char* kd = ring + (n % ST) * 2 * DM_BK * RRB;
	unsigned char* vd = kd + DM_BK * RRB;
#pragma unroll
	for (int i0 = 0; i0 < N; i0 += DM_THREADS) {
		int i = i0 + (int)threadIdx.x;
		if (N % DM_THREADS != 0 && i >= N) continue;
		int row = i / CPR, c = i % CPR;
		int kk = n * DM_BK + row; // key index in the split
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
	return kk < nk ? bt[seqOff + (k0 + kk) / bs] : -1;
}
__device__ __forceinline__ int dm_rowof(int b, int bs, int kvHeads, int kvh, int k0, int kk) {
	return b < 0 ? -1 : (b * bs + (k0 + kk) % bs) * kvHeads + kvh;
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

template <int HD, int MT, int ST>
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
	constexpr int WROWS = kv_f8 ? DM_KW : 0; // an FP8 cache: each warp's widened K, then V, rows
	constexpr bool PSPLIT = act_is_f16<T>::v;
	constexpr bool QREG = MT == 1; // Q's fragments kept in registers (one m-tile: 4·KC registers)
	static_assert(HD % 16 == 0 && DM_THREADS == DC_THREADS && (DM_BK * CPR) % DM_THREADS == 0 && DM_BK <= DM_THREADS && ST >= 2,
	              "decode_mma shape");
	static_assert(kv_f8 || RRB == RB, "decode_mma ring rows");
	static_assert(kv_f8 || ST <= 3, "decode_mma ring of the activation dtype");

	const int sp = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
	const int group = heads / kvHeads, h0 = kvh * group;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tq = lane & 3, g = lane >> 2;
	const int mi = lane >> 3, rr = lane & 7; // ldmatrix: the matrix and row this lane addresses

	float* wm = (float*)dm_smem;
	float* wl = wm + DM_WARPS * ROWS;
	int* tab = (int*)(wl + DM_WARPS * ROWS); // tab[2][DM_BK]: the rows of the next stages to load (dm_row)
	unsigned short* Qs = (unsigned short*)(tab + 2 * DM_BK);
	unsigned short* wide = Qs + ROWS * STR; // FP8: wide[DM_WARPS][DM_KW][STR]
	unsigned char* ring = (unsigned char*)(wide + DM_WARPS * WROWS * STR);
	float* red = (float*)wide;

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
	const int nblk = (nk + DM_BK - 1) / DM_BK;

#pragma unroll
	for (int i = 0; i < ST - 1; i++)
		if (i < nblk) dm_load<HD, ST, 1>(ring, kc, vc, bt, seqOff, bs, kvHeads, kvh, k0, nk, fresh, i);
	pdl_enter();
	// Q rows (zeros past the group), in the first group of copies.
	for (int i = tid; i < ROWS * CPR; i += DM_THREADS) {
		int r = i / CPR, c = i % CPR;
		bool in = r < group;
		cp16(smem_addr(Qs + r * STR + c * 8), in ? q + ((long long)t * heads + h0 + r) * HD + c * 8 : q, in);
	}
#pragma unroll
	for (int i = 0; i < ST - 1; i++) {
		if (i < nblk) dm_load<HD, ST, 2>(ring, kc, vc, bt, seqOff, bs, kvHeads, kvh, k0, nk, fresh, i);
		cp_commit();
	}
	// The rows of stage ST − 1 (the first loaded in the loop) into tab[(ST − 1) & 1].
	if (tid < DM_BK && ST - 1 < nblk) {
		const int kk = (ST - 1) * DM_BK + tid;
		tab[((ST - 1) & 1) * DM_BK + tid] = dm_rowof(dm_bt(bt, seqOff, bs, k0, nk, kk), bs, kvHeads, kvh, k0, kk);
	}

	// ldmatrix lane addresses (as prefill_fa): Q as the A operand (matrices:
	// rows 0-7 / 8-15 × columns 0-7, then 8-15), K as the B operand (keys
	// 0-7 × dims 0-7, 8-15, then keys 8-15: b0, b1 of key tiles 0 and 1),
	// V transposed (keys 0-7 / 8-15 × dims 0-7, then dims 8-15: b0, b1 of
	// dim tiles 0 and 1), each at the warp's 16 keys of stage 0.
	const unsigned sQ = smem_addr(Qs) + (((mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;
	// With an FP8 cache the warp's K and V rows are its widened ones.
	const unsigned sK = kv_f8 ? smem_addr(wide) + ((warp * WROWS + (mi >> 1) * 8 + rr) * STR + (mi & 1) * 8) * 2
	                          : smem_addr(ring) + ((warp * DM_KW + (mi >> 1) * 8 + rr) * STR + (mi & 1) * 8) * 2;
	const unsigned sV = kv_f8 ? smem_addr(wide) + ((warp * WROWS + (mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2
	                          : smem_addr(ring) + DM_BK * RB + ((warp * DM_KW + (mi & 1) * 8 + rr) * STR + (mi >> 1) * 8) * 2;

	float o[MT][OT][4];
	float m[MT][2], l[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
#pragma unroll
		for (int i = 0; i < OT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
		m[mt][0] = m[mt][1] = NEG_INF;
		l[mt][0] = l[mt][1] = 0.f;
	}
	const float sl2 = scale * LOG2E; // scale > 0 (decodeMMAOK)
	unsigned qr[QREG ? KC : 1][4];   // QREG: Q's A fragments, loaded at the first stage

	for (int n = 0; n < nblk; n++) {
		cp_wait<ST - 2>(); // stage n is in (the later ones may not be)
		__syncthreads();   // every warp is done with stage n − 1, and tab holds stage n + ST − 1's rows
		// The block-table entry of key tid of stage n + ST, loaded now and
		// made a row (into tab) after the math; then the copies of stage
		// n + ST − 1 from the rows in tab.
		const bool tabNext = tid < DM_BK && n + ST < nblk;
		const int kkNext = (n + ST) * DM_BK + tid;
		const int btNext = tabNext ? dm_bt(bt, seqOff, bs, k0, nk, kkNext) : -1;
		if (n + ST - 1 < nblk) dm_load_tab<HD, ST>(ring, kc, vc, tab + ((n + ST - 1) & 1) * DM_BK, n + ST - 1);
		cp_commit();
		const int kw = n * DM_BK + warp * DM_KW; // the warp's first key in the split
		if (kw < nk) {                           // some of its keys left (uniform over the warp)
		// An FP8 cache: the warp's 16 keys of stage n, loaded now (K's
		// rows, and V's DM_BK rows further in the ring) and widened into
		// the warp's rows, K's now (the barrier above: the warp is done
		// with the previous stage's rows), V's once S is computed.
		typedef Widen<HD, kv_f8 ? 2 * DM_KW : 2, 32> WK;
		WK wv;
		unsigned short* const wrows = wide + warp * WROWS * STR;
		if constexpr (kv_f8) {
			widen_load(wv, ring + (n % ST) * SB + warp * DM_KW * RRB, RRB, (DM_BK - DM_KW) * RRB, lane);
			widen_store<HD, 2 * DM_KW, 32, 0, WK::IT / 2>(wrows, STR, wv, lane);
			__syncwarp();
		}
		const unsigned kbase = kv_f8 ? sK : sK + (n % ST) * SB, vbase = kv_f8 ? sV : sV + (n % ST) * SB;
		if constexpr (QREG) {
			if (n == 0) {
#pragma unroll
				for (int c = 0; c < KC; c++) ldsm4(qr[c], sQ + c * 32);
			}
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
			ldsm4(b, kbase + c * 32);
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				unsigned qa[4];
				if constexpr (QREG) {
					qa[0] = qr[c][0];
					qa[1] = qr[c][1];
					qa[2] = qr[c][2];
					qa[3] = qr[c][3];
				} else {
					ldsm4(qa, sQ + mt * 16 * RB + c * 32);
				}
				if (c & 1) {
					mma16816(s2[mt][0], qa, b[0], b[1], q);
					mma16816(s2[mt][1], qa, b[2], b[3], q);
				} else {
					mma16816(s[mt][0], qa, b[0], b[1], q);
					mma16816(s[mt][1], qa, b[2], b[3], q);
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

		if constexpr (kv_f8) { // V's rows where K's were
			__syncwarp();
			widen_store<HD, 2 * DM_KW, 32, WK::IT / 2, WK::IT>(wrows, STR, wv, lane);
			__syncwarp();
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
				pa[mt][i] = PK2(x, y);
				if constexpr (PSPLIT) pl[mt][i] = PK2(x - lo16(pa[mt][i], (f16*)0), y - hi16(pa[mt][i], (f16*)0));
			}
		}
#pragma unroll
		for (int ot = 0; ot < OT; ot += 2) {
			unsigned b[4];
			ldsm4t(b, vbase + ot * 16);
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				mma16816(o[mt][ot], pa[mt], b[0], b[1], q);
				mma16816(o[mt][ot + 1], pa[mt], b[2], b[3], q);
				if constexpr (PSPLIT) {
					mma16816(o[mt][ot], pl[mt], b[0], b[1], q);
					mma16816(o[mt][ot + 1], pl[mt], b[2], b[3], q);
				}
			}
		}
		} // kw < nk
		if (tabNext) tab[((n + ST) & 1) * DM_BK + tid] = dm_rowof(btNext, bs, kvHeads, kvh, k0, kkNext);
	}

	// The warps' partials, over the ring: every warp is done with it and
	// no copy is in flight after the barrier.
	cp_wait<0>();
	__syncthreads();
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
		float l0 = l[mt][0], l1 = l[mt][1];
		l0 += __shfl_xor_sync(FULL_MASK, l0, 1);
		l0 += __shfl_xor_sync(FULL_MASK, l0, 2);
		l1 += __shfl_xor_sync(FULL_MASK, l1, 1);
		l1 += __shfl_xor_sync(FULL_MASK, l1, 2);
		// Half h of the tile: row mt·16 + g + 8h, accumulators 2h and 2h+1.
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int r = mt * 16 + g + 8 * h;
			if (r >= group) continue;
			if (tq == 0) {
				wm[warp * ROWS + r] = m[mt][h];
				wl[warp * ROWS + r] = h ? l1 : l0;
			}
			float* dst = red + (warp * ROWS + r) * RS + 2 * tq;
#pragma unroll
			for (int ot = 0; ot < OT; ot++) st_f2(dst + ot * 8, o[mt][ot][2 * h], o[mt][ot][2 * h + 1]);
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
	if (single) return;
	decode_merge<HD>(out, wsAcc, wsM, wsL, counters, t, kvh, h0, group, heads, kvHeads, maxSplits, nsplit);
}

// decode_mma_<HD> and decode_mma32_<HD>: the 3-stage ring (DM_ST);
// decode_mma_s2_<HD> and decode_mma32_s2_<HD> (DecodePlan.Stages 2): a ring
// of 2, 74 KiB at head dim 128 and groups ≤ 16, so three blocks an SM
// (registers bounded for them: 170 a thread). Over an FP8 cache the rings
// are of 5 and 3 stages (97 and 60 KiB at head dim 128: two and three
// blocks an SM).
#define DECODE_MMA(HD)                                                                                               \
	extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_mma_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_mma32_##HD(DC_PARAMS) { decode_mma<HD, 2, DM_ST>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS, 3) decode_mma_s2_##HD(DC_PARAMS) { decode_mma<HD, 1, DM_ST2>(DC_ARGS); } \
	extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_mma32_s2_##HD(DC_PARAMS) { decode_mma<HD, 2, DM_ST2>(DC_ARGS); }
DECODE_MMA(16)
DECODE_MMA(32)
DECODE_MMA(64)
DECODE_MMA(80)
DECODE_MMA(96)
DECODE_MMA(128)

#endif // ACT_MMA
