// An external decode product for kiln's tests (docs/EXTERNAL_KERNELS.md):
// y[t,n] = x[t,k]·w[n,k]ᵀ with bf16 operands (passed as their bits),
// summed in float32, written as f32; one warp an output column.
__device__ __forceinline__ float from_bf16(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
__device__ __forceinline__ unsigned short to_bf16(float f) {
	unsigned u = __float_as_uint(f);
	u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
	return (unsigned short)(u >> 16);
}
extern "C" __global__ void ext_gemv_bf16_f32(float* y, const unsigned short* x, const unsigned short* w, int t, int k, int n) {
	int warps = blockDim.x / 32, lane = threadIdx.x % 32;
	int col = blockIdx.x * warps + threadIdx.x / 32;
	if (col >= n) return;
	const unsigned short* wr = w + (long long)col * k;
	for (int r = 0; r < t; r++) {
		const unsigned short* xr = x + (long long)r * k;
		float acc = 0.f;
		for (int i = lane; i < k; i += 32) acc += from_bf16(xr[i]) * from_bf16(wr[i]);
		for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
		if (lane == 0) y[(long long)r * n + col] = acc;
	}
}
