// kiln CUDA kernels: attention. Appended to kernels.cu by kernels.go (one
// NVRTC source).

// ---------------------------------------------------------------- attention
//
// Cache layout per layer: [blocks][blockSize][kvHeads][hd]. Token at position p
// of sequence s attends to keys j, window_start(p) <= j <= p, stored at slot
// bt[seqOff[s] + j/bs]*bs + j%bs. Scores are kept in the log2 domain (q is
// pre-scaled by scale·log2 e) and exponentiated with exp2f.

#define PF_BQ 64  // queries per prefill tile (the Go packer's PrefillTile)
#define PF_BK 32  // keys per shared-memory stage
#define PF_THREADS 128

// softcap_l2 soft-caps a score of the log2 domain: capl2·tanh(s/capl2),
// capl2 the cap times log2 e, which is Gemma 2's cap·tanh(s/cap) of the
// natural score; a cap of 0 leaves it.
__device__ __forceinline__ float softcap_l2(float s, float capl2) { return capl2 > 0.f ? capl2 * tanhf(s / capl2) : s; }

// SoftcapRaw soft-caps the raw scores of the tensor-core kernels, whose
// online softmax scales them by sl2 (the scale times log2 e) later: what
// softcap_l2(s·sl2, capl2) / sl2 gives, (capl2 / sl2)·tanh(s·sl2 / capl2),
// by two multiplies an element (that form divided twice an element, each
// an IEEE division with its slow path: 386 calls of it in prefill_wg's
// SASS, a third of its instructions; session 47). capl2 > 0.
struct SoftcapRaw {
	float in, out; // sl2 / capl2 and capl2 / sl2
	__device__ __forceinline__ SoftcapRaw(float sl2, float capl2) : in(sl2 / capl2), out(capl2 / sl2) {}
	__device__ __forceinline__ float operator()(float s) const { return out * tanhf(s * in); }
};

// kv_bs is the tokens a cache block holds: KILN_BS where the module was
// built for one block size (kernels.NewFor), a constant that the compiler
// folds into kv_page's and kv_row's arithmetic, else bs as the kernel was
// given it.
__device__ __forceinline__ int kv_bs(int bs) {
#ifdef KILN_BS
	return KILN_BS;
#else
	return bs;
#endif
}

// kv_page is the index of key j (≥ 0) in its sequence's block table,
// j / bs: by a shift where a block holds a power of two tokens (kiln's 16;
// the integer division was half of prefill_wg's time: docs/PERF.md,
// session 44). KV_ROW_DIV keeps the division whatever the block size (the
// emulator's FP8 builds take it, so that the path of other block sizes
// runs).
__device__ __forceinline__ int kv_page(int j, int bs) {
	bs = kv_bs(bs);
#ifdef KV_ROW_DIV
	return j / bs;
#else
	return (bs & (bs - 1)) == 0 ? j >> (__ffs(bs) - 1) : j / bs;
#endif
}

// kv_slot is the cache slot of key j (≥ 0) of a sequence whose block table
// gives blk for j's page (bt[seqOff + kv_page(j, bs)]); an int, as
// NewKVCache keeps a layer's slots (times kv heads) within one.
__device__ __forceinline__ int kv_slot(int blk, int j, int bs) {
	bs = kv_bs(bs);
	return blk * bs + (j - kv_page(j, bs) * bs);
}

// kv_row is the element offset of key j's row for kv head kvh in the cache.
// Built for blocks of a power of two tokens (KILN_BS), the slot is a shift
// and a mask and the slot's row index is 32-bit arithmetic (NewKVCache keeps
// a layer's slots times kv heads within an int): prefill attention 1.07–1.35×
// the run-time form's speed on the H200 (docs/PERF.md, sessions 45 and 46).
__device__ __forceinline__ long long kv_row(const int* bt, int seqOff, int bs, int kvHeads, int kvh, int hd, int j) {
#if defined(KILN_BS) && !defined(KV_ROW_DIV)
	if ((KILN_BS & (KILN_BS - 1)) == 0) {
		const int sh = __ffs(KILN_BS) - 1, slot = (bt[seqOff + (j >> sh)] << sh) | (j & (KILN_BS - 1));
		return (long long)(slot * kvHeads + kvh) * hd;
	}
#endif
	const long long slot = kv_slot(bt[seqOff + kv_page(j, bs)], j, bs);
	return (slot * kvHeads + kvh) * hd;
}

// The CUDA-core kernels (prefill_impl, decode_impl) read caches of the
// activation dtype only: an FP8 cache (KV_F8) takes the tensor-core kernels
// (prefill_mma.cu, decode_mma.cu), and the Go side refuses it where those
// do not apply.
#ifndef KV_F8
// Prefill: grid (tiles, heads), block 128. Tile i covers tokens
// [tileTok0[i], tileTok0[i]+tileCnt[i]), all of one sequence. Two threads per
// query; thread half h owns the float4 chunks c of the head with c%2 == h.
template <int HD>
__device__ void prefill_impl(const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt,
                             const int* positions, const int* seqIndex, const int* seqBlockOff, const int* bt, int heads,
                             int kvHeads, int bs, int window, float scale, float cap) {
	constexpr int NC = HD / 4;    // float4 chunks per row
	constexpr int NCH = NC / 2;   // per thread
	constexpr int CPR = HD / VEC; // 16-byte chunks per cache row
	// Keys a stage: fewer past head dim 128, whose stages would pass the
	// 48 KiB of static shared memory.
	constexpr int BK = HD > 128 ? PF_BK / 2 : PF_BK;
	__shared__ float4 Ks[BK][NC];
	__shared__ float4 Vs[BK][NC];
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
	float qs = scale * LOG2E, capl2 = cap * LOG2E;
	const T* qr = q + ((long long)tok * heads + h) * HD;
#pragma unroll
	for (int i = 0; i < NCH; i++) {
		int c = (2 * i + hf) * 4;
		qv[i] = f4(tof(qr[c]) * qs, tof(qr[c + 1]) * qs, tof(qr[c + 2]) * qs, tof(qr[c + 3]) * qs);
		acc[i] = f4(0.f, 0.f, 0.f, 0.f);
	}
	float m = NEG_INF, l = 0.f;

	for (int kb = kLo; kb <= kHi; kb += BK) {
		__syncthreads();
		for (int i = tid; i < BK * CPR; i += PF_THREADS) {
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

		float s[BK];
		float mt = NEG_INF;
#pragma unroll
		for (int j = 0; j < BK; j++) {
			float d = 0.f;
#pragma unroll
			for (int i = 0; i < NCH; i++) {
				float4 k = Ks[j][2 * i + hf];
				d += qv[i].x * k.x + qv[i].y * k.y + qv[i].z * k.z + qv[i].w * k.w;
			}
			d += __shfl_xor_sync(FULL_MASK, d, 1);
			int kp = kb + j;
			s[j] = (kp >= lo && kp <= p) ? softcap_l2(d, capl2) : NEG_INF;
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
			for (int j = 0; j < BK; j++) {
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


#endif // KV_F8

// Decode (flash-decoding): grid (maxSplits, kvHeads, tokens), block 128.
// Block (sp, kvh, t) covers keys [lo + sp*chunk, min(lo+(sp+1)*chunk, p+1)) of
// token t (chunk <= 128) for the group of query heads sharing kv head kvh.
// A token whose keys fit in one split gets its output from that block.
// Otherwise each block writes per head the partial max m (log2 domain), sum
// l and unnormalised acc[hd] into the workspace at index
// w = (t*heads + h)*maxSplits + sp (acc at w*hd: 16-byte aligned, then m,
// then l), and the last of the token's blocks to finish merges them.
//
// The cluster variant (CL, compute capability 9.0+): the grid's maxSplits
// blocks along x are one thread-block cluster, and each token's keys are
// spread evenly over them (ceil(keys/maxSplits) a block, at most chunk).
// Each block keeps its partials in its shared memory; after a cluster
// barrier every block merges a share of the outputs, reading the others'
// partials through distributed shared memory (no workspace, no counters,
// no round trip through L2), and a second barrier keeps each block's shared
// memory alive until the others have read it.
//
// Dynamic shared memory: floats qs[group][hd+4], part[group][hd] (CL only),
// sc[group*chunk], ints slots[chunk], floats red[NS*4*hd] sm[group]
// sl[group], then (at a 16-byte boundary) the chunk's K rows, each padded
// by 16 bytes.
//
// Latency, not bandwidth, bounds it at short context, so the dependent
// memory round trips are kept few: the block's cache slots are read before
// the wait for the previous kernel (the batch's metadata comes from the host
// before the step and no kernel writes it), and so are the K and V rows of
// the keys before the sequence's first position in the batch (seqFresh:
// earlier steps wrote them; the previous kernel writes this step's); then
// Q and the remaining rows are loaded, every K row by cp.async into shared
// memory, every V row (each thread its share) into registers, and the
// merge loads each split's partials in batches. Each score (key, query head) is one thread's dot product, so
// that a short chunk spreads its scores over the block (padded rows: no
// bank conflicts).
#define DC_THREADS 128

// pv_add adds key j's V values f (VEC of them) to the accumulators of the
// up to 4 query heads g0.. of the group, weighted by their scores sc.
__device__ __forceinline__ void pv_add(float (&acc)[4][VEC], const float* f, const float* sc, int g0, int group, int chunk,
                                       int j) {
#pragma unroll
	for (int gg = 0; gg < 4; gg++) {
		if (g0 + gg < group) {
			float pj = sc[(g0 + gg) * chunk + j];
#pragma unroll
			for (int e = 0; e < VEC; e++) acc[gg][e] += pj * f[e];
		}
	}
}

// ldcg and ldcg4 load through L2 only (not the SM's L1, which does not see
// other blocks' stores); volatile keeps them after the fence that precedes
// them.
__device__ __forceinline__ float ldcg(const float* p) {
	float v;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
	return v;
}
__device__ __forceinline__ float4 ldcg4(const float* p) {
	float4 v;
	asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
	return v;
}

// decode_merge: the last of token t's nsplit split blocks (for kv head kvh,
// query heads h0..h0+group-1) to finish merges their partials: out =
// Σ 2^(m_s-M) acc_s / Σ 2^(m_s-M) l_s, reading the others' partials from L2,
// and leaves the counter at zero for the next launch. Every block of the
// token's splits calls it after its threads have written its partials (at
// w = (t*heads + h)*maxSplits + sp, as decode_impl describes); blocks of
// DC_THREADS threads.
template <int HD>
__device__ __forceinline__ void decode_merge(T* out, const float* wsAcc, const float* wsM, const float* wsL, int* counters,
                                             int t, int kvh, int h0, int group, int heads, int kvHeads, int maxSplits,
                                             int nsplit) {
	const int tid = threadIdx.x;
	constexpr int Q4 = HD / 4;
	__shared__ int last;
	__threadfence();
	__syncthreads();
	if (tid == 0) last = atomicAdd(counters + t * kvHeads + kvh, 1) == nsplit - 1;
	__syncthreads();
	if (!last) return;
	if (tid == 0) counters[t * kvHeads + kvh] = 0;
	__threadfence();
	// Thread i takes four dims (one float4) of one head, online over
	// batches of MG splits whose loads are issued together. Split 0 is in
	// the first batch and has keys, so M is finite after it; splits past
	// nsplit weigh 2^-inf = 0.
	constexpr int MG = 8;
	for (int i = tid; i < group * Q4; i += DC_THREADS) {
		int gg = i / Q4, d = (i % Q4) * 4;
		long long row = (long long)t * heads + h0 + gg;
		long long w0 = row * maxSplits;
		float M = NEG_INF, L = 0.f;
		float4 o = f4(0.f, 0.f, 0.f, 0.f);
		for (int s0 = 0; s0 < nsplit; s0 += MG) {
			float ms[MG], ls[MG];
			float4 as[MG];
#pragma unroll
			for (int j = 0; j < MG; j++) {
				bool in = s0 + j < nsplit;
				long long w = w0 + (in ? s0 + j : s0);
				ms[j] = in ? ldcg(wsM + w) : NEG_INF;
				ls[j] = in ? ldcg(wsL + w) : 0.f;
				as[j] = in ? ldcg4(wsAcc + w * HD + d) : f4(0.f, 0.f, 0.f, 0.f);
			}
			float mn = M;
#pragma unroll
			for (int j = 0; j < MG; j++) mn = fmaxf(mn, ms[j]);
			float c = exp2f(M - mn);
			L *= c;
			o.x *= c; o.y *= c; o.z *= c; o.w *= c;
#pragma unroll
			for (int j = 0; j < MG; j++) {
				float e = exp2f(ms[j] - mn);
				L += e * ls[j];
				o.x += e * as[j].x; o.y += e * as[j].y; o.z += e * as[j].z; o.w += e * as[j].w;
			}
			M = mn;
		}
		T* dst = out + row * HD + d;
		dst[0] = fromf<T>(o.x / L);
		dst[1] = fromf<T>(o.y / L);
		dst[2] = fromf<T>(o.z / L);
		dst[3] = fromf<T>(o.w / L);
	}
}

#ifndef KV_F8
template <int HD, bool CL>
__device__ void decode_impl(const T* q, const T* kc, const T* vc, T* out, float* wsAcc, float* wsM, float* wsL,
                            int* counters, const int* positions, const int* seqIndex, const int* seqBlockOff, const int* seqFresh, const int* bt, int heads,
                            int kvHeads, int bs, int window, float scale, float cap, int chunk, int maxSplits) {
	constexpr int CPR = HD / VEC;                       // 16-byte chunks per row
	constexpr int NS = DC_THREADS / CPR;                // row slices in the PV phase
	constexpr int PVI = (DC_THREADS + NS - 1) / NS;     // rows per thread in the PV phase
	constexpr bool PRE = PVI <= 16;                     // prefetch V into registers
	int sp = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
	int group = heads / kvHeads, h0 = kvh * group;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

	constexpr int QS = HD + 4;                     // floats per q row in shared memory
	constexpr int KROW = HD * (int)sizeof(T) + 16; // bytes per K row in shared memory
	extern __shared__ float smem[];
	float* qs = smem;
	float* part = qs + group * QS; // 16-byte aligned: QS is a multiple of 4
	float* sc = part + (CL ? group * HD : 0);
	int* slots = (int*)(sc + group * chunk);
	float* red = (float*)(slots + chunk);
	float* sm = red + NS * 4 * HD;
	float* sl = sm + group;
	char* ks = (char*)smem + ((4 * (int)(sl + group - smem) + 15) & ~15);

	// Before the wait: positions, block table, slots.
	int p = positions[t];
	int lo = window_start(p, window);
	int nsplit, k0, nk;
	if constexpr (CL) {
		// Every block of the cluster goes on to the barriers, with or
		// without keys (no keys: m = -inf, l = 0, acc = 0).
		nsplit = gridDim.x;
		int per = (p - lo + nsplit) / nsplit; // ceil(keys / blocks) <= chunk
		k0 = lo + sp * per;
		nk = p + 1 - k0 < 0 ? 0 : imin(per, p + 1 - k0);
	} else {
		nsplit = (p - lo + chunk) / chunk;
		if (sp >= nsplit) return; // uniform over the block
		k0 = lo + sp * chunk;
		nk = imin(chunk, p + 1 - k0);
	}
	int seqOff = seqBlockOff[seqIndex[t]];
	if (tid < nk) {
		const int kp = k0 + tid;
		slots[tid] = kv_slot(bt[seqOff + kv_page(kp, bs)], kp, bs);
	}
	// Keys before the first of this step's positions of the sequence were
	// written by earlier steps: their K and V loads start before the wait
	// (block rows [0, nold)); the rest were written by the previous kernel.
	int nold = imin(nk, seqFresh[seqIndex[t]] - k0);
	__syncthreads();

	// K and V loads: the older rows', then (after the wait) the others' and
	// Q, all in flight together.
	int r = tid / CPR, cc = tid % CPR;
	for (int j = r; j < nold; j += NS)
		cp16(smem_addr(ks + j * KROW + cc * 16), kc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC, true);
	uint4 vpre[PRE ? PVI : 1];
	if constexpr (PRE) {
		if (r < NS) {
#pragma unroll
			for (int i = 0; i < PVI; i++) {
				int j = r + i * NS;
				if (j < nold) vpre[i] = *(const uint4*)(vc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC);
			}
		}
	}
	pdl_enter();
	for (int j = r; j < nk; j += NS)
		if (j >= nold)
			cp16(smem_addr(ks + j * KROW + cc * 16), kc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC, true);
	cp_commit();
	if constexpr (PRE) {
		if (r < NS) {
#pragma unroll
			for (int i = 0; i < PVI; i++) {
				int j = r + i * NS;
				if (j < nk && j >= nold) vpre[i] = *(const uint4*)(vc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC);
			}
		}
	}
	float qscale = scale * LOG2E;
	const uint4* qr = (const uint4*)(q + ((long long)t * heads + h0) * HD);
#pragma unroll 2
	for (int i = tid; i < group * CPR; i += DC_THREADS) {
		float f[VEC];
		unpack16(qr[i], f, q);
		float* qd = qs + (i / CPR) * QS + (i % CPR) * VEC;
#pragma unroll
		for (int e = 0; e < VEC; e++) qd[e] = f[e] * qscale;
	}
	cp_wait<0>();
	__syncthreads();

	// Scores: thread i takes (key i / group, head i % group), ...
	for (int i = tid; i < nk * group; i += DC_THREADS) {
		int j = i / group, g = i % group;
		const uint4* kr = (const uint4*)(ks + j * KROW);
		const float* qh = qs + g * QS;
		float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int c = 0; c < CPR; c++) {
			float f[VEC];
			unpack16(kr[c], f, kc);
#pragma unroll
			for (int e = 0; e < VEC; e++) d[e & 3] += qh[c * VEC + e] * f[e];
		}
		sc[g * chunk + j] = softcap_l2((d[0] + d[1]) + (d[2] + d[3]), cap * LOG2E);
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

	// PV: thread (r, cc) sums rows r, r+NS, ... of its 16-byte column chunk;
	// the slices are summed through shared memory into the output (one
	// split) or the block's partial accumulators.
	bool single = nsplit == 1;
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
						pv_add(acc, f, sc, g0, group, chunk, j);
					}
				}
			} else {
				for (int j = r; j < nk; j += NS) {
					float f[VEC];
					load16(vc + ((long long)slots[j] * kvHeads + kvh) * HD + cc * VEC, f);
					pv_add(acc, f, sc, g0, group, chunk, j);
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
				long long row = (long long)t * heads + h0 + g0 + gg;
				if (single) out[row * HD + d] = fromf<T>(v / sl[g0 + gg]);
				else if (CL) part[(g0 + gg) * HD + d] = v;
				else wsAcc[(row * maxSplits + sp) * HD + d] = v;
			}
		}
		__syncthreads();
	}
	if (single) return;
	constexpr int Q4 = HD / 4;
	if constexpr (CL) {
		// Block sp merges outputs sp, sp + nsplit, ... (one float4 of one
		// head each): out = Σ 2^(m_s-M) acc_s / Σ 2^(m_s-M) l_s over the
		// cluster's blocks s. Block 0 has keys, so M is finite.
		constexpr int MAXC = 16; // cu.MaxCluster
		cluster_sync();
		for (int i = sp + nsplit * tid; i < group * Q4; i += nsplit * DC_THREADS) {
			int gg = i / Q4, d = (i % Q4) * 4;
			float ms[MAXC], ls[MAXC];
			float4 as[MAXC];
#pragma unroll
			for (int s = 0; s < MAXC; s++) {
				bool in = s < nsplit;
				ms[s] = in ? lds_cluster(dsmem(sm + gg, s)) : NEG_INF;
				ls[s] = in ? lds_cluster(dsmem(sl + gg, s)) : 0.f;
				as[s] = in ? lds_cluster4(dsmem(part + gg * HD + d, s)) : f4(0.f, 0.f, 0.f, 0.f);
			}
			float M = ms[0];
#pragma unroll
			for (int s = 1; s < MAXC; s++) M = fmaxf(M, ms[s]);
			float L = 0.f;
			float4 o = f4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
			for (int s = 0; s < MAXC; s++) {
				float e = exp2f(ms[s] - M);
				L += e * ls[s];
				o.x += e * as[s].x; o.y += e * as[s].y; o.z += e * as[s].z; o.w += e * as[s].w;
			}
			T* dst = out + ((long long)t * heads + h0 + gg) * HD + d;
			dst[0] = fromf<T>(o.x / L);
			dst[1] = fromf<T>(o.y / L);
			dst[2] = fromf<T>(o.z / L);
			dst[3] = fromf<T>(o.w / L);
		}
		cluster_sync();
		return;
	}
	if (tid < group) {
		long long w = ((long long)t * heads + h0 + tid) * maxSplits + sp;
		wsM[w] = sm[tid];
		wsL[w] = sl[tid];
	}

	decode_merge<HD>(out, wsAcc, wsM, wsL, counters, t, kvh, h0, group, heads, kvHeads, maxSplits, nsplit);
}

#endif // KV_F8

// DC_PARAMS and DC_ARGS are the parameters of every decode attention kernel
// (these split and cluster kernels, and the tensor-core decode_mma kernels
// of decode_mma.cu): one launch wrapper, Kernels.DecodeAttention, passes them.
#define DC_PARAMS                                                                                                     \
	const T *q, const KV *kc, const KV *vc, T *out, float *wsAcc, float *wsM, float *wsL, int *counters,              \
	    const int *positions, const int *seqIndex, const int *seqBlockOff, const int *seqFresh, const int *bt,        \
	    int heads, int kvHeads, int bs, int window, float scale, float cap, int chunk, int maxSplits
#define DC_ARGS                                                                                                       \
	q, kc, vc, out, wsAcc, wsM, wsL, counters, positions, seqIndex, seqBlockOff, seqFresh, bt, heads, kvHeads, bs,    \
	    window, scale, cap, chunk, maxSplits

#ifndef KV_F8
// DECODE_ATTN defines decode kernel NAME: split plans (CL false) or
// cluster plans (CL true).
#define DECODE_ATTN(NAME, HD, CL)                                                                                    \
	extern "C" __global__ void __launch_bounds__(DC_THREADS) NAME(DC_PARAMS) { decode_impl<HD, CL>(DC_ARGS); }

#define ATTN_PREFILL(HD)                                                                                             \
	extern "C" __global__ void __launch_bounds__(PF_THREADS) prefill_attn_##HD(                                       \
	    const T* q, const T* kc, const T* vc, T* out, const int* tileTok0, const int* tileCnt, const int* positions,  \
	    const int* seqIndex, const int* seqBlockOff, const int* bt, int heads, int kvHeads, int bs, int window,        \
	    float scale, float cap) {                                                                                      \
		prefill_impl<HD>(q, kc, vc, out, tileTok0, tileCnt, positions, seqIndex, seqBlockOff, bt, heads, kvHeads, bs, \
		                 window, scale, cap);                                                                          \
	}
#define ATTN_DECODE(HD) DECODE_ATTN(decode_attn_##HD, HD, false)
#define ATTN_DECODE_CL(HD) DECODE_ATTN(decode_attn_cl_##HD, HD, true)

// KILN_HD builds one head dim's kernels (kernels.NewHeadDim), else all;
// the CUDA-core attention kernels are three parts of the kernels module
// (KILN_PART_IS), compiled at once: the prefill (part 2), the decode's
// split plans (part 4) and its cluster plans (part 5).
#ifdef KILN_HD
// (ATTN_APPLY expands KILN_HD before the kernel's macro pastes it.)
#define ATTN_APPLY(K, HD) K(HD)
#define ATTN_EACH_HD(K) ATTN_APPLY(K, KILN_HD)
#else
#define ATTN_EACH_HD(K) K(8) K(16) K(32) K(64) K(80) K(96) K(128) K(256)
#endif
#if KILN_PART_IS(2)
ATTN_EACH_HD(ATTN_PREFILL)
#endif
#if KILN_PART_IS(4)
ATTN_EACH_HD(ATTN_DECODE)
#endif
#if KILN_PART_IS(5)
ATTN_EACH_HD(ATTN_DECODE_CL)
#endif
#endif // KV_F8
