// kiln CUDA kernels: prefill attention on Hopper's warpgroup MMA (wgmma),
// f16/bf16 activations over an f16/bf16 cache, head dims 64 and 128.
// Appended after prefill_mma.cu (its pf_smem, quad_sum, PF_PARAMS) and
// wgmma.cu by kernels.go when the module is built for sm_90a (-DACT_WGMMA).
//
// One block takes one prefill tile (up to PF_BQ = 64 query tokens) for two
// query heads of one kv head: a warpgroup (4 warps, 128 threads) a head,
// its 64 rows the M of wgmma m64nNk16 (warp w: rows 16w..16w+15, as
// mma16816's tiles). Both warpgroups share the K/V stages. Q, K and V sit
// in shared memory in wgmma's 128-byte swizzled atoms (8 rows of 128
// bytes; a row of HD elements is HD/64 such columns of atoms, each column
// a region of its own), copied there by cp.async; the block's base is
// rounded up to 1024 bytes (the dynamic shared memory holds 1 KB more).
//
// S = Q·Kᵀ is m64n(BK)k16 with both operands K-major in shared memory (the
// next 16 of the head dim 32 bytes on within a region). O += P·V takes P
// from registers (S's accumulators rounded to the activation dtype are
// exactly wgmma's A fragments) and V MN-major, as its rows lie: each
// 128-byte row 64 head dims of one key (wg_desc_mn).
//
// The softmax of a stage overlaps the previous stage's P·V (FlashAttention
// 3's pipelining within a warpgroup): stage n issues S_n = Q·K_nᵀ, then
// O += P_{n−1}·V_{n−1}, waits for S_n alone and computes P_n in S's
// registers, then waits for P·V before it rescales O and rounds P_n into
// the A fragments P_{n−1} held. Stage 0 is peeled off, so that the loop
// has no branch between a wgmma and its wait (ptxas serializes the wgmma
// of a kernel where it cannot tell that no other instruction reads their
// accumulators before the wait: C7514).
//
// K_n and V_{n−1} therefore share a round of copies: stage n issues the
// copies of K_{n+ST−1} and V_{n+ST−2} into rings of ST slots (the slots of
// K_{n−1} and V_{n−2}, free after the barrier that starts the stage),
// waited for at the start of stage n+ST−1. The softmax is prefill_fa's
// (log2 domain, raw-score maxima, masks only on stages that cross a row's
// window or position).
//
// f16 splits P into hi + lo parts for P·V, as prefill_fa does.

#ifdef ACT_WGMMA
// sw128 is the byte offset of 16-byte chunk c (0-7) of row r in 128-byte
// rows swizzled in 1024-byte atoms (from an atom-aligned base).
__device__ __forceinline__ unsigned sw128(int r, int c) { return (unsigned)(r * 128 + ((c ^ (r & 7)) << 4)); }

// wg_load copies keys kb..kb+BK−1 of the cache c (rows of kv head kvh of
// the sequence at seqOff) into the K or V slot at base: thread tid of NTH
// chunk tid + NTH·i (zeros past kHi: masked, and no NaN garbage in P·V).
template <int HD, int BK, int NTH>
__device__ __forceinline__ void wg_load(unsigned base, const KV* c, int kb, int kHi, const int* bt, int seqOff, int bs, int kvHeads,
                                        int kvh, int tid) {
	constexpr int CH = HD / 8, N = BK * CH, KR = BK * 128;
#pragma unroll
	for (int i0 = 0; i0 < N; i0 += NTH) {
		const int i = i0 + tid, row = i / CH, ch = i % CH, j = kb + row;
		const bool in = j <= kHi;
		const long long at = in ? kv_row(bt, seqOff, bs, kvHeads, kvh, HD, j) + ch * 8 : 0;
		cp16(base + (ch / 8) * KR + sw128(row, ch % 8), c + at, in);
	}
}

// wg_issue issues the copies of K_{n+ST−1} and V_{n+ST−2} (those of the
// nblk stages that exist) into their slots of the rings at sK and sV: the
// round of copies stage n issues (K_j and V_{j−1} come in one round, as
// stage j uses them), then commits it.
template <int HD, int BK, int ST, int NTH>
__device__ __forceinline__ void wg_issue(int n, int nblk, unsigned sK, unsigned sV, const KV* kc, const KV* vc, int kLo, int kHi,
                                         const int* bt, int seqOff, int bs, int kvHeads, int kvh, int tid) {
	constexpr int SLOT = HD / 64 * BK * 128;
	const int jk = n + ST - 1, jv = n + ST - 2;
	if (jk < nblk) wg_load<HD, BK, NTH>(sK + (jk % ST) * SLOT, kc, kLo + jk * BK, kHi, bt, seqOff, bs, kvHeads, kvh, tid);
	if (jv >= 0 && jv < nblk) wg_load<HD, BK, NTH>(sV + (jv % ST) * SLOT, vc, kLo + jv * BK, kHi, bt, seqOff, bs, kvHeads, kvh, tid);
	cp_commit();
}

// wg_tma copies keys kb..kb+BK−1 (kb a block's first key) of the cache the
// tensor map at map describes into the K or V slot at base, where wg_load
// puts them, by TMA: a copy a block of BS slots and 64 head dims of kv head
// kvh (the map's box: 16-byte chunk c of row r lands at (c ^ r%8)·16, as
// sw128 puts it), for the blocks whose first key is within kHi (a block
// past the sequence's last key has no table entry); they complete on the
// mbarrier at bar, which expects their bytes. One thread issues them.
template <int HD, int BK, int BS>
__device__ __forceinline__ void wg_tma(unsigned base, unsigned bar, const KilnTensorMap* map, int kb, int kHi, const int* bt, int seqOff,
                                       int kvh) {
	constexpr int KR = BK * 128, PAGES = BK / BS;
	const int left = (kHi - kb) / BS + 1, np = left < PAGES ? left : PAGES;
	mbar_expect(bar, (unsigned)(np * (HD / 64) * BS * 128));
	// The blocks' table entries first, all loads in flight at once (each
	// copy's asm is a memory barrier to the compiler: a load after one
	// would wait for the load before it).
	const int* pt = bt + seqOff + kb / BS;
	int slot[PAGES];
#pragma unroll
	for (int pg = 0; pg < PAGES; pg++) slot[pg] = pg < np ? pt[pg] * BS : 0;
#pragma unroll
	for (int pg = 0; pg < PAGES; pg++) {
		if (pg >= np) break;
#pragma unroll
		for (int h = 0; h < HD / 64; h++) tma_load_3d(base + h * KR + pg * BS * 128, map, h * 64, kvh, slot[pg], bar);
	}
}

// wg_issue_tma is wg_issue by TMA (wg_tma; thread 0 alone): K_j's copies
// complete on the mbarrier at sBar + 8·(j mod ST), V_j's at sBar +
// 8·(ST + j mod ST).
template <int HD, int BK, int ST, int BS>
__device__ __forceinline__ void wg_issue_tma(int n, int nblk, unsigned sK, unsigned sV, unsigned sBar, const KilnTensorMap* km,
                                             const KilnTensorMap* vm, int kLo, int kHi, const int* bt, int seqOff, int kvh, int tid) {
	constexpr int SLOT = HD / 64 * BK * 128;
	const int jk = n + ST - 1, jv = n + ST - 2;
	if (tid != 0) return;
	if (jk < nblk) wg_tma<HD, BK, BS>(sK + (jk % ST) * SLOT, sBar + 8 * (jk % ST), km, kLo + jk * BK, kHi, bt, seqOff, kvh);
	if (jv >= 0 && jv < nblk) wg_tma<HD, BK, BS>(sV + (jv % ST) * SLOT, sBar + 8 * (ST + jv % ST), vm, kLo + jv * BK, kHi, bt, seqOff, kvh);
}

// WG_ROUND(n) issues stage n's round of copies (K_{n+ST−1}, V_{n+ST−2}) in
// prefill_wg, by cp.async or by TMA; WG_LANDED(n) waits until K_n and
// V_{n−1} are in this thread's view.
#define WG_ROUND(n)                                                                                                   \
	do {                                                                                                              \
		if constexpr (TBS > 0)                                                                                        \
			wg_issue_tma<HD, BK, ST, TBS>(n, nblk, sK, sV, sBar, kmap, vmap, kLo, kHi, bt, seqOff, kvh, tid);          \
		else                                                                                                          \
			wg_issue<HD, BK, ST, NTH>(n, nblk, sK, sV, kc, vc, kLo, kHi, bt, seqOff, bs, kvHeads, kvh, tid);          \
	} while (0)
#define WG_LANDED(n)                                                                                                  \
	do {                                                                                                              \
		if constexpr (TBS > 0) {                                                                                      \
			mbar_wait(sBar + 8 * ((n) % ST), ((n) / ST) & 1);                                                         \
			if ((n) > 0) mbar_wait(sBar + 8 * (ST + ((n) - 1) % ST), (((n) - 1) / ST) & 1);                           \
		} else {                                                                                                      \
			cp_wait<ST - 2>();                                                                                        \
		}                                                                                                             \
	} while (0)

// wg_pv issues O += P·V for the P of k-steps p (and its lo parts pl, f16)
// over the V slot at vs (regions lbo bytes apart).
template <int HD, int PK, int PL>
__device__ __forceinline__ void wg_pv(float* o, const unsigned (&p)[PK][4], const unsigned (&pl)[PK][PL], unsigned vs, unsigned lbo) {
#pragma unroll
	for (int kk = 0; kk < PK; kk++) {
		const unsigned long long vd = wg_desc_mn(vs + kk * 16 * 128, lbo);
		wg_mma_rs<HD>(o, p[kk], vd);
		if constexpr (PL == 4) wg_mma_rs<HD>(o, pl[kk], vd);
	}
}

// wg_s issues S = Q·Kᵀ for the 64 Q rows at q and the BK keys at k (both
// in regions of 128-byte rows: Q's 64·128 bytes apart, K's BK·128).
template <int HD, int BK> __device__ __forceinline__ void wg_s(float* s, unsigned q, unsigned k) {
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++)
		wg_mma<BK>(s, wg_desc(q + (kk / 4) * 64 * 128 + 32 * (kk % 4)), wg_desc(k + (kk / 4) * BK * 128 + 32 * (kk % 4)), kk);
}

// WgRows is what the softmax needs of a thread's two rows: their windows'
// starts and positions, the keys [fLo, fHi] no row masks, the thread's
// quad lane, the scale in the log2 domain and the soft cap.
struct WgRows {
	int lo0, p0, lo1, p1, fLo, fHi, tq;
	float sl2, cap;
};

// wg_softmax is prefill_fa's online softmax on a stage's scores s (keys
// kb..kb+BK−1; a thread's rows g and g+8 of its warp): masks, the rows'
// maxima m and sums l updated, s replaced by P (unrounded), and the factors
// c0, c1 by which O must be rescaled.
template <int BK>
__device__ __forceinline__ void wg_softmax(float (&s)[BK / 2], int kb, const WgRows& r, float& m0, float& m1, float& l0, float& l1,
                                           float& c0, float& c1) {
	constexpr int NS = BK / 8; // 8-key column tiles
	if (r.cap > 0.f) {         // soft-capped scores (Gemma 2), back in the domain sl2 scales
		const SoftcapRaw sc(r.sl2, r.cap * LOG2E);
#pragma unroll
		for (int i = 0; i < BK / 2; i++) s[i] = sc(s[i]);
	}
	if (!(kb >= r.fLo && kb + BK - 1 <= r.fHi)) {
#pragma unroll
		for (int nt = 0; nt < NS; nt++) {
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int j = kb + nt * 8 + 2 * r.tq + e;
				if (!(j >= r.lo0 && j <= r.p0)) s[4 * nt + e] = NEG_INF;
				if (!(j >= r.lo1 && j <= r.p1)) s[4 * nt + 2 + e] = NEG_INF;
			}
		}
	}
	float mx0 = m0, mx1 = m1;
#pragma unroll
	for (int nt = 0; nt < NS; nt++) {
		mx0 = fmaxf(mx0, fmaxf(s[4 * nt], s[4 * nt + 1]));
		mx1 = fmaxf(mx1, fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
	}
	mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 1));
	mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, 2));
	mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 1));
	mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, 2));
	// Scores in the log2 domain: p = 2^(s·sl2 − m·sl2).
	const float sl2 = r.sl2;
	const float b0 = mx0 == NEG_INF ? 0.f : mx0 * sl2, b1 = mx1 == NEG_INF ? 0.f : mx1 * sl2;
	c0 = ex2f(fmaf(m0, sl2, -b0));
	c1 = ex2f(fmaf(m1, sl2, -b1));
	m0 = mx0;
	m1 = mx1;
	float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
	for (int nt = 0; nt < NS; nt++) {
		s[4 * nt] = ex2f(fmaf(s[4 * nt], sl2, -b0));
		s[4 * nt + 1] = ex2f(fmaf(s[4 * nt + 1], sl2, -b0));
		s[4 * nt + 2] = ex2f(fmaf(s[4 * nt + 2], sl2, -b1));
		s[4 * nt + 3] = ex2f(fmaf(s[4 * nt + 3], sl2, -b1));
		ls0 += s[4 * nt] + s[4 * nt + 1];
		ls1 += s[4 * nt + 2] + s[4 * nt + 3];
	}
	l0 = l0 * c0 + ls0;
	l1 = l1 * c1 + ls1;
}

// wg_pack rounds P (in s) to wgmma's A fragments: k-step kk is keys
// 16kk..16kk+15, S's column tiles 2kk (a0 row g, a1 row g+8) and 2kk+1
// (a2, a3); f16 (PL 4) also the lo parts.
template <int N, int PK, int PL>
__device__ __forceinline__ void wg_pack(const float (&s)[N], unsigned (&p)[PK][4], unsigned (&pl)[PK][PL]) {
#pragma unroll
	for (int kk = 0; kk < PK; kk++) {
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int at = 4 * (2 * kk + (i >> 1)) + (i & 1) * 2;
			p[kk][i] = PK2(s[at], s[at + 1]);
			if constexpr (PL == 4) pl[kk][i] = PK2(s[at] - lo16(p[kk][i], (f16*)0), s[at + 1] - hi16(p[kk][i], (f16*)0));
		}
	}
}

// WgTile is what a thread of prefill_wg (and prefill_wgp) knows of its
// block's tile: its first token and count, the block's first head and kv
// head, the sequence's block-table offset; the thread's warpgroup, head,
// rows (r0 and r0 + 8; v0, v1: within the tile) and quad lane; the
// softmax's view of its rows; the tile's keys [kLo, kHi] (kLo rounded down
// to a multiple of round) and the stages over them.
struct WgTile {
	int tok0, cnt, h0, kvh, seqOff, tid, lane, wg, hw, r0, r1, tq, kLo, kHi, nblk;
	bool v0, v1;
	WgRows rows;
};

// wg_begin starts a block of the wgmma prefill (two heads a block, BK keys
// a stage): its tile (the grid's last first, the most keys when causal),
// Q of both heads copied by cp.async into sQ (zeros past the tile's tokens;
// chunk c of row r of head h in region c/8 of the head's; not committed),
// and the tile's keys (tile_keys: a call of the whole block).
template <int HD, int BK>
__device__ __forceinline__ WgTile wg_begin(unsigned sQ, int round, PF_PARAMS) {
	constexpr int NH = 2, NTH = 128 * NH, HR = HD / 64, CH = HD / 8, QR = 64 * 128;
	WgTile t;
	const int hg = heads / NH, bid = blockIdx.x;
	const int tile = (int)gridDim.x / hg - 1 - bid / hg;
	t.h0 = (bid % hg) * NH;
	t.tok0 = tileTok0[tile], t.cnt = tileCnt[tile];
	t.seqOff = seqBlockOff[seqIndex[t.tok0]];
	t.kvh = t.h0 / (heads / kvHeads);
	t.tid = threadIdx.x, t.lane = t.tid & 31;
	const int warp = t.tid >> 5, g = t.lane >> 2;
	t.tq = t.lane & 3;
	t.wg = warp >> 2, t.hw = t.h0 + t.wg;
	t.r0 = (warp & 3) * 16 + g, t.r1 = t.r0 + 8;
	t.v0 = t.r0 < t.cnt, t.v1 = t.r1 < t.cnt;
	for (int i = t.tid; i < NH * 64 * CH; i += NTH) {
		const int c = i % CH, r = (i / CH) % 64, h = i / (CH * 64);
		const bool in = r < t.cnt;
		const T* src = in ? q + ((long long)(t.tok0 + r) * heads + t.h0 + h) * HD + c * 8 : q;
		cp16(sQ + (h * HR + c / 8) * QR + sw128(r, c % 8), src, in);
	}
	const int p0 = t.v0 ? positions[t.tok0 + t.r0] : -1, p1 = t.v1 ? positions[t.tok0 + t.r1] : -1;
	const int lo0 = t.v0 ? window_start(p0, window) : 0, lo1 = t.v1 ? window_start(p1, window) : 0;
	// A stage inside [fLo, fHi] needs no mask.
	const TileKeys tk = tile_keys(positions, t.tok0, t.cnt, window, t.tid);
	t.kLo = tk.lo - tk.lo % round, t.kHi = tk.hi;
	t.nblk = (t.kHi - t.kLo) / BK + 1;
	t.rows = WgRows{lo0, p0, lo1, p1, tk.fLo, tk.fHi, t.tq, scale * LOG2E, cap}; // scale > 0 (PrefillAttention)
	return t;
}

// wg_rescale scales a thread's O rows by the softmax's factors c0 and c1.
template <int HD> __device__ __forceinline__ void wg_rescale(float (&o)[HD / 2], float c0, float c1) {
#pragma unroll
	for (int j = 0; j < HD / 8; j++) {
		o[4 * j] *= c0;
		o[4 * j + 1] *= c0;
		o[4 * j + 2] *= c1;
		o[4 * j + 3] *= c1;
	}
}

// wg_end stores a thread's O rows of its head, divided by their sums (l0
// and l1, the thread's parts).
template <int HD>
__device__ __forceinline__ void wg_end(const float (&o)[HD / 2], float l0, float l1, const WgTile& t, T* out, int heads) {
	const float s0 = quad_sum(l0), s1 = quad_sum(l1);
	if (t.v0) {
		unsigned* op = (unsigned*)(out + ((long long)(t.tok0 + t.r0) * heads + t.hw) * HD + 2 * t.tq);
		const float inv = 1.0f / s0;
#pragma unroll
		for (int j = 0; j < HD / 8; j++) op[j * 4] = PK2(o[4 * j] * inv, o[4 * j + 1] * inv);
	}
	if (t.v1) {
		unsigned* op = (unsigned*)(out + ((long long)(t.tok0 + t.r1) * heads + t.hw) * HD + 2 * t.tq);
		const float inv = 1.0f / s1;
#pragma unroll
		for (int j = 0; j < HD / 8; j++) op[j * 4] = PK2(o[4 * j + 2] * inv, o[4 * j + 3] * inv);
	}
}

// wg_zero_tail zeroes the rows from..BK−1 of the V slot at vs (regions of
// BK rows, HD/64 of them), by all NTH threads: the TMA builds copy whole
// blocks, and rows past the tile's last key (another position's values,
// or a stale slot) must not put NaN into P·V.
template <int HD, int BK, int NTH> __device__ __forceinline__ void wg_zero_tail(unsigned vs, int from, int tid) {
	for (int i = from * 8 + tid; i < BK * 8; i += NTH) // 16-byte chunks of the rows
#pragma unroll
		for (int h = 0; h < HD / 64; h++) st_shared_zero16(vs + h * BK * 128 + i * 16);
}

// prefill_wg: HD head dim (64 or 128), BK keys a stage (64 or 128), ST
// slots of K and of V. Dynamic shared memory: 1024 + 2·64·HD·2 (Q of both
// heads) + 2·ST·BK·HD·2 bytes (wgShared in prefill.go). 256 threads. Grid:
// tiles·heads/2 blocks, the last tile (the most keys, causal) first.
//
// TBS > 0: K and V come by TMA (wg_issue_tma) over the tensor maps kmap and
// vmap of a cache of TBS-token blocks, each slot's copies completing on an
// mbarrier of its own (2·ST of them, 8 bytes each, after the rings: 16·ST
// bytes more); the tile's first key rounded down to its block's (the keys
// before it masked as any outside a row's window), and the last stage's V
// rows past the tile's last key zeroed before its P·V (no NaN of a stale
// slot in P·V).
template <int HD, int BK, int ST, int TBS = 0>
__device__ __forceinline__ void prefill_wg(PF_PARAMS, const KilnTensorMap* kmap = nullptr, const KilnTensorMap* vmap = nullptr) {
	static_assert((HD == 64 || HD == 128) && (BK == 64 || BK == 128) && ST >= 2, "prefill_wg shape");
	static_assert(TBS == 0 || (TBS >= 8 && BK % TBS == 0 && (TBS & (TBS - 1)) == 0), "prefill_wg: TMA over blocks of 8 to BK tokens");
	static_assert(!kv_f8, "prefill_wg: an FP8 cache takes prefill_fa");
	constexpr int NH = 2, NTH = 128 * NH; // heads (warpgroups) a block, threads
	constexpr int HR = HD / 64;           // 128-byte regions of a row
	constexpr int QR = 64 * 128;          // a region of 64 Q rows
	constexpr int KR = BK * 128;          // a region of a K or V slot
	constexpr int SLOT = HR * KR;         // a slot of K (or V)
	constexpr int PK = BK / 16;           // k-steps of P·V
	constexpr bool PSPLIT = act_is_f16<T>::v;
	const unsigned sb = (smem_addr(pf_smem) + 1023u) & ~1023u;
	// Q of both heads, then the rings of K and V.
	const unsigned sQ = sb, sK = sb + NH * HR * QR, sV = sK + ST * SLOT;
	const unsigned sBar = sV + ST * SLOT; // TBS: the slots' mbarriers, K's then V's

	// The tile, Q's copies (committed with the first round), the keys.
	const WgTile t = wg_begin<HD, BK>(sQ, TBS > 0 ? TBS : 1, PF_ARGS);
	const int seqOff = t.seqOff, kvh = t.kvh, tid = t.tid, kLo = t.kLo, kHi = t.kHi, nblk = t.nblk;
	const unsigned qw = sQ + t.wg * HR * QR; // the warpgroup's Q
	if constexpr (TBS > 0) {
		if (tid == 0) {
			for (int i = 0; i < 2 * ST; i++) mbar_init(sBar + 8 * i, 1);
			mbar_init_fence();
		}
		__syncthreads();
	}

	float o[HD / 2], s[BK / 2];
#pragma unroll
	for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
	float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f, c0, c1;
	unsigned p[PK][4], pl[PK][PSPLIT ? 4 : 1]; // P of the last softmax
	const WgRows& rows = t.rows;

	// EARLY (the cp.async builds): O is rescaled by a stage's softmax
	// factors in the next stage, between the issue of its S and of its
	// P·V (FlashAttention 3's order), rather than between the wait for P·V
	// and the next stage's issue, where it delays the next wgmma: on an
	// H200 (session 47) wg128 +2.3% / +3.5% at 4,096 tokens causal / full,
	// +2.0-2.4% at 2,048 causal; the TMA builds lost 0.5-2% with it (wgt128,
	// wgp128), and keep the rescale after the wait.
	constexpr bool EARLY = TBS == 0;

	// The rounds of stages 1−ST..−1 (with Q in the first), then stage 0:
	// S_0 alone (no P·V before it).
#pragma unroll
	for (int n = 1 - ST; n < 0; n++) WG_ROUND(n);
	if constexpr (TBS > 0) {
		cp_commit(); // Q
		cp_wait<0>();
	}
	WG_LANDED(0);       // K_0 (and Q) are in (this thread's copies)
	fence_async_smem(); // and visible to wgmma
	__syncthreads();    // every thread's
	WG_ROUND(0);
	wg_fence();
	wg_s<HD, BK>(s, qw, sK);
	wg_commit();
	wg_wait0();
	wg_hold(s, BK / 2);
	wg_softmax<BK>(s, kLo, rows, m0, m1, l0, l1, c0, c1); // O is 0: nothing to rescale
	wg_pack(s, p, pl);
	for (int n = 1; n < nblk; n++) {
		const int kb = kLo + n * BK;
		WG_LANDED(n); // K_n and V_{n−1} are in
		fence_async_smem();
		__syncthreads(); // every warpgroup is done with stage n−1 (K_{n−1}, V_{n−2})
		WG_ROUND(n);
		wg_fence();
		wg_s<HD, BK>(s, qw, sK + (n % ST) * SLOT);
		wg_commit();
		if constexpr (EARLY) {
			wg_rescale<HD>(o, c0, c1);
			wg_fence();
		}
		wg_pv<HD>(o, p, pl, sV + ((n - 1) % ST) * SLOT, KR);
		wg_commit();
		wg_wait<1>(); // S_n is done; P_{n−1}·V_{n−1} may not be
		wg_hold(s, BK / 2);
		wg_softmax<BK>(s, kb, rows, m0, m1, l0, l1, c0, c1);
		wg_wait0(); // P_{n−1}·V_{n−1} is done: O may be rescaled, P replaced
		wg_hold(o, HD / 2);
		if constexpr (!EARLY) wg_rescale<HD>(o, c0, c1);
		wg_pack(s, p, pl);
	}
	// The last stage's P·V: V_{nblk−1} came with the last round of copies.
	if constexpr (TBS > 0) {
		const int last = nblk - 1;
		mbar_wait(sBar + 8 * (ST + last % ST), (last / ST) & 1);
		wg_zero_tail<HD, BK, NTH>(sV + (last % ST) * SLOT, kHi - (kLo + last * BK) + 1, tid); // from its first row past kHi
	} else {
		cp_wait<0>();
	}
	fence_async_smem();
	__syncthreads();
	if constexpr (EARLY) wg_rescale<HD>(o, c0, c1);
	wg_fence();
	wg_pv<HD>(o, p, pl, sV + ((nblk - 1) % ST) * SLOT, KR);
	wg_commit();
	wg_wait0();
	wg_hold(o, HD / 2);
	wg_end<HD>(o, l0, l1, t, out, heads);
}

#undef WG_ROUND
#undef WG_LANDED

// WGP_VN (0 or 1) is how many stages ahead of the one that issues them
// prefill_wgp's copies of V go: round n copies V_{n+WGP_VN}. 1 is what ran
// on the H200 in session 47; 0 (-DWGP_VN=0, an experiment: emulated, not
// yet run on a GPU) takes the wait for the slot's release by the other
// warpgroup, which comes after its softmax, off warp 0's path (below).
#ifndef WGP_VN
#define WGP_VN 1
#endif

// wgp_round is prefill_wgp's round n of copies (thread 0 alone): K_{n+2}
// and V_{n+WGP_VN}, those of the nblk stages that exist, by TMA (wg_tma), each
// into its slot once every warp has released the slot's use before (stage
// j − ST: K_j's slot on the mbarrier at sEmpty + 8·(j mod ST), V_j's at
// sEmpty + 8·(ST + j mod ST)); they complete on sFull's likewise.
template <int HD, int BK, int ST, int BS>
__device__ __forceinline__ void wgp_round(int n, int nblk, unsigned sK, unsigned sV, unsigned sFull, unsigned sEmpty,
                                          const KilnTensorMap* km, const KilnTensorMap* vm, int kLo, int kHi, const int* bt, int seqOff,
                                          int kvh) {
	constexpr int SLOT = HD / 64 * BK * 128;
	const int jk = n + 2, jv = n + WGP_VN;
	if (jk >= 0 && jk < nblk) {
		if (jk >= ST) mbar_wait(sEmpty + 8 * (jk % ST), (jk / ST - 1) & 1);
		wg_tma<HD, BK, BS>(sK + (jk % ST) * SLOT, sFull + 8 * (jk % ST), km, kLo + jk * BK, kHi, bt, seqOff, kvh);
	}
	if (jv >= 0 && jv < nblk) {
		if (jv >= ST) mbar_wait(sEmpty + 8 * (ST + jv % ST), (jv / ST - 1) & 1);
		wg_tma<HD, BK, BS>(sV + (jv % ST) * SLOT, sFull + 8 * (ST + jv % ST), vm, kLo + jv * BK, kHi, bt, seqOff, kvh);
	}
}

// prefill_wgp is prefill_wg's TMA build (blocks of BS tokens) with its two
// warpgroups in ping-pong (FlashAttention 3's schedule; with the TMA
// builds, WG_TMA): no barrier of the whole block a stage. Each warpgroup issues a
// stage's wgmma (S_n, then P_{n−1}·V_{n−1}) only after the other has issued
// its own (named barriers 1 and 2: a warpgroup waits at its own, then
// arrives at the other's; warpgroup 1 arrives once first), so that one's
// softmax runs under the other's multiplies. The rings have ST = 3 slots
// and round n (thread 0, once its warpgroup has issued stage n's wgmma,
// while it waits for S_n) copies K_{n+2} and V_{n+1} (WGP_VN): a slot is
// refilled with the use three stages on, which the warpgroup behind has
// released (each warp arrives on the slot's empty mbarrier once its wgmma
// that read it are done: 8 arrivals a phase). The other warpgroup released
// K_{n−1}'s slot once its S_{n−1} was done, which its wgmma issued before
// stage n's, so that wait is under S_n's. Neither the copies' issue nor the
// block table's loads are then between a warpgroup's softmax and its next
// wgmma (session 47: with the round before the named barrier, warp 0 spent
// 40% of its time in it and both warpgroups 40% waiting at the barrier;
// after the move, 1.08-1.09x). V_{n+1}'s slot held V_{n−2}, which the
// other warpgroup releases only after its softmax of stage n−1: Nsight
// then still shows 38% of the warps' time at the named barrier, which
// this wait serializing the two warpgroups would explain. With WGP_VN 0
// round n copies V_n (needed a stage later, with S_{n+1}) into V_{n−3}'s
// slot, released a stage earlier. Dynamic shared memory:
// wgShared's, then 2·ST mbarriers of copies done and 2·ST of slots released
// (32·ST bytes).
template <int HD, int BK, int BS>
__device__ __forceinline__ void prefill_wgp(PF_PARAMS, const KilnTensorMap* kmap, const KilnTensorMap* vmap) {
	static_assert((HD == 64 || HD == 128) && BK == 128, "prefill_wgp shape");
	static_assert(BS >= 8 && BK % BS == 0 && (BS & (BS - 1)) == 0, "prefill_wgp: TMA over blocks of 8 to BK tokens");
	static_assert(!kv_f8, "prefill_wgp: an FP8 cache takes prefill_fa");
	constexpr int ST = 3, NH = 2, NTH = 128 * NH;
	constexpr int HR = HD / 64, QR = 64 * 128, KR = BK * 128, SLOT = HR * KR, PK = BK / 16;
	constexpr bool PSPLIT = act_is_f16<T>::v;
	const unsigned sb = (smem_addr(pf_smem) + 1023u) & ~1023u;
	const unsigned sQ = sb, sK = sb + NH * HR * QR, sV = sK + ST * SLOT;
	const unsigned sFull = sV + ST * SLOT, sEmpty = sFull + 16 * ST;

	const WgTile t = wg_begin<HD, BK>(sQ, BS, PF_ARGS);
	cp_commit(); // Q
	const int seqOff = t.seqOff, kvh = t.kvh, tid = t.tid, lane = t.lane, wg = t.wg, kLo = t.kLo, kHi = t.kHi, nblk = t.nblk;
	const unsigned qw = sQ + wg * HR * QR;
	// round(n): thread 0's round n of copies (wgp_round).
	const auto round = [&](int n) { wgp_round<HD, BK, ST, BS>(n, nblk, sK, sV, sFull, sEmpty, kmap, vmap, kLo, kHi, bt, seqOff, kvh); };
	if (tid == 0) {
		for (int i = 0; i < 4 * ST; i++) mbar_init(sFull + 8 * i, i < 2 * ST ? 1 : 8);
		mbar_init_fence();
		round(-2); // K_0
		round(-1); // K_1 (and V_0)
	}
	cp_wait<0>();       // Q (this thread's copies)
	fence_async_smem(); // visible to wgmma
	__syncthreads();    // every thread's, and the barriers initialized

	float o[HD / 2], s[BK / 2];
#pragma unroll
	for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
	float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f, c0, c1;
	unsigned p[PK][4], pl[PK][PSPLIT ? 4 : 1];
	const WgRows& rows = t.rows;
	const int mine = 1 + wg, other = 2 - wg; // the warpgroups' named barriers

	if (wg == 1) named_arrive(1, NTH); // warpgroup 0 issues first
	// Stage 0: S_0 alone.
	mbar_wait(sFull, 0); // K_0
	named_sync(mine, NTH);
	wg_fence();
	wg_s<HD, BK>(s, qw, sK);
	wg_commit();
	named_arrive(other, NTH);
	if (tid == 0) round(0);
	wg_wait0();
	if (lane == 0) mbar_arrive(sEmpty); // K_0's slot
	wg_hold(s, BK / 2);
	wg_softmax<BK>(s, kLo, rows, m0, m1, l0, l1, c0, c1);
	wg_pack(s, p, pl);
	for (int n = 1; n < nblk; n++) {
		const int kb = kLo + n * BK;
		mbar_wait(sFull + 8 * (n % ST), (n / ST) & 1);                  // K_n
		mbar_wait(sFull + 8 * (ST + (n - 1) % ST), ((n - 1) / ST) & 1); // V_{n−1}
		named_sync(mine, NTH);
		wg_fence();
		wg_s<HD, BK>(s, qw, sK + (n % ST) * SLOT);
		wg_commit();
		wg_pv<HD>(o, p, pl, sV + ((n - 1) % ST) * SLOT, KR);
		wg_commit();
		named_arrive(other, NTH);
		if (tid == 0) round(n);
		wg_wait<1>(); // S_n is done
		if (lane == 0) mbar_arrive(sEmpty + 8 * (n % ST));
		wg_hold(s, BK / 2);
		wg_softmax<BK>(s, kb, rows, m0, m1, l0, l1, c0, c1);
		wg_wait0(); // P_{n−1}·V_{n−1} is done
		if (lane == 0) mbar_arrive(sEmpty + 8 * (ST + (n - 1) % ST));
		wg_hold(o, HD / 2);
		wg_rescale<HD>(o, c0, c1);
		wg_pack(s, p, pl);
	}
	// The last stage's P·V, its V rows past kHi zeroed first (by every
	// thread: both warpgroups read them).
	const int last = nblk - 1;
	const unsigned vs = sV + (last % ST) * SLOT;
	mbar_wait(sFull + 8 * (ST + last % ST), (last / ST) & 1);
	wg_zero_tail<HD, BK, NTH>(vs, kHi - (kLo + last * BK) + 1, tid);
	fence_async_smem();
	__syncthreads();
	named_sync(mine, NTH);
	wg_fence();
	wg_pv<HD>(o, p, pl, vs, KR);
	wg_commit();
	if (wg == 0) named_arrive(other, NTH); // warpgroup 1's last wait; warpgroup 0 waits no more
	wg_wait0();
	wg_hold(o, HD / 2);
	wg_end<HD>(o, l0, l1, t, out, heads);
}

static_assert(PF_BQ == 64, "prefill_wg: a tile's tokens are a warpgroup's 64 rows");
// prefill_wg_<HD>_<BK>_<ST>: one block a multiprocessor (up to 255
// registers a thread).
#define WG_KERNEL(HD, BK, ST)                                                                                        \
	extern "C" __global__ void __launch_bounds__(256, 1) prefill_wg_##HD##_##BK##_##ST(PF_PARAMS) {                  \
		prefill_wg<HD, BK, ST>(PF_ARGS);                                                                               \
	}
// prefill_wgt_<HD>_<BK>_<ST>: K and V by TMA over the tensor maps kmap and
// vmap (a module built for one block size, KILN_BS, of 8 to 64 tokens, a
// power of two; WG_TMA: an experiment, off by default).
#if defined(WG_TMA) && defined(KILN_BS)
#if KILN_BS >= 8 && KILN_BS <= 64 && (KILN_BS & (KILN_BS - 1)) == 0
#define WGT_KERNEL(HD, BK, ST)                                                                                       \
	extern "C" __global__ void __launch_bounds__(256, 1)                                                             \
	    prefill_wgt_##HD##_##BK##_##ST(PF_PARAMS, const __grid_constant__ KilnTensorMap kmap,                        \
	                                   const __grid_constant__ KilnTensorMap vmap) {                                 \
		prefill_wg<HD, BK, ST, KILN_BS>(PF_ARGS, &kmap, &vmap);                                                        \
	}
// prefill_wgp_<HD>_128_3: prefill_wgp (the TMA build in ping-pong).
#define WGP_KERNEL(HD)                                                                                               \
	extern "C" __global__ void __launch_bounds__(256, 1)                                                             \
	    prefill_wgp_##HD##_128_3(PF_PARAMS, const __grid_constant__ KilnTensorMap kmap,                              \
	                             const __grid_constant__ KilnTensorMap vmap) {                                       \
		prefill_wgp<HD, 128, KILN_BS>(PF_ARGS, &kmap, &vmap);                                                          \
	}
#endif
#endif
#ifdef WGT_KERNEL
#define WG_KERNELS(HD) WG_KERNEL(HD, 128, 2) WG_KERNEL(HD, 64, 2) WGT_KERNEL(HD, 128, 2) WGT_KERNEL(HD, 64, 2) WGP_KERNEL(HD)
#else
#define WG_KERNELS(HD) WG_KERNEL(HD, 128, 2) WG_KERNEL(HD, 64, 2)
#endif
// Part 1 of the kernels module (KILN_PART_IS), beside prefill_mma; not in
// an FP8 cache's module.
#if KILN_PART_IS(1) && !defined(KV_F8)
#if !defined(KILN_HD) || KILN_HD == 64
WG_KERNELS(64)
#endif
#if !defined(KILN_HD) || KILN_HD == 128
WG_KERNELS(128)
#endif
#endif // KILN_PART_IS(1)
#endif // ACT_WGMMA
