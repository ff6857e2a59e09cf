// Driver of TestFoldKernelsEmulated (emu_test.go): runs, on the host, the
// kernels of a norm folded into the products around it (swiglu_packed_n,
// rope_qkv_write_n, fold_gain; backend/cuda/normfold.go), and the plain
// readers that share their code (swiglu_packed_v, rope_qkv_write and
// rope_qkv_write_r, without scales, and the two RoPE readers with an FP8
// product's scales), as kernels.go launches them, against a
// float64 reference (every element within 2e-2
// for bf16, 4e-3 for f16, of |ref| + the output's rms; fold_gain bit for
// bit), and the dequantization of a table of experts' matrices
// (dequant_q8_0 and dequant_q4_k with srcs) against the same kernels run
// matrix by matrix, bit for bit, the matrices of experts without entries
// left as they were. Prints one line per case and "N failed".
#include <algorithm>
#include <random>

static const double kTol = std::is_same<T, bf16>::value ? 2e-2 : 4e-3;

// rowChunks is kernels.go's grid of the RowRMS readers.
static dim3 rowChunks(int units, int per, int rows) { return dim3{(unsigned)std::max(1, (units + 256 * per - 1) / (256 * per)), (unsigned)rows, 1}; }

// Rows of dim at a scale of their own each (0.1 to 30), as residuals.
static std::vector<T> rows_at(std::mt19937_64& rng, int rows, int dim) {
	std::normal_distribution<float> d;
	std::uniform_real_distribution<double> u(0, 1);
	std::vector<T> v((size_t)rows * dim);
	for (int r = 0; r < rows; r++) {
		float s = (float)(0.1 * pow(300, u(rng)));
		for (int i = 0; i < dim; i++) v[(size_t)r * dim + i] = fromf<T>(d(rng) * s);
	}
	return v;
}

static std::vector<double> inv_rms(const std::vector<T>& nx, int rows, int dim, double eps) {
	std::vector<double> inv(rows);
	for (int r = 0; r < rows; r++) {
		double ss = 0;
		for (int i = 0; i < dim; i++) ss += (double)tof(nx[(size_t)r * dim + i]) * tof(nx[(size_t)r * dim + i]);
		inv[r] = 1 / sqrt(ss / dim + eps);
	}
	return inv;
}

// within counts the elements of got off ref by more than kTol of |ref| +
// rms(ref), printing the first few.
static int within(const char* what, const std::vector<double>& ref, const T* got) {
	double ss = 0;
	for (double v : ref) ss += v * v;
	const double rms = sqrt(ss / std::max<size_t>(ref.size(), 1)) + 1e-30;
	int bad = 0;
	double worst = 0;
	for (size_t i = 0; i < ref.size(); i++) {
		double g = tof(got[i]), e = fabs(g - ref[i]) / (fabs(ref[i]) + rms);
		if (!(e <= kTol)) {
			if (bad < 5) fprintf(stderr, "  %s [%zu] = %g, want %g\n", what, i, g, ref[i]);
			bad++;
			e = INFINITY;
		}
		worst = std::max(worst, e);
	}
	printf("%s: worst %.3g, %d bad\n", what, worst, bad);
	return bad;
}

// ewGrid is kernels.go's grid of the elementwise kernels.
static dim3 ewGrid(long long n) { return dim3{(unsigned)std::max(1LL, std::min((n + 255) / 256, 65535LL)), 1, 1}; }

// swiglu_case runs swiglu_packed_n (folded) or swiglu_packed_v (its rows
// not divided: inv 1).
static int swiglu_case(int rows, int dim, int n, bool folded, unsigned seed) {
	std::mt19937_64 rng(seed);
	const float eps = 1e-5f;
	auto nx = rows_at(rng, rows, dim);
	std::normal_distribution<float> d;
	std::vector<T> gu((size_t)rows * 2 * n), out((size_t)rows * n);
	for (auto& v : gu) v = fromf<T>(d(rng) * 20);
	for (auto& v : out) v.x = 0x7fc1;
	const int nv = n / VEC;
	if (folded) {
		launch(rowChunks(nv, 2, rows), 256, [&] { swiglu_packed_n(gu.data(), nx.data(), dim, eps, out.data(), nv); });
	} else {
		launch(ewGrid((long long)rows * nv), 256, [&] { swiglu_packed_v(gu.data(), nullptr, nullptr, out.data(), rows, nv); });
	}
	auto inv = folded ? inv_rms(nx, rows, dim, eps) : std::vector<double>(rows, 1.0);
	std::vector<double> ref((size_t)rows * n);
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < n; c++) {
			double g = tof(gu[(size_t)r * 2 * n + c]) * inv[r], u = tof(gu[(size_t)r * 2 * n + n + c]) * inv[r];
			ref[(size_t)r * n + c] = g / (1 + exp(-g)) * u;
		}
	char what[96];
	snprintf(what, sizeof what, "%s %dx%d over rows of %d", folded ? "swiglu_packed_n" : "swiglu_packed_v", rows, n, dim);
	return within(what, ref, out.data());
}

// rope_case runs rope_qkv_write_n (folded), else rope_qkv_write or, with byRows,
// rope_qkv_write_r, or with vec, rope_qkv_write_v (their rows not
// divided: inv 1; with scaled, the rows an FP8 product's, each element
// read times its row's and column's scales).
static int rope_case(int rows, int heads, int kvHeads, int hd, int interleaved, bool folded, unsigned seed, bool byRows = false,
                     bool scaled = false, bool vec = false) {
	std::mt19937_64 rng(seed);
	const float eps = 1e-5f;
	const int dim = 256, maxPos = 64, nh = heads + 2 * kvHeads, half = hd / 2, width = kvHeads * hd;
	const int nslot = rows + 5;
	auto nx = rows_at(rng, rows, dim);
	std::normal_distribution<float> d;
	std::vector<T> qkv((size_t)rows * nh * hd), q((size_t)rows * heads * hd), kc((size_t)nslot * width), vc((size_t)nslot * width);
	for (auto& v : qkv) v = fromf<T>(d(rng) * 20);
	for (auto& v : q) v.x = 0x7fc1;
	for (auto& v : kc) v = fromf<T>(d(rng));
	for (auto& v : vc) v = fromf<T>(d(rng));
	auto kc0 = kc, vc0 = vc;
	std::uniform_real_distribution<double> u(0, 1);
	std::vector<float> sr(rows), sc((size_t)nh * hd);
	for (auto& v : sr) v = (float)std::ldexp(1 + u(rng), (int)(rng() % 3) - 1);
	for (auto& v : sc) v = (float)std::ldexp(1 + u(rng), (int)(rng() % 3) - 1);
	const float* psr = scaled ? sr.data() : nullptr;
	const float* psc = scaled ? sc.data() : nullptr;
	std::vector<int> pos(rows), slots(rows), perm(nslot);
	for (int i = 0; i < nslot; i++) perm[i] = i;
	std::shuffle(perm.begin(), perm.end(), rng);
	for (int t = 0; t < rows; t++) pos[t] = (int)(rng() % maxPos), slots[t] = perm[t];
	std::vector<float> table((size_t)maxPos * hd);
	for (int p = 0; p < maxPos; p++)
		for (int i = 0; i < half; i++) {
			double a = p * pow(10000.0, -2.0 * i / hd);
			table[(size_t)p * hd + i] = (float)cos(a), table[(size_t)p * hd + half + i] = (float)sin(a);
		}
	int differ = 0;
	if (vec) {
		// kernels.go's grid (ropeGrid): blocks of ropeThreads (128),
		// ROPE_UNITS units a thread.
		const int units = nh * half / VEC, threads = 128, per = threads * ROPE_UNITS;
		launch(dim3{(unsigned)((units + per - 1) / per), (unsigned)rows, 1}, threads, [&] {
			rope_qkv_write_v(qkv.data(), psr, psc, q.data(), kc.data(), vc.data(), pos.data(), slots.data(), table.data(), heads, kvHeads,
			                 hd, interleaved);
		});
		// The same bits as rope_qkv_write_r.
		auto q2 = q, kc2 = kc0, vc2 = vc0;
		for (auto& v : q2) v.x = 0x7fc1;
		launch(rowChunks(nh * half, 4, rows), 256, [&] {
			rope_qkv_write_r(qkv.data(), psr, psc, q2.data(), kc2.data(), vc2.data(), pos.data(), slots.data(), table.data(), heads,
			                 kvHeads, hd, interleaved);
		});
		for (size_t i = 0; i < q.size(); i++) differ += q[i].x != q2[i].x;
		for (size_t i = 0; i < kc.size(); i++) differ += (kc[i].x != kc2[i].x) + (vc[i].x != vc2[i].x);
		if (differ) printf("rope_qkv_write_v: %d elements differ from rope_qkv_write_r's\n", differ);
	} else if (folded) {
		launch(rowChunks(nh * half, 4, rows), 256, [&] {
			rope_qkv_write_n(qkv.data(), nx.data(), dim, eps, q.data(), kc.data(), vc.data(), pos.data(), slots.data(), table.data(), heads,
			                 kvHeads, hd, interleaved);
		});
	} else if (byRows) {
		launch(rowChunks(nh * half, 4, rows), 256, [&] {
			rope_qkv_write_r(qkv.data(), psr, psc, q.data(), kc.data(), vc.data(), pos.data(), slots.data(), table.data(), heads,
			                 kvHeads, hd, interleaved);
		});
	} else {
		launch(ewGrid((long long)rows * nh * half), 256, [&] {
			rope_qkv_write(qkv.data(), psr, psc, q.data(), kc.data(), vc.data(), pos.data(), slots.data(), table.data(), rows, heads,
			               kvHeads, hd, interleaved);
		});
	}
	auto inv = folded ? inv_rms(nx, rows, dim, eps) : std::vector<double>(rows, 1.0);
	std::vector<double> qref(q.size()), kref(kc.size()), vref(vc.size());
	for (size_t i = 0; i < kc.size(); i++) kref[i] = tof(kc0[i]), vref[i] = tof(vc0[i]);
	for (int t = 0; t < rows; t++)
		for (int h = 0; h < nh; h++) {
			const T* src = &qkv[((size_t)t * nh + h) * hd];
			for (int i = 0; i < half; i++) {
				int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
				auto at = [&](int c) { return tof(src[c]) * inv[t] * (scaled ? (double)sr[t] * sc[(size_t)h * hd + c] : 1.0); };
				double x1 = at(a), x2 = at(b);
				double c = table[(size_t)pos[t] * hd + i], s = table[(size_t)pos[t] * hd + half + i];
				double r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
				if (h < heads) {
					qref[((size_t)t * heads + h) * hd + a] = r1, qref[((size_t)t * heads + h) * hd + b] = r2;
				} else if (h < heads + kvHeads) {
					size_t o = (size_t)slots[t] * width + (size_t)(h - heads) * hd;
					kref[o + a] = r1, kref[o + b] = r2;
				} else {
					size_t o = (size_t)slots[t] * width + (size_t)(h - heads - kvHeads) * hd;
					vref[o + 2 * i] = at(2 * i), vref[o + 2 * i + 1] = at(2 * i + 1);
				}
			}
		}
	char what[96];
	int bad = 0;
	const char* name = folded ? "rope_qkv_write_n" : vec ? "rope_qkv_write_v" : byRows ? "rope_qkv_write_r" : "rope_qkv_write";
	if (scaled) name = vec ? "rope_qkv_write_v, scaled," : byRows ? "rope_qkv_write_r, scaled," : "rope_qkv_write, scaled,";
	snprintf(what, sizeof what, "%s q, %d rows, %d/%d heads of %d, interleaved %d", name, rows, heads, kvHeads, hd, interleaved);
	bad += within(what, qref, q.data());
	snprintf(what, sizeof what, "%s k cache, %d rows, %d/%d heads of %d, interleaved %d", name, rows, heads, kvHeads, hd, interleaved);
	bad += within(what, kref, kc.data());
	snprintf(what, sizeof what, "%s v cache, %d rows, %d/%d heads of %d, interleaved %d", name, rows, heads, kvHeads, hd, interleaved);
	bad += within(what, vref, vc.data());
	return bad + differ;
}

static int fold_gain_case(unsigned seed) {
	std::mt19937_64 rng(seed);
	std::normal_distribution<float> d;
	const int rows = 7, cols = 96;
	std::vector<T> w((size_t)rows * cols);
	std::vector<float> g(cols);
	for (auto& v : w) v = fromf<T>(d(rng));
	for (auto& v : g) v = d(rng);
	auto w0 = w;
	launch(dim3{2, 1, 1}, 256, [&] { fold_gain_impl<float>(w.data(), g.data(), rows, cols); });
	int bad = 0;
	for (int i = 0; i < rows * cols; i++)
		if (w[i].x != fromf<T>(tof(w0[i]) * g[i % cols]).x) bad++;
	printf("fold_gain %dx%d: %d bad\n", rows, cols, bad);
	return bad;
}

// dequant_case widens a table of experts' matrices of random blocks (f16
// scales finite) with counts, then without, against each matrix widened
// alone.
template <class K>
static int dequant_case(const char* name, int blockBytes, const std::vector<int>& scaleOffs, K kernel, unsigned seed) {
	std::mt19937_64 rng(seed);
	std::normal_distribution<float> d;
	const int experts = 3, kinds = 2, M = experts * kinds, n = 512, groups = n / 32, blocks = n / (blockBytes == 34 ? 32 : 256);
	std::vector<std::vector<unsigned char>> src(M);
	std::vector<std::vector<T>> dst(M), alone(M);
	std::vector<unsigned long long> srcs(M), dsts(M);
	for (int j = 0; j < M; j++) {
		src[j].resize((size_t)blocks * blockBytes);
		for (auto& b : src[j]) b = (unsigned char)rng();
		for (int b = 0; b < blocks; b++)
			for (int o : scaleOffs) {
				unsigned short h = f2h(d(rng) * 0.1f);
				src[j][(size_t)b * blockBytes + o] = (unsigned char)h, src[j][(size_t)b * blockBytes + o + 1] = (unsigned char)(h >> 8);
			}
		dst[j].assign(n, T{0x7fc1}), alone[j].assign(n, T{0x7fc1});
		srcs[j] = (unsigned long long)(uintptr_t)src[j].data(), dsts[j] = (unsigned long long)(uintptr_t)dst[j].data();
		launch(dim3{1, 1, 1}, 256, [&] { kernel(src[j].data(), alone[j].data(), (long long)groups, nullptr, nullptr, nullptr, 0); });
	}
	std::vector<int> count = {2, 0, 5};
	int bad = 0;
	for (int routed = 1; routed >= 0; routed--) {
		for (int j = 0; j < M; j++) dst[j].assign(n, T{0x7fc1});
		launch(dim3{1, (unsigned)M, 1}, 256,
		       [&] { kernel(nullptr, nullptr, (long long)groups, srcs.data(), dsts.data(), routed ? count.data() : nullptr, experts); });
		for (int j = 0; j < M; j++) {
			bool widened = !routed || count[j % experts] > 0;
			for (int i = 0; i < n; i++)
				if (dst[j][i].x != (widened ? alone[j][i].x : 0x7fc1)) bad++;
		}
	}
	printf("dequant_%s, a table of %d matrices of %d experts: %d bad\n", name, M, experts, bad);
	return bad;
}

int main() {
	g_after_wait = [](const void*) { return false; };
	int fails = 0;
	for (bool folded : {true, false}) {
		fails += swiglu_case(3, 256, 96, folded, 1) != 0;
		fails += swiglu_case(2, 512, 8 * 1100, folded, 2) != 0; // several chunks a row
		fails += rope_case(3, 4, 2, 64, 0, folded, 3) != 0;
		fails += rope_case(2, 32, 8, 128, 1, folded, 4) != 0; // several chunks a row
	}
	fails += rope_case(3, 4, 2, 64, 0, false, 3, true) != 0;
	fails += rope_case(2, 32, 8, 128, 1, false, 4, true) != 0; // several blocks a row
	fails += rope_case(2, 32, 8, 128, 0, false, 8, true) != 0;
	fails += rope_case(3, 4, 2, 64, 0, false, 9, true, true) != 0;
	fails += rope_case(2, 32, 8, 128, 1, false, 10, true, true) != 0;
	fails += rope_case(3, 4, 2, 64, 0, false, 11, false, true) != 0;
	// The vector form: one block a row (4/2 heads of 64: 32 units), several
	// (32/8 heads of 128: 384 units), a head of 80 (half not a multiple of
	// 16 elements), both layouts, scaled or not.
	for (int il = 0; il < 2; il++)
		for (int scaled = 0; scaled < 2; scaled++) {
			fails += rope_case(3, 4, 2, 64, il, false, 12 + 2 * il + scaled, false, scaled, true) != 0;
			fails += rope_case(2, 32, 8, 128, il, false, 16 + 2 * il + scaled, false, scaled, true) != 0;
			fails += rope_case(2, 5, 1, 80, il, false, 20 + 2 * il + scaled, false, scaled, true) != 0;
		}
	// rope_qkv_write_v with two blocks a row (640 units), scaled or not.
	for (int scaled = 0; scaled < 2; scaled++) fails += rope_case(2, 64, 8, 128, 0, false, 32 + scaled, false, scaled, true) != 0;
	fails += fold_gain_case(5) != 0;
	fails += dequant_case("q8_0", 34, {0}, dequant_q8_0, 6) != 0;
	fails += dequant_case("q4_k", 144, {0, 2}, dequant_q4_k, 7) != 0;
	printf("%d failed\n", fails);
	return fails != 0;
}
