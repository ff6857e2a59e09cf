// kiln CUDA kernels: a mixture of experts' products on the tensor cores
// (prefill, and decode steps of many rows). Appended to the GEMV module
// after gemv_tile.cu (f16 and bf16 only): moe.cu's moe_gate_up and
// moe_down as gemv_tile.cu's tiles, grouped by expert.
//
// Block (x, e, z) takes entries 64·z.. of expert e's list (moe_order's,
// or the rows 0..rows-1 of the shared expert, order null) as a tile's x
// rows, gathered from wherever they are (the epilogue's xrow), and x-th
// tile of the expert's weight rows: for gate/up, 64 outputs a tile (a
// gate row and its up row each, from the expert's two matrices: wrow), for
// down 128. Blocks past an expert's entries leave at once. Every sum is
// the tile's own (no split of K), so results do not depend on scheduling;
// stores go where moe.cu's kernels put them (h by entry, y by entry in
// f32), for moe_combine.
//
// PDL: the lists are the previous kernel's output, so every block waits
// before it reads them (and so before any copy).

#if defined(GEMV_MMA) && KILN_PART_IS(2)

#define MT_ROWS 64 // entries a tile (NT 8)

// mt_entries is expert e's entries: order[start[e]...] (count[e] of them),
// or with order null the rows 0..rows-1 (the shared expert).
__device__ __forceinline__ int mt_entries(const int* order, const int* start, const int* count, int e, int rows,
                                          const int** list) {
	if (!order) {
		*list = 0;
		return rows;
	}
	*list = order + start[e];
	return count[e];
}

// MoEGateUpOut: tile row t is entry list[i0 + t] (entry i0 + t without a
// list), whose x row is entry / div; output j pairs row j of the gate
// matrix (w) with row j of up: h[entry·F + j] = SiLU(gate_j)·up_j.
struct MoEGateUpOut {
	T* h;
	const T* up;
	const int* list;
	int i0, div, F;
	static constexpr int ROWS = 2;
	static constexpr bool LATE = true, GATHER = true;
	struct Pre {};
	__device__ __forceinline__ int units() const { return F; }
	__device__ __forceinline__ long long row(int j, int) const { return j; }
	__device__ __forceinline__ int entry(int t) const { return list ? list[i0 + t] : i0 + t; }
	__device__ __forceinline__ const T* wrow(const T* w, int j, int which, int K) const {
		return (which ? up : w) + (long long)j * K;
	}
	__device__ __forceinline__ const T* xrow(const T* x, int r, int K) const { return x + (long long)(entry(r) / div) * K; }
	__device__ __forceinline__ Pre pre(int, int) const { return Pre{}; }
	__device__ __forceinline__ void put(const Pre&, int t, int j, float g, float u) const {
		store(h + (long long)entry(t) * F + j, silu_f(g) * u);
	}
};

// MoEDownOut: tile row t is entry list[i0 + t] (i0 + t), its h row the
// entry's; y[entry·N + n] = the sum, in f32.
struct MoEDownOut {
	float* y;
	const int* list;
	int i0, N;
	static constexpr int ROWS = 1;
	static constexpr bool LATE = false, GATHER = true;
	struct Pre {};
	__device__ __forceinline__ int units() const { return N; }
	__device__ __forceinline__ long long row(int n, int) const { return n; }
	__device__ __forceinline__ int entry(int t) const { return list ? list[i0 + t] : i0 + t; }
	__device__ __forceinline__ const T* wrow(const T* w, int n, int, int K) const { return w + (long long)n * K; }
	__device__ __forceinline__ const T* xrow(const T* h, int r, int K) const { return h + (long long)entry(r) * K; }
	__device__ __forceinline__ Pre pre(int, int) const { return Pre{}; }
	__device__ __forceinline__ void put(const Pre&, int t, int n, float s, float) const { y[(long long)entry(t) * N + n] = s; }
};

// grid (ceil(inter/64), E, ceil(rows/64)), block GT_THREADS: moe_gate_up's
// h for the entries of block (·, e, z) (entry i's x row i / K). Both
// kernels wait for the kernel before them, then leave when the expert has
// no entries there, before gemv_tile_impl reads a weight: the experts kept
// in GGUF blocks are widened by the kernel before (Kernels.MoE's Widen),
// and a skipped expert's scratch holds another layer's matrix.
extern "C" __global__ void __launch_bounds__(GT_THREADS)
    moe_tile_gate_up(const T* x, const T* const* gate, const T* const* up, const int* order, const int* start, const int* count,
                     int rows, int K, int dim, int inter, T* h) {
	pdl_wait();
	const int e = blockIdx.y, i0 = MT_ROWS * blockIdx.z;
	const int* list;
	const int cnt = mt_entries(order, start, count, e, rows, &list);
	if (i0 >= cnt) return;
	gemv_tile_impl<8, 64, 4, 1>(x, gate[e], dim, imin(MT_ROWS, cnt - i0), 1, MoEGateUpOut{h, up[e], list, i0, K, inter});
}

// grid (ceil(dim/128), E, ceil(rows/64)), block GT_THREADS: moe_down's y
// for the entries of block (·, e, z).
extern "C" __global__ void __launch_bounds__(GT_THREADS)
    moe_tile_down(const T* h, const T* const* down, const int* order, const int* start, const int* count, int rows, int inter,
                  int dim, float* y) {
	pdl_wait();
	const int e = blockIdx.y, i0 = MT_ROWS * blockIdx.z;
	const int* list;
	const int cnt = mt_entries(order, start, count, e, rows, &list);
	if (i0 >= cnt) return;
	gemv_tile_impl<8, 64, 4, 1>(h, down[e], inter, imin(MT_ROWS, cnt - i0), 1, MoEDownOut{y, list, i0, dim});
}

#endif // GEMV_MMA && KILN_PART_IS(2)
