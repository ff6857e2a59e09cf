// Driver of TestGEMVTileEmulated (emu_test.go): runs gemv_tile.cu's
// kernels (after prelude.h, shared.cu and gemv.cu's epilogues) on the host
// and compares them with a float64 reference: the plain product (out in
// ACT and in f32), the SwiGLU and RoPE epilogues; row counts 1 to 64 on the
// three tile widths, K of 1 to 7 stages, outputs that fill part of a tile,
// and K split over clusters of 1 to 5 blocks (blocks without a stage
// too). Outputs past the product must keep their poison; x must not be
// copied before pdl_wait.
#include <algorithm>
#include <random>
#include <string>
#include <type_traits>

static std::mt19937_64 g_rng(7);
static float randn() {
	static std::normal_distribution<float> d;
	return d(g_rng);
}
static std::vector<T> rand_act(size_t n, float scale) {
	std::vector<T> v(n);
	for (auto& e : v) e = fromf<T>(randn() * scale);
	return v;
}

static int g_fail = 0;
static double g_worst = 0;
static void check(const char* what, int i, double got, double ref, double tol) {
	double err = fabs(got - ref) / (1 + fabs(ref));
	if (err > g_worst) g_worst = err;
	if (!(err <= tol) && g_fail++ < 10) fprintf(stderr, "%s: element %d = %g, want %g\n", what, i, got, ref);
}
static double tol_act() { return std::is_same<T, bf16>::value ? 1e-2 : 2e-3; }

// Product ref[t·rows + r] of x[TT,K] and w[rows,K].
static std::vector<double> product(const std::vector<T>& x, const std::vector<T>& w, int TT, int K, int rows) {
	std::vector<double> ref((size_t)TT * rows);
	for (int t = 0; t < TT; t++)
		for (int r = 0; r < rows; r++) {
			double s = 0;
			for (int k = 0; k < K; k++) s += (double)tof(x[(size_t)t * K + k]) * tof(w[(size_t)r * K + k]);
			ref[(size_t)t * rows + r] = s;
		}
	return ref;
}
static double rnd64(double v) { return tof(fromf<T>((float)v)); }

static int nt_for(int TT) { return TT <= 16 ? 2 : TT <= 32 ? 4 : 8; }

// launch runs the grid: tiles clusters of splits blocks, x the buffer that
// must wait for pdl_wait.
static void launch(int tiles, int splits, const void* x, size_t xbytes, const std::function<void()>& kernel) {
	g_after_wait = [=](const void* src) { return src >= x && (const char*)src < (const char*)x + xbytes; };
	for (int c = 0; c < tiles; c++) {
		memset(g_smem, 0xff, sizeof(g_smem));
		run_cluster(dim3{(unsigned)(c * splits), 0, 0}, splits, kernel);
	}
}

typedef void (*PlainFn)(const T*, const T*, void*, int, int, int, int, int);
static PlainFn plain_fn(int nt, int bk) {
	if (bk == 128) return nt == 2 ? gemv_tile_2_128_4_1 : nt == 4 ? gemv_tile_4_128_3_1 : gemv_tile_8_128_3_1;
	return nt == 2 ? gemv_tile_2_64_4_1 : nt == 4 ? gemv_tile_4_64_4_1 : gemv_tile_8_64_4_1;
}

static PlainFn plain_fn_r64(int nt) { return nt == 2 ? gemv_tile_r64_2_64_4_1 : nt == 4 ? gemv_tile_r64_4_64_4_1 : gemv_tile_r64_8_64_4_1; }

// plain runs the plain product on tiles of rows (128, or the sweep's 64).
static void plain(int nt, int TT, int K, int N, int splits, bool outF32, int bk = 64, int rows = 128) {
	auto x = rand_act((size_t)TT * K, 1 / sqrtf((float)K)), w = rand_act((size_t)N * K, 1);
	auto ref = product(x, w, TT, K, N);
	const int total = TT * N + 64, tiles = (N + rows - 1) / rows;
	std::vector<float> o32(total, NAN);
	std::vector<T> oact(total, fromf<T>(NAN));
	void* out = outF32 ? (void*)o32.data() : (void*)oact.data();
	PlainFn f = rows == 64 ? plain_fn_r64(nt) : plain_fn(nt, bk);
	launch(tiles, splits, x.data(), x.size() * sizeof(T), [&] { f(x.data(), w.data(), out, K, N, TT, outF32, splits); });
	char what[128];
	snprintf(what, sizeof what, "gemv_tile_%d BK=%d rows=%d T=%d K=%d N=%d splits=%d outF32=%d", nt, bk, rows, TT, K, N, splits, outF32);
	for (int i = 0; i < total; i++) {
		double got = outF32 ? o32[i] : tof(oact[i]);
		if (i >= TT * N) {
			if (!std::isnan(got) && g_fail++ < 10) fprintf(stderr, "%s: element %d past the product written\n", what, i);
			continue;
		}
		check(what, i, got, outF32 ? ref[i] : rnd64(ref[i]), outF32 ? 1e-5 : tol_act());
	}
}

static void swiglu(int TT, int K, int F, int splits) {
	const int nt = nt_for(TT);
	auto x = rand_act((size_t)TT * K, 1 / sqrtf((float)K)), w = rand_act((size_t)2 * F * K, 1);
	auto ref = product(x, w, TT, K, 2 * F);
	const int total = TT * F + 64, tiles = (F + 63) / 64;
	std::vector<T> out(total, fromf<T>(NAN));
	launch(tiles, splits, x.data(), x.size() * sizeof(T), [&] {
		if (nt == 2) gemv_tile_swiglu_2_64_4_1(x.data(), w.data(), out.data(), K, F, TT, splits);
		if (nt == 4) gemv_tile_swiglu_4_64_4_1(x.data(), w.data(), out.data(), K, F, TT, splits);
		if (nt == 8) gemv_tile_swiglu_8_64_4_1(x.data(), w.data(), out.data(), K, F, TT, splits);
	});
	char what[128];
	snprintf(what, sizeof what, "gemv_tile_swiglu_%d T=%d K=%d F=%d splits=%d", nt, TT, K, F, splits);
	for (int i = 0; i < total; i++) {
		double got = tof(out[i]);
		if (i >= TT * F) {
			if (!std::isnan(got) && g_fail++ < 10) fprintf(stderr, "%s: element %d past the output written\n", what, i);
			continue;
		}
		const int t = i / F, j = i % F;
		double g = rnd64(ref[(size_t)t * 2 * F + j]), u = rnd64(ref[(size_t)t * 2 * F + F + j]);
		check(what, i, got, rnd64(g / (1 + exp(-g)) * u), tol_act());
	}
}

static void rope(int TT, int K, int H, int KH, int hd, int splits, bool il) {
	const int nt = nt_for(TT), rows = (H + 2 * KH) * hd, units = rows / 2, width = KH * hd, maxPos = 50;
	const int nslot = TT + 3;
	auto x = rand_act((size_t)TT * K, 1 / sqrtf((float)K)), w = rand_act((size_t)rows * K, 1);
	auto ref = product(x, w, TT, K, rows);
	std::vector<float> table((size_t)maxPos * hd);
	for (int p = 0; p < maxPos; p++)
		for (int i = 0; i < hd / 2; i++) {
			double a = p * pow(10000.0, -2.0 * i / hd);
			table[(size_t)p * hd + i] = (float)cos(a);
			table[(size_t)p * hd + hd / 2 + i] = (float)sin(a);
		}
	std::vector<int> pos(TT), slots(TT);
	std::vector<int> perm(nslot);
	for (int i = 0; i < nslot; i++) perm[i] = i;
	std::shuffle(perm.begin(), perm.end(), g_rng);
	for (int t = 0; t < TT; t++) pos[t] = (int)(g_rng() % maxPos), slots[t] = perm[t];
	std::vector<T> q((size_t)TT * H * hd, fromf<T>(NAN)), kc = rand_act((size_t)nslot * width, 1), vc = rand_act((size_t)nslot * width, 1);
	const std::vector<T> kc0 = kc, vc0 = vc;
	launch((units + 63) / 64, splits, x.data(), x.size() * sizeof(T), [&] {
		auto f = nt == 2 ? gemv_tile_rope_2_64_4_1 : nt == 4 ? gemv_tile_rope_4_64_4_1 : gemv_tile_rope_8_64_4_1;
		f(x.data(), w.data(), K, TT, splits, q.data(), kc.data(), vc.data(), pos.data(), slots.data(), table.data(), H, KH, hd, il);
	});
	char what[160];
	snprintf(what, sizeof what, "gemv_tile_rope_%d T=%d K=%d heads=%d/%d hd=%d splits=%d interleaved=%d", nt, TT, K, H, KH, hd, splits, il);
	std::vector<double> qr(q.size()), kr(kc.size()), vr(vc.size());
	for (size_t i = 0; i < kr.size(); i++) kr[i] = tof(kc0[i]), vr[i] = tof(vc0[i]);
	for (int t = 0; t < TT; t++)
		for (int h = 0; h < H + 2 * KH; h++)
			for (int i = 0; i < hd / 2; i++) {
				const int e0 = il ? 2 * i : i, e1 = il ? 2 * i + 1 : i + hd / 2;
				double x1 = rnd64(ref[(size_t)t * rows + h * hd + e0]), x2 = rnd64(ref[(size_t)t * rows + h * hd + e1]);
				if (h >= H + KH) {
					size_t o = (size_t)slots[t] * width + (h - H - KH) * hd;
					vr[o + e0] = x1, vr[o + e1] = x2;
					continue;
				}
				double c = table[(size_t)pos[t] * hd + i], s = table[(size_t)pos[t] * hd + hd / 2 + i];
				double r1 = rnd64(x1 * c - x2 * s), r2 = rnd64(x2 * c + x1 * s);
				if (h < H) qr[((size_t)t * H + h) * hd + e0] = r1, qr[((size_t)t * H + h) * hd + e1] = r2;
				else {
					size_t o = (size_t)slots[t] * width + (h - H) * hd;
					kr[o + e0] = r1, kr[o + e1] = r2;
				}
			}
	std::string wq = std::string(what) + " q", wk = std::string(what) + " k cache", wv = std::string(what) + " v cache";
	for (size_t i = 0; i < q.size(); i++) check(wq.c_str(), (int)i, tof(q[i]), qr[i], tol_act());
	for (size_t i = 0; i < kc.size(); i++) check(wk.c_str(), (int)i, tof(kc[i]), kr[i], tol_act());
	for (size_t i = 0; i < vc.size(); i++) check(wv.c_str(), (int)i, tof(vc[i]), vr[i], tol_act());
}

// folded runs the tile kernels with a norm folded in: gemv_tile_norm_…
// (x rows of rms about 3, against the product divided by each row's rms),
// gemv_tile_add_… (against the product plus a residual, rounded once) and
// gemv_tile_swiglu_norm_… (against SwiGLU of the divided product).
static void folded(int TT, int K, int N, int splits) {
	const int nt = nt_for(TT), total = TT * N + 64, tiles = (N + 127) / 128;
	const float eps = 1e-5f;
	auto x = rand_act((size_t)TT * K, 3), w = rand_act((size_t)N * K, 1 / sqrtf((float)K)), add = rand_act((size_t)TT * N, 1);
	auto ref = product(x, w, TT, K, N);
	std::vector<double> inv(TT);
	for (int t = 0; t < TT; t++) {
		double ss = 0;
		for (int k = 0; k < K; k++) ss += (double)tof(x[(size_t)t * K + k]) * tof(x[(size_t)t * K + k]);
		inv[t] = 1 / sqrt(ss / K + eps);
	}
	std::vector<T> on(total, fromf<T>(NAN)), oa(total, fromf<T>(NAN));
	launch(tiles, splits, x.data(), x.size() * sizeof(T), [&] {
		auto fn = nt == 2 ? gemv_tile_norm_2_64_4_1 : nt == 4 ? gemv_tile_norm_4_64_4_1 : gemv_tile_norm_8_64_4_1;
		fn(x.data(), w.data(), on.data(), K, N, TT, 0, splits, eps);
	});
	launch(tiles, splits, x.data(), x.size() * sizeof(T), [&] {
		auto fa = nt == 2 ? gemv_tile_add_2_64_4_1 : nt == 4 ? gemv_tile_add_4_64_4_1 : gemv_tile_add_8_64_4_1;
		fa(x.data(), w.data(), oa.data(), K, N, TT, splits, add.data());
	});
	char what[128];
	snprintf(what, sizeof what, "gemv_tile_norm/add_%d T=%d K=%d N=%d splits=%d", nt, TT, K, N, splits);
	for (int i = 0; i < total; i++) {
		if (i >= TT * N) {
			if ((!std::isnan(tof(on[i])) || !std::isnan(tof(oa[i]))) && g_fail++ < 10) fprintf(stderr, "%s: element %d past the product written\n", what, i);
			continue;
		}
		check(what, i, tof(on[i]), rnd64(ref[i] * inv[i / N]), tol_act());
		check(what, i, tof(oa[i]), rnd64(ref[i] + tof(add[i])), tol_act());
	}
	const int F = N / 2, ftotal = TT * F + 64;
	std::vector<T> os(ftotal, fromf<T>(NAN));
	launch((F + 63) / 64, splits, x.data(), x.size() * sizeof(T), [&] {
		auto fs = nt == 2 ? gemv_tile_swiglu_norm_2_64_4_1 : nt == 4 ? gemv_tile_swiglu_norm_4_64_4_1 : gemv_tile_swiglu_norm_8_64_4_1;
		fs(x.data(), w.data(), os.data(), K, F, TT, splits, eps);
	});
	for (int i = 0; i < ftotal; i++) {
		if (i >= TT * F) {
			if (!std::isnan(tof(os[i])) && g_fail++ < 10) fprintf(stderr, "%s swiglu: element %d past the output written\n", what, i);
			continue;
		}
		const int t = i / F, j = i % F;
		double g = rnd64(ref[(size_t)t * N + j] * inv[t]), u = rnd64(ref[(size_t)t * N + F + j] * inv[t]);
		check(what, i, tof(os[i]), rnd64(g / (1 + exp(-g)) * u), tol_act());
	}
}

int main() {
	struct P { int nt, TT, K, N, splits; };
	for (P p : {P{2, 9, 192, 200, 1}, P{2, 16, 448, 128, 3}, P{2, 3, 64, 37, 1}, P{4, 17, 64, 37, 2}, P{4, 32, 192, 256, 2},
	            P{8, 33, 448, 200, 5}, P{8, 64, 192, 128, 1}, P{8, 9, 64, 128, 4}})
		for (bool f32 : {false, true}) plain(p.nt, p.TT, p.K, p.N, p.splits, f32);
	// The sweep's configurations of 128 columns a stage.
	plain(2, 16, 384, 200, 2, false, 128);
	plain(4, 20, 128, 128, 1, true, 128);
	plain(8, 64, 640, 130, 3, false, 128);
	// The sweep's tiles of 64 rows.
	plain(2, 9, 192, 200, 1, false, 64, 64);
	plain(4, 20, 448, 100, 3, true, 64, 64);
	plain(8, 64, 192, 64, 2, false, 64, 64);
	plain(8, 33, 640, 37, 5, true, 64, 64);
	swiglu(12, 192, 70, 1);
	swiglu(64, 192, 70, 3);
	swiglu(40, 64, 64, 2);
	for (bool il : {false, true}) {
		rope(20, 128, 2, 1, 64, 2, il);
		rope(64, 192, 3, 1, 32, 1, il);
	}
	// A norm folded in: the three tile widths, K split over 1 to 5 blocks
	// (a block without a stage among them), outputs that fill part of a tile.
	folded(9, 192, 200, 1);
	folded(16, 448, 130, 3);
	folded(24, 64, 256, 2);
	folded(33, 192, 128, 5);
	folded(64, 256, 260, 2);
	printf("gemv tile kernels (%s): worst relative error %.3g, %d failures\n", std::is_same<T, bf16>::value ? "bf16" : "f16", g_worst,
	       g_fail);
	return g_fail ? 1 : 0;
}
