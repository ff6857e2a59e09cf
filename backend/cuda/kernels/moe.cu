// kiln CUDA kernels: a mixture of experts (ir.MoE). Appended to kernels.cu
// by kernels.go (one NVRTC source), after the common kernels.
//
// A step's MoE layer is five launches, every sum in a fixed order (no
// atomics), so that a step's result does not depend on scheduling:
//
//   moe_route    the router's logits, each row's TopK experts and weights,
//                and the shared expert's gate;
//   moe_order    the entries (row·K + j: row's j-th choice) grouped by
//                expert, in order;
//   moe_gate_up  each expert's SiLU(gate·x)·(up·x) for the rows routed to
//                it, reading the expert's rows once for up to MOE_TG rows;
//   moe_down     each expert's down product of those;
//   moe_combine  each row's weighted sum of its experts' outputs, plus the
//                shared expert's.
//
// The shared expert (Qwen2-MoE) runs through moe_gate_up and moe_down as one
// expert every row goes to (order null: entry i is row i).
//
// Weights are in the activation dtype, one matrix an expert, found through
// device tables of pointers; widths are multiples of 8 (16-byte loads).

#if KILN_PART_IS(0)

#define MOE_MAX_E 256 // experts a router may have
#define MOE_TG 8      // rows an expert's warp takes at once

// grid (rows), a block of up to 32 warps: logits x[r]·router[e] for every
// expert (a warp each, in turn: at one row a step the router's rows are
// read by the whole block at once), then warp 0 takes the TopK (the larger
// logit first, the lower index among equals; lane l holds the choices of
// experts l, l + 32, ...) and their weights, the softmax of their logits
// (norm) or their probabilities under the softmax over every expert (each
// lane's share summed in order, then over the warp); with sgate,
// sharedW[r] = sigmoid(x[r]·sgate). A NaN logit counts as −∞, so that the
// TopK are always K distinct experts.
extern "C" __global__ void moe_route(const T* x, const T* router, const T* sgate, int rows, int dim, int E, int K, int norm,
                                     int* topIdx, float* topW, float* sharedW) {
	pdl_enter();
	__shared__ float lg[MOE_MAX_E + 1];
	int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (r >= rows) return;
	const T* xr = x + (long long)r * dim;
	for (int e = warp; e < E + (sgate ? 1 : 0); e += blockDim.x >> 5) {
		const T* w = e < E ? router + (long long)e * dim : sgate;
		float d = 0.f;
		for (int c = lane * VEC; c < dim; c += 32 * VEC) {
			float fx[VEC], fw[VEC];
			load16(xr + c, fx);
			load16(w + c, fw);
#pragma unroll
			for (int i = 0; i < VEC; i++) d += fx[i] * fw[i];
		}
		d = warp_sum(d);
		if (lane == 0) lg[e] = e < E && d != d ? NEG_INF : d; // a NaN logit ranks last: the order stays total
	}
	__syncthreads();
	if (warp != 0) return;
	unsigned chosen = 0; // bit j: expert lane + 32·j taken
	int first = 0;
	float sum = 0.f;
	for (int j = 0; j < K; j++) {
		int bi = -1;
		float bv = 0.f;
		for (int e = lane, q = 0; e < E; e += 32, q++)
			if (!(chosen >> q & 1) && (bi < 0 || lg[e] > bv)) bi = e, bv = lg[e];
#pragma unroll
		for (int o = 16; o; o >>= 1) {
			int oi = __shfl_xor_sync(FULL_MASK, bi, o);
			float ov = __shfl_xor_sync(FULL_MASK, bv, o);
			if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bi = oi, bv = ov;
		}
		if ((bi & 31) == lane) chosen |= 1u << (bi >> 5);
		if (j == 0) first = bi;
		float p = expf(lg[bi] - lg[first]);
		if (lane == 0) {
			topIdx[r * K + j] = bi;
			topW[r * K + j] = p;
		}
		if (norm) sum += p;
	}
	if (!norm) {
		for (int e = lane; e < E; e += 32) sum += expf(lg[e] - lg[first]);
		sum = warp_sum(sum);
	}
	__syncwarp();
	if (lane == 0) {
		for (int j = 0; j < K; j++) topW[r * K + j] /= sum;
		if (sgate) sharedW[r] = 1.f / (1.f + expf(-lg[E]));
	}
}

// grid (E), block 32: expert e's entries (i with topIdx[i] == e), in order,
// at order[start[e]...], start[e] the entries of the experts before it;
// count[e] of them.
extern "C" __global__ void moe_order(const int* topIdx, int entries, int* order, int* start, int* count) {
	pdl_enter();
	int e = blockIdx.x, lane = threadIdx.x;
	int before = 0, n = 0;
	for (int base = 0; base < entries; base += 32) {
		int i = base + lane;
		int v = i < entries ? topIdx[i] : -1;
		before += __popc(__ballot_sync(FULL_MASK, v >= 0 && v < e));
		n += __popc(__ballot_sync(FULL_MASK, v == e));
	}
	int at = before;
	for (int base = 0; base < entries; base += 32) {
		int i = base + lane;
		bool hit = i < entries && topIdx[i] == e;
		unsigned b = __ballot_sync(FULL_MASK, hit);
		if (hit) order[at + __popc(b & ((1u << lane) - 1))] = i;
		at += __popc(b);
	}
	if (lane == 0) {
		start[e] = before;
		count[e] = n;
	}
}

// moe_entries is expert e's entries: order[start[e]...] (count[e] of them),
// or with order null the rows 0..rows-1 (the shared expert).
__device__ __forceinline__ int moe_entries(const int* order, const int* start, const int* count, int e, int rows,
                                           const int** list) {
	if (!order) {
		*list = 0;
		return rows;
	}
	*list = order + start[e];
	return count[e];
}

// grid (E, ceil(inter/4)), block 128: warp w computes row n = 4·y + w of
// expert e's gate and up matrices against the x rows of its entries
// (entry i is row i / K), MOE_TG at a time, and h[i·inter + n] =
// SiLU(gate·x)·(up·x).
extern "C" __global__ void moe_gate_up(const T* x, const T* const* gate, const T* const* up, const int* order,
                                       const int* start, const int* count, int rows, int K, int dim, int inter, T* h) {
	pdl_enter();
	int e = blockIdx.x, n = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (n >= inter) return;
	const int* list;
	int cnt = moe_entries(order, start, count, e, rows, &list);
	const T* g = gate[e] + (long long)n * dim;
	const T* u = up[e] + (long long)n * dim;
	for (int i0 = 0; i0 < cnt; i0 += MOE_TG) {
		int m = imin(MOE_TG, cnt - i0);
		float ag[MOE_TG], au[MOE_TG];
#pragma unroll
		for (int k = 0; k < MOE_TG; k++) ag[k] = au[k] = 0.f;
		for (int c = lane * VEC; c < dim; c += 32 * VEC) {
			float fg[VEC], fu[VEC];
			load16(g + c, fg);
			load16(u + c, fu);
#pragma unroll
			for (int k = 0; k < MOE_TG; k++) {
				if (k < m) {
					int i = list ? list[i0 + k] : i0 + k;
					float fx[VEC];
					load16(x + (long long)(i / K) * dim + c, fx);
#pragma unroll
					for (int v = 0; v < VEC; v++) {
						ag[k] += fg[v] * fx[v];
						au[k] += fu[v] * fx[v];
					}
				}
			}
		}
#pragma unroll
		for (int k = 0; k < MOE_TG; k++) {
			float sg = warp_sum(ag[k]), su = warp_sum(au[k]);
			if (lane == 0 && k < m) {
				int i = list ? list[i0 + k] : i0 + k;
				h[(long long)i * inter + n] = fromf<T>(silu_f(sg) * su);
			}
		}
	}
}

// grid (E, ceil(dim/4)), block 128: warp w computes row d = 4·y + w of
// expert e's down matrix against h of its entries, MOE_TG at a time:
// y[i·dim + d] (f32).
extern "C" __global__ void moe_down(const T* h, const T* const* down, const int* order, const int* start, const int* count,
                                    int rows, int inter, int dim, float* y) {
	pdl_enter();
	int e = blockIdx.x, d = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (d >= dim) return;
	const int* list;
	int cnt = moe_entries(order, start, count, e, rows, &list);
	const T* w = down[e] + (long long)d * inter;
	for (int i0 = 0; i0 < cnt; i0 += MOE_TG) {
		int m = imin(MOE_TG, cnt - i0);
		float acc[MOE_TG];
#pragma unroll
		for (int k = 0; k < MOE_TG; k++) acc[k] = 0.f;
		for (int c = lane * VEC; c < inter; c += 32 * VEC) {
			float fw[VEC];
			load16(w + c, fw);
#pragma unroll
			for (int k = 0; k < MOE_TG; k++) {
				if (k < m) {
					int i = list ? list[i0 + k] : i0 + k;
					float fh[VEC];
					load16(h + (long long)i * inter + c, fh);
#pragma unroll
					for (int v = 0; v < VEC; v++) acc[k] += fw[v] * fh[v];
				}
			}
		}
#pragma unroll
		for (int k = 0; k < MOE_TG; k++) {
			float s = warp_sum(acc[k]);
			if (lane == 0 && k < m) y[(long long)(list ? list[i0 + k] : i0 + k) * dim + d] = s;
		}
	}
}

// out[r, d] = Σ_j topW[r·K + j]·y[(r·K + j)·dim + d] (j in order), plus
// sharedW[r]·ys[r·dim + d] (sharedW null: 1) when ys is given.
extern "C" __global__ void moe_combine(const float* y, const float* topW, const float* ys, const float* sharedW, int rows,
                                       int K, int dim, T* out) {
	pdl_enter();
	GRID_STRIDE(i, (long long)rows * dim) {
		long long r = i / dim, d = i % dim;
		float s = 0.f;
		for (int j = 0; j < K; j++) s += topW[r * K + j] * y[(r * K + j) * dim + d];
		if (ys) s += (sharedW ? sharedW[r] : 1.f) * ys[i];
		out[i] = fromf<T>(s);
	}
}

#endif // KILN_PART_IS(0)
