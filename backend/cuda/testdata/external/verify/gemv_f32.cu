// An external decode product for kiln's tests (docs/EXTERNAL_KERNELS.md):
// y[t,n] = x[t,k]·w[n,k]ᵀ in float32, one warp an output column, every
// row in turn. Plain on purpose: it is correct, not fast.
extern "C" __global__ void ext_gemv_f32(float* y, const float* x, const float* w, int t, int k, int n) {
	int warps = blockDim.x / 32, lane = threadIdx.x % 32;
	int col = blockIdx.x * warps + threadIdx.x / 32;
	if (col >= n) return;
	const float* wr = w + (long long)col * k;
	for (int r = 0; r < t; r++) {
		const float* xr = x + (long long)r * k;
		float acc = 0.f;
		for (int i = lane; i < k; i += 32) acc += xr[i] * wr[i];
		for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
		if (lane == 0) y[(long long)r * n + col] = acc;
	}
}
