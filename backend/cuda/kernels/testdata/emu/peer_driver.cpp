// Driver of TestPeerKernelsEmulated (emu_test.go): runs allreduce.cu's
// kernels on the host for groups of 2, 3, 4 and 8 ranks, every rank's call
// at once (G blocks a rank, one cluster of prelude.h's threads), as
// kernels.go launches them: a sequence of calls on the same regions that
// takes turns between the one-shot Lamport form, the flag form, the
// two-shot form (over more than two ranks) and the logits' exchange by
// rows, in f32, f16 and bf16, in place and not, with vector counts that
// leave the two-shot chunks uneven and the last grid stride part full.
// Every rank's all-reduce must hold the ranks' partials summed in rank
// order in float32, rounded to the dtype (-0 and +0 alike); after every
// Lamport call every word of every region's Lamport buffers must be empty
// again; a scatter must leave each rank's rows of the whole logits in its
// staging, bit for bit. Then the same forms back to back, each rank running
// ahead of the others as its stream lets it (sequence_case). Prints one
// line per group and dtype and "N failed".
#include <cmath>
#include <random>
#include <type_traits>

static const int G = 2;                  // blocks of a rank's call
static const long long CAP = 64 << 10;   // bytes of partial sums a call moves at most
static const long long STAGING = 64 << 10; // the scatter's staging
static const unsigned LP_EMPTY_WORD = LP_EMPTY;

struct Group {
	int ranks;
	std::vector<std::vector<unsigned char>> mem;
	unsigned char* reg(int q) { return q < ranks ? mem[q].data() : nullptr; }
};
#define REGS(g) g.reg(0), g.reg(1), g.reg(2), g.reg(3), g.reg(4), g.reg(5), g.reg(6), g.reg(7)

// make_group allocates and clears the regions as kernels.ClearPeerRegion:
// the header and the flag form's buffers zero, the Lamport buffers empty.
static Group make_group(int ranks) {
	Group g{ranks, {}};
	g.mem.resize(ranks);
	for (auto& m : g.mem) {
		m.assign(AR_HDR + 4ll * ranks * CAP + STAGING, 0);
		unsigned* w = (unsigned*)(m.data() + AR_HDR + 2ll * ranks * CAP);
		for (long long i = 0; i < 2ll * ranks * CAP / 4; i++) w[i] = LP_EMPTY;
	}
	return g;
}

// launch_ranks runs call(rank) for every rank at once.
static void launch_ranks(int ranks, const std::function<void(int)>& call) {
	g_threads = AR_THREADS;
	gridDim = dim3{(unsigned)G, 1, 1};
	blockDim = dim3{AR_THREADS, 1, 1};
	g_cluster_grid = G;
	run_cluster(dim3{0, 0, 0}, ranks * G, [&] { call(g_cur->rank / G); });
	g_cluster_grid = 0;
}

// full_lamport counts the words of the regions' Lamport buffers that a
// call left full.
static long long full_lamport(Group& g) {
	long long n = 0;
	for (auto& m : g.mem) {
		const unsigned* w = (const unsigned*)(m.data() + AR_HDR + 2ll * g.ranks * CAP);
		for (long long i = 0; i < 2ll * g.ranks * CAP / 4; i++) n += w[i] != LP_EMPTY;
	}
	return n;
}

template <typename E> struct Kernels;
template <> struct Kernels<f32> {
	static constexpr auto one = &peer_lamport_f32, flags = &peer_allreduce_f32, two = &peer_lamport2_f32;
	static constexpr auto add = &peer_lamport_add_f32;
	static constexpr const char* name = "f32";
};
template <> struct Kernels<f16> {
	static constexpr auto one = &peer_lamport_f16, flags = &peer_allreduce_f16, two = &peer_lamport2_f16;
	static constexpr auto add = &peer_lamport_add_f16;
	static constexpr const char* name = "f16";
};
template <> struct Kernels<bf16> {
	static constexpr auto one = &peer_lamport_bf16, flags = &peer_allreduce_bf16, two = &peer_lamport2_bf16;
	static constexpr auto add = &peer_lamport_add_bf16;
	static constexpr const char* name = "bf16";
};

template <typename E> static unsigned bits(E v) {
	unsigned b = 0;
	memcpy(&b, &v, sizeof(E));
	return b;
}
// pushed is a partial's value as the kernels sum it: an empty-looking
// element is pushed as -0 → +0 (16-bit) or the empty f32 word as -0.
template <typename E> static float pushed(E v) {
	if (sizeof(E) == 2 && bits(v) == 0x8000u) return 0.f;
	if (sizeof(E) == 4 && bits(v) == LP_EMPTY) return -0.f;
	return tof(v);
}

// allreduce_case runs one all-reduce of nv vectors on every rank (form 0:
// one shot, 1: flags, 2: two shots) and checks the sums and, for the
// Lamport forms, the buffers.
template <typename E>
static int allreduce_case(Group& g, std::mt19937_64& rng, int form, long long nv, bool inPlace) {
	const int ranks = g.ranks;
	const long long n = nv * 16 / sizeof(E);
	std::normal_distribution<float> d;
	std::vector<std::vector<E>> part(ranks), out(ranks);
	for (int q = 0; q < ranks; q++) {
		part[q].resize(n);
		for (long long i = 0; i < n; i++) {
			float v = d(rng);
			if (i % 16 == 0) v = 0.f;
			if (i % 16 == 7) v = -0.f;
			part[q][i] = fromf<E>(v);
			if (sizeof(E) == 4 && q == 0 && i % 64 == 11) memcpy(&part[q][i], &LP_EMPTY_WORD, 4);
		}
		out[q] = inPlace ? part[q] : std::vector<E>(n);
	}
	std::vector<float> want(n);
	for (long long i = 0; i < n; i++) {
		float acc = 0.f;
		for (int q = 0; q < ranks; q++) acc += pushed(part[q][i]);
		want[i] = tof(fromf<E>(acc));
	}
	auto k = form == 0 ? Kernels<E>::one : form == 1 ? Kernels<E>::flags : Kernels<E>::two;
	launch_ranks(ranks, [&](int r) {
		const E* src = inPlace ? out[r].data() : part[r].data();
		k(src, out[r].data(), nv, r, ranks, CAP, REGS(g));
	});
	int bad = 0;
	for (int q = 0; q < ranks; q++)
		for (long long i = 0; i < n; i++)
			if (!(tof(out[q][i]) == want[i])) {
				if (bad < 3) fprintf(stderr, "  form %d, %lld vectors, rank %d, element %lld: %g, want %g\n", form, nv, q, i, tof(out[q][i]), want[i]);
				bad++;
			}
	if (form != 1) {
		const long long full = full_lamport(g);
		if (full) {
			fprintf(stderr, "  form %d, %lld vectors: %lld Lamport words left full\n", form, nv, full);
			bad++;
		}
	}
	return bad;
}

// scatter_case exchanges rows of n f32 logits a rank and checks every
// rank's staging.
static int scatter_case(Group& g, std::mt19937_64& rng, int rows, int n) {
	const int ranks = g.ranks, share = (rows + ranks - 1) / ranks;
	std::normal_distribution<float> d;
	std::vector<std::vector<float>> shard(ranks, std::vector<float>((size_t)rows * n));
	for (auto& s : shard)
		for (auto& x : s) x = d(rng);
	launch_ranks(ranks, [&](int r) { peer_scatter_rows(shard[r].data(), rows, n, r, ranks, CAP, REGS(g)); });
	int bad = 0;
	for (int q = 0; q < ranks; q++) {
		const float* staging = (const float*)(g.mem[q].data() + AR_HDR + 4ll * ranks * CAP);
		for (int row = q * share; row < rows && row < (q + 1) * share; row++)
			for (int from = 0; from < ranks; from++)
				for (int c = 0; c < n; c++) {
					const float got = staging[((size_t)(row - q * share) * ranks + from) * n + c], want = shard[from][(size_t)row * n + c];
					if (memcmp(&got, &want, 4) != 0) {
						if (bad < 3) fprintf(stderr, "  scatter of %d rows: rank %d's row %d, rank %d's column %d: %g, want %g\n", rows, q, row, from, c, got, want);
						bad++;
					}
				}
	}
	return bad;
}

template <typename W> struct NormKernels;
template <> struct NormKernels<f32> {
	static constexpr auto two = &peer_lamport2_norm_wf32;
};
template <> struct NormKernels<f16> {
	static constexpr auto two = &peer_lamport2_norm_wf16;
};
template <> struct NormKernels<bf16> {
	static constexpr auto two = &peer_lamport2_norm_wbf16;
};

// norm_case runs the two-shot all-reduce with the residual add and RMSNorm
// after it (peer_lamport2_norm) of rows×dim of T on every rank, the
// sum written apart (alias 0), over r (1) or over src (2), normed over
// src (3) or over src a third of the rows on (4, with sync), and checks each rank's sum (x + r, x the ranks' partials
// summed in rank order and rounded, bit for bit but for the sign of
// zero), its norm (within 2⁻⁷ of the float64 norm of that sum, relative),
// that every rank holds the same bits, and the Lamport buffers.
template <typename W> static int norm_case(Group& g, std::mt19937_64& rng, int rows, int dim, int alias) {
	const int ranks = g.ranks;
	const size_t n = (size_t)rows * dim;
	const float eps = 1e-5f;
	std::normal_distribution<float> d;
	std::vector<std::vector<T>> part(ranks), sum(ranks), normed(ranks);
	std::vector<T> r(n);
	std::vector<W> w(dim);
	for (auto& x : r) x = fromf<T>(d(rng));
	for (auto& x : w) x = fromf<W>(1 + 0.5f * d(rng));
	for (int q = 0; q < ranks; q++) {
		part[q].resize(n);
		for (size_t i = 0; i < n; i++) part[q][i] = fromf<T>(i % 16 == 7 ? -0.f : d(rng));
	}
	std::vector<float> want(n);
	for (size_t i = 0; i < n; i++) {
		float acc = 0.f;
		for (int q = 0; q < ranks; q++) acc += pushed(part[q][i]);
		want[i] = tof(fromf<T>(tof(fromf<T>(acc)) + tof(r[i])));
	}
	auto k = NormKernels<W>::two;
	// src[q] holds the partials and, past them, a third of the rows more
	// for alias 4's norm.
	const size_t shift = (size_t)(rows / 3) * dim;
	std::vector<std::vector<T>> rr(ranks, r), src(part);
	for (auto& x : src) x.resize(n + shift);
	for (int q = 0; q < ranks; q++) sum[q].assign(n, fromf<T>(0.f)), normed[q].assign(n, fromf<T>(0.f));
	launch_ranks(ranks, [&](int q) {
		T* s = alias == 1 ? rr[q].data() : alias == 2 ? src[q].data() : sum[q].data();
		T* o = alias == 3 ? src[q].data() : alias == 4 ? src[q].data() + shift : normed[q].data();
		k(src[q].data(), rr[q].data(), w.data(), s, o, rows, dim, eps, alias == 4, q, ranks, CAP, REGS(g));
	});
	for (int q = 0; q < ranks; q++)
		if (alias == 4) normed[q].assign(src[q].begin() + shift, src[q].end());
	int bad = 0;
	for (int q = 0; q < ranks; q++) {
		const std::vector<T>& s = alias == 1 ? rr[q] : alias == 2 ? src[q] : sum[q];
		const std::vector<T>& o = alias == 3 ? src[q] : normed[q]; // alias 4: copied into normed
		for (int row = 0; row < rows; row++) {
			double ss = 0;
			for (int c = 0; c < dim; c++) ss += (double)want[(size_t)row * dim + c] * want[(size_t)row * dim + c];
			const double scale = 1 / std::sqrt(ss / dim + eps);
			for (int c = 0; c < dim; c++) {
				const size_t i = (size_t)row * dim + c;
				const double wn = want[i] * scale * tof(w[c]);
				if (!(tof(s[i]) == want[i]) || !(std::fabs(tof(o[i]) - wn) <= std::fabs(wn) / 128 + 1e-6)) {
					if (bad < 3)
						fprintf(stderr, "  norm (%d×%d, alias %d), rank %d, element %zu: sum %g, want %g; norm %g, want %g\n", rows, dim,
						        alias, q, i, tof(s[i]), want[i], tof(o[i]), wn);
					bad++;
				}
				if (q > 0 && memcmp(&o[i], &(alias == 3 ? src[0] : normed[0])[i], sizeof(T)) != 0) {
					if (bad < 3) fprintf(stderr, "  norm (%d×%d): rank %d's element %zu is not rank 0's\n", rows, dim, q, i);
					bad++;
				}
			}
		}
	}
	if (const long long full = full_lamport(g)) {
		fprintf(stderr, "  norm (%d×%d): %lld Lamport words left full\n", rows, dim, full);
		bad++;
	}
	return bad;
}

// add_case runs the one-shot all-reduce with a residual added
// (peer_lamport_add) of nv vectors on every rank, the sums written apart
// (alias 0), over src (1), over r (2), or over src a third of the vectors
// on (3, with sync: a thread keeps its partials and r in registers, and
// every block of the rank pushes before any stores), and checks each
// rank's sums (the ranks' partials in rank order in float32, plus r,
// rounded once) and the Lamport buffers.
template <typename E> static int add_case(Group& g, std::mt19937_64& rng, long long nv, int alias) {
	const int ranks = g.ranks;
	const long long n = nv * 16 / sizeof(E), shift = alias == 3 ? nv / 3 * 16 / (long long)sizeof(E) : 0;
	std::normal_distribution<float> d;
	std::vector<E> r(n);
	for (auto& x : r) x = fromf<E>(d(rng));
	std::vector<std::vector<E>> part(ranks), src(ranks), rr(ranks, r), out(ranks, std::vector<E>(n));
	for (int q = 0; q < ranks; q++) {
		part[q].resize(n);
		for (long long i = 0; i < n; i++) part[q][i] = fromf<E>(i % 16 == 7 ? -0.f : d(rng));
		src[q] = part[q];
		src[q].resize(n + shift);
	}
	std::vector<float> want(n);
	for (long long i = 0; i < n; i++) {
		float acc = 0.f;
		for (int q = 0; q < ranks; q++) acc += pushed(part[q][i]);
		want[i] = tof(fromf<E>(acc + tof(r[i])));
	}
	launch_ranks(ranks, [&](int q) {
		E* dst = alias == 1 ? src[q].data() : alias == 2 ? rr[q].data() : alias == 3 ? src[q].data() + shift : out[q].data();
		Kernels<E>::add(src[q].data(), rr[q].data(), dst, nv, alias == 3, q, ranks, CAP, REGS(g));
	});
	int bad = 0;
	for (int q = 0; q < ranks; q++) {
		const E* got = alias == 1 ? src[q].data() : alias == 2 ? rr[q].data() : alias == 3 ? src[q].data() + shift : out[q].data();
		for (long long i = 0; i < n; i++)
			if (!(tof(got[i]) == want[i])) {
				if (bad < 3) fprintf(stderr, "  add (%lld vectors, alias %d), rank %d, element %lld: %g, want %g\n", nv, alias, q, i, tof(got[i]), want[i]);
				bad++;
			}
	}
	if (const long long full = full_lamport(g)) {
		fprintf(stderr, "  add (%lld vectors, alias %d): %lld Lamport words left full\n", nv, alias, full);
		bad++;
	}
	return bad;
}

template <typename E> static int group_case(int ranks, unsigned seed) {
	std::mt19937_64 rng(seed);
	Group g = make_group(ranks);
	const int two = ranks > 2 ? 2 : 0; // the two-shot form takes more than two ranks
	int bad = 0;
	bad += allreduce_case<E>(g, rng, 0, 37, false);
	bad += allreduce_case<E>(g, rng, 1, 300, true);
	bad += allreduce_case<E>(g, rng, two, 1001, false); // uneven chunks
	bad += scatter_case(g, rng, 5, 36);
	bad += allreduce_case<E>(g, rng, two, 2500, true); // the last unrolled stride part full
	bad += allreduce_case<E>(g, rng, 0, 600, true);
	bad += scatter_case(g, rng, ranks, 8);
	bad += allreduce_case<E>(g, rng, two, (long long)ranks * ranks, false); // the fewest vectors the two-shot form takes
	bad += allreduce_case<E>(g, rng, 1, 64, false);
	// The one-shot form with the residual added: vectors fewer than a
	// grid's threads, more (two and three strides), past AR_ADD_MAXV
	// strides (the tail loop), and over src with sync.
	bad += add_case<E>(g, rng, 37, 0);
	bad += add_case<E>(g, rng, 1001, 1);
	bad += allreduce_case<E>(g, rng, 1, 64, false);
	bad += add_case<E>(g, rng, 1300, 2);
	bad += add_case<E>(g, rng, 2500, 0);
	bad += add_case<E>(g, rng, 1001, 3);
	bad += add_case<E>(g, rng, 2048, 3);
	if (std::is_same<E, T>::value) {
		// The two-shot form with the add and norm (over two ranks too,
		// which kernels.go does not ask of it), between the others: rows
		// of fewer vectors than a block's threads, of more (2400: 300 or
		// 150 vectors), of PN_MAXV·AR_THREADS (bf16), fewer rows than
		// ranks.
		const int most = VEC * PN_MAXV * AR_THREADS;
		bad += norm_case<f32>(g, rng, 1, 2400, 0);
		bad += norm_case<T>(g, rng, 7, 2400, 1);
		bad += allreduce_case<E>(g, rng, 0, 37, true);
		bad += norm_case<f32>(g, rng, 40, 96, 2);
		bad += norm_case<f32>(g, rng, 3, 96, 3);
		bad += norm_case<T>(g, rng, 1, 96, 0);
		bad += norm_case<f32>(g, rng, (int)(CAP / (most * sizeof(T))), most, 1);
		bad += norm_case<T>(g, rng, 30, 96, 4);
		bad += norm_case<f32>(g, rng, 12, 2400, 4);
		bad += allreduce_case<E>(g, rng, two, 1001, false);
	}
	printf("%d ranks, %s: %d wrong\n", ranks, Kernels<E>::name, bad);
	return bad;
}

// sequence_case runs a sequence of calls on every rank back to back, as a
// rank's stream runs them: each rank's blocks go from one call to the next
// as soon as all of them have finished the call before (a barrier of the
// rank's threads), so that a rank runs ahead of the others into the next
// calls' buffers and flags; before some calls one rank is held back a
// while. The forms take turns at random, a scatter always followed by an
// all-reduce (as a step's collectives follow its sampling), and every
// rank's snapshot of its staging is taken right after its scatter. Every
// result is checked at the end, and the Lamport buffers must be empty.
template <typename E> static int sequence_case(int ranks, unsigned seed) {
	std::mt19937_64 rng(seed);
	std::normal_distribution<float> d;
	Group g = make_group(ranks);
	struct Call {
		int form; // 0 one shot, 1 flags, 2 two shots, 3 scatter
		long long nv;
		int rows, n;
		bool inPlace;
		int held, turns; // the rank held back before the call, and for how many turns
		std::vector<std::vector<E>> part, out;
		std::vector<std::vector<float>> shard, snap;
		std::vector<float> want;
	};
	std::vector<Call> calls(40);
	for (size_t k = 0; k < calls.size(); k++) {
		Call& c = calls[k];
		c.form = (int)(rng() % 4);
		if (c.form == 2 && ranks <= 2) c.form = 0;
		if (k > 0 && calls[k - 1].form == 3 && c.form == 3) c.form = 1;
		if (k + 1 == calls.size() && c.form == 3) c.form = 0;
		const long long sizes[] = {1, 37, (long long)ranks * ranks, 600, 1001, 2500};
		c.nv = sizes[rng() % 6];
		if (c.form == 2 && c.nv < (long long)ranks * ranks) c.nv = (long long)ranks * ranks;
		c.inPlace = rng() % 2;
		c.held = (int)(rng() % ranks), c.turns = rng() % 3 == 0 ? (int)(rng() % 200) : 0;
		if (c.form == 3) {
			c.rows = 1 + (int)(rng() % 9), c.n = 4 * (1 + (int)(rng() % 20));
			c.shard.assign(ranks, std::vector<float>((size_t)c.rows * c.n));
			for (auto& sh : c.shard)
				for (auto& x : sh) x = d(rng);
			c.snap.assign(ranks, std::vector<float>((size_t)c.rows * ranks * c.n));
			continue;
		}
		const long long n = c.nv * 16 / sizeof(E);
		c.part.resize(ranks);
		for (auto& p : c.part) {
			p.resize(n);
			for (long long i = 0; i < n; i++) p[i] = fromf<E>(i % 16 == 7 ? -0.f : d(rng));
		}
		c.out.resize(ranks);
		for (int q = 0; q < ranks; q++) c.out[q] = c.inPlace ? c.part[q] : std::vector<E>(n);
		c.want.resize(n);
		for (long long i = 0; i < n; i++) {
			float acc = 0.f;
			for (int q = 0; q < ranks; q++) acc += pushed(c.part[q][i]);
			c.want[i] = tof(fromf<E>(acc));
		}
	}
	std::vector<Barrier> stream(ranks, Barrier{G * AR_THREADS});
	launch_ranks(ranks, [&](int r) {
		for (auto& c : calls) {
			if (c.held == r)
				for (int i = 0; i < c.turns; i++) yield_turn();
			switch (c.form) {
			case 3:
				peer_scatter_rows(c.shard[r].data(), c.rows, c.n, r, ranks, CAP, REGS(g));
				break;
			default: {
				auto k = c.form == 0 ? Kernels<E>::one : c.form == 1 ? Kernels<E>::flags : Kernels<E>::two;
				const E* src = c.inPlace ? c.out[r].data() : c.part[r].data();
				k(src, c.out[r].data(), c.nv, r, ranks, CAP, REGS(g));
			}
			}
			stream[r].wait();
			if (c.form == 3 && threadIdx.x == 0 && blockIdx.x == 0)
				memcpy(c.snap[r].data(), g.mem[r].data() + AR_HDR + 4ll * ranks * CAP, c.snap[r].size() * 4);
		}
	});
	int bad = 0;
	for (size_t k = 0; k < calls.size(); k++) {
		Call& c = calls[k];
		if (c.form == 3) {
			const int share = (c.rows + ranks - 1) / ranks;
			for (int q = 0; q < ranks; q++)
				for (int row = q * share; row < c.rows && row < (q + 1) * share; row++)
					for (int from = 0; from < ranks; from++)
						for (int col = 0; col < c.n; col++)
							if (memcmp(&c.snap[q][((size_t)(row - q * share) * ranks + from) * c.n + col], &c.shard[from][(size_t)row * c.n + col], 4) != 0) {
								if (bad < 3) fprintf(stderr, "  call %zu (scatter of %d rows): rank %d's row %d differs\n", k, c.rows, q, row);
								bad++;
							}
			continue;
		}
		for (int q = 0; q < ranks; q++)
			for (size_t i = 0; i < c.want.size(); i++)
				if (!(tof(c.out[q][i]) == c.want[i])) {
					if (bad < 3) fprintf(stderr, "  call %zu (form %d, %lld vectors), rank %d, element %zu: %g, want %g\n", k, c.form, c.nv, q, i, tof(c.out[q][i]), c.want[i]);
					bad++;
				}
	}
	if (const long long full = full_lamport(g)) {
		fprintf(stderr, "  %lld Lamport words left full\n", full);
		bad++;
	}
	printf("%d ranks, %s, %zu calls back to back: %d wrong\n", ranks, Kernels<E>::name, calls.size(), bad);
	return bad;
}

int main() {
	g_after_wait = [](const void*) { return false; };
	int fails = 0;
	unsigned seed = 1;
	for (int ranks : {2, 3, 4, 8}) {
		fails += group_case<f32>(ranks, seed++) != 0;
		fails += group_case<f16>(ranks, seed++) != 0;
		fails += group_case<bf16>(ranks, seed++) != 0;
		fails += sequence_case<f32>(ranks, seed++) != 0;
		fails += sequence_case<bf16>(ranks, seed++) != 0;
	}
	printf("%d failed\n", fails);
	return fails != 0;
}
