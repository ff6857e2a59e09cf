// kiln CUDA kernels: Hopper's warpgroup MMA (wgmma) for the GEMV's tile
// kernels (gemv_tile.cu) and the prefill attention (prefill_wg.cu),
// appended after mma.cu in the gemv module when it is built for sm_90a
// (-DGEMV_WGMMA, gemv.go) and in the kernels module likewise (-DACT_WGMMA,
// kernels.go). The emulator (testdata/emu/prelude.h) has its own versions
// of these but the descriptors.

#if defined(GEMV_WGMMA) || defined(ACT_WGMMA)
// wg_fence orders register accesses before the warpgroup's next wgmma;
// wg_commit closes a group of wgmma; wg_wait0 waits for every group.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// wg_wait<N> waits until at most the N latest groups are in flight.
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// wg_hold ties the n registers at r to the wgmma wait before it: the
// compiler sees them written there, so it moves no read of them (nor
// write) across the wait (wgmma writes its accumulators asynchronously,
// which the compiler does not know).
__device__ __forceinline__ void wg_hold(float* r, int n) {
#pragma unroll
	for (int i = 0; i < n; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// fence_async_smem makes this thread's writes to shared memory (cp.async
// included, once waited for) visible to the async proxy wgmma reads through.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// wg_desc is the wgmma descriptor of a K-major operand whose rows are 128
// bytes swizzled in 1024-byte atoms of 8 rows (the atom holding shared
// address a, 1024-aligned, plus the byte offset of the columns): start
// address, leading byte offset 16 (unused by this layout), stride byte
// offset 1024 (from one 8-row atom to the next), swizzle mode 1 (128 bytes).
__device__ __forceinline__ unsigned long long wg_desc(unsigned a) {
	return (unsigned long long)((a & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
// wg_desc_mn is the descriptor of an MN-major operand (B of wg_mma_rs) in
// the same 128-byte swizzled atoms: each 128-byte row holds 64 consecutive
// columns (N) of one k, 8 k a 1024-byte atom, the next 8 k 1024 bytes on
// (stride byte offset) and the next 64 columns lbo bytes on (leading byte
// offset).
__device__ __forceinline__ unsigned long long wg_desc_mn(unsigned a, unsigned lbo) {
	return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
	       ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// KilnTensorMap is a tensor map of Hopper's TMA (CUtensorMap, cu.TensorMap):
// a kernel takes it as a `const __grid_constant__` parameter and names its
// address in the bulk tensor copies.
struct __align__(64) KilnTensorMap {
	unsigned long long v[16];
};
// mbar_init makes the 8 bytes of shared memory at bar an mbarrier of count
// arrivals a phase; mbar_init_fence makes the initialized barriers visible
// to the async proxy (the TMA's completions).
__device__ __forceinline__ void mbar_init(unsigned bar, int count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory"); }
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// mbar_expect arrives on bar and has its phase wait for bytes more of
// copies besides (the TMA's complete_tx).
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// mbar_arrive arrives on bar (one of its count arrivals a phase), releasing
// this thread's accesses before it.
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
	unsigned long long state; // the phase's token, unused
	asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(bar) : "memory");
	(void)state;
}
// named_sync waits at named barrier id (1-15; 0 is __syncthreads') until n
// threads have arrived there, itself included; named_arrive arrives without
// waiting. n is a multiple of 32, whole warps arriving.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// mbar_wait waits until bar's phase of parity parity (0 or 1) is complete.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
	asm volatile("{\n.reg .pred p;\nMBAR_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra MBAR_WAIT;\n}" ::"r"(bar),
	             "r"(parity)
	             : "memory");
}
// st_shared_zero16 zeroes the 16 bytes of shared memory at a.
__device__ __forceinline__ void st_shared_zero16(unsigned a) { asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(a), "r"(0) : "memory"); }
// tma_load_3d copies the box of the tensor map at map whose first element
// is at coordinates (c0, c1, c2), innermost first, to shared memory at dst
// (1024-byte aligned under a 128-byte swizzle), completing its bytes on the
// mbarrier at bar.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const KilnTensorMap* map, int c0, int c1, int c2, unsigned bar) {
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
	             "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
	             : "memory");
}

// WG_AB is the PTX type of the module's activations (ACT: bf16 or f16).
#define WG_STR2(x) #x
#define WG_STR(x) WG_STR2(x)
#define WG_AB WG_STR(ACT)

// wg_mma<N> is wgmma m64nNk16 with f32 accumulation, d += A·B, A (64×16) and
// B (16×N) in shared memory as the descriptors a and b describe, both
// K-major. d holds N/2 floats a thread: d[4j..4j+3] of warp w, lane l
// (g = l/4, q = l%4) are rows 16w+g, 16w+g, 16w+g+8, 16w+g+8 and columns
// 8j+2q, 8j+2q+1, 8j+2q, 8j+2q+1. With acc 0 d is overwritten (d = A·B).
template <int N> __device__ __forceinline__ void wg_mma(float* d, unsigned long long a, unsigned long long b, int acc = 1);
template <> __device__ __forceinline__ void wg_mma<16>(float* d, unsigned long long a, unsigned long long b, int acc) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(a), "l"(b), "r"(acc));
}
template <> __device__ __forceinline__ void wg_mma<32>(float* d, unsigned long long a, unsigned long long b, int acc) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(a), "l"(b), "r"(acc));
}

template <> __device__ __forceinline__ void wg_mma<64>(float* d, unsigned long long a, unsigned long long b, int acc) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(a), "l"(b), "r"(acc));
}
template <> __device__ __forceinline__ void wg_mma<128>(float* d, unsigned long long a, unsigned long long b, int acc) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "l"(a), "l"(b), "r"(acc));
}
// wg_mma_rs<N> is wgmma m64nNk16, d += A·B, with A (64×16) in registers as
// mma16816 takes a 16×16 tile (warp w of the warpgroup: rows 16w..16w+15)
// and B (16×N) in shared memory MN-major (wg_desc_mn).
template <int N> __device__ __forceinline__ void wg_mma_rs(float* d, const unsigned* a, unsigned long long b);
template <> __device__ __forceinline__ void wg_mma_rs<64>(float* d, const unsigned* a, unsigned long long b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma_rs<128>(float* d, const unsigned* a, unsigned long long b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#endif // GEMV_WGMMA || ACT_WGMMA
