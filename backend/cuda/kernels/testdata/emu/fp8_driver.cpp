// Driver of TestFP8WritersEmulated (emu_test.go): runs, on the host, the
// FP8-form writers that take several rows a block (add_norm_rows_q,
// swiglu_packed_qr: kernels.go's path from prefillRowsQ rows) and the
// one-row-a-block kernels they stand in for (norm_vec_impl's FP8 form,
// swiglu_packed_q), as kernels.go launches them, and compares their sums,
// codes and row scales byte for byte: with and without an FP8 product's
// scales, an odd last block, rows of fewer and more columns than a block
// has threads, and row scales written over the product's (qs = sr). First
// e4m3_div, the writers' division, against the host's x/s on random pairs
// (scales at every mantissa extreme, quotients across E4M3's range).
// Prints one line per case and "N failed".
#include <random>

static std::vector<T> rand_rows(std::mt19937_64& rng, size_t n, float scale) {
	std::normal_distribution<float> d;
	std::vector<T> v(n);
	for (auto& x : v) x = fromf<T>(d(rng) * scale);
	return v;
}

// Scales 2^k·(1 + u), k in -4..2, as an FP8 product's.
static std::vector<float> rand_scales(std::mt19937_64& rng, size_t n) {
	std::uniform_real_distribution<double> u(0, 1);
	std::vector<float> v(n);
	for (auto& x : v) x = (float)std::ldexp(1 + u(rng), (int)(rng() % 7) - 4);
	return v;
}

static int same(const char* what, const void* a, const void* b, size_t n) {
	const unsigned char *x = (const unsigned char*)a, *y = (const unsigned char*)b;
	int bad = 0;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i]) {
			if (bad < 3) fprintf(stderr, "  %s: byte %zu is %#x, want %#x\n", what, i, x[i], y[i]);
			bad++;
		}
	printf("%s: %zu bytes, %d differ\n", what, n, bad);
	return bad;
}

static int threads_for(int nv) { return std::min(256, (nv + 31) / 32 * 32); }

static int norm_case(int rows, int dim, bool scaled, unsigned seed) {
	std::mt19937_64 rng(seed);
	const float eps = 1e-5f;
	const int nv = dim / VEC;
	auto x = rand_rows(rng, (size_t)rows * dim, 2), r = rand_rows(rng, (size_t)rows * dim, 2);
	auto wv = rand_scales(rng, dim);
	std::vector<float> sr, sc;
	if (scaled) sr = rand_scales(rng, rows), sc = rand_scales(rng, dim);
	const float* psr = scaled ? sr.data() : nullptr;
	const float* psc = scaled ? sc.data() : nullptr;
	std::vector<T> sum1((size_t)rows * dim), sum2((size_t)rows * dim);
	std::vector<unsigned char> q1((size_t)rows * dim, 0xee), q2((size_t)rows * dim, 0xee);
	std::vector<float> qs1(rows, -1), qs2(rows, -1);
	launch(dim3{(unsigned)rows, 1, 1}, threads_for(nv), [&] {
		norm_vec_impl<float, false, true>(x.data(), r.data(), wv.data(), sum1.data(), (T*)0, dim, eps, q1.data(), qs1.data(), psr, psc);
	});
	launch(dim3{(unsigned)((rows + ROWS_N - 1) / ROWS_N), 1, 1}, threads_for(nv), [&] {
		add_norm_rows_q<float>(x.data(), r.data(), psr, psc, wv.data(), sum2.data(), q2.data(), qs2.data(), rows, dim, eps);
	});
	char what[96];
	int bad = 0;
	snprintf(what, sizeof what, "add_norm_rows_q %dx%d scaled %d: sum", rows, dim, scaled);
	bad += same(what, sum2.data(), sum1.data(), sum1.size() * sizeof(T));
	snprintf(what, sizeof what, "add_norm_rows_q %dx%d scaled %d: codes", rows, dim, scaled);
	bad += same(what, q2.data(), q1.data(), q1.size());
	snprintf(what, sizeof what, "add_norm_rows_q %dx%d scaled %d: row scales", rows, dim, scaled);
	bad += same(what, qs2.data(), qs1.data(), qs1.size() * sizeof(float));
	return bad;
}

// swiglu_case: which scales (0 none, 1 rows, 2 columns, 3 both); inPlace
// writes the row scales over the product's.
static int swiglu_case(int rows, int n, int which, bool inPlace, unsigned seed) {
	std::mt19937_64 rng(seed);
	const int nv = n / VEC;
	auto gu = rand_rows(rng, (size_t)rows * 2 * n, 2);
	auto sr = rand_scales(rng, rows), sc = rand_scales(rng, 2 * n);
	auto sr1 = sr, sr2 = sr;
	const float* psc = which & 2 ? sc.data() : nullptr;
	std::vector<unsigned char> q1((size_t)rows * n, 0xee), q2((size_t)rows * n, 0xee);
	std::vector<float> qs1(rows, -1), qs2(rows, -1);
	float* out1 = inPlace ? sr1.data() : qs1.data();
	float* out2 = inPlace ? sr2.data() : qs2.data();
	launch(dim3{(unsigned)rows, 1, 1}, threads_for(nv), [&] {
		swiglu_packed_q(gu.data(), which & 1 ? sr1.data() : nullptr, psc, q1.data(), out1, nv);
	});
	launch(dim3{(unsigned)((rows + ROWS_Q - 1) / ROWS_Q), 1, 1}, threads_for(nv), [&] {
		swiglu_packed_qr(gu.data(), which & 1 ? sr2.data() : nullptr, psc, q2.data(), out2, rows, nv);
	});
	char what[96];
	int bad = 0;
	snprintf(what, sizeof what, "swiglu_packed_qr %dx%d scales %d in place %d: codes", rows, n, which, inPlace);
	bad += same(what, q2.data(), q1.data(), q1.size());
	snprintf(what, sizeof what, "swiglu_packed_qr %dx%d scales %d in place %d: row scales", rows, n, which, inPlace);
	bad += same(what, out2, out1, rows * sizeof(float));
	return bad;
}

// div_case compares e4m3_div(x, s, 1/s) with x/s, both rounded once, on n
// random pairs: s a float of [2^-60, 2^60), its mantissa often all ones or
// zeros or near them, |x| up to 448·s and down to 2^-40 of it, or ±0.
static int div_case(long n, unsigned seed) {
	std::mt19937_64 rng(seed);
	long bad = 0;
	for (long i = 0; i < n; i++) {
		unsigned m = (unsigned)(rng() & 0x7fffff);
		switch (rng() % 8) {
		case 0: m = 0x7fffff; break;
		case 1: m = 0; break;
		case 2: m = 0x7fffff - (unsigned)(rng() % 16); break;
		case 3: m = (unsigned)(rng() % 16); break;
		}
		unsigned bits = (unsigned)(67 + rng() % 120) << 23 | m;
		float s;
		memcpy(&s, &bits, 4);
		int e;
		frexpf(448.f * s, &e);
		float x = rng() % 64 == 0 ? 0.f : ldexpf((float)((rng() >> 40) | 1) / (float)(1 << 24), e - (int)(rng() % 40));
		if (rng() & 1) x = -x;
		const float got = e4m3_div(x, s, __frcp_rn(s)), want = x / s;
		if (memcmp(&got, &want, 4) != 0) bad++; // bits: −0 is not +0
	}
	printf("e4m3_div against x/s, %ld pairs: %ld differ\n", n, bad);
	return bad != 0;
}

int main() {
	g_after_wait = [](const void*) { return false; };
	int fails = 0;
	fails += div_case(4000000, 30);
	fails += norm_case(8, 256, false, 1) != 0;
	fails += norm_case(7, 4096, true, 2) != 0; // an odd last block, two vectors a thread
	fails += norm_case(5, 96, true, 3) != 0;   // fewer columns than a warp's vectors
	fails += norm_case(3, 5120, true, 4) != 0; // two and a half vectors a thread
	for (int which = 0; which <= 3; which++) fails += swiglu_case(5, 1024, which, false, 10 + which) != 0;
	fails += swiglu_case(3, 8 * 300, 3, false, 20) != 0; // more vectors than threads, an odd last block
	fails += swiglu_case(4, 96, 1, true, 21) != 0;
	fails += swiglu_case(3, 14336, 3, false, 22) != 0; // Llama-3-8B's rows: 7 vectors a thread, the last in registers
	printf("%d failed\n", fails);
	return fails != 0;
}
