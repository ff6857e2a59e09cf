// Shared by the emulated attention drivers (driver.cpp, prefill_driver.cpp):
// the cache's elements, a paged batch over random block tables, and the
// float64 reference the outputs are held to.
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

// PagedBatch is a step's tokens over random block tables (blocks of EMU_BS
// tokens, 16 unless a build defines it): sequences of {length after the
// step, tokens in the step}, the cache full of random values, random
// queries.
#ifndef EMU_BS
#define EMU_BS 16
#endif
struct PagedBatch {
	static constexpr int bs = EMU_BS;
	int heads, kvHeads, hd, window, blocks = 0, maxPos = 0;
	std::vector<int> positions, seqIndex, seqBlockOff, seqFresh, bt;
	std::vector<std::vector<int>> seqBlocks;
	std::vector<KV> kc, vc;
	std::vector<T> q;
	PagedBatch(int heads, int kvHeads, int hd, int window, const std::vector<std::pair<int, int>>& seqs, std::mt19937_64& rng)
	    : heads(heads), kvHeads(kvHeads), hd(hd), window(window) {
		std::normal_distribution<float> nd(0.f, 1.f);
		int need = 0;
		for (auto& s : seqs) need += (s.first + bs - 1) / bs;
		blocks = need + 3;
		std::vector<int> perm(blocks);
		for (int i = 0; i < blocks; i++) perm[i] = i;
		std::shuffle(perm.begin(), perm.end(), rng);
		int next = 0;
		for (size_t si = 0; si < seqs.size(); si++) {
			auto [len, ntok] = seqs[si];
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
		const size_t width = (size_t)kvHeads * hd;
		kc.resize((size_t)blocks * bs * width);
		vc.resize(kc.size());
		for (auto& x : kc) x = kv_make(nd(rng));
		for (auto& x : vc) x = kv_make(nd(rng));
		q.resize(positions.size() * heads * hd);
		for (auto& x : q) x = fromf<T>(nd(rng));
	}
	int tokens() const { return (int)positions.size(); }
	// check compares out with the float64 attention as the GPU tests do
	// (compareRows: each element within 2e-2 of |ref| + its row's rms),
	// printing the first misses; it returns the misses and sets worst.
	// check compares out with attention in float64 (scores soft-capped to
	// cap·tanh(s/cap) when cap > 0).
	int check(const std::vector<T>& out, float scale, float cap, double* worst) const {
		const int group = heads / kvHeads;
		int bad = 0;
		*worst = 0;
		for (int t = 0; t < tokens(); t++) {
			int p = positions[t], lo = window_start(p, window);
			auto& sb = seqBlocks[seqIndex[t]];
			for (int h = 0; h < heads; h++) {
				int kvh = h / group;
				std::vector<double> sc(p - lo + 1);
				double mx = -INFINITY;
				for (int j = lo; j <= p; j++) {
					long slot = (long)sb[j / bs] * bs + j % bs;
					double d = 0;
					for (int e = 0; e < hd; e++) d += (double)tof(q[((size_t)t * heads + h) * hd + e]) * kvf(kc[(slot * kvHeads + kvh) * hd + e]);
					sc[j - lo] = d * scale;
					if (cap > 0) sc[j - lo] = cap * tanh(sc[j - lo] / cap);
					mx = std::max(mx, sc[j - lo]);
				}
				double sum = 0;
				for (auto& s : sc) {
					s = exp(s - mx);
					sum += s;
				}
				std::vector<double> o(hd, 0.0);
				for (int j = lo; j <= p; j++) {
					long slot = (long)sb[j / bs] * bs + j % bs;
					for (int e = 0; e < hd; e++) o[e] += sc[j - lo] / sum * kvf(vc[(slot * kvHeads + kvh) * hd + e]);
				}
				double ss = 0;
				for (double v : o) ss += v * v;
				double rms = sqrt(ss / hd);
				for (int e = 0; e < hd; e++) {
					double g = tof(out[((size_t)t * heads + h) * hd + e]);
					double err = fabs(g - o[e]) / (fabs(o[e]) + rms);
					if (!(err <= 2e-2)) {
						if (bad < 5) fprintf(stderr, "  t=%d h=%d e=%d got %g want %g (err %g)\n", t, h, e, g, o[e], err);
						bad++;
						err = INFINITY;
					}
					*worst = std::max(*worst, err);
				}
			}
		}
		return bad;
	}
};
