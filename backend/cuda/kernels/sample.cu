// kiln sampling on the GPU: engine.Sampler.Sample (engine/sample.go) for R
// rows of f32 logits, one block of NT threads per row, so that only the
// chosen ids leave the device. Compiled by NVRTC as its own module
// (kiln_sample); no CUDA headers. The Go wrapper is sample.go.
//
// Per row, as the CPU sampler:
//   x = penalized logit · (1/temperature): penalties are patched from the
//       row's history entries into the scratch row xs; temperature 0 is
//       greedy (first index of the largest penalized logit, NaN never wins).
//   top-k: the k-th largest x by radix select; ties by lower id.
//   p = float32(float32(exp(float64(x - max))) / Σ) into the scratch row
//       ps, -1 for tokens cut by top-k.
//   top-p: the shortest prefix in (p desc, id asc) order whose mass reaches
//       top_p, by radix select over p weighted by mass.
//   min-p: p >= float32(min_p) · max p.
//   draw: the candidate whose interval [before, before + p) in the CPU's
//       candidate order holds u · total, where the order is id order when
//       neither top-k nor top-p cut, (x desc, id asc) after top-k alone and
//       (p desc, id asc) after top-p. The mass before a token is the mass of
//       the larger keys plus that of equal keys with smaller ids.
// Masses are summed exactly as integers in units of 2^-60, so no sum
// depends on the order of the additions (the CPU sums in float64).
//
// A row with top-k of at most KC takes the compact path: after the top-k
// select its survivors are gathered into shared memory, sorted as the CPU
// sorts them, and softmax, top-p, min-p and the draw run there. Other rows
// make passes over the whole row (each radix select three), so their cost
// is that of one SM streaming the row several times.

#ifndef NT
#define NT 1024 // threads per block (a multiple of 32, at most 1024); sample.go's sampleThreads
#endif
#define NWARP (NT / 32)
#define FULL 0xffffffffu

// Radix selects take three digits of the 32-bit keys: 8 bits, then 12 and
// 12. The first digit, where most elements fall into few bins, is counted
// in 32 copies, one per lane ([bin][lane]: the lanes of a warp never hit the
// same bank); the later digits, where few elements take part, in one
// histogram of 4096 bins. Both live in the same dynamic shared memory.
#define D0 256   // bins of the first digit
#define HB 4096  // bins of the later digits
#define DYN_WORDS 16384 // 64 KiB: [lo, hi] × D0 × 32, or [lo, hi, count, min id] × HB; sample.go's sampleShared
#define NONE 0xffffffffu
#define IDMAX 0x7fffffff
#define FIX_ONE 1152921504606846976.0f // 2^60: a mass of 1
#define U 8 // elements per thread in flight in the passes over a row
#define KC 1024 // top-k up to KC: the survivors are gathered and sorted in shared memory

typedef unsigned long long u64;

// RowParams is one row's parameters (64 bytes; sample.go writes them).
struct RowParams {
	double top_p; // used when flags & TOPP
	double u;     // the row's uniform draw in [0, 1)
	float inv_temp, min_p, rep, freq, pres;
	int top_k; // used when flags & TOPK
	int flags;
	int hist_off, hist_len; // the row's entries (id, count, seen) in hist
	int pad[3];
};

#define GREEDY 1
#define PENALTY 2 // penalties active (with entries to apply)
#define TOPK 4    // 0 < top_k < vocab
#define TOPP 8    // 0 < top_p < 1

#ifndef KILN_EMU
extern __shared__ unsigned sample_dyn[]; // DYN_WORDS
#endif

struct Smem {
	u64 h0[D0];         // the first digit's weights, summed over the copies
	u64 ru[NWARP];      // scans and segment sums
	double rd[NWARP];   // sums
	float rv[NWARP];    // maxima
	int ri[NWARP];      // their ids
	u64 b_before, b_off, b_w; // broadcasts
	unsigned b_bin;
	int b_found, b_id, cnt;
};

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// xkey orders floats as unsigned integers (-0 as +0).
__device__ __forceinline__ unsigned xkey(float x) {
	unsigned u = __float_as_uint(x == 0.f ? 0.f : x);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// fix is the mass of probability p in units of 2^-60 (truncated).
__device__ __forceinline__ u64 fix(float p) {
	return p > 0.f ? __float2ull_rz(__fmul_rn(fminf(p, 2.f), FIX_ONE)) : 0ull;
}

// frac_target is floor(u · total), at most total-1 (total > 0).
__device__ __forceinline__ u64 frac_target(double u, u64 total) {
	u64 t = (u64)(u * (double)total);
	return t < total ? t : total - 1;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
	return v;
}

__device__ __forceinline__ u64 warp_incl_scan_u64(u64 v, int lane) {
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		u64 t = __shfl_up_sync(FULL, v, o);
		if (lane >= o) v += t;
	}
	return v;
}

// block_sum_d: every thread gets the same sum.
__device__ double block_sum_d(double v, Smem& s) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
	__syncthreads();
	if (lane == 0) s.rd[w] = v;
	__syncthreads();
	v = lane < NWARP ? s.rd[lane] : 0.0;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
	return v;
}

__device__ float block_max_f(float v, Smem& s) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	__syncthreads();
	if (lane == 0) s.rv[w] = v;
	__syncthreads();
	v = lane < NWARP ? s.rv[lane] : v;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	return v;
}

// block_excl_scan: the sum of v over the threads before this one, and the
// block's total. The next call's first barrier protects s.ru.
__device__ u64 block_excl_scan(u64 v, Smem& s, u64* total) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	u64 inc = warp_incl_scan_u64(v, lane);
	__syncthreads();
	if (lane == 31) s.ru[w] = inc;
	__syncthreads();
	if (w == 0) {
		u64 x = lane < NWARP ? s.ru[lane] : 0;
		x = warp_incl_scan_u64(x, lane);
		if (lane < NWARP) s.ru[lane] = x;
	}
	__syncthreads();
	*total = s.ru[NWARP - 1];
	return (w > 0 ? s.ru[w - 1] : 0) + inc - v;
}

// better: a (at id ia) beats b (at ib) for engine.Argmax: larger, then lower
// id; NaN never beats a number.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
	bool na = a != a, nb = b != b;
	if (na || nb) return na == nb ? ia < ib : nb;
	return a > b || (a == b && ia < ib);
}

// load_strip reads this thread's U elements of the strip of a row of V at
// base (all the loads in flight before any is used), pad past the end.
__device__ __forceinline__ void load_strip(const float* src, int base, int V, float pad, float (&v)[U]) {
#pragma unroll
	for (int j = 0; j < U; j++) {
		int i = base + j * NT + (int)threadIdx.x;
		v[j] = i < V ? src[i] : pad;
	}
}

// block_argmax: the first index of the largest src[i] (NaN never wins; all
// NaN: 0). The common case takes one comparison per element; rows of only
// NaN and -Inf take a second pass.
__device__ int block_argmax(const float* src, int V, Smem& s) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	float bv = __int_as_float(0xff800000);
	int bi = -1;
	for (int base = 0; base < V; base += U * NT) {
		float v[U];
		load_strip(src, base, V, 0.f, v);
#pragma unroll
		for (int j = 0; j < U; j++) {
			int i = base + j * NT + (int)threadIdx.x;
			if (i < V && v[j] > bv) bv = v[j], bi = i;
		}
	}
	if (bi < 0) bv = __int_as_float(0x7fffffff), bi = IDMAX; // none above -Inf
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) { // every element NaN or -Inf
			bv = __int_as_float(0x7fffffff), bi = IDMAX;
			for (int i = threadIdx.x; i < V; i += NT)
				if (better(src[i], i, bv, bi)) bv = src[i], bi = i;
		}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(FULL, bv, o);
			int oi = __shfl_xor_sync(FULL, bi, o);
			if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
		}
		__syncthreads();
		if (lane == 0) s.rv[w] = bv, s.ri[w] = bi;
		__syncthreads();
		if (lane < NWARP) bv = s.rv[lane], bi = s.ri[lane];
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(FULL, bv, o);
			int oi = __shfl_xor_sync(FULL, bi, o);
			if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
		}
		if (bi != IDMAX) break;
	}
	return bi;
}

// hist_add adds weight w of element id to bin (NONE: nothing) of digit lv
// (unit: every weight is 1). The weights are kept as low and high words
// (32-bit shared atomics are native, 64-bit ones are not). The last digit
// also counts elements and keeps their smallest id. Every lane of the warp
// calls it; when all its admitted lanes share one bin (ties, many equal
// logits) the warp adds once, from its lowest admitted lane, which holds the
// smallest id (ids rise with the lane).
__device__ __forceinline__ void hist_add(unsigned bin, u64 w, unsigned id, bool unit, int lv) {
	unsigned* d = sample_dyn;
	int lane = threadIdx.x & 31;
	unsigned valid = __ballot_sync(FULL, bin != NONE);
	if (!valid) return;
	int l0 = __ffs(valid) - 1;
	unsigned b0 = __shfl_sync(FULL, bin, l0);
	bool one = __all_sync(FULL, bin == NONE || bin == b0);
	unsigned n = 1;
	if (one) {
		n = __popc(valid);
		w = unit ? n : warp_sum_u64(w);
		if (lane != l0) return;
	} else {
		if (bin == NONE) return;
		if (unit) w = 1;
	}
	int a = lv == 0 ? (int)bin * 32 + lane : (int)bin;
	int hi = lv == 0 ? D0 * 32 : HB;
	unsigned lo = (unsigned)w, old = atomicAdd(&d[a], lo);
	if (!unit) {
		unsigned h = (unsigned)(w >> 32) + (old + lo < old ? 1u : 0u);
		if (h) atomicAdd(&d[hi + a], h);
	}
	if (lv == 2) {
		atomicAdd(&d[2 * HB + bin], n);
		atomicMin(&d[3 * HB + bin], id);
	}
}

// hist_pass builds the histogram of digit lv (bits shift.., dmask) of the
// keys of the elements that f admits and whose higher bits (pmask) equal
// prefix. F: bool get(int i, unsigned& key, u64& weight); F::unit: the
// weights are all 1. After the first digit, h0 holds its bins' weights.
template <class F>
__device__ void hist_pass(const F& f, int V, unsigned prefix, unsigned pmask, int shift, unsigned dmask, int lv, Smem& s) {
	unsigned* d = sample_dyn;
	for (int a = threadIdx.x; a < DYN_WORDS; a += NT) d[a] = (lv > 0 && a >= 3 * HB) ? NONE : 0u;
	__syncthreads();
	for (int base = 0; base < V; base += U * NT) {
		unsigned bin[U];
		u64 w[U];
#pragma unroll
		for (int j = 0; j < U; j++) {
			int i = base + j * NT + (int)threadIdx.x;
			unsigned k = 0;
			u64 ww = 0;
			bool ok = i < V && f.get(i, k, ww);
			bin[j] = (ok && (k & pmask) == prefix) ? (k >> shift) & dmask : NONE;
			w[j] = bin[j] != NONE ? ww : 0;
		}
#pragma unroll
		for (int j = 0; j < U; j++) hist_add(bin[j], w[j], (unsigned)(base + j * NT + threadIdx.x), F::unit, lv);
	}
	__syncthreads();
	if (lv == 0) { // sum the copies: TPB threads per bin
		const int TPB = NT >= D0 ? NT / D0 : 1, CPT = 32 / TPB;
		int part = threadIdx.x % TPB;
		for (int g = threadIdx.x / TPB; g < D0; g += NT / TPB) {
			u64 t = 0;
			for (int c = part * CPT; c < (part + 1) * CPT; c++) t += ((u64)d[D0 * 32 + g * 32 + c] << 32) | d[g * 32 + c];
			for (int o = 1; o < TPB; o <<= 1) t += __shfl_xor_sync(FULL, t, o);
			if (part == 0) s.h0[g] = t;
		}
		__syncthreads();
	}
}

// binw is the weight of bin b of digit lv, after hist_pass.
__device__ __forceinline__ u64 binw(const Smem& s, int lv, int b) {
	return lv == 0 ? s.h0[b] : ((u64)sample_dyn[HB + b] << 32) | sample_dyn[b];
}

// Sel is a radix select's result: the key T with W(key > T) <= target <
// W(key >= T) (W: the summed weights), before = W(key > T), and the count,
// weight and smallest id of the elements with key T.
struct Sel {
	int found; // 0: target >= the total weight
	unsigned key, cnt, minid;
	u64 before, target, w;
};

// radix_select selects by the weights of f over the keys, largest first
// (three passes). frac: the target is floor(u · total weight).
template <class F>
__device__ Sel radix_select(const F& f, int V, bool frac, double u, u64 target, Smem& s) {
	Sel r;
	r.found = 0, r.key = 0, r.cnt = 0, r.minid = NONE, r.before = 0, r.target = target, r.w = 0;
	unsigned prefix = 0, pmask = 0;
	u64 before = 0;
	for (int lv = 0; lv < 3; lv++) {
		int shift = lv == 0 ? 24 : lv == 1 ? 12 : 0;
		unsigned dmask = lv == 0 ? 0xffu : 0xfffu;
		hist_pass(f, V, prefix, pmask, shift, dmask, lv, s);
		const int nb = lv == 0 ? D0 : HB, bpt = (nb + NT - 1) / NT; // bins per thread, in descending order
		u64 loc = 0;
		for (int q = 0; q < bpt; q++) {
			int qi = (int)threadIdx.x * bpt + q;
			if (qi < nb) loc += binw(s, lv, nb - 1 - qi);
		}
		u64 tot;
		u64 acc = block_excl_scan(loc, s, &tot);
		if (lv == 0) {
			if (frac) {
				if (tot == 0) return r;
				target = frac_target(u, tot);
			}
			if (target >= tot) return r;
		}
		u64 tg = target - before;
		for (int q = 0; q < bpt; q++) {
			int qi = (int)threadIdx.x * bpt + q;
			if (qi >= nb) break;
			unsigned b = nb - 1 - qi;
			u64 wb = binw(s, lv, b);
			if (tg >= acc && tg - acc < wb) s.b_bin = b, s.b_before = acc, s.b_w = wb;
			acc += wb;
		}
		__syncthreads();
		unsigned b = s.b_bin;
		before += s.b_before;
		prefix |= b << shift;
		pmask |= dmask << shift;
		if (lv == 2) r.cnt = sample_dyn[2 * HB + b], r.minid = sample_dyn[3 * HB + b], r.w = s.b_w;
		__syncthreads();
	}
	r.found = 1, r.key = prefix, r.before = before, r.target = target;
	return r;
}

// prefix_select finds in id order the element i with W(< i) <= target <
// W(<= i), or -1 (F: u64 weight(int i)). Each level sums NWARP segments
// (one per warp) and keeps the one holding the target, down to 128
// elements that one warp scans. frac: the target is floor(u · total).
template <class F>
__device__ int prefix_select(const F& f, int V, bool frac, double u, u64 target, Smem& s) {
	int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	int lo = 0, hi = V;
	u64 off = target;
	bool first = true;
	while (hi - lo > 128) {
		int seg = (hi - lo + NWARP - 1) / NWARP;
		int a = lo + wp * seg, e = imin(a + seg, hi);
		u64 sum = 0;
		for (int i = a + lane; i < e; i += 32 * U) {
			u64 w[U];
#pragma unroll
			for (int j = 0; j < U; j++) w[j] = i + 32 * j < e ? f.weight(i + 32 * j) : 0;
#pragma unroll
			for (int j = 0; j < U; j++) sum += w[j];
		}
		sum = warp_sum_u64(sum);
		__syncthreads();
		if (lane == 0) s.ru[wp] = sum;
		__syncthreads();
		if (threadIdx.x == 0) {
			u64 o = off;
			if (first && frac) {
				u64 tot = 0;
				for (int k = 0; k < NWARP; k++) tot += s.ru[k];
				o = tot ? frac_target(u, tot) : ~0ull;
			}
			int found = -1;
			u64 acc = 0;
			for (int k = 0; k < NWARP; k++) {
				if (o >= acc && o - acc < s.ru[k]) {
					found = k;
					break;
				}
				acc += s.ru[k];
			}
			s.b_found = found;
			s.b_off = o - acc;
		}
		__syncthreads();
		int found = s.b_found;
		if (found < 0) return -1;
		off = s.b_off;
		lo += found * seg;
		hi = imin(lo + seg, hi);
		first = false;
	}
	if (wp == 0) {
		u64 o = off;
		if (first && frac) {
			u64 sum = 0;
			for (int i = lo + lane; i < hi; i += 32) sum += f.weight(i);
			sum = warp_sum_u64(sum);
			o = sum ? frac_target(u, sum) : ~0ull;
		}
		int res = -1;
		u64 run = 0;
		for (int c = lo; c < hi; c += 32) {
			int i = c + lane;
			u64 w = i < hi ? f.weight(i) : 0;
			u64 inc = warp_incl_scan_u64(w, lane);
			u64 bef = run + inc - w;
			unsigned hit = __ballot_sync(FULL, o >= bef && o - bef < w);
			if (hit) {
				res = c + __ffs(hit) - 1;
				break;
			}
			run += __shfl_sync(FULL, inc, 31);
		}
		if (lane == 0) s.b_id = res;
	}
	__syncthreads();
	int id = s.b_id;
	__syncthreads();
	return id;
}

// seq_select finds the position r < n with W(< r) <= target < W(<= r) for
// weights f(r) (F: u64 operator()(int r)), or -1. frac: the target is
// floor(u · total).
template <class F>
__device__ int seq_select(const F& f, int n, bool frac, double u, u64 target, Smem& s) {
	int per = (n + NT - 1) / NT, a = (int)threadIdx.x * per, e = imin(a + per, n);
	u64 loc = 0;
	for (int r = a; r < e; r++) loc += f(r);
	u64 tot;
	u64 ex = block_excl_scan(loc, s, &tot);
	if (frac) {
		if (tot == 0) return -1;
		target = frac_target(u, tot);
	}
	if (target >= tot) return -1;
	for (int r = a; r < e; r++) {
		u64 w = f(r);
		if (target >= ex && target - ex < w) s.b_id = r;
		ex += w;
	}
	__syncthreads();
	int r = s.b_id;
	__syncthreads();
	return r;
}

// The compact path's arrays in the dynamic shared memory (KC each): the
// gathered survivors (key, id, x), the survivors sorted by (x desc, id asc)
// (x, id, p), and the candidate order (positions in the sorted arrays).
#define C_KEY 0
#define C_ID (KC)
#define C_X (2 * KC)
#define S_X (3 * KC)
#define S_ID (4 * KC)
#define S_P (5 * KC)
#define ORD (6 * KC)

struct CandW { // the draw's weights in candidate order
	const unsigned* d;
	int keep;  // top-p: the first keep candidates
	float cut; // min-p
	__device__ u64 operator()(int r) const {
		if (r >= keep) return 0;
		float p = __uint_as_float(d[S_P + d[ORD + r]]);
		return p >= cut ? fix(p) : 0;
	}
};

struct CandAll { // top-p: every survivor's mass in candidate order
	const unsigned* d;
	__device__ u64 operator()(int r) const { return fix(__uint_as_float(d[S_P + d[ORD + r]])); }
};

// sample_compact finishes a row whose top-k survivors (x key > tk_key, or ==
// and id <= tk_id) number at most KC: it gathers them, sorts them as the CPU
// does, and runs softmax, top-p, min-p and the draw in shared memory.
__device__ int sample_compact(const float* src, float scl, int V, unsigned tk_key, int tk_id, const RowParams& P, Smem& s) {
	unsigned* d = sample_dyn;
	const int lane = threadIdx.x & 31;
	if (threadIdx.x == 0) s.cnt = 0;
	__syncthreads();
	for (int base = 0; base < V; base += U * NT) {
		float v[U];
		load_strip(src, base, V, 0.f, v);
#pragma unroll
		for (int j = 0; j < U; j++) {
			int i = base + j * NT + (int)threadIdx.x;
			float x = __fmul_rn(v[j], scl);
			unsigned k = xkey(x);
			bool in = i < V && (k > tk_key || (k == tk_key && i <= tk_id));
			unsigned m = __ballot_sync(FULL, in);
			if (m) {
				int l0 = __ffs(m) - 1, pos = 0;
				if (lane == l0) pos = atomicAdd(&s.cnt, __popc(m));
				pos = __shfl_sync(FULL, pos, l0) + __popc(m & ((1u << lane) - 1));
				if (in && pos < KC) d[C_KEY + pos] = k, d[C_ID + pos] = (unsigned)i, d[C_X + pos] = __float_as_uint(x);
			}
		}
	}
	__syncthreads();
	const int n = imin(s.cnt, KC);
	if (n == 0) return -1;
	// Sort by (x desc, id asc): each survivor's rank.
	for (int t = threadIdx.x; t < n; t += NT) {
		unsigned k = d[C_KEY + t], id = d[C_ID + t];
		int r = 0;
		for (int j = 0; j < n; j++) {
			unsigned kj = d[C_KEY + j];
			r += kj > k || (kj == k && d[C_ID + j] < id);
		}
		d[S_X + r] = d[C_X + t], d[S_ID + r] = id;
	}
	__syncthreads();
	// Softmax in that order.
	const float vmax = __uint_as_float(d[S_X]);
	double sum = 0;
	for (int t = threadIdx.x; t < n; t += NT) sum += exp((double)__fsub_rn(__uint_as_float(d[S_X + t]), vmax));
	sum = block_sum_d(sum, s);
	float maxp = 0.f;
	for (int t = threadIdx.x; t < n; t += NT) {
		float e = (float)exp((double)__fsub_rn(__uint_as_float(d[S_X + t]), vmax));
		float p = (float)__ddiv_rn((double)e, sum);
		d[S_P + t] = __float_as_uint(p);
		maxp = fmaxf(maxp, p);
	}
	maxp = block_max_f(maxp, s); // its barriers publish S_P
	// Candidate order: (p desc, id asc) after top-p, else the sorted order.
	int keep = n;
	if (P.flags & TOPP) {
		for (int t = threadIdx.x; t < n; t += NT) {
			unsigned k = d[S_P + t], id = d[S_ID + t];
			int r = 0;
			for (int j = 0; j < n; j++) {
				unsigned kj = d[S_P + j];
				r += kj > k || (kj == k && d[S_ID + j] < id);
			}
			d[ORD + r] = t;
		}
		__syncthreads();
		u64 tp = (u64)(P.top_p * 1152921504606846976.0);
		if (tp == 0) tp = 1;
		CandAll f = {d};
		int c = seq_select(f, n, false, 0.0, tp - 1, s); // the first candidate whose cumulative mass reaches top_p
		if (c >= 0) keep = c + 1;
	} else {
		for (int t = threadIdx.x; t < n; t += NT) d[ORD + t] = t;
		__syncthreads();
	}
	CandW f = {d, keep, P.min_p > 0.f ? __fmul_rn(P.min_p, maxp) : 0.f};
	int r = seq_select(f, n, true, P.u, 0, s);
	return (int)d[S_ID + d[ORD + (r >= 0 ? r : 0)]];
}

// ---------------------------------------------------------------- views

// x = src[i]·scl: the logits times 1/temperature, or the patched scratch row
// times 1.
struct XCount { // top-k: every token, weight 1, keyed by x
	static const bool unit = true;
	const float* src;
	float scl;
	__device__ bool get(int i, unsigned& k, u64& w) const {
		k = xkey(__fmul_rn(src[i], scl));
		w = 1;
		return true;
	}
};

struct XTie { // tokens with x key `key`, in id order
	const float* src;
	float scl;
	unsigned key;
	__device__ u64 weight(int i) const { return xkey(__fmul_rn(src[i], scl)) == key; }
};

struct PMass { // top-p: top-k survivors, by mass, keyed by p
	static const bool unit = false;
	const float* ps;
	__device__ bool get(int i, unsigned& k, u64& w) const {
		float p = ps[i];
		if (!(p >= 0.f)) return false;
		k = __float_as_uint(p);
		w = fix(p);
		return true;
	}
};

struct PTie { // top-k survivors with p key `key`
	const float* ps;
	unsigned key;
	__device__ u64 weight(int i) const {
		float p = ps[i];
		return p >= 0.f && __float_as_uint(p) == key;
	}
};

// Cand: the final candidates (top-k, top-p, min-p).
struct Cand {
	const float* ps;
	unsigned tp_key; // top-p: p > tp_key, or p == tp_key and id <= tp_id
	int tp_id;
	float cut; // min-p
	__device__ bool in(int i, float p) const {
		if (!(p >= 0.f) || !(p >= cut)) return false;
		unsigned k = __float_as_uint(p);
		return k > tp_key || (k == tp_key && i <= tp_id);
	}
};

struct DrawP { // order (p desc, id asc)
	static const bool unit = false;
	Cand c;
	__device__ bool get(int i, unsigned& k, u64& w) const {
		float p = c.ps[i];
		if (!c.in(i, p)) return false;
		k = __float_as_uint(p);
		w = fix(p);
		return true;
	}
};

struct DrawPTie {
	Cand c;
	unsigned key;
	__device__ u64 weight(int i) const {
		float p = c.ps[i];
		return c.in(i, p) && __float_as_uint(p) == key;
	}
};

struct DrawX { // order (x desc, id asc)
	static const bool unit = false;
	Cand c;
	const float* src;
	float scl;
	__device__ bool get(int i, unsigned& k, u64& w) const {
		float p = c.ps[i];
		if (!c.in(i, p)) return false;
		k = xkey(__fmul_rn(src[i], scl));
		w = fix(p);
		return true;
	}
};

struct DrawXTie {
	Cand c;
	const float* src;
	float scl;
	unsigned key;
	__device__ u64 weight(int i) const {
		float p = c.ps[i];
		return c.in(i, p) && xkey(__fmul_rn(src[i], scl)) == key;
	}
};

struct DrawId { // id order
	Cand c;
	__device__ u64 weight(int i) const {
		float p = c.ps[i];
		return c.in(i, p) ? fix(p) : 0;
	}
};

// ---------------------------------------------------------------- kernel

// grid (rows), block NT. logits [rows, V] (not modified); params [rows];
// hist: int32 triples (id, count, seen); xs [rows, V] scratch for rows with
// PENALTY (may be null otherwise); ps [rows, V] scratch; out int32 [rows].
extern "C" __global__ void __launch_bounds__(NT, 1)
sample_rows(const float* logits, int V, const RowParams* params, const int* hist, float* xs, float* ps, int* out) {
	__shared__ Smem s;
	const int row = blockIdx.x;
	const RowParams P = params[row];
	const float* L = logits + (long long)row * V;
	const bool greedy = P.flags & GREEDY;
	const float inv = greedy ? 1.f : P.inv_temp;
	const float* src = L;
	float scl = inv;
	if ((P.flags & PENALTY) && P.hist_len > 0 && xs) {
		float* X = xs + (long long)row * V;
		for (int base = 0; base < V; base += U * NT) {
			float v[U];
			load_strip(L, base, V, 0.f, v);
#pragma unroll
			for (int j = 0; j < U; j++) {
				int i = base + j * NT + (int)threadIdx.x;
				if (i < V) X[i] = __fmul_rn(v[j], inv);
			}
		}
		__syncthreads();
		const int* h = hist + 3LL * P.hist_off;
		for (int e = threadIdx.x; e < P.hist_len; e += NT) {
			int id = h[3 * e], n = h[3 * e + 1], seen = h[3 * e + 2]; // seen: 1 seen, 2 banned
			if (id < 0 || id >= V) continue;
			if (seen & 2) {
				X[id] = __int_as_float(0xff800000); // -inf
				continue;
			}
			float l = L[id];
			if (P.rep != 0.f && P.rep != 1.f && (seen & 1)) l = l > 0.f ? __fdiv_rn(l, P.rep) : __fmul_rn(l, P.rep);
			if (n > 0) l = __fsub_rn(l, __fadd_rn(__fmul_rn(P.freq, (float)n), P.pres));
			X[id] = __fmul_rn(l, inv);
		}
		__syncthreads();
		src = X;
		scl = 1.f;
	}
	const bool compact = !greedy && (P.flags & TOPK) && P.top_k <= KC;
	float vmax = 0.f; // the largest x (x = src·scl keeps the order)
	int best = 0;
	if (!compact) {
		best = block_argmax(src, V, s);
		vmax = __fmul_rn(src[best], scl);
	}
	if (greedy) {
		if (threadIdx.x == 0) out[row] = best;
		return;
	}
	float* Pr = ps + (long long)row * V;

	// top-k: survivors have x key > tk_key, or == tk_key and id <= tk_id.
	unsigned tk_key = 0;
	int tk_id = IDMAX;
	if (P.flags & TOPK) {
		XCount f = {src, scl};
		Sel r = radix_select(f, V, false, 0.0, (u64)(P.top_k - 1), s);
		if (r.found) {
			tk_key = r.key;
			u64 need = (u64)P.top_k - r.before; // 1..cnt
			if (need >= r.cnt) tk_id = IDMAX;
			else if (need == 1) tk_id = (int)r.minid;
			else {
				XTie t = {src, scl, r.key};
				tk_id = prefix_select(t, V, false, 0.0, need - 1, s);
			}
		}
	}
	if (compact) {
		int id = sample_compact(src, scl, V, tk_key, tk_id, P, s);
		if (threadIdx.x == 0) out[row] = id >= 0 && id < V ? id : 0;
		return;
	}

	// Softmax over the survivors: the exponentials, then the probabilities.
	double sum = 0;
	for (int base = 0; base < V; base += U * NT) {
		float v[U];
		load_strip(src, base, V, 0.f, v);
#pragma unroll
		for (int j = 0; j < U; j++) {
			int i = base + j * NT + (int)threadIdx.x;
			float x = __fmul_rn(v[j], scl);
			unsigned k = xkey(x);
			float e = -1.f;
			if (i < V && (k > tk_key || (k == tk_key && i <= tk_id))) {
				double ed = exp((double)__fsub_rn(x, vmax));
				sum += ed;
				e = (float)ed;
			}
			if (i < V) Pr[i] = e;
		}
	}
	sum = block_sum_d(sum, s);
	float maxp = 0.f;
	for (int base = 0; base < V; base += U * NT) {
		float v[U];
		load_strip(Pr, base, V, -1.f, v);
#pragma unroll
		for (int j = 0; j < U; j++) {
			int i = base + j * NT + (int)threadIdx.x;
			if (v[j] >= 0.f) {
				float p = (float)__ddiv_rn((double)v[j], sum);
				Pr[i] = p;
				maxp = fmaxf(maxp, p);
			}
		}
	}
	maxp = block_max_f(maxp, s); // its barriers also publish Pr

	// top-p: the cut is the token j with W(before j) < top_p <= W(through j).
	Cand c = {Pr, 0u, IDMAX, 0.f};
	if (P.flags & TOPP) {
		u64 tp = (u64)(P.top_p * 1152921504606846976.0);
		if (tp == 0) tp = 1;
		PMass f = {Pr};
		Sel r = radix_select(f, V, false, 0.0, tp - 1, s);
		if (r.found) {
			c.tp_key = r.key;
			u64 n = (r.target - r.before) / (r.w / r.cnt); // the cut's rank among the ties
			if (n + 1 >= r.cnt) c.tp_id = IDMAX;
			else if (n == 0) c.tp_id = (int)r.minid;
			else {
				PTie t = {Pr, r.key};
				c.tp_id = prefix_select(t, V, false, 0.0, n, s);
			}
		}
	}
	if (P.min_p > 0.f) c.cut = __fmul_rn(P.min_p, maxp);

	// The draw.
	int id = -1;
	if (P.flags & (TOPK | TOPP)) {
		Sel r;
		if (P.flags & TOPP) {
			DrawP f = {c};
			r = radix_select(f, V, true, P.u, 0, s);
		} else {
			DrawX f = {c, src, scl};
			r = radix_select(f, V, true, P.u, 0, s);
		}
		if (r.found) {
			u64 n = (r.target - r.before) / (r.w / r.cnt);
			if (n == 0 || r.cnt == 1) id = (int)r.minid;
			else if (P.flags & TOPP) {
				DrawPTie t = {c, r.key};
				id = prefix_select(t, V, false, 0.0, n, s);
			} else {
				DrawXTie t = {c, src, scl, r.key};
				id = prefix_select(t, V, false, 0.0, n, s);
			}
		}
	} else {
		DrawId f = {c};
		id = prefix_select(f, V, true, P.u, 0, s);
	}
	if (id < 0 || id >= V) id = best; // no mass left (NaN or infinite logits)
	if (threadIdx.x == 0) out[row] = id;
}
