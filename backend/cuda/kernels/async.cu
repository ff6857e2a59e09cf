// kiln CUDA kernels: asynchronous copies to shared memory and
// thread-block clusters, for the kernels that stage their operands in
// shared memory. Prepended to attention.cu (kernels.go) and to the tensor-core
// tile kernels of the gemv module (gemv.go).

// smem_addr is the shared-state-space address of p (in shared memory).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	return a;
}
// cp16 copies 16 bytes global → shared asynchronously (zero-fills when
// !in); cp_commit closes a group of copies, cp_wait<N> waits until at most
// N groups are still in flight. Before compute capability 8.0 the copy is a
// plain load and store.
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool in) {
#if __CUDA_ARCH__ >= 800
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
#else
	uint4 v;
	v.x = v.y = v.z = v.w = 0u;
	if (in) v = *(const uint4*)src;
	asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#endif
}
// cp16n copies the first n (0 to 16) of the 16 bytes at src (16-byte
// aligned) and zero-fills the rest.
__device__ __forceinline__ void cp16n(unsigned dst, const void* src, int n) {
#if __CUDA_ARCH__ >= 800
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
#else
	__align__(16) unsigned char b[16];
	for (int i = 0; i < 16; i++) b[i] = i < n ? ((const unsigned char*)src)[i] : 0;
	const uint4 v = *(const uint4*)b;
	asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#endif
}
// cp16_l2 is cp16 asking the L2 to fetch the 256 bytes around src (for
// streams that read on past it).
__device__ __forceinline__ void cp16_l2(unsigned dst, const void* src, bool in) {
#if __CUDA_ARCH__ >= 800
	asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
#else
	cp16(dst, src, in);
#endif
}
__device__ __forceinline__ void cp_commit() {
#if __CUDA_ARCH__ >= 800
	asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_wait() {
#if __CUDA_ARCH__ >= 800
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Thread-block clusters (compute capability 9.0+; decode attention's
// cluster kernels are launched only there): cluster_sync is a barrier over
// every thread of the cluster that makes the shared memory each block
// wrote before it visible to the others after it; dsmem maps the address
// of a variable in this block's shared memory to the same variable in the
// cluster's block rank, and lds_cluster, lds_cluster4 load through such an
// address.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
	asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ unsigned dsmem(const void* p, int rank) {
	unsigned r = smem_addr(p);
#if __CUDA_ARCH__ >= 900
	asm volatile("mapa.shared::cluster.u32 %0, %0, %1;" : "+r"(r) : "r"(rank));
#endif
	return r;
}
__device__ __forceinline__ float lds_cluster(unsigned a) {
	float v;
#if __CUDA_ARCH__ >= 900
	asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#else
	asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
	return v;
}
__device__ __forceinline__ float4 lds_cluster4(unsigned a) {
	float4 v;
#if __CUDA_ARCH__ >= 900
	asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
#else
	asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
#endif
	return v;
}
