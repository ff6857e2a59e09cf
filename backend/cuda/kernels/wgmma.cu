// kiln CUDA kernels: Hopper's warpgroup MMA (wgmma) for the GEMV's tile
// kernels (gemv_tile.cu), appended after mma.cu in the gemv module when it is
// built for sm_90a (-DGEMV_WGMMA, gemv.go). The emulator
// (testdata/emu/prelude.h) has its own versions of these.

#ifdef GEMV_WGMMA
// wg_fence orders register accesses before the warpgroup's next wgmma;
// wg_commit closes a group of wgmma; wg_wait0 waits for every group.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// fence_async_smem makes this thread's writes to shared memory (cp.async
// included, once waited for) visible to the async proxy wgmma reads through.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// WG_AB is the PTX type of the module's activations (ACT: bf16 or f16).
#define WG_STR2(x) #x
#define WG_STR(x) WG_STR2(x)
#define WG_AB WG_STR(ACT)

// wg_mma<N> is wgmma m64nNk16 with f32 accumulation, d += A·B, A (64×16) and
// B (16×N) in shared memory as the descriptors a and b describe, both
// K-major. d holds N/2 floats a thread: d[4j..4j+3] of warp w, lane l
// (g = l/4, q = l%4) are rows 16w+g, 16w+g, 16w+g+8, 16w+g+8 and columns
// 8j+2q, 8j+2q+1, 8j+2q, 8j+2q+1.
template <int N> __device__ __forceinline__ void wg_mma(float* d, unsigned long long a, unsigned long long b);
template <> __device__ __forceinline__ void wg_mma<16>(float* d, unsigned long long a, unsigned long long b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(a), "l"(b), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<32>(float* d, unsigned long long a, unsigned long long b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(a), "l"(b), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<64>(float* d, unsigned long long a, unsigned long long b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." WG_AB "." WG_AB
	             " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(a), "l"(b), "r"(1));
}
#endif // GEMV_WGMMA
