// For TestPeerKernelsEmulated (emu_test.go): the host forms of the PTX
// helpers of allreduce.cu (its "The PTX" section, which the test leaves
// out), for the ranks of a group run as one cluster of prelude.h's
// threads (g_cluster_grid blocks a rank) on one OS thread. A load of what
// another rank may store hands the turn on first, so that a thread that
// waits for a peer lets the peer run; every other thread runs until its
// next barrier or such load. Memory is the host's, in program order: the
// fences and the release and acquire order are the GPU test's to check.
typedef float f32;
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
	unsigned o = *p;
	*p = o + v;
	return o;
}
static inline void ar_st_release(unsigned* p, unsigned v) { *(volatile unsigned*)p = v; }
static inline unsigned ar_ld_acquire(const unsigned* p) {
	yield_turn();
	return *(const volatile unsigned*)p;
}
static inline uint4 ar_ld_cg(const void* p) {
	uint4 v;
	memcpy(&v, p, 16);
	return v;
}
static inline uint4 ar_ld_volatile(const void* p) {
	yield_turn();
	uint4 v;
	memcpy(&v, p, 16);
	return v;
}
// The clock, one for all the threads, moves 1 µs a reading by any thread:
// a wait that no peer ends reaches AR_TIMEOUT_NS (20 s) after 20 million
// readings, thousands of turns of every thread (a wait that a peer ends
// takes a few).
static unsigned long long g_ar_clock = 0;
static inline unsigned long long ar_now() { return g_ar_clock += 1000; }
static inline void ar_fence_sys() {}
static inline void ar_trap() {
	fprintf(stderr, "trap: block %u of a rank waited in vain\n", blockIdx.x);
	abort();
}
