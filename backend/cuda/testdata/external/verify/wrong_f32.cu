// A wrong external decode product for kiln's tests: it multiplies each row
// of x by the weights' next row (column col+1), so the gate that checks
// every candidate against the default must reject it.
extern "C" __global__ void ext_wrong_f32(float* y, const float* x, const float* w, int t, int k, int n) {
	int warps = blockDim.x / 32, lane = threadIdx.x % 32;
	int col = blockIdx.x * warps + threadIdx.x / 32;
	if (col >= n) return;
	const float* wr = w + (long long)((col + 1) % n) * k;
	for (int r = 0; r < t; r++) {
		const float* xr = x + (long long)r * k;
		float acc = 0.f;
		for (int i = lane; i < k; i += 32) acc += xr[i] * wr[i];
		for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
		if (lane == 0) y[(long long)r * n + col] = acc;
	}
}
