// Driver of TestDecodeMMAEmulated (emu_test.go): runs decode_mma on random
// paged caches, block by block, and compares every output with a float64
// reference as the GPU test does (compareRows: each element within 2e-2 of
// |ref| + its row's rms). Prints one line per case and "N failed".
#include <algorithm>
#include <random>
// The cache's elements: the activation dtype, or (KV_F8) E4M3 codes, made
// from normal floats as tensor.F32ToE4M3 makes them; kvf is an element's
// value, which the reference reads.
#ifdef KV_F8
static KV kv_make(float f) {
	unsigned bits = __float_as_uint(f), sign = (bits >> 24) & 0x80, abs = bits & 0x7fffffffu;
	if (abs > 0x7f800000u) return KV{0x7f};
	if (abs >= 0x43e00000u) return KV{(unsigned char)(sign | 0x7e)};
	if (abs < 0x3c800000u) return KV{(unsigned char)(sign | (unsigned)nearbyint((double)__uint_as_float(abs) * 512))};
	unsigned r = (abs + 0x7ffffu + ((abs >> 20) & 1)) >> 20;
	int v = (int)r - (120 << 3);
	return KV{(unsigned char)(sign | (v < 0x7f ? v : 0x7e))};
}
static double kvf(KV x) { return e4m3_float(x.x); }
#else
static KV kv_make(float f) { return fromf<T>(f); }
static double kvf(KV x) { return tof(x); }
#endif

struct Case {
	int heads, kvHeads, hd, window;
	std::vector<std::pair<int, int>> seqs; // {length after the step, tokens in the step}
	int chunk;
};

static void launch_one(int hd, int mt, int st, DC_PARAMS) {
#define CALL(H, M)                                                                    \
	if (hd == H && mt == M && st == DM_ST) { decode_mma<H, M, DM_ST>(DC_ARGS); return; } \
	if (hd == H && mt == M && st == DM_ST2) { decode_mma<H, M, DM_ST2>(DC_ARGS); return; }
	CALL(16, 1) CALL(32, 1) CALL(64, 1) CALL(80, 1) CALL(96, 1) CALL(128, 1)
	CALL(16, 2) CALL(32, 2) CALL(64, 2) CALL(80, 2) CALL(96, 2) CALL(128, 2)
	fprintf(stderr, "no kernel\n");
	abort();
}

static double run(const Case& c, int st, unsigned seed) {
	const int bs = 16;
	std::mt19937_64 rng(seed);
	std::normal_distribution<float> nd(0.f, 1.f);
	int need = 0;
	for (auto& s : c.seqs) need += (s.first + bs - 1) / bs;
	int blocks = need + 3;
	std::vector<int> perm(blocks);
	for (int i = 0; i < blocks; i++) perm[i] = i;
	std::shuffle(perm.begin(), perm.end(), rng);
	std::vector<int> positions, seqIndex, seqBlockOff, seqFresh, bt;
	std::vector<std::vector<int>> seqBlocks;
	int next = 0, maxPos = 0;
	for (size_t si = 0; si < c.seqs.size(); si++) {
		auto [len, ntok] = c.seqs[si];
		seqBlockOff.push_back((int)bt.size());
		std::vector<int> sb;
		for (int i = 0; i < (len + bs - 1) / bs; i++) sb.push_back(perm[next++]);
		bt.insert(bt.end(), sb.begin(), sb.end());
		seqBlocks.push_back(sb);
		seqFresh.push_back(len - ntok);
		for (int p = len - ntok; p < len; p++) {
			positions.push_back(p);
			seqIndex.push_back((int)si);
			maxPos = std::max(maxPos, p);
		}
	}
	int Tn = (int)positions.size();
	int width = c.kvHeads * c.hd;
	auto rnd = [&](size_t n) {
		std::vector<T> v(n);
		for (auto& x : v) x = fromf<T>(nd(rng));
		return v;
	};
	auto rndKV = [&](size_t n) {
		std::vector<KV> v(n);
		for (auto& x : v) x = kv_make(nd(rng));
		return v;
	};
	std::vector<KV> kc = rndKV((size_t)blocks * bs * width), vc = rndKV((size_t)blocks * bs * width);
	std::vector<T> q = rnd((size_t)Tn * c.heads * c.hd);
	std::vector<T> out((size_t)Tn * c.heads * c.hd);
	for (auto& x : out) x.x = 0x7fc1;
	int ctx = maxPos + 1;
	if (c.window > 0) ctx = std::min(ctx, c.window);
	int splits = (ctx + c.chunk - 1) / c.chunk;
	// Q, and the K/V rows of this step's keys, are the previous kernel's.
	std::vector<bool> fresh((size_t)blocks * bs, false);
	for (size_t si = 0; si < c.seqs.size(); si++)
		for (int p = seqFresh[si]; p < c.seqs[si].first; p++) fresh[(size_t)seqBlocks[si][p / bs] * bs + p % bs] = true;
	g_after_wait = [&](const void* src) {
		const T* p = (const T*)src;
		if (p >= q.data() && p < q.data() + q.size()) return true;
		const KV* e = (const KV*)src;
		for (const std::vector<KV>* cache : {&kc, &vc})
			if (e >= cache->data() && e < cache->data() + cache->size()) return (bool)fresh[(e - cache->data()) / width];
		return false;
	};
	std::vector<float> ws((size_t)Tn * c.heads * splits * (c.hd + 2) + 4, NAN);
	float* wsAcc = ws.data();
	float* wsM = wsAcc + (size_t)Tn * c.heads * splits * c.hd;
	float* wsL = wsM + (size_t)Tn * c.heads * splits;
	std::vector<int> counters(Tn * c.kvHeads, 0);
	int group = c.heads / c.kvHeads;
	int mt = group > 16 ? 2 : 1;
	float scale = 1.0f / sqrtf((float)c.hd);
	gridDim = dim3{(unsigned)splits, (unsigned)c.kvHeads, (unsigned)Tn};
	blockDim = dim3{128, 1, 1};
	for (int z = 0; z < Tn; z++)
		for (int y = 0; y < c.kvHeads; y++)
			for (int x = 0; x < splits; x++) {
				for (size_t i = 0; i < sizeof(g_smem) / 2; i++) ((unsigned short*)g_smem)[i] = 0x7fc1;
				run_block(dim3{(unsigned)x, (unsigned)y, (unsigned)z}, [&] {
					launch_one(c.hd, mt, st, q.data(), kc.data(), vc.data(), out.data(), wsAcc, wsM, wsL, counters.data(),
					           positions.data(), seqIndex.data(), seqBlockOff.data(), seqFresh.data(), bt.data(), c.heads,
					           c.kvHeads, bs, c.window, scale, c.chunk, splits);
				});
			}
	for (int v : counters)
		if (v != 0) { fprintf(stderr, "counter left at %d\n", v); abort(); }
	// reference
	double worst = 0;
	int bad = 0;
	for (int t = 0; t < Tn; t++) {
		int p = positions[t], lo = window_start(p, c.window);
		auto& sb = seqBlocks[seqIndex[t]];
		for (int h = 0; h < c.heads; h++) {
			int kvh = h / group;
			std::vector<double> sc(p - lo + 1);
			double mx = -INFINITY;
			for (int j = lo; j <= p; j++) {
				long slot = (long)sb[j / bs] * bs + j % bs;
				double d = 0;
				for (int e = 0; e < c.hd; e++)
					d += (double)tof(q[((size_t)t * c.heads + h) * c.hd + e]) * kvf(kc[(slot * c.kvHeads + kvh) * c.hd + e]);
				sc[j - lo] = d * scale;
				mx = std::max(mx, sc[j - lo]);
			}
			double sum = 0;
			for (auto& s : sc) { s = exp(s - mx); sum += s; }
			std::vector<double> o(c.hd, 0.0);
			for (int j = lo; j <= p; j++) {
				long slot = (long)sb[j / bs] * bs + j % bs;
				for (int e = 0; e < c.hd; e++) o[e] += sc[j - lo] / sum * kvf(vc[(slot * c.kvHeads + kvh) * c.hd + e]);
			}
			double ss = 0;
			for (double v : o) ss += v * v;
			double rms = sqrt(ss / c.hd);
			for (int e = 0; e < c.hd; e++) {
				double g = tof(out[((size_t)t * c.heads + h) * c.hd + e]);
				double err = fabs(g - o[e]) / (fabs(o[e]) + rms);
				if (!(err <= 2e-2)) {
					if (bad < 5) fprintf(stderr, "  t=%d h=%d e=%d got %g want %g (err %g)\n", t, h, e, g, o[e], err);
					bad++;
					err = INFINITY;
				}
				worst = std::max(worst, err);
			}
		}
	}
	printf("heads %d/%d hd %d window %d chunk %d splits %d tokens %d stages %d: worst %.3g, %d bad\n", c.heads, c.kvHeads, c.hd, c.window,
	       c.chunk, splits, Tn, st, worst, bad);
	fflush(stdout);
	return bad ? -1 : worst;
}

int main(int argc, char** argv) {
	std::vector<Case> cases = {
		{8, 2, 128, 0, {{1, 1}, {37, 1}, {300, 1}}, 128},
		{8, 2, 128, 0, {{1, 1}, {37, 1}, {300, 1}}, 512},
		{8, 2, 128, 100, {{260, 2}, {70, 2}}, 128},
		{24, 1, 64, 0, {{200, 1}, {17, 2}}, 128},
		{24, 1, 64, 0, {{200, 1}, {17, 2}}, 256},
		{4, 4, 80, 50, {{150, 1}, {3, 1}}, 128},
		{16, 2, 96, 0, {{400, 1}}, 256},
		{16, 1, 16, 0, {{130, 1}, {64, 1}, {65, 1}}, 128},
		{12, 4, 32, 0, {{200, 1}, {2, 2}}, 128},
		{32, 1, 128, 0, {{300, 1}}, 1024},
		{8, 2, 128, 0, {{600, 1}, {5, 1}}, 64},
		{32, 8, 128, 0, {{129, 2}, {64, 1}, {65, 1}}, 128},
		{8, 2, 128, 0, {{700, 1}, {450, 2}, {3, 1}}, 448},
		{32, 1, 64, 300, {{900, 1}}, 192},
	};
	int fails = 0;
	// Each case with the default ring (DM_ST stages) and with the _s2
	// kernels' (DM_ST2: 2, or 3 over an FP8 cache).
	for (int st : {DM_ST, DM_ST2})
		for (size_t i = 0; i < cases.size(); i++)
			if (run(cases[i], st, 1234 + i) < 0) fails++;
	printf("%d failed\n", fails);
	return fails != 0;
}
