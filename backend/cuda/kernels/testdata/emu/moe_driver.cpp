// Driver of TestMoEEmulated (emu_test.go): runs moe.cu's five kernels on
// the host as kernels.MoE launches them, over random experts, and compares
// each row's output with a float64 reference (the router's logits, the
// TopK by logit, their weights, each expert's SwiGLU MLP, the shared
// expert and its sigmoid gate): every element within 2e-2 (bf16; 4e-3
// f16) of |ref| + its row's rms. Outputs must all be written, and
// every entry must reach exactly one expert's list. Prints one line per
// case and "N failed".
#include <algorithm>
#include <random>

struct Case {
	int rows, E, K, norm, dim, inter, sharedInter, sharedGate;
};

static std::vector<T> rnd_act(std::mt19937_64& rng, size_t n, float scale) {
	std::normal_distribution<float> d;
	std::vector<T> v(n);
	for (auto& e : v) e = fromf<T>(d(rng) * scale);
	return v;
}

static double dot(const T* a, const T* b, int n) {
	double s = 0;
	for (int i = 0; i < n; i++) s += (double)tof(a[i]) * tof(b[i]);
	return s;
}

// moe_route's block: as kernels.MoE launches it (512), and a smaller one.
static int moeRouteThreads = 512;

static int run(const Case& c, unsigned seed) {
	std::mt19937_64 rng(seed);
	const int R = c.rows, D = c.dim, I = c.inter, S = c.sharedInter, E = c.E, K = c.K;
	auto x = rnd_act(rng, (size_t)R * D, 1), router = rnd_act(rng, (size_t)E * D, 0.3f);
	std::vector<std::vector<T>> g(E), u(E), dn(E);
	std::vector<const T*> pg(E), pu(E), pd(E);
	for (int e = 0; e < E; e++) {
		g[e] = rnd_act(rng, (size_t)I * D, 0.2f), u[e] = rnd_act(rng, (size_t)I * D, 0.2f), dn[e] = rnd_act(rng, (size_t)D * I, 0.2f);
		pg[e] = g[e].data(), pu[e] = u[e].data(), pd[e] = dn[e].data();
	}
	auto sg = rnd_act(rng, (size_t)S * D, 0.2f), su = rnd_act(rng, (size_t)S * D, 0.2f), sd = rnd_act(rng, (size_t)D * S, 0.2f);
	auto sgate = rnd_act(rng, D, 0.3f);
	const T* psg = sg.data();
	const T* psu = su.data();
	const T* psd = sd.data();
	std::vector<int> topIdx(R * K, -7), order(R * K, -7), start(E, -7), count(E, -7);
	std::vector<float> topW(R * K, NAN), sharedW(R, NAN), y((size_t)R * K * D, NAN), ys((size_t)R * D, NAN);
	std::vector<T> h((size_t)R * K * I), hs((size_t)R * S), out((size_t)R * D);
	for (auto& v : out) v.x = 0x7fc1;
	const T* sgp = S > 0 && c.sharedGate ? sgate.data() : nullptr;
	float* shw = S > 0 && c.sharedGate ? sharedW.data() : nullptr;
	g_after_wait = [](const void*) { return false; };
	launch(dim3{(unsigned)R, 1, 1}, moeRouteThreads, [&] {
		moe_route(x.data(), router.data(), sgp, R, D, E, K, c.norm, topIdx.data(), topW.data(), shw);
	});
	launch(dim3{(unsigned)E, 1, 1}, 32, [&] { moe_order(topIdx.data(), R * K, order.data(), start.data(), count.data()); });
	launch(dim3{(unsigned)E, (unsigned)(I + 3) / 4, 1}, 128, [&] {
		moe_gate_up(x.data(), pg.data(), pu.data(), order.data(), start.data(), count.data(), R, K, D, I, h.data());
	});
	launch(dim3{(unsigned)E, (unsigned)(D + 3) / 4, 1}, 128, [&] {
		moe_down(h.data(), pd.data(), order.data(), start.data(), count.data(), R, I, D, y.data());
	});
	if (S > 0) {
		launch(dim3{1, (unsigned)(S + 3) / 4, 1}, 128, [&] {
			moe_gate_up(x.data(), &psg, &psu, nullptr, nullptr, nullptr, R, 1, D, S, hs.data());
		});
		launch(dim3{1, (unsigned)(D + 3) / 4, 1}, 128, [&] { moe_down(hs.data(), &psd, nullptr, nullptr, nullptr, R, S, D, ys.data()); });
	}
	launch(dim3{(unsigned)std::min((R * D + 255) / 256, 65535), 1, 1}, 256, [&] {
		moe_combine(y.data(), topW.data(), S > 0 ? ys.data() : nullptr, shw, R, K, D, out.data());
	});

	int bad = 0;
	// Every entry in exactly one list, each list in order.
	std::vector<int> seen(R * K, 0);
	int total = 0;
	for (int e = 0; e < E; e++) {
		if (start[e] != total) bad++, fprintf(stderr, "  expert %d starts at %d, want %d\n", e, start[e], total);
		for (int i = 0; i < count[e]; i++) {
			int en = order[start[e] + i];
			if (en < 0 || en >= R * K || topIdx[en] != e || (i > 0 && en <= order[start[e] + i - 1])) bad++;
			else seen[en]++;
		}
		total += count[e];
	}
	for (int v : seen)
		if (v != 1) bad++;
	// The float64 reference.
	double worst = 0;
	for (int r = 0; r < R; r++) {
		const T* xr = x.data() + (size_t)r * D;
		std::vector<double> lg(E), o(D, 0.0);
		for (int e = 0; e < E; e++) lg[e] = dot(xr, router.data() + (size_t)e * D, D);
		std::vector<int> idx(E);
		for (int e = 0; e < E; e++) idx[e] = e;
		std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return lg[a] > lg[b]; });
		double sum = 0;
		for (int j = 0; j < (c.norm ? K : E); j++) sum += exp(lg[idx[j]] - lg[idx[0]]);
		auto mlp = [&](const T* G, const T* U, const T* Dn, int w, double p) {
			std::vector<double> hh(w);
			for (int n = 0; n < w; n++) {
				double a = dot(xr, G + (size_t)n * D, D), b = dot(xr, U + (size_t)n * D, D);
				hh[n] = a / (1 + exp(-a)) * b;
			}
			for (int d = 0; d < D; d++) {
				double s = 0;
				for (int n = 0; n < w; n++) s += tof(Dn[(size_t)d * w + n]) * hh[n];
				o[d] += p * s;
			}
		};
		for (int j = 0; j < K; j++) {
			int e = idx[j];
			if (topIdx[r * K + j] != e) {
				bad++;
				fprintf(stderr, "  row %d choice %d: expert %d, want %d\n", r, j, topIdx[r * K + j], e);
			}
			mlp(g[e].data(), u[e].data(), dn[e].data(), I, exp(lg[e] - lg[idx[0]]) / sum);
		}
		if (S > 0) mlp(sg.data(), su.data(), sd.data(), S, c.sharedGate ? 1 / (1 + exp(-dot(xr, sgate.data(), D))) : 1);
		double ss = 0;
		for (double v : o) ss += v * v;
		double rms = sqrt(ss / D);
		for (int d = 0; d < D; d++) {
			double got = tof(out[(size_t)r * D + d]), err = fabs(got - o[d]) / (fabs(o[d]) + rms);
			double tol = std::is_same<T, bf16>::value ? 2e-2 : 4e-3;
			if (!(err <= tol)) {
				if (bad < 5) fprintf(stderr, "  row %d col %d: %g, want %g\n", r, d, got, o[d]);
				bad++;
				err = INFINITY;
			}
			worst = std::max(worst, err);
		}
	}
	printf("rows %d, %d experts, %d a row (norm %d), dim %d, width %d, shared %d (gate %d): worst %.3g, %d bad\n", R, E, K, c.norm, D,
	       I, S, c.sharedGate, worst, bad);
	fflush(stdout);
	return bad;
}

// nan_route: rows whose router logits are NaN (x NaN, or one NaN router
// row) still get K distinct experts in range.
static int nan_route() {
	const int R = 2, D = 32, E = 8, K = 3;
	std::mt19937_64 rng(5);
	auto x = rnd_act(rng, (size_t)R * D, 1), router = rnd_act(rng, (size_t)E * D, 0.3f);
	for (int i = 0; i < D; i++) x[i] = fromf<T>(NAN);       // row 0: every logit NaN
	router[(size_t)2 * D] = fromf<T>(NAN);                  // expert 2: NaN for row 1 too
	std::vector<int> topIdx(R * K, -7);
	std::vector<float> topW(R * K, 0);
	g_after_wait = [](const void*) { return false; };
	launch(dim3{(unsigned)R, 1, 1}, moeRouteThreads,
	       [&] { moe_route(x.data(), router.data(), nullptr, R, D, E, K, 1, topIdx.data(), topW.data(), nullptr); });
	int bad = 0;
	for (int r = 0; r < R; r++)
		for (int j = 0; j < K; j++) {
			int e = topIdx[r * K + j];
			bool dup = false;
			for (int i = 0; i < j; i++) dup |= topIdx[r * K + i] == e;
			if (e < 0 || e >= E || dup) {
				fprintf(stderr, "NaN logits: row %d pick %d is expert %d\n", r, j, e);
				bad++;
			}
		}
	printf("NaN logits: %d bad picks\n", bad);
	return bad != 0;
}

int main() {
	std::vector<Case> cases = {
		{1, 8, 2, 1, 64, 32, 0, 0},    // Mixtral's routing, a decode step
		{5, 16, 4, 0, 128, 48, 40, 1}, // Qwen2-MoE: the softmax over all, a gated shared expert
		{37, 64, 8, 0, 64, 16, 0, 0},  // OLMoE-like: many experts, several groups of rows
		{20, 4, 2, 1, 96, 24, 32, 0},  // a shared expert without a gate; lists past MOE_TG
		{3, 256, 8, 1, 32, 8, 0, 0},   // the most experts
		{70, 8, 1, 0, 64, 16, 0, 0},   // one expert a row, lists of many groups
	};
	int fails = 0;
	for (size_t i = 0; i < cases.size(); i++)
		if (run(cases[i], 99 + i)) fails++;
	fails += nan_route();
	moeRouteThreads = 64; // two warps: each takes several experts in turn
	for (size_t i = 0; i < cases.size(); i += 2)
		if (run(cases[i], 199 + i)) fails++;
	printf("%d failed\n", fails);
	return fails != 0;
}
