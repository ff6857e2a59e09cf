// Driver of TestGEMVKQEmulated (emu_test.go): runs gemv_kq.cu's frame
// (gemv_kq_impl with KQ4K and KQ6K) on the host on the cases the test
// wrote to KQ_DATA (Q4_K and Q6_K blocks from tensor.Quantize, x rounded
// to ACT, and the float64 reference of the product with x rounded to int8
// as q8x does; a gain and the reference of x times it; an addend), at 1,
// 2, 5 and 8 rows, out in ACT and in f32, plain, with the gain and (out in
// ACT) with the addend added (AddStore), on grids
// small enough that warps loop over several rows; the weights' ring copies
// complete only at their cp.async.wait_group, outputs past the product
// must keep their poison.
#include <string>
#include <type_traits>

#define KQ_STR2(x) #x
#define KQ_STR(x) KQ_STR2(x)

static int g_fail = 0;
static double g_worst = 0;
static double tol(bool f32) { return f32 ? 1e-4 : std::is_same<T, bf16>::value ? 1e-2 : 2e-3; }

// run runs the kernel: plain (g and add null), with the gain g, or with
// add added (out in ACT).
template <class F, int TT>
static void run(const T* x, const T* g, const T* add, const unsigned char* w, void* out, int K, int N, int outF32, int blocks) {
	gridDim = dim3{(unsigned)blocks, 1, 1};
	blockDim = dim3{32 * KQ_WARPS, 1, 1};
	g_threads = 32 * KQ_WARPS;
	g_after_wait = [=](const void* src) { return src >= (const void*)x && src < (const void*)(x + (size_t)TT * K); };
	for (int b = 0; b < blocks; b++) {
		memset(g_smem, 0xff, sizeof(g_smem));
		run_block(dim3{(unsigned)b, 0, 0}, [&] {
			if (add) gemv_kq_impl<F, TT>(x, g, w, K, AddStore{(T*)out, N, add});
			else gemv_kq_impl<F, TT>(x, g, w, K, OutStore{out, N, outF32});
		});
	}
}

template <class F>
static void run_rows(int TT, const T* x, const T* g, const T* add, const unsigned char* w, void* out, int K, int N, int outF32, int blocks) {
	switch (TT) {
	case 1: return run<F, 1>(x, g, add, w, out, K, N, outF32, blocks);
	case 2: return run<F, 2>(x, g, add, w, out, K, N, outF32, blocks);
	case 5: return run<F, 5>(x, g, add, w, out, K, N, outF32, blocks);
	case 8: return run<F, 8>(x, g, add, w, out, K, N, outF32, blocks);
	}
	fprintf(stderr, "no kernel for %d rows\n", TT);
	abort();
}

template <class V> static std::vector<V> read(FILE* f, size_t n) {
	std::vector<V> v(n);
	if (fread(v.data(), sizeof(V), n, f) != n) {
		fprintf(stderr, "%s: short read\n", KQ_DATA);
		exit(2);
	}
	return v;
}

int main() {
	const std::string path = std::string(KQ_DATA) + "/kq_" + KQ_STR(ACT) + ".bin";
	FILE* f = fopen(path.c_str(), "rb");
	if (!f) {
		fprintf(stderr, "%s: cannot open\n", path.c_str());
		return 2;
	}
	const int cases = read<int>(f, 1)[0];
	for (int c = 0; c < cases; c++) {
		const auto h = read<int>(f, 5); // format (0 Q4_K, 1 Q6_K), K, N, blocks, weight bytes
		const int fmt = h[0], K = h[1], N = h[2], blocks = h[3];
		const auto w = read<unsigned char>(f, (size_t)h[4]);
		const auto xf = read<float>(f, (size_t)8 * K);
		const auto ref = read<double>(f, (size_t)8 * N);
		const auto gf = read<float>(f, (size_t)K);
		const auto refGain = read<double>(f, (size_t)8 * N);
		const auto af = read<float>(f, (size_t)8 * N);
		std::vector<T> x(xf.size()), g(gf.size()), add(af.size());
		for (size_t i = 0; i < x.size(); i++) x[i] = fromf<T>(xf[i]);
		for (size_t i = 0; i < g.size(); i++) g[i] = fromf<T>(gf[i]);
		for (size_t i = 0; i < add.size(); i++) add[i] = fromf<T>(af[i]);
		// form 0 plain, 1 with the gain, 2 with the addend (out in ACT)
		for (int form = 0; form < 3; form++)
			for (int TT : {1, 2, 5, 8}) {
				const bool f32 = form < 2 && TT % 2 == 1;
				const int total = TT * N + 64;
				std::vector<float> o32(total, NAN);
				std::vector<T> oact(total, fromf<T>(NAN));
				void* out = f32 ? (void*)o32.data() : (void*)oact.data();
				const T* gp = form == 1 ? g.data() : nullptr;
				const T* ap = form == 2 ? add.data() : nullptr;
				if (fmt == 0) run_rows<KQ4K>(TT, x.data(), gp, ap, w.data(), out, K, N, f32, blocks);
				else run_rows<KQ6K>(TT, x.data(), gp, ap, w.data(), out, K, N, f32, blocks);
				char what[160];
				snprintf(what, sizeof what, "%s %s T=%d K=%d N=%d blocks=%d outF32=%d", fmt ? "Q6_K" : "Q4_K",
				         form == 0 ? "plain" : form == 1 ? "gain" : "add", TT, K, N, blocks, f32);
				for (int i = 0; i < total; i++) {
					const double got = f32 ? o32[i] : tof(oact[i]);
					if (i >= TT * N) {
						if (!std::isnan(got) && g_fail++ < 10) fprintf(stderr, "%s: element %d past the product written\n", what, i);
						continue;
					}
					const double want = form == 1 ? refGain[i] : form == 2 ? ref[i] + tof(add[i]) : ref[i];
					const double err = fabs(got - want) / (1 + fabs(want));
					if (err > g_worst) g_worst = err;
					if (!(err <= tol(f32)) && g_fail++ < 10) fprintf(stderr, "%s: element %d = %g, want %g\n", what, i, got, want);
				}
			}
	}
	fclose(f);
	printf("gemv K-quant kernels (%s): %d cases, worst relative error %.3g, %d failures\n", KQ_STR(ACT), cases, g_worst, g_fail);
	return g_fail ? 1 : 0;
}
