// Driver of TestMoETileEmulated (emu_test.go): runs moe_tile.cu's kernels
// (moe_tile_gate_up, moe_tile_down, on gemv_tile.cu's tiles) on the host
// over random experts and random routings, with the lists as moe_order
// makes them (entries grouped by expert, in order), and compares them with
// a float64 reference: h[entry] = SiLU(gate·x)·(up·x) of the entry's row
// and expert within 1e-2 (bf16; 2e-3 f16) of 1 + |ref|, and y[entry] =
// down·h (of the kernel's h) within 1e-5 relative. Experts with no entries,
// with more entries than a tile, and the shared expert (no lists: every
// row) are covered; every entry must be written and nothing past them, and
// no block may copy x or h before pdl_wait. Prints one line per case and
// "N failed".
#include <algorithm>
#include <random>

static std::mt19937_64 g_rng(11);
static std::vector<T> rand_act(size_t n, float scale) {
	std::normal_distribution<float> d;
	std::vector<T> v(n);
	for (auto& e : v) e = fromf<T>(d(g_rng) * scale);
	return v;
}

// launch runs body as every block of grid (one at a time), in the buffer
// (the previous kernel's output) no copy may read before pdl_wait.
static void launch(dim3 grid, const void* in, size_t bytes, const std::function<void()>& body) {
	g_threads = GT_THREADS;
	gridDim = grid;
	blockDim = dim3{GT_THREADS, 1, 1};
	g_after_wait = [=](const void* src) { return src >= in && (const char*)src < (const char*)in + bytes; };
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				memset(g_smem, 0xff, sizeof(g_smem));
				run_block(dim3{x, y, z}, body);
			}
}

static int g_failed = 0;

// run: rows rows of dim, E experts of inter rows, K a row (skew: most
// entries to expert 0), or the shared expert (E 0: every row, K 1).
static void run(int rows, int E, int K, int dim, int inter, bool skew) {
	const bool shared = E == 0;
	const int experts = shared ? 1 : E, k = shared ? 1 : K, entries = rows * k;
	auto x = rand_act((size_t)rows * dim, 1);
	std::vector<std::vector<T>> g(experts), u(experts), dn(experts);
	std::vector<const T*> pg(experts), pu(experts), pd(experts);
	for (int e = 0; e < experts; e++) {
		g[e] = rand_act((size_t)inter * dim, 1 / sqrtf((float)dim)), u[e] = rand_act((size_t)inter * dim, 1 / sqrtf((float)dim));
		dn[e] = rand_act((size_t)dim * inter, 1 / sqrtf((float)inter));
		pg[e] = g[e].data(), pu[e] = u[e].data(), pd[e] = dn[e].data();
	}
	// Each row's K distinct experts; the lists as moe_order makes them.
	std::vector<int> top(entries);
	for (int r = 0; r < rows; r++) {
		std::vector<int> perm(experts);
		for (int e = 0; e < experts; e++) perm[e] = e;
		std::shuffle(perm.begin(), perm.end(), g_rng);
		if (skew) std::iter_swap(perm.begin(), std::find(perm.begin(), perm.end(), 0));
		for (int j = 0; j < k; j++) top[r * k + j] = perm[j];
	}
	std::vector<int> order, start(experts), count(experts);
	for (int e = 0; e < experts; e++) {
		start[e] = (int)order.size();
		for (int i = 0; i < entries; i++)
			if (top[i] == e) order.push_back(i);
		count[e] = (int)order.size() - start[e];
	}
	const int* po = shared ? nullptr : order.data();
	const int* ps = shared ? nullptr : start.data();
	const int* pc = shared ? nullptr : count.data();
	const int extra = 64;
	std::vector<T> h((size_t)entries * inter + extra, fromf<T>(NAN));
	std::vector<float> y((size_t)entries * dim + extra, NAN);
	const unsigned z = (rows + 63) / 64;
	launch(dim3{(unsigned)((inter + 63) / 64), (unsigned)experts, z}, x.data(), x.size() * sizeof(T),
	       [&] { moe_tile_gate_up(x.data(), pg.data(), pu.data(), po, ps, pc, rows, k, dim, inter, h.data()); });
	launch(dim3{(unsigned)((dim + 127) / 128), (unsigned)experts, z}, h.data(), h.size() * sizeof(T),
	       [&] { moe_tile_down(h.data(), pd.data(), po, ps, pc, rows, inter, dim, y.data()); });
	int bad = 0;
	double worst = 0;
	const double tol = std::is_same<T, bf16>::value ? 1e-2 : 2e-3;
	auto fail = [&](const char* what, int i, double got, double want) {
		if (bad++ < 5) fprintf(stderr, "  %s %d: %g, want %g\n", what, i, got, want);
	};
	for (int i = 0; i < entries; i++) {
		const int e = top[i], r = i / k;
		for (int j = 0; j < inter; j++) {
			double gs = 0, us = 0;
			for (int c = 0; c < dim; c++) {
				double xv = tof(x[(size_t)r * dim + c]);
				gs += xv * tof(g[e][(size_t)j * dim + c]), us += xv * tof(u[e][(size_t)j * dim + c]);
			}
			const double want = gs / (1 + exp(-gs)) * us, got = tof(h[(size_t)i * inter + j]);
			const double err = fabs(got - want) / (1 + fabs(want));
			worst = std::max(worst, err);
			if (!(err <= tol)) fail("h", i * inter + j, got, want);
		}
		for (int d = 0; d < dim; d++) {
			double s = 0, mag = 0;
			for (int c = 0; c < inter; c++) {
				double t = tof(dn[e][(size_t)d * inter + c]) * tof(h[(size_t)i * inter + c]);
				s += t, mag += fabs(t);
			}
			const double got = y[(size_t)i * dim + d];
			if (!(fabs(got - s) <= 1e-5 * (1 + mag))) fail("y", i * dim + d, got, s);
		}
	}
	for (int i = 0; i < extra; i++) {
		if (!std::isnan(tof(h[(size_t)entries * inter + i]))) fail("h past the entries", i, tof(h[(size_t)entries * inter + i]), NAN);
		if (!std::isnan(y[(size_t)entries * dim + i])) fail("y past the entries", i, y[(size_t)entries * dim + i], NAN);
	}
	printf("rows %d experts %d top %d dim %d inter %d%s%s: worst h error %.3g, %d bad\n", rows, E, K, dim, inter, shared ? " (shared)" : "",
	       skew ? " skewed" : "", worst, bad);
	if (bad) g_failed++;
}

int main() {
	run(5, 4, 2, 64, 64, false);
	run(40, 8, 2, 128, 192, false);
	run(100, 4, 2, 64, 128, true); // expert 0: 100 entries, two tiles
	run(130, 16, 4, 64, 64, false); // three tiles of rows, experts without entries likely
	run(3, 64, 1, 64, 64, false);  // most experts without entries
	run(70, 0, 0, 128, 64, false);  // the shared expert: every row, two tiles
	printf("%d failed\n", g_failed);
	return g_failed ? 1 : 0;
}
