// Host emulation of the CUDA built-ins and PTX the tensor-core decode
// (decode_mma.cu) and the GEMV's tile kernels (gemv_tile.cu) use, for
// TestDecodeMMAEmulated and TestGEMVTileEmulated (emu_test.go), which
// compile it with a host C++ compiler, followed by the kernel's own source
// and a driver (driver.cpp, gemv_driver.cpp). The CUDA threads of a block,
// or of a thread-block cluster's blocks, take turns on one OS thread
// (ucontext), handing the turn on at every barrier; each block of a cluster
// has its own shared memory, read by the others through dsmem addresses
// (rank in the top byte); the warp
// collectives (shfl.sync, ldmatrix, mma.sync) exchange their operands
// through a table and a warp barrier and compute what the PTX ISA
// specifies for each lane; cp.async copies are held until the
// cp.async.wait_group that must complete them (so a read before its wait
// sees the poisoned shared memory); a cp.async of Q or of this step's K/V
// rows before pdl_enter() is an error (g_after_wait, set by the driver).
// Not a model of timing or of the memory model.
#undef _FORTIFY_SOURCE // its longjmp check refuses the jumps between the threads' stacks
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
dim3 blockIdx;
dim3 gridDim, blockDim;
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __grid_constant__

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
typedef ACT T;

#define NEG_INF (-INFINITY)
#define LOG2E 1.4426950408889634f
#define FULL_MASK 0xffffffffu

static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

// Round to nearest even.
static inline unsigned short f2bf(float f) {
	unsigned u = __float_as_uint(f);
	if (std::isnan(f)) return 0x7fc0;
	u += 0x7fff + ((u >> 16) & 1);
	return (unsigned short)(u >> 16);
}
// The approximate exponential and division (shared.cu's silu_f): the
// host's accurate forms; __fdividef gives 0 for a divisor past 2^126, as
// the device's does. Not the device's bits.
// (glibc declares an __expf of its own: the names are macros.)
static inline float emu_expf(float x) { return expf(x); }
static inline float emu_fdividef(float a, float b) { return fabsf(b) > 0x1p126f ? a * 0.0f : a / b; }
#define __expf emu_expf
#define __fdividef emu_fdividef
static inline float bf2f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
// f32 → f16, round to nearest even (clang has no _Float16 on x86-64).
static inline unsigned short f2h(float f) {
	unsigned x = __float_as_uint(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
	if (ax >= 0x7f800000) return sign | (ax > 0x7f800000 ? 0x7e00 : 0x7c00);
	if (ax >= 0x477ff000) return sign | 0x7c00; // 65520 and up round to inf
	if (ax < 0x38800000) return sign | (unsigned)nearbyintf(__uint_as_float(ax) * 16777216.0f); // subnormal: units of 2^-24
	unsigned h = ((((ax >> 23) - 127 + 15)) << 10) | ((ax & 0x7fffff) >> 13), rem = ax & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
	return sign | h;
}
static inline float h2f(unsigned short x) {
	unsigned sign = (x & 0x8000u) << 16, e = (x >> 10) & 0x1f, m = x & 0x3ff;
	if (e == 0) {
		float v = m * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	if (e == 31) return __uint_as_float(sign | 0x7f800000 | (m << 13));
	return __uint_as_float(sign | ((e - 15 + 127) << 23) | (m << 13));
}

static inline float tof(float v) { return v; }
static inline float tof(bf16 v) { return bf2f(v.x); }
static inline float tof(f16 v) { return h2f(v.x); }
template <typename X> X fromf(float v);
template <> float fromf<float>(float v) { return v; }
template <> bf16 fromf<bf16>(float v) { return bf16{f2bf(v)}; }
template <> f16 fromf<f16>(float v) { return f16{f2h(v)}; }
static inline float lo16(unsigned w, bf16*) { return bf2f(w & 0xffff); }
static inline float hi16(unsigned w, bf16*) { return bf2f(w >> 16); }
static inline float lo16(unsigned w, f16*) { return h2f(w & 0xffff); }
static inline float hi16(unsigned w, f16*) { return h2f(w >> 16); }
static inline float elem(unsigned short x, const bf16*) { return bf2f(x); }
static inline float elem(unsigned short x, const f16*) { return h2f(x); }

static inline float4 f4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int window_start(int p, int window) { return (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0; }

// ---- threads, blocks and barriers: each CUDA thread of a block is a
// ucontext run by one OS thread; a barrier hands the others the turn
// until all have arrived. A thread starts by setcontext and then switches
// by _setjmp/_longjmp, which, unlike swapcontext, make no system call (the
// signal mask) at every turn: most of the emulated tests' time before.
#include <setjmp.h>
#include <ucontext.h>
alignas(16) unsigned char g_smem[256 << 10]; // cluster rank 0's shared memory
static unsigned char* g_rank_smem[16] = {g_smem};
struct Block;
struct Copy { unsigned dst; const void* src; bool in; int group; int n = 16; }; // n: bytes read (the rest zero-filled)
struct Thread {
	ucontext_t uc;            // its start
	jmp_buf jb;               // where it resumes once started
	bool started = false;
	dim3 idx, block;
	int rank = 0;             // the block's rank in its cluster
	Block* blk = nullptr;
	std::vector<Copy> pending; // cp.async copies not yet complete
	int group = 0;             // the open group's id
	bool waited = false;       // pdl_enter() was called
	bool done = false;
	const int* wait_gen = nullptr; // the barrier generation it waits past
	int wait_at = 0;
};
static std::vector<char> g_stacks; // the threads' stacks (64 KB each), reused block after block
Thread* g_cur;
jmp_buf g_sched; // where the scheduler resumes when a thread yields or ends
std::function<void()> g_body;
#define threadIdx (g_cur->idx)
static void yield_turn() {
	if (!_setjmp(g_cur->jb)) _longjmp(g_sched, 1);
}
struct Barrier {
	int n, count = 0, gen = 0;
	void wait() {
		int g = gen;
		if (++count == n) {
			count = 0;
			gen++;
			return;
		}
		g_cur->wait_gen = &gen;
		g_cur->wait_at = g;
		yield_turn(); // the scheduler resumes it once gen has moved on
		g_cur->wait_gen = nullptr;
	}
};
// g_threads is the threads of a block (128 unless the driver sets another
// count, up to 1024, before a launch).
static int g_threads = 128;
// Mbar is an emulated mbarrier: arrivals a phase, the phases completed, and
// the current phase's arrivals, expected and issued TMA bytes, and its
// copies (their bytes read at issue, landed when a wait completes the
// phase: a read of the destination before its wait sees kPoison).
struct TmaCopy { unsigned dst; std::vector<unsigned char> bytes; };
struct Mbar {
	int count = 1, phases = 0, arrived = 0;
	long long expected = 0, issued = 0;
	std::vector<TmaCopy> copies;
};
struct Block {
	std::map<unsigned, Mbar> mbars; // by shared address
	Barrier bar{g_threads};
	std::map<int, Barrier> named; // bar.sync / bar.arrive's barriers by id (1-15)
	Barrier wbar[32] = {{32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32},
	                    {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}, {32}};
	unsigned long long xch[32][32][8]; // warp exchange tables
};
Block* g_block;
Barrier* g_cluster_bar;
static void thread_entry() {
	g_body();
	g_cur->done = true;
	_longjmp(g_sched, 1);
}
static inline unsigned char* cur_smem() { return g_rank_smem[g_cur->rank]; }
// g_cluster_grid, when set, makes run_cluster's block r block r %
// g_cluster_grid: several grids of that many blocks (the ranks of a peer
// all-reduce, each its own launch on the device) run as one cluster.
static int g_cluster_grid = 0;
// run_cluster runs body as the g_threads threads of each of the n blocks first,
// first + (1, 0, 0), ... of one cluster (n ≤ 16; n = 1: one block) until
// all return. Ranks past 0 get shared memory poisoned with 0xff bytes.
static void run_cluster(dim3 first, int n, const std::function<void()>& body) {
	const int bt = g_threads, nt = bt * n;
	std::vector<Block*> blocks(n);
	for (int r = 0; r < n; r++) {
		blocks[r] = new Block();
		if (r > 0) {
			if (!g_rank_smem[r]) g_rank_smem[r] = new unsigned char[sizeof(g_smem)];
			memset(g_rank_smem[r], 0xff, sizeof(g_smem));
		}
	}
	Barrier cbar{nt};
	g_cluster_bar = &cbar;
	g_body = body;
	g_stacks.resize((size_t)nt << 16);
	std::vector<Thread> th(nt);
	for (int t = 0; t < nt; t++) {
		th[t].rank = t / bt;
		th[t].idx = dim3{(unsigned)(t % bt), 0, 0};
		th[t].block = dim3{first.x + (unsigned)(g_cluster_grid ? th[t].rank % g_cluster_grid : th[t].rank), first.y, first.z};
		th[t].blk = blocks[th[t].rank];
		getcontext(&th[t].uc);
		th[t].uc.uc_stack.ss_sp = g_stacks.data() + ((size_t)t << 16);
		th[t].uc.uc_stack.ss_size = 64 << 10;
		th[t].uc.uc_link = nullptr; // thread_entry never returns
		makecontext(&th[t].uc, thread_entry, 0);
	}
	for (;;) {
		bool all = true, ran = false;
		for (auto& t : th) {
			if (t.done) continue;
			all = false;
			if (t.wait_gen && *t.wait_gen == t.wait_at) continue; // still blocked
			ran = true;
			g_cur = &t;
			g_block = t.blk;
			blockIdx = t.block;
			if (!_setjmp(g_sched)) {
				if (!t.started) {
					t.started = true;
					setcontext(&t.uc);
				}
				_longjmp(t.jb, 1);
			}
		}
		if (all) break;
		if (!ran) {
			fprintf(stderr, "cluster at block (%d, %d, %d): every thread waits at a barrier the others do not reach\n", first.x, first.y,
			        first.z);
			abort();
		}
	}
	for (auto& t : th)
		if (!t.pending.empty()) {
			fprintf(stderr, "cp.async copies left pending\n");
			abort();
		}
	for (auto* b : blocks)
		for (auto& [a, m] : b->mbars)
			if (!m.copies.empty()) {
				fprintf(stderr, "TMA copies on the mbarrier at %u left pending\n", a);
				abort();
			}
	for (auto* b : blocks) delete b;
}
static void run_block(dim3 idx, const std::function<void()>& body) { run_cluster(idx, 1, body); }
// launch runs body as every block of grid, blocks of threads threads (the
// drivers' plain launches).
static void launch(dim3 grid, int threads, const std::function<void()>& body) {
	g_threads = threads;
	gridDim = grid;
	blockDim = dim3{(unsigned)threads, 1, 1};
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) run_block(dim3{x, y, z}, body);
}
// g_after_wait reports whether a copy from src must wait for pdl_enter()
// (Q, and K/V rows of this step's keys).
std::function<bool(const void*)> g_after_wait;
static inline int lane_id() { return threadIdx.x & 31; }
static inline int warp_id() { return threadIdx.x >> 5; }
static inline void warp_sync() { g_block->wbar[warp_id()].wait(); }
static inline void __syncwarp() { warp_sync(); }
static inline void __syncthreads() { g_block->bar.wait(); }
static inline void __threadfence() {}
static inline int atomicAdd(int* p, int v) {
	int o = *p;
	*p = o + v;
	return o;
}
static inline int atomicMin(int* p, int v) {
	int o = *p;
	*p = o < v ? o : v;
	return o;
}
static inline int atomicMax(int* p, int v) {
	int o = *p;
	*p = o > v ? o : v;
	return o;
}

template <typename V> static V shfl_xor(V v, int m) {
	unsigned long long b = 0;
	memcpy(&b, &v, sizeof(V));
	g_block->xch[warp_id()][lane_id()][0] = b;
	warp_sync();
	unsigned long long o = g_block->xch[warp_id()][lane_id() ^ m][0];
	warp_sync();
	V r;
	memcpy(&r, &o, sizeof(V));
	return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int m) { return shfl_xor(v, m); }
// __ballot_sync: bit i set when lane i's pred holds (every lane of the warp
// takes part).
static inline unsigned __ballot_sync(unsigned, int pred) {
	g_block->xch[warp_id()][lane_id()][0] = pred != 0;
	warp_sync();
	unsigned b = 0;
	for (int l = 0; l < 32; l++)
		if (g_block->xch[warp_id()][l][0]) b |= 1u << l;
	warp_sync();
	return b;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(int v) { return __builtin_ffs(v); }

// ---- shared memory addresses: offsets into the block's shared memory
static inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - cur_smem()); }
// g_smem_limit, when a driver sets it, is the dynamic shared memory the
// host gives the kernel: a copy past it aborts. A copy's destination holds
// kPoison from its issue until it lands (cp_wait), so that a read before
// then sees garbage, and a write before then aborts when it lands.
static unsigned g_smem_limit = 0;
static const unsigned char kPoison = 0xa5;
static inline void cp16(unsigned dst, const void* src, bool in) {
	if (in && !g_cur->waited && g_after_wait(src)) {
		fprintf(stderr, "thread %d of block (%d, %d, %d) copies from %p before pdl_enter\n", threadIdx.x, blockIdx.x, blockIdx.y,
		        blockIdx.z, src);
		abort();
	}
	if (g_smem_limit && dst + 16 > g_smem_limit) {
		fprintf(stderr, "cp16 to shared memory byte %u past the kernel's %u\n", dst + 16, g_smem_limit);
		abort();
	}
	memset(cur_smem() + dst, kPoison, 16);
	g_cur->pending.push_back({dst, src, in, g_cur->group});
}
static inline void cp16_l2(unsigned dst, const void* src, bool in) { cp16(dst, src, in); }
static inline void cp16n(unsigned dst, const void* src, int n) {
	cp16(dst, src, n > 0);
	g_cur->pending.back().n = n;
}
static inline void cp_commit() { g_cur->group++; }
template <int N> static inline void cp_wait() {
	// complete every committed group but the newest N
	std::vector<Copy> keep;
	for (auto& c : g_cur->pending) {
		if (c.group < g_cur->group - N) {
			for (int i = 0; i < 16; i++)
				if (cur_smem()[c.dst + i] != kPoison) {
					fprintf(stderr, "shared memory byte %u written while a copy to it was in flight\n", c.dst + i);
					abort();
				}
			if (c.in) {
				memcpy(cur_smem() + c.dst, c.src, c.n);
				memset(cur_smem() + c.dst + c.n, 0, 16 - c.n);
			} else memset(cur_smem() + c.dst, 0, 16);
		} else keep.push_back(c);
	}
	g_cur->pending.swap(keep);
}

// ---- mbarriers and TMA (prefill_wg's TBS builds; wgmma.cu's versions are
// the device's): KilnTensorMap is the emulation's tensor map, which the
// driver fills as cu.Device.EncodeTiled describes it (3 dimensions,
// innermost first; a box of rows of box[0] elements, swizzled in 128-byte
// rows by the shared address's bits as the hardware does).
struct KilnTensorMap {
	const unsigned char* base;
	unsigned long long dims[3], strides[2]; // strides in bytes, of dimensions 1 and 2
	unsigned box[3];
	int elem, swizzle;
};
static Mbar& mbar_at(unsigned bar) {
	auto it = g_block->mbars.find(bar);
	if (it == g_block->mbars.end()) {
		fprintf(stderr, "no mbarrier at shared address %u\n", bar);
		abort();
	}
	return it->second;
}
static inline void mbar_init(unsigned bar, int count) { g_block->mbars[bar] = Mbar{count}; }
static inline void mbar_init_fence() {}
static inline void mbar_expect(unsigned bar, unsigned bytes) {
	Mbar& m = mbar_at(bar);
	m.arrived++;
	m.expected += bytes;
}
static inline void st_shared_zero16(unsigned a) { memset(cur_smem() + a, 0, 16); }
static inline void tma_load_3d(unsigned dst, const KilnTensorMap* map, int c0, int c1, int c2, unsigned bar) {
	const int row = (int)map->box[0] * map->elem, rows = (int)(map->box[1] * map->box[2]);
	if (dst % 128 != 0 || (map->swizzle == 128 && row > 128)) {
		fprintf(stderr, "TMA box to shared address %u (rows of %d bytes)\n", dst, row);
		abort();
	}
	if (g_smem_limit && dst + (unsigned)(row * rows) > g_smem_limit) {
		fprintf(stderr, "TMA box to shared memory byte %u past the kernel's %u\n", dst + row * rows, g_smem_limit);
		abort();
	}
	TmaCopy c{dst, std::vector<unsigned char>((size_t)row * rows, 0)};
	for (int z = 0; z < (int)map->box[2]; z++)
		for (int y = 0; y < (int)map->box[1]; y++) {
			const int r = z * (int)map->box[1] + y;
			const unsigned long long gy = (unsigned long long)c1 + y, gz = (unsigned long long)c2 + z;
			for (int x = 0; x < (int)map->box[0]; x++) {
				const unsigned long long gx = (unsigned long long)c0 + x;
				if (gx >= map->dims[0] || gy >= map->dims[1] || gz >= map->dims[2]) continue; // out of bounds: zeros
				const unsigned char* src = map->base + gz * map->strides[1] + gy * map->strides[0] + gx * map->elem;
				int b = x * map->elem; // its byte in the row, then swizzled by the row's address
				const unsigned a = dst + (unsigned)(r * row);
				if (map->swizzle == 128) b = ((b >> 4) ^ ((a >> 7) & 7)) << 4 | (b & 15);
				memcpy(c.bytes.data() + (size_t)r * row + b, src, map->elem);
			}
		}
	memset(cur_smem() + dst, kPoison, c.bytes.size());
	Mbar& m = mbar_at(bar);
	m.issued += (long long)c.bytes.size();
	m.copies.push_back(std::move(c));
}
// mbar_complete completes bar's current phase (every arrival and expected
// byte in): its copies land (a destination written while they were in
// flight aborts), and the next phase starts.
static void mbar_complete(unsigned bar, Mbar& m) {
	for (auto& c : m.copies) {
		for (size_t i = 0; i < c.bytes.size(); i++)
			if (cur_smem()[c.dst + i] != kPoison) {
				fprintf(stderr, "shared memory byte %zu written while a TMA copy to it (mbarrier at %u) was in flight\n", c.dst + i, bar);
				abort();
			}
		memcpy(cur_smem() + c.dst, c.bytes.data(), c.bytes.size());
	}
	m.copies.clear();
	m.phases++, m.arrived = 0, m.expected = m.issued = 0;
}
// mbar_wait returns once bar's phase of parity parity is complete: at once
// for the phase before the current one; for the current one, once its
// arrivals and expected bytes are all in (the others' turns meanwhile), when
// its copies land.
static inline void mbar_wait(unsigned bar, unsigned parity) {
	for (long spins = 0;; spins++) {
		Mbar& m = mbar_at(bar);
		if ((unsigned)(m.phases & 1) != parity) return;
		if (m.arrived == m.count && m.issued == m.expected) {
			mbar_complete(bar, m);
			return;
		}
		if (m.issued > m.expected || spins > (1 << 20)) {
			fprintf(stderr, "mbarrier at %u: %d of %d arrivals, %lld of %lld bytes: a phase that never completes\n", bar, m.arrived, m.count,
			        m.issued, m.expected);
			abort();
		}
		yield_turn();
	}
}
// mbar_arrive arrives on bar; the arrival that completes the phase (every
// arrival and expected byte in) lands its copies and starts the next, as the
// hardware's does.
static inline void mbar_arrive(unsigned bar) {
	Mbar& m = mbar_at(bar);
	if (++m.arrived > m.count) {
		fprintf(stderr, "mbarrier at %u: %d arrivals in a phase of %d\n", bar, m.arrived, m.count);
		abort();
	}
	if (m.arrived == m.count && m.issued == m.expected) mbar_complete(bar, m);
}
// named_sync and named_arrive: bar.sync and bar.arrive on named barrier id
// of n threads (the block's; id 0 is __syncthreads').
static inline Barrier& named_bar(int id, int n) {
	if (id < 1 || id > 15 || n % 32 != 0 || n > g_threads) {
		fprintf(stderr, "named barrier %d of %d threads\n", id, n);
		abort();
	}
	auto it = g_block->named.try_emplace(id, Barrier{n}).first;
	if (it->second.n != n) {
		fprintf(stderr, "named barrier %d used with %d and %d threads\n", id, it->second.n, n);
		abort();
	}
	return it->second;
}
static inline void named_sync(int id, int n) { named_bar(id, n).wait(); }
static inline void named_arrive(int id, int n) {
	Barrier& b = named_bar(id, n);
	if (++b.count == b.n) {
		b.count = 0;
		b.gen++;
	}
}
static inline void pdl_enter() { g_cur->waited = true; }
static inline void pdl_wait() { pdl_enter(); }
static inline void pdl_trigger() {}

// ---- clusters: a dsmem address is the rank (top byte) and the offset
static inline void cluster_sync() { g_cluster_bar->wait(); }
static inline unsigned dsmem(const void* p, int rank) { return ((unsigned)rank << 24) | smem_addr(p); }
static inline float lds_cluster(unsigned a) {
	float v;
	memcpy(&v, g_rank_smem[a >> 24] + (a & 0xffffff), 4);
	return v;
}
static inline float4 lds_cluster4(unsigned a) {
	float4 v;
	memcpy(&v, g_rank_smem[a >> 24] + (a & 0xffffff), 16);
	return v;
}

// ---- ldmatrix: lane i addresses row i%8 of matrix i/8
static inline unsigned short sm16(unsigned a) { unsigned short v; memcpy(&v, cur_smem() + a, 2); return v; }
static void ldsm_impl(unsigned* r, unsigned a, bool trans) {
	int w = warp_id(), l = lane_id();
	g_block->xch[w][l][0] = a;
	warp_sync();
	for (int m = 0; m < 4; m++) {
		int g = l >> 2, tq = l & 3;
		unsigned lo, hi;
		if (!trans) { // row g, cols 2tq, 2tq+1
			unsigned row = (unsigned)g_block->xch[w][m * 8 + g][0];
			lo = sm16(row + 4 * tq);
			hi = sm16(row + 4 * tq + 2);
		} else { // transposed: element (row 2tq, col g) and (row 2tq+1, col g) of the stored matrix
			unsigned r0 = (unsigned)g_block->xch[w][m * 8 + 2 * tq][0], r1 = (unsigned)g_block->xch[w][m * 8 + 2 * tq + 1][0];
			lo = sm16(r0 + 2 * g);
			hi = sm16(r1 + 2 * g);
		}
		r[m] = lo | (hi << 16);
	}
	warp_sync();
}
static inline void ldsm4(unsigned* r, unsigned a) { ldsm_impl(r, a, false); }
static inline void ldsm4t(unsigned* r, unsigned a) { ldsm_impl(r, a, true); }

// ---- mma.sync m16n8k16 row.col, f32 accumulate
template <typename X> static void mma_impl(float* c, const unsigned* a, unsigned b0, unsigned b1) {
	int w = warp_id(), l = lane_id();
	auto* x = g_block->xch[w][l];
	for (int i = 0; i < 4; i++) x[i] = a[i];
	x[4] = b0;
	x[5] = b1;
	warp_sync();
	auto A = [&](int row, int k) -> float { // A[row][k]
		int g = row & 7, hiRow = row >> 3, kk = k & 7, hiK = k >> 3, tq = kk >> 1;
		unsigned reg = (unsigned)g_block->xch[w][g * 4 + tq][hiRow + 2 * hiK];
		unsigned short h = (kk & 1) ? reg >> 16 : reg & 0xffff;
		return elem(h, (const X*)0);
	};
	auto B = [&](int k, int n) -> float { // B[k][n]
		int kk = k & 7, hiK = k >> 3, tq = kk >> 1;
		unsigned reg = (unsigned)g_block->xch[w][n * 4 + tq][4 + hiK];
		unsigned short h = (kk & 1) ? reg >> 16 : reg & 0xffff;
		return elem(h, (const X*)0);
	};
	int g = l >> 2, tq = l & 3;
	float out[4];
	for (int i = 0; i < 4; i++) {
		int row = g + (i >= 2 ? 8 : 0), col = 2 * tq + (i & 1);
		double s = c[i];
		for (int k = 0; k < 16; k++) s += (double)A(row, k) * B(k, col);
		out[i] = (float)s;
	}
	warp_sync();
	for (int i = 0; i < 4; i++) c[i] = out[i];
}
static inline void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1, const bf16*) { mma_impl<bf16>(c, a, b0, b1); }
static inline void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1, const f16*) { mma_impl<f16>(c, a, b0, b1); }
static inline unsigned cvt2(float lo, float hi, const bf16*) { return f2bf(lo) | ((unsigned)f2bf(hi) << 16); }
static inline unsigned cvt2(float lo, float hi, const f16*) { return f2h(lo) | ((unsigned)f2h(hi) << 16); }
#define PK2(lo, hi) cvt2((lo), (hi), (const T*)0)
static inline float ex2f(float x) { return exp2f(x); }
template <typename X> struct act_is_f16 { static constexpr bool v = false; };
template <> struct act_is_f16<f16> { static constexpr bool v = true; };
static inline float ldcg(const float* p) { return *p; }
static inline float4 ldcg4(const float* p) { return *(const float4*)p; }

// ---- gemv.cu's stores and rounding (its PTX cvt.rn), for its epilogues
static inline void store(float* p, float v) { *p = v; }
static inline void store(bf16* p, float v) { p->x = f2bf(v); }
static inline void store(f16* p, float v) { p->x = f2h(v); }
static inline float rnd(float v, const float*) { return v; }
static inline float rnd(float v, const bf16*) { return bf2f(f2bf(v)); }
static inline float rnd(float v, const f16*) { return h2f(f2h(v)); }
static inline float rnd(float v) { return rnd(v, (const T*)0); }

// ---- wgmma (gemv_tile.cu built with GEMV_WGMMA, prefill_wg.cu): each
// thread computes its own accumulator elements (wg_mma's layout in
// wgmma.cu) from shared memory as the descriptors address it (wgmma.cu's
// wg_desc and wg_desc_mn, taken from the source), at the call; the
// hardware's asynchrony is not modelled (a kernel must wait for its wgmma
// before it reads their results or overwrites their operands: the GPU
// tests check that). A block's warps 4i..4i+3 are its warpgroup i.
static inline void wg_fence() {}
static inline void wg_commit() {}
static inline void wg_wait0() {}
template <int N> static inline void wg_wait() {}
static inline void wg_hold(float*, int) {}
static inline void fence_async_smem() {}
// wg_check stops on a descriptor the emulator does not model: only the
// 128-byte swizzle with base offset 0.
static inline void wg_check(unsigned long long desc) {
	if ((desc >> 62) != 1 || ((desc >> 49) & 7) != 0) {
		fprintf(stderr, "wgmma descriptor %llx: only the 128-byte swizzle with base offset 0 is emulated\n", desc);
		abort();
	}
}
// wg_swz is shared byte address a with the 128-byte swizzle applied
// (address bits 4-6 XORed with bits 7-9).
static inline unsigned wg_swz(unsigned a) { return a ^ (((a >> 7) & 7) << 4); }
// wg_elem is element (row, k), k < 16, of a K-major operand as descriptor
// desc addresses it: start address, stride byte offset from one 8-row atom
// to the next, rows 128 bytes apart inside an atom.
template <typename X> static float wg_elem(unsigned long long desc, int row, int k) {
	wg_check(desc);
	unsigned start = (unsigned)(desc & 0x3FFF) << 4, sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
	return elem(sm16(wg_swz(start + (unsigned)(row / 8) * sbo + (unsigned)(row % 8) * 128 + 2 * (unsigned)k)), (const X*)0);
}
// wg_elem_mn is element (k, n), k < 16, of an MN-major operand: 64
// consecutive n a 128-byte row, the next 64 n the leading byte offset on,
// 8 k rows an atom, the next 8 k the stride byte offset on.
template <typename X> static float wg_elem_mn(unsigned long long desc, int k, int n) {
	wg_check(desc);
	unsigned start = (unsigned)(desc & 0x3FFF) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4,
	         sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
	return elem(sm16(wg_swz(start + (unsigned)(n / 64) * lbo + 2 * (unsigned)(n % 64) + (unsigned)(k / 8) * sbo + (unsigned)(k % 8) * 128)),
	            (const X*)0);
}
// wg_mma<N>: d += A·B (d = A·B when acc is 0) for A 64×16 (rows of the
// warpgroup's 4 warps, 16 each) and B 16×N, B's descriptor addressing its
// N columns as rows.
template <int N> static void wg_mma(float* d, unsigned long long a, unsigned long long b, int acc = 1) {
	int w = warp_id() & 3, l = lane_id(), g = l >> 2, q = l & 3;
	for (int j = 0; j < N / 8; j++)
		for (int i = 0; i < 4; i++) {
			int row = 16 * w + g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * q + (i & 1);
			double s = acc ? d[4 * j + i] : 0.0;
			for (int k = 0; k < 16; k++) s += (double)wg_elem<T>(a, row, k) * wg_elem<T>(b, col, k);
			d[4 * j + i] = (float)s;
		}
}
// wg_mma_rs<N>: d += A·B for A 64×16 in registers (each warp's 16 rows as
// mma16816's A tile, exchanged within the warp) and B 16×N MN-major.
template <int N> static void wg_mma_rs(float* d, const unsigned* a, unsigned long long b) {
	int w = warp_id(), l = lane_id(), g = l >> 2, q = l & 3;
	auto* x = g_block->xch[w][l];
	for (int i = 0; i < 4; i++) x[i] = a[i];
	warp_sync();
	auto A = [&](int row, int k) -> float { // A[row][k], row < 16 of this warp
		int gg = row & 7, hiRow = row >> 3, kk = k & 7, hiK = k >> 3, tq = kk >> 1;
		unsigned reg = (unsigned)g_block->xch[w][gg * 4 + tq][hiRow + 2 * hiK];
		unsigned short h = (kk & 1) ? reg >> 16 : reg & 0xffff;
		return elem(h, (const T*)0);
	};
	float out[N / 2];
	for (int j = 0; j < N / 8; j++)
		for (int i = 0; i < 4; i++) {
			int row = g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * q + (i & 1);
			double s = d[4 * j + i];
			for (int k = 0; k < 16; k++) s += (double)A(row, k) * wg_elem_mn<T>(b, k, col);
			out[4 * j + i] = (float)s;
		}
	warp_sync();
	for (int i = 0; i < N / 2; i++) d[i] = out[i];
}
