// Driver of TestDecodeMMAEmulated (emu_test.go): runs decode_mma on random
// paged caches, block by block, and compares every output with a float64
// reference as the GPU test does (compareRows: each element within 2e-2 of
// |ref| + its row's rms). Prints one line per case and "N failed".
struct Case {
	int heads, kvHeads, hd, window;
	std::vector<std::pair<int, int>> seqs; // {length after the step, tokens in the step}
	int chunk;
	float cap; // soft-capped scores (0: none)
};

// launch_one runs one block of the kernel for head dim hd, mt m-tiles, a
// ring of st stages and hg kv heads a block (several only where
// DECODE_MMA_HEADS defines kernels: one m-tile, the default ring, head
// dims up to 128, not over an FP8 cache).
static void launch_one(int hd, int mt, int st, int hg, DC_PARAMS) {
#define CALL_G(H, M, G)                                                                     \
	if (hd == H && mt == M && hg == G && st == DM_ST) { decode_mma<H, M, DM_ST, G>(DC_ARGS); return; } \
	if (hd == H && mt == M && hg == G && G == 1 && st == DM_ST2) { decode_mma<H, M, DM_ST2, G>(DC_ARGS); return; }
#ifdef KV_F8
#define CALL(H, M) CALL_G(H, M, 1)
#else
#define CALL(H, M) CALL_G(H, M, 1) if constexpr (M == 1 && H <= 128) { CALL_G(H, 1, 2) CALL_G(H, 1, 4) }
#endif
	CALL(16, 1) CALL(32, 1) CALL(64, 1) CALL(80, 1) CALL(96, 1) CALL(128, 1) CALL(256, 1)
	CALL(16, 2) CALL(32, 2) CALL(64, 2) CALL(80, 2) CALL(96, 2) CALL(128, 2) CALL(256, 2)
	fprintf(stderr, "no kernel\n");
	abort();
}

static double run(const Case& c, int st, int hg, unsigned seed) {
	std::mt19937_64 rng(seed);
	PagedBatch pb(c.heads, c.kvHeads, c.hd, c.window, c.seqs, rng);
	const int bs = PagedBatch::bs, Tn = pb.tokens(), width = c.kvHeads * c.hd;
	std::vector<T> out((size_t)Tn * c.heads * c.hd);
	for (auto& x : out) x.x = 0x7fc1;
	int ctx = pb.maxPos + 1;
	if (c.window > 0) ctx = std::min(ctx, c.window);
	int splits = (ctx + c.chunk - 1) / c.chunk;
	// Q, and the K/V rows of this step's keys, are the previous kernel's.
	std::vector<bool> fresh((size_t)pb.blocks * bs, false);
	for (size_t si = 0; si < c.seqs.size(); si++)
		for (int p = pb.seqFresh[si]; p < c.seqs[si].first; p++) fresh[(size_t)pb.seqBlocks[si][p / bs] * bs + p % bs] = true;
	g_after_wait = [&](const void* src) {
		const T* p = (const T*)src;
		if (p >= pb.q.data() && p < pb.q.data() + pb.q.size()) return true;
		const KV* e = (const KV*)src;
		for (const std::vector<KV>* cache : {&pb.kc, &pb.vc})
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
	g_threads = 128;
	{ // the shared memory the host gives the plan (decodeMMAShared in kernels.go)
		const int rows = 16 * mt, rowBytes = (c.hd + 8) * 2;
		int ringRow = rowBytes, stages = st;
#ifdef KV_F8
		ringRow = c.hd + 16;
#endif
		if (hg <= 1) stages = std::min(stages, (c.chunk + 63) / 64);
		const int ring = stages * 2 * 64 * ringRow, red = 4 * rows * (c.hd + 8) * 4;
		g_smem_limit = 2 * 4 * rows * 4 + 2 * 64 * 4 + rows * rowBytes + std::max(ring, red);
	}
	gridDim = dim3{(unsigned)splits, (unsigned)(c.kvHeads / hg), (unsigned)Tn};
	blockDim = dim3{128, 1, 1};
	for (int z = 0; z < Tn; z++)
		for (int y = 0; y < c.kvHeads / hg; y++)
			for (int x = 0; x < splits; x++) {
				for (size_t i = 0; i < sizeof(g_smem) / 2; i++) ((unsigned short*)g_smem)[i] = 0x7fc1;
				run_block(dim3{(unsigned)x, (unsigned)y, (unsigned)z}, [&] {
					launch_one(c.hd, mt, st, hg, pb.q.data(), pb.kc.data(), pb.vc.data(), out.data(), wsAcc, wsM, wsL, counters.data(),
					           pb.positions.data(), pb.seqIndex.data(), pb.seqBlockOff.data(), pb.seqFresh.data(), pb.bt.data(), c.heads,
					           c.kvHeads, bs, c.window, scale, c.cap, c.chunk, splits);
				});
			}
	for (int v : counters)
		if (v != 0) { fprintf(stderr, "counter left at %d\n", v); abort(); }
	double worst;
	int bad = pb.check(out, scale, c.cap, &worst);
	printf("heads %d/%d hd %d window %d chunk %d splits %d tokens %d stages %d kv heads a block %d cap %g: worst %.3g, %d bad\n", c.heads,
	       c.kvHeads, c.hd, c.window, c.chunk, splits, Tn, st, hg, c.cap, worst, bad);
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
		// Soft-capped scores (Gemma 2): one and many splits, a window.
		{8, 2, 128, 0, {{1, 1}, {37, 1}, {300, 1}}, 128, 1.5f},
		{16, 2, 64, 100, {{260, 2}, {70, 1}}, 512, 1.5f},
		// Head dim 256 (Gemma's), with Gemma 2's soft cap and a window.
		{8, 4, 256, 0, {{1, 1}, {200, 1}}, 128, 0},
		{16, 8, 256, 64, {{150, 2}, {9, 1}}, 128, 1.5f},
		{32, 1, 256, 0, {{70, 1}}, 128, 0},
		// Speculative verification: k+1 tokens of one sequence, Llama-3's
		// 32 query heads over 8 (3 and 5 tokens: one 16-row tile of a KV
		// head's queries, 9: two), short and longer contexts.
		{32, 8, 128, 0, {{23, 3}}, 128, 0},
		{32, 8, 128, 0, {{25, 5}}, 128, 0},
		{32, 8, 128, 0, {{41, 9}}, 128, 0},
		{32, 8, 128, 0, {{305, 5}}, 512, 0},
		// Llama-3's heads at one split and at several, short and long
		// contexts side by side (the kv heads a block then cross stages
		// of one key, of a partial ring and of a full one).
		{32, 8, 128, 0, {{700, 1}, {130, 1}, {1, 1}, {64, 1}}, 1024, 0},
		{32, 8, 128, 0, {{700, 1}, {130, 1}, {1, 1}, {65, 1}}, 192, 0},
	};
	int fails = 0;
	// Each case with the default ring (DM_ST stages) and with the _s2
	// kernels' (DM_ST2: 2, or 3 over an FP8 cache); over a cache of the
	// activation dtype, groups of up to 16 heads also with the default
	// ring and 2 and 4 kv heads a block where they divide the kv heads (in
	// the bf16 build: the heads' pipeline is the same code for f16, whose
	// products the one-head runs check).
	bool f8 = false;
#ifdef KV_F8
	f8 = true;
#endif
	for (int st : {DM_ST, DM_ST2})
		for (size_t i = 0; i < cases.size(); i++)
			for (int hg : {1, 2, 4}) {
				const Case& c = cases[i];
				if (hg > 1 && (f8 || act_is_f16<T>::v || st != DM_ST || c.hd > 128 || c.heads / c.kvHeads > 16 || c.kvHeads % hg != 0)) continue;
				if (run(c, st, hg, 1234 + i) < 0) fails++;
			}
	printf("%d failed\n", fails);
	return fails != 0;
}
