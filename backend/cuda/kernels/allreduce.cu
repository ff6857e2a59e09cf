// kiln CUDA kernels: the one-shot all-reduce of a tensor-parallel group over
// peer memory (NVLink). Appended after moe.cu by kernels.go (one NVRTC
// source; part 0).
//
// One process drives every GPU of the group and has enabled peer access
// between them, so a kernel on one device stores straight into memory
// allocated on another. Each rank has a region on its own device (its
// pointer, as every rank's, is a kernel parameter, r0…r7):
//
//   flags[AR_SLOTS][AR_MAX_RANKS] u32   written by the peers: flags[b][q] is
//                                       the last call whose data rank q's
//                                       block b has stored here
//   ctr, done (u32)                     the calls this rank has made, and
//                                       the blocks of the current call that
//                                       have finished
//   diag (u32 × 8)                      tests: ar_stuck's record
//   buffers from AR_HDR:                [2 parities][ranks][cap bytes]:
//                                       rank q's partial sums stored here
//   Lamport buffers after them:         [2 parities][ranks][cap bytes],
//                                       every word LP_EMPTY when unused
//                                       (the Lamport form, below)
//
// A call of the flag form (epoch e = ctr + 1, the same on every rank, as
// every rank makes the same calls in the same order): each block pushes its
// share of the rank's partial sums into every peer's buffer of parity
// e % 2 and source rank,
// then, after a system-scope fence and a barrier, releases flag e into each
// peer's flags[b][rank] (st.release.sys); it waits until its own
// flags[b][q] reach e for every peer q (ld.acquire.sys), and sums the
// ranks' partials in rank order in float32, so that every rank computes the
// same bits. The last block to finish moves ctr on.
//
// Why a buffer is never overwritten while it is read: rank i writes parity
// p's buffers at calls e and e + 2. Before call e + 2 it finished call
// e + 1, so one of its blocks saw rank j's flag e + 1, which rank j stores
// only inside its call e + 1, once its call e (and its reads of parity p)
// ended: kernels of a stream run in order, and each waits for the previous
// one (griddepcontrol.wait) before touching memory. This holds whatever
// blocks a call has, so the grid follows the size, and the vectors a block
// takes differ from call to call. A peer that never arrives (its launch
// failed) makes the waiting kernel trap after AR_TIMEOUT_NS: the step fails
// with a launch error instead of hanging.

#if KILN_PART_IS(0)

#define AR_MAX_RANKS 8
#define AR_SLOTS 64     // the most blocks of a call (kernels.PeerSlots)
#define AR_THREADS 256  // threads of a block
#define AR_HDR 4096     // bytes of a region's header
#define AR_TIMEOUT_NS 20000000000ull

#define AR_REGION_PARAMS                                                                                 \
	unsigned char *r0, unsigned char *r1, unsigned char *r2, unsigned char *r3, unsigned char *r4,       \
	    unsigned char *r5, unsigned char *r6, unsigned char *r7
#define AR_REGION_ARGS r0, r1, r2, r3, r4, r5, r6, r7

struct ar_regions {
	unsigned char* p[AR_MAX_RANKS];
};
__device__ __forceinline__ ar_regions ar_pack(AR_REGION_PARAMS) {
	ar_regions r;
	r.p[0] = r0, r.p[1] = r1, r.p[2] = r2, r.p[3] = r3, r.p[4] = r4, r.p[5] = r5, r.p[6] = r6, r.p[7] = r7;
	return r;
}
// ar_region is rank q's region, chosen by comparisons rather than by
// indexing p: an index known only at run time (this rank, a thread's peer,
// a vector's owner) puts all eight pointers in local memory (clang's PTX
// had a 192-byte depot in every peer kernel, session 41).
__device__ __forceinline__ unsigned char* ar_region(const ar_regions& rg, int q) {
	unsigned char* p = rg.p[0];
#pragma unroll
	for (int i = 1; i < AR_MAX_RANKS; i++) p = q == i ? rg.p[i] : p;
	return p;
}

// ---- The PTX the kernels below use, each in a helper of its own
// (testdata/emu/peer_prelude.h has their host forms for
// TestPeerKernelsEmulated).
__device__ __forceinline__ void ar_st_release(unsigned* p, unsigned v) {
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ar_ld_acquire(const unsigned* p) {
	unsigned v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}
// ar_ld_cg loads 16 bytes at p past the L1 (ld.global.cg).
__device__ __forceinline__ uint4 ar_ld_cg(const void* p) {
	uint4 v;
	asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
	return v;
}
__device__ __forceinline__ unsigned long long ar_now() {
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
// ar_ld_volatile loads 16 bytes at p from memory every time (no cache of
// an earlier load).
__device__ __forceinline__ uint4 ar_ld_volatile(const void* p) {
	uint4 v;
	asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
	return v;
}
// ar_fence_sys orders this thread's stores before its later ones for
// every device (__threadfence_system).
__device__ __forceinline__ void ar_fence_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }
__device__ __forceinline__ void ar_trap() { asm volatile("trap;"); }
// ---- end of the PTX

// ar_call is what a call's kernel works from: every rank's region, this
// rank's own, the call's epoch, and the grid-stride loops' first vector
// and stride (vector v is thread v % stride's in every loop of the call).
struct ar_call {
	ar_regions rg;
	unsigned char* own;
	unsigned e;
	long long v0, stride;
};

// ar_start begins a call of rank: waits for the previous kernel
// (pdl_enter), then reads the epoch (one thread; every thread of the
// block gets it).
__device__ __forceinline__ ar_call ar_start(int rank, AR_REGION_PARAMS) {
	__shared__ unsigned sh;
	ar_call c;
	c.rg = ar_pack(AR_REGION_ARGS);
	c.own = ar_region(c.rg, rank);
	pdl_enter();
	if (threadIdx.x == 0) sh = *(volatile unsigned*)(c.own + 4 * AR_SLOTS * AR_MAX_RANKS) + 1;
	__syncthreads();
	c.e = sh;
	c.v0 = (long long)blockIdx.x * AR_THREADS + threadIdx.x;
	c.stride = (long long)gridDim.x * AR_THREADS;
	return c;
}

// ar_stuck: a peer's flag has not come for AR_TIMEOUT_NS (its launch
// failed, or the ranks' calls differ). The kernel traps, failing the step,
// unless the region's word at AR_DIAG is set (tests): then it records the
// call, the flag it saw, its block and the peer at AR_DIAG + 4… and goes
// on (its sums are then wrong).
#define AR_DIAG (4 * AR_SLOTS * AR_MAX_RANKS + 8)
// AR_ARRIVE: the blocks of the rank's call that reached ar_rank_sync (the
// call's last block sets it back to 0, ar_end).
#define AR_ARRIVE (AR_DIAG + 32)
__device__ void ar_stuck(unsigned char* own, unsigned e, unsigned seen, int q) {
	unsigned* d = (unsigned*)(own + AR_DIAG);
	if (*(volatile unsigned*)d == 0) ar_trap();
	if (atomicAdd(d + 1, 1u) == 0) {
		d[2] = e, d[3] = seen, d[4] = blockIdx.x, d[5] = q, d[6] = *(volatile unsigned*)(own + 4 * AR_SLOTS * AR_MAX_RANKS);
	}
}

// ar_exchange: after the block's pushes, releases epoch e to every peer's
// flag of this block and waits for every peer's flag of this block here.
// Each thread fences its own pushes at system scope first, so that every
// store over NVLink is performed before the barrier and the flag, rather
// than leaning on one thread's release being cumulative, through a block
// barrier, for the other threads' stores to another device.
__device__ __forceinline__ void ar_exchange(const ar_regions& rg, int rank, int ranks, unsigned e) {
	ar_fence_sys();
	__syncthreads();
	int q = threadIdx.x;
	if (q < ranks && q != rank) {
		unsigned* theirs = (unsigned*)ar_region(rg, q) + blockIdx.x * AR_MAX_RANKS + rank;
		ar_st_release(theirs, e);
		const unsigned* mine = (const unsigned*)ar_region(rg, rank) + blockIdx.x * AR_MAX_RANKS + q;
		unsigned long long t0 = ar_now();
		unsigned seen;
		while ((int)((seen = ar_ld_acquire(mine)) - e) < 0) {
			if (ar_now() - t0 > AR_TIMEOUT_NS) {
				ar_stuck(ar_region(rg, rank), e, seen, q);
				break;
			}
		}
	}
	__syncthreads();
}

// ar_end: the last block of the call to finish moves the rank's call count
// on (each block read it at its start).
__device__ __forceinline__ void ar_end(unsigned char* own, unsigned e) {
	if (threadIdx.x != 0) return;
	unsigned* ctr = (unsigned*)(own + 4 * AR_SLOTS * AR_MAX_RANKS);
	__threadfence();
	if (atomicAdd(ctr + 1, 1u) == gridDim.x - 1) {
		ctr[1] = 0;
		*(unsigned*)(own + AR_ARRIVE) = 0;
		*(volatile unsigned*)ctr = e;
	}
}

// ar_buf: rank q's buffer of parity e % 2 in region reg.
__device__ __forceinline__ unsigned char* ar_buf(unsigned char* reg, unsigned e, int q, int ranks, long long cap) {
	return reg + AR_HDR + ((long long)(e & 1) * ranks + q) * cap;
}

// ar_sum_ranks16 is the sum over the ranks, in rank order in float32, of
// the 16-byte vectors of E that get(q) returns for each rank q, into f.
template <typename E, class G> __device__ __forceinline__ void ar_sum_ranks16(float* f, int ranks, G get) {
	constexpr int N = 16 / sizeof(E);
#pragma unroll
	for (int i = 0; i < N; i++) f[i] = 0.f;
#pragma unroll
	for (int q = 0; q < AR_MAX_RANKS; q++) {
		if (q >= ranks) break;
		float g[N];
		unpack16(get(q), g, (const E*)0);
#pragma unroll
		for (int i = 0; i < N; i++) f[i] += g[i];
	}
}

// ar_sum16: the sum over the ranks of 16-byte vector v of the partials
// (rank's own from src, the others' from its buffers here, read past the
// L1, which may hold an older call's lines), into f.
template <typename E>
__device__ __forceinline__ void ar_sum16(float* f, const E* src, long long v, unsigned char* own, unsigned e, int rank,
                                         int ranks, long long cap) {
	ar_sum_ranks16<E>(f, ranks, [&](int q) {
		return q == rank ? ((const uint4*)src)[v] : ar_ld_cg((const uint4*)ar_buf(own, e, q, ranks, cap) + v);
	});
}


// peer_allreduce_<E>: dst = the sum over the ranks of src, nv 16-byte
// vectors (16-byte aligned; dst may be src; nv·16 ≤ cap). Grid up to
// AR_SLOTS blocks of AR_THREADS: block b takes vectors b·AR_THREADS + t +
// k·gridDim·AR_THREADS.
template <typename E>
__device__ void peer_allreduce_impl(const E* src, E* dst, long long nv, int rank, int ranks, long long cap,
                                    AR_REGION_PARAMS) {
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	for (long long v = c.v0; v < nv; v += c.stride) {
		uint4 w = ((const uint4*)src)[v];
#pragma unroll
		for (int q = 0; q < AR_MAX_RANKS; q++) {
			if (q >= ranks) break;
			if (q != rank) ((uint4*)ar_buf(ar_region(c.rg, q), c.e, rank, ranks, cap))[v] = w;
		}
	}
	ar_exchange(c.rg, rank, ranks, c.e);
	for (long long v = c.v0; v < nv; v += c.stride) {
		float f[16 / sizeof(E)];
		ar_sum16<E>(f, src, v, c.own, c.e, rank, ranks, cap);
		((uint4*)dst)[v] = pack16(f, (const E*)0);
	}
	ar_end(c.own, c.e);
}

// The Lamport form (TensorRT-LLM's name for it): no flags and no fences.
// A call's buffers (parity e % 2) hold LP_EMPTY in every 32-bit word until a
// peer's data lands there; a rank pushes its partials into every peer's
// buffer of its own rank, then reads its own buffers, each 16-byte vector
// again until none of its elements is empty (the data is its own flag: an
// element is stored whole, and the reader looks at each), and writes
// LP_EMPTY back over what it read. An empty element is -0 in 16-bit
// dtypes (each half of LP_EMPTY), the word LP_EMPTY itself in f32 (a
// negative subnormal): a partial's such element is pushed, and summed by
// its own rank, as -0 → +0 (f16, bf16) or → -0 (f32), so that every rank
// still sums the same values (in f32 the sum then takes -0 for that
// subnormal).
//
// Why a buffer is empty again before it is written: rank j writes rank i's
// buffer of parity e % 2 at calls e and e + 2. Its call e + 2 follows its
// call e + 1, which read rank i's data of call e + 1; rank i stores that
// only inside its call e + 1, after its call e, in which it emptied the
// buffer, had ended (each of its kernels waits for the one before). A
// call of the flag form in between counts as a call (the epoch is the same
// counter), and its data arriving shows the same order. The parity, not
// e % 3, also survives the counter's wrap past 2³² (2³² is even).
#define LP_EMPTY 0x80008000u

// lp_buf: rank q's Lamport buffer of parity e % 2 in region reg, past the
// flag form's (ar_buf's) two parities.
__device__ __forceinline__ unsigned char* lp_buf(unsigned char* reg, unsigned e, int q, int ranks, long long cap) {
	return ar_buf(reg, e, q, ranks, cap) + 2ll * ranks * cap;
}
template <typename E> __device__ __forceinline__ bool lp_empty(unsigned w) {
	if (sizeof(E) == 4) return w == LP_EMPTY;
	return (w & 0xffffu) == 0x8000u || (w >> 16) == 0x8000u;
}
template <typename E> __device__ __forceinline__ unsigned lp_canon(unsigned w) {
	if (sizeof(E) == 4) return w == LP_EMPTY ? 0x80000000u : w;
	if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
	if ((w >> 16) == 0x8000u) w &= 0xffffu;
	return w;
}
template <typename E> __device__ __forceinline__ bool lp_empty16(uint4 v) {
	return lp_empty<E>(v.x) || lp_empty<E>(v.y) || lp_empty<E>(v.z) || lp_empty<E>(v.w);
}
template <typename E> __device__ __forceinline__ uint4 lp_canon16(uint4 v) {
	v.x = lp_canon<E>(v.x), v.y = lp_canon<E>(v.y), v.z = lp_canon<E>(v.z), v.w = lp_canon<E>(v.w);
	return v;
}

// lp_push stores vector w (canonical) at byte off of this rank's buffer in
// every peer's region.
__device__ __forceinline__ void lp_push(const ar_regions& rg, unsigned e, int rank, int ranks, long long cap, long long off,
                                        uint4 w) {
#pragma unroll
	for (int q = 0; q < AR_MAX_RANKS; q++) {
		if (q >= ranks) break;
		if (q != rank) *(uint4*)(lp_buf(ar_region(rg, q), e, rank, ranks, cap) + off) = w;
	}
}

// lp_ready is w, loaded from p (rank q's vector in a buffer here), once
// none of its elements is empty: until then it loads p again. It empties
// p. (A peer that never comes: ar_stuck, after AR_TIMEOUT_NS.)
template <typename E>
__device__ __forceinline__ uint4 lp_ready(uint4 w, uint4* p, unsigned char* own, unsigned e, int q) {
	if (lp_empty16<E>(w)) {
		const unsigned long long t0 = ar_now();
		do {
			if (ar_now() - t0 > AR_TIMEOUT_NS) {
				ar_stuck(own, e, 0, q);
				break;
			}
			w = ar_ld_volatile(p);
		} while (lp_empty16<E>(w));
	}
	uint4 empty;
	empty.x = empty.y = empty.z = empty.w = LP_EMPTY;
	*p = empty;
	return w;
}

// lp_take waits for rank q's vector at byte off of its buffer here, empties
// it, and returns it (a peer that never comes: ar_stuck, after
// AR_TIMEOUT_NS; in the tests that record it instead of trapping, a late
// peer's vector is then left in the buffer, and the region's later calls
// are not to be trusted).
template <typename E>
__device__ __forceinline__ uint4 lp_take(unsigned char* own, unsigned e, int q, int ranks, long long cap, long long off) {
	uint4* p = (uint4*)(lp_buf(own, e, q, ranks, cap) + off);
	return lp_ready<E>(ar_ld_volatile(p), p, own, e, q);
}

// lp_sum16 is the sum over the ranks of a 16-byte vector at byte off:
// mine (this rank's, canonical) and the peers' from their buffers here.
template <typename E>
__device__ __forceinline__ void lp_sum16(float* f, uint4 mine, unsigned char* own, unsigned e, int rank, int ranks,
                                         long long cap, long long off) {
	ar_sum_ranks16<E>(f, ranks, [&](int q) { return q == rank ? mine : lp_take<E>(own, e, q, ranks, cap, off); });
}

// peer_lamport_<E>: peer_allreduce_<E>'s sums in the Lamport form. Any
// grid of AR_THREADS-thread blocks: vector v is thread v % (grid·threads)'s
// in both loops (dst may be src).
template <typename E>
__device__ void peer_lamport_impl(const E* src, E* dst, long long nv, int rank, int ranks, long long cap, AR_REGION_PARAMS) {
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	for (long long v = c.v0; v < nv; v += c.stride)
		lp_push(c.rg, c.e, rank, ranks, cap, v * 16, lp_canon16<E>(((const uint4*)src)[v]));
	for (long long v = c.v0; v < nv; v += c.stride) {
		float f[16 / sizeof(E)];
		lp_sum16<E>(f, lp_canon16<E>(((const uint4*)src)[v]), c.own, c.e, rank, ranks, cap, v * 16);
		((uint4*)dst)[v] = pack16(f, (const E*)0);
	}
	ar_end(c.own, c.e);
}

// The two-shot Lamport form (peer_lamport2_<E>), for groups of more than
// two ranks and sums past kernels.PeerOneShotBytes: the one-shot form
// pushes a rank's whole partials to each of the n-1 others, this one
// 2(n-1)/n of them, as NCCL's ring does, in one kernel. The vectors fall
// in n chunks of cv = ⌈nv/n⌉ (every chunk holds some: the caller passes
// nv ≥ n²), chunk q rank q's to sum:
//   1. a rank pushes its partials of each other rank q's chunk into rank
//      q's buffer of the pushing rank (lp_buf), at the vector's offset;
//   2. it sums its own chunk, its partials and the peers' (taken from its
//      buffers, emptied), in rank order in float32 as the one-shot form,
//      rounds the sum to E, canonical (-0 → +0, so that it is never
//      empty), stores it in dst and pushes it into every peer's buffer of
//      its own rank at the same offsets: those of its own chunk, which no
//      peer's step 1 wrote there;
//   3. it takes every other chunk's sums from its buffers of their owners.
// Every word a call stores is emptied by the same call, and in every call
// each rank reads data of every other rank's same call (step 2 takes
// their partials, step 3 their sums), so the one-shot form's reasoning
// for the parities holds for both forms' calls in any order. Vector v is
// thread v % (grid·threads)'s in steps 1 and 3, which read and write it
// (dst may be src); step 2's vectors, its own chunk's, are no other
// step's. Loads are issued LP2_UNROLL vectors (steps 1, 3: ar_stream) or
// all ranks (step 2) at a time before any is used, to keep many in flight.
#define LP2_UNROLL 4
// ar_stream runs put(v, load(v)) for each vector v < n of this thread (v %
// (grid·threads) its own, as in every loop of a call), LP2_UNROLL at a
// time: their loads first, so that they are in flight together, then the
// puts.
template <class L, class P>
__device__ __forceinline__ void ar_stream(const ar_call& c, long long n, L load, P put) {
	for (long long v0 = c.v0; v0 < n; v0 += LP2_UNROLL * c.stride) {
		uint4 w[LP2_UNROLL];
#pragma unroll
		for (int u = 0; u < LP2_UNROLL; u++) {
			const long long v = v0 + u * c.stride;
			if (v < n) w[u] = load(v);
		}
#pragma unroll
		for (int u = 0; u < LP2_UNROLL; u++) {
			const long long v = v0 + u * c.stride;
			if (v < n) put(v, w[u]);
		}
	}
}
__device__ __forceinline__ uint4 ar_zero16() {
	uint4 v;
	v.x = v.y = v.z = v.w = 0;
	return v;
}
// lp2_sum16 is step 2's sum over the ranks of vector v of this rank's
// chunk: mine (this rank's partial, canonical) and the peers' from its
// buffers (their loads issued together, then each waited for and
// emptied), in rank order in float32, into f.
template <typename E>
__device__ __forceinline__ void lp2_sum16(float* f, uint4 mine, const ar_call& c, long long v, int rank, int ranks, long long cap) {
	const auto buf = [&](int q) { return (uint4*)(lp_buf(c.own, c.e, q, ranks, cap) + v * 16); };
	uint4 w[AR_MAX_RANKS];
#pragma unroll
	for (int q = 0; q < AR_MAX_RANKS; q++) {
		if (q >= ranks) break;
		w[q] = q == rank ? mine : ar_ld_volatile(buf(q));
	}
	ar_sum_ranks16<E>(f, ranks, [&](int q) { return q == rank ? w[q] : lp_ready<E>(w[q], buf(q), c.own, c.e, q); });
}
template <typename E>
__device__ void peer_lamport2_impl(const E* src, E* dst, long long nv, int rank, int ranks, long long cap,
                                   AR_REGION_PARAMS) {
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	const uint4* s = (const uint4*)src;
	uint4* d = (uint4*)dst;
	const long long cv = (nv + ranks - 1) / ranks;
	ar_stream(c, nv, [&](long long v) { return s[v]; },
	          [&](long long v, uint4 w) {
		          const int q = (int)(v / cv);
		          if (q != rank) *(uint4*)(lp_buf(ar_region(c.rg, q), c.e, rank, ranks, cap) + v * 16) = lp_canon16<E>(w);
	          });
	const long long hi = nv < (rank + 1) * cv ? nv : (rank + 1) * cv;
	for (long long v = rank * cv + c.v0; v < hi; v += c.stride) {
		float f[16 / sizeof(E)];
		lp2_sum16<E>(f, lp_canon16<E>(s[v]), c, v, rank, ranks, cap);
		const uint4 sum = lp_canon16<E>(pack16(f, (const E*)0));
		d[v] = sum;
		lp_push(c.rg, c.e, rank, ranks, cap, v * 16, sum);
	}
	const auto sums = [&](long long v) { return (uint4*)(lp_buf(c.own, c.e, (int)(v / cv), ranks, cap) + v * 16); };
	ar_stream(c, nv, [&](long long v) { return (int)(v / cv) != rank ? ar_ld_volatile(sums(v)) : ar_zero16(); },
	          [&](long long v, uint4 w) {
		          const int q = (int)(v / cv);
		          if (q != rank) d[v] = lp_ready<E>(w, sums(v), c.own, c.e, q);
	          });
	ar_end(c.own, c.e);
}

// The two-shot form with the residual add and RMSNorm that follow a
// tensor-parallel all-reduce in the same kernel (peer_lamport2_norm_w<W>):
// for a step's rows[rows, dim] of T, what peer_lamport2_<T> into x, then
// add_rmsnorm_v_w<W> compute: x = the sum over the ranks of src in rank
// order in float32, rounded to T; sum = x + r rounded to T; normed =
// RMSNorm(sum, w). The rows fall in chunks of ⌈rows/ranks⌉, rank q's to
// sum (every rank's norm needs whole rows):
//   1. a rank pushes its partials (canonical) of each other rank's rows
//      into that owner's buffer of the pushing rank;
//   2. it sums its own rows' vectors (its partials and the peers', taken
//      from its buffers), in rank order in float32 as peer_lamport2,
//      adds r, and stores each vector's sum (canonical, so that every rank
//      holds the same bits) into every rank's buffer of its own rank, its
//      own region's included;
//   3. it takes every row's sums from its buffers of their owners, a row a
//      block (block b rows b, b + grid, …; thread t the row's vectors t,
//      t + AR_THREADS, …, PN_MAXV at most: rows of up to
//      PN_MAXV·AR_THREADS vectors), held in registers while the block sums
//      their squares as norm_vec_impl does (every rank the same bits), and
//      writes sum and normed.
// Steps 1 and 2 take their vectors as peer_lamport2's steps do; the
// buffers' offsets, the parities and the emptying are its (a vector's
// offset is its index in the rows · 16; every word a call stores it
// empties). src and r are read in steps 1 and 2 only, and a vector of sum
// or normed is written in step 3 only once its sum, which its partials and
// r's vector went into, has come: sum and normed may lie exactly on src or
// r. Where they overlap src otherwise (the memory plan reused the
// partials' buffer), sync makes every block of the rank finish step 2
// before step 3 (ar_rank_sync); r they must not overlap otherwise (as
// add_rmsnorm's own kernel needs).
#define PN_MAXV 4
__device__ void ar_rank_sync(unsigned char* own, unsigned e) {
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned* n = (unsigned*)(own + AR_ARRIVE);
		atomicAdd(n, 1u);
		const unsigned long long t0 = ar_now();
		unsigned seen;
		while ((seen = ar_ld_acquire(n)) < gridDim.x) {
			if (ar_now() - t0 > AR_TIMEOUT_NS) {
				ar_stuck(own, e, seen, -1);
				break;
			}
		}
	}
	__syncthreads();
}
// pn_store writes the row's sums s (its thread's vectors) into sum and
// their RMSNorm into normed.
template <typename W>
__device__ __forceinline__ void pn_store(const uint4* s, const W* w, T* sum, T* normed, long long row, int dim, float eps,
                                         float* sh) {
	const int nv = dim / VEC;
	float ss = 0.f;
#pragma unroll
	for (int i = 0; i < PN_MAXV; i++) {
		const int c = threadIdx.x + i * AR_THREADS;
		if (c < nv) {
			float f[VEC];
			unpack16(s[i], f, (const T*)0);
#pragma unroll
			for (int j = 0; j < VEC; j++) ss += f[j] * f[j];
		}
	}
	ss = block_sum(ss, sh);
	const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	uint4* s4 = (uint4*)(sum + row * dim);
#pragma unroll
	for (int i = 0; i < PN_MAXV; i++) {
		const int c = threadIdx.x + i * AR_THREADS;
		if (c < nv) {
			s4[c] = s[i];
			float f[VEC], o[VEC];
			unpack16(s[i], f, (const T*)0);
#pragma unroll
			for (int j = 0; j < VEC; j++) o[j] = f[j] * scale * tof(w[c * VEC + j]);
			store16(normed + row * dim + c * VEC, o);
		}
	}
}
template <typename W>
__device__ void peer_lamport2_norm_impl(const T* src, const T* r, const W* w, T* sum, T* normed, int rows, int dim, float eps,
                                        int sync, int rank, int ranks, long long cap, AR_REGION_PARAMS) {
	__shared__ float pn_sh[32];
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	const uint4* s4 = (const uint4*)src;
	const long long nv = dim / VEC, total = rows * nv;
	const int rs = (rows + ranks - 1) / ranks; // rows a chunk
	const long long lo = rank * rs < rows ? (long long)rank * rs : rows, hi = lo + rs < rows ? lo + rs : rows;
	const auto slot = [&](unsigned char* reg, int q, long long v) { return (uint4*)(lp_buf(reg, c.e, q, ranks, cap) + v * 16); };
	// 1. The partials of the others' rows pushed to their owners.
	ar_stream(c, total, [&](long long v) { return s4[v]; },
	          [&](long long v, uint4 x) {
		          const int q = (int)(v / nv / rs);
		          if (q != rank) *slot(ar_region(c.rg, q), rank, v) = lp_canon16<T>(x);
	          });
	// 2. This rank's rows summed, r added, and pushed to every rank.
	for (long long v = lo * nv + c.v0; v < hi * nv; v += c.stride) {
		float f[VEC], b[VEC];
		lp2_sum16<T>(f, lp_canon16<T>(s4[v]), c, v, rank, ranks, cap);
		load16(r + v * VEC, b);
#pragma unroll
		for (int j = 0; j < VEC; j++) f[j] = round_t(round_t(f[j]) + b[j]);
		const uint4 x = lp_canon16<T>(pack16(f, (const T*)0));
		lp_push(c.rg, c.e, rank, ranks, cap, v * 16, x);
		*slot(c.own, rank, v) = x;
	}
	if (sync) ar_rank_sync(c.own, c.e);
	// 3. Every row's sums taken, a row a block, and normalized.
	for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
		const int q = (int)(row / rs);
		uint4 s[PN_MAXV];
#pragma unroll
		for (int i = 0; i < PN_MAXV; i++)
			if (threadIdx.x + i * AR_THREADS < nv) s[i] = ar_ld_volatile(slot(c.own, q, row * nv + threadIdx.x + i * AR_THREADS));
#pragma unroll
		for (int i = 0; i < PN_MAXV; i++)
			if (threadIdx.x + i * AR_THREADS < nv)
				s[i] = lp_ready<T>(s[i], slot(c.own, q, row * nv + threadIdx.x + i * AR_THREADS), c.own, c.e, q);
		pn_store<W>(s, w, sum, normed, row, dim, eps, pn_sh);
	}
	ar_end(c.own, c.e);
}

// peer_scatter_rows: the rows of the logits, each to the rank that samples
// it. x[rows, n] is this rank's vocabulary shard of the logits (f32,
// columns rank·n… of the whole, n a multiple of 4); rank q samples rows
// [q·share, (q+1)·share), share = ⌈rows/ranks⌉, and holds them whole in
// its staging (AR_HDR + 4·ranks·cap bytes into its region): [share][ranks·n]
// f32. Each rank stores its columns of each row into the staging of the
// row's rank (its own by local stores), then, after a system-scope fence,
// exchanges this block's flag with every peer (ar_exchange): once every
// block has, every peer's stores into this rank's staging are done, so the
// kernels after this one read the whole rows. The staging is not written
// again until the next call's scatter, which every rank reaches only after
// the step's collectives after this one, so after this rank's reads of it.
extern "C" __global__ void __launch_bounds__(AR_THREADS, 4) peer_scatter_rows(const float* x, int rows, int n, int rank,
                                                                               int ranks, long long cap, AR_REGION_PARAMS) {
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	const int share = (rows + ranks - 1) / ranks, nv = n / 4;
	const long long total = (long long)rows * nv, rowV = (long long)ranks * nv;
	const uint4* src = (const uint4*)x;
	ar_stream(c, total, [&](long long v) { return src[v]; },
	          [&](long long v, uint4 w) {
		          const int r = (int)(v / nv), q = r / share;
		          uint4* staging = (uint4*)(ar_region(c.rg, q) + AR_HDR + 4ll * ranks * cap);
		          staging[(long long)(r - q * share) * rowV + (long long)rank * nv + (v - (long long)r * nv)] = w;
	          });
	ar_exchange(c.rg, rank, ranks, c.e);
	ar_end(c.own, c.e);
}

// The kernels of each dtype: peer_allreduce_<E> (the flag form),
// peer_lamport_<E> and peer_lamport2_<E>. Every form keeps at least 4
// blocks a multiprocessor (64 registers a thread at most), so that eight
// ranks' grids of AR_SLOTS blocks fit one device of 128 multiprocessors or
// more at once, as the tests' ranks (streams of one device) must: a block
// waits for the other ranks' blocks.
#define PEER_ALLREDUCE(E, FORM)                                                                                   \
	extern "C" __global__ void __launch_bounds__(AR_THREADS, 4) peer_##FORM##_##E(                                \
	    const E* src, E* dst, long long nv, int rank, int ranks, long long cap, AR_REGION_PARAMS) {               \
		peer_##FORM##_impl<E>(src, dst, nv, rank, ranks, cap, AR_REGION_ARGS);                                   \
	}
#define PEER_ALLREDUCES(E) PEER_ALLREDUCE(E, allreduce) PEER_ALLREDUCE(E, lamport) PEER_ALLREDUCE(E, lamport2)
PEER_ALLREDUCES(f32)
PEER_ALLREDUCES(f16)
PEER_ALLREDUCES(bf16)


// The two-shot form with the add and norm after it, of weight dtype W.
#define PEER_NORMS(W)                                                                                                 \
	extern "C" __global__ void __launch_bounds__(AR_THREADS, 4)                                                       \
	    peer_lamport2_norm_w##W(const T* src, const T* r, const W* w, T* sum, T* normed, int rows, int dim, float eps, \
	                            int sync, int rank, int ranks, long long cap, AR_REGION_PARAMS) {                     \
		peer_lamport2_norm_impl<W>(src, r, w, sum, normed, rows, dim, eps, sync, rank, ranks, cap, AR_REGION_ARGS);   \
	}
PEER_NORMS(f32)
PEER_NORMS(f16)
PEER_NORMS(bf16)

// peer_lamport_add_<E>: peer_lamport_<E> with r (nv vectors of E, the same
// on every rank) added to each sum, in float32 after the ranks' partials,
// before the store into dst: a norm's residual add, folded into the
// all-reduce before it (GEMV.RunFolded applies the norm's 1/rms in the
// product after it). dst may lie on src or r, or apart from both; where
// it overlaps src otherwise (the memory plan reused the partials' buffer),
// sync has every thread keep its partials and r in registers (at most
// AR_ADD_MAXV vectors a thread) and every block of the rank push before
// any stores (ar_rank_sync).
#define AR_ADD_MAXV 4
template <typename E>
__device__ void peer_lamport_add_impl(const E* src, const E* r, E* dst, long long nv, int sync, int rank, int ranks,
                                      long long cap, AR_REGION_PARAMS) {
	constexpr int N = 16 / sizeof(E);
	const ar_call c = ar_start(rank, AR_REGION_ARGS);
	const uint4 *src16 = (const uint4*)src, *r16 = (const uint4*)r;
	// A thread's first AR_ADD_MAXV vectors in loops unrolled, so that the
	// partials and r kept with sync stay in registers (indexed by a count
	// known only at run time they were in local memory: 128 bytes in
	// clang's PTX), then the rest.
	uint4 mine[AR_ADD_MAXV], kept[AR_ADD_MAXV];
#pragma unroll
	for (int k = 0; k < AR_ADD_MAXV; k++) {
		const long long v = c.v0 + k * c.stride;
		if (v >= nv) break;
		const uint4 m = lp_canon16<E>(src16[v]);
		lp_push(c.rg, c.e, rank, ranks, cap, v * 16, m);
		if (sync) mine[k] = m, kept[k] = r16[v];
	}
	for (long long v = c.v0 + AR_ADD_MAXV * c.stride; v < nv; v += c.stride)
		lp_push(c.rg, c.e, rank, ranks, cap, v * 16, lp_canon16<E>(src16[v]));
	if (sync) ar_rank_sync(c.own, c.e);
	// add stores vector v's sum over the ranks (this rank's partial m) plus
	// r's vector rr.
	const auto add = [&](long long v, uint4 m, uint4 rr) {
		float f[N], g[N];
		unpack16(rr, g, (const E*)0);
		lp_sum16<E>(f, m, c.own, c.e, rank, ranks, cap, v * 16);
#pragma unroll
		for (int i = 0; i < N; i++) f[i] += g[i];
		((uint4*)dst)[v] = pack16(f, (const E*)0);
	};
#pragma unroll
	for (int k = 0; k < AR_ADD_MAXV; k++) {
		const long long v = c.v0 + k * c.stride;
		if (v >= nv) break;
		if (sync) { // (one call with conditional operands put mine and kept in local memory)
			add(v, mine[k], kept[k]);
		} else {
			add(v, lp_canon16<E>(src16[v]), r16[v]);
		}
	}
	for (long long v = c.v0 + AR_ADD_MAXV * c.stride; v < nv; v += c.stride) add(v, lp_canon16<E>(src16[v]), r16[v]);
	ar_end(c.own, c.e);
}
#define PEER_ADD(E)                                                                                               \
	extern "C" __global__ void __launch_bounds__(AR_THREADS, 4) peer_lamport_add_##E(                             \
	    const E* src, const E* r, E* dst, long long nv, int sync, int rank, int ranks, long long cap,              \
	    AR_REGION_PARAMS) {                                                                                       \
		peer_lamport_add_impl<E>(src, r, dst, nv, sync, rank, ranks, cap, AR_REGION_ARGS);                       \
	}
PEER_ADD(f32)
PEER_ADD(f16)
PEER_ADD(bf16)

#endif // KILN_PART_IS(0)
