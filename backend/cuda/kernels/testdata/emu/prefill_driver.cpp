// Driver of TestPrefillMMAEmulated (emu_test.go): runs the tensor-core
// prefill (prefill_fa, each build prefill.go's pfMMA launches: four heads a
// block of 8 warps, two heads, one head) on random paged caches, block by
// block, and compares every output with the float64 reference as the GPU
// test does. Prints one line per case and "N failed".
struct Case {
	int heads, kvHeads, hd, window;
	std::vector<std::pair<int, int>> seqs; // {length after the step, tokens in the step}
	float cap; // soft-capped scores (0: none)
};

// WgBuild is a build of prefill_wg the driver runs: keys a stage, slots of
// K and of V (prefill.go's wgBuilds, and 3 slots, which kiln does not
// build, for the rings' wrap-around), K and V by TMA (WG_TMA builds: the
// same three over tensor maps of the cache), and the two warpgroups in
// ping-pong (prefill_wgp: 128 keys, 3 slots, TMA).
struct WgBuild {
	int bk, st;
	bool tma, pp;
};
#if defined(WG_TMA) && defined(KILN_BS)
static_assert(KILN_BS == EMU_BS, "the TMA builds' tensor maps have boxes of the cache's blocks");
static const WgBuild wg_builds[] = {{64, 2, false, false}, {128, 2, false, false}, {64, 3, false, false}, {64, 2, true, false},
                                    {128, 2, true, false},  {64, 3, true, false},   {128, 3, true, true}};
#else
static const WgBuild wg_builds[] = {{64, 2, false, false}, {128, 2, false, false}, {64, 3, false, false}};
#endif
// g_kmap and g_vmap are the TMA builds' tensor maps of the case's caches.
static KilnTensorMap g_kmap, g_vmap;

// launch_one runs block bid of variant v (0: 4 heads a block, 1: 2 heads,
// 2: 1 head; from 3 on wg_builds' prefill_wg) at head dim hd; it reports
// false for a variant the group does not take.
static bool launch_one(int hd, int v, int bid, PF_PARAMS) {
	blockIdx = dim3{(unsigned)bid, 0, 0};
#if defined(ACT_WGMMA) && !defined(KV_F8)
	if (v >= 3 && (hd == 64 || hd == 128)) { // prefill_wg's builds (wg_builds)
		const WgBuild b = wg_builds[v - 3];
#if defined(WG_TMA) && defined(KILN_BS)
#define WG_CALL(H, BK, ST)                                                                                  \
	if (hd == H && b.bk == BK && b.st == ST && !b.pp) {                                                     \
		if (b.tma) prefill_wg<H, BK, ST, KILN_BS>(PF_ARGS, &g_kmap, &g_vmap);                               \
		else prefill_wg<H, BK, ST>(PF_ARGS);                                                                \
	}                                                                                                       \
	if constexpr (BK == 128 && ST == 3)                                                                     \
		if (hd == H && b.bk == BK && b.st == ST && b.pp) prefill_wgp<H, BK, KILN_BS>(PF_ARGS, &g_kmap, &g_vmap);
#else
#define WG_CALL(H, BK, ST)                                                                                  \
	if (hd == H && b.bk == BK && b.st == ST) prefill_wg<H, BK, ST>(PF_ARGS);
#endif
		WG_CALL(64, 64, 2) WG_CALL(64, 128, 2) WG_CALL(64, 64, 3) WG_CALL(128, 64, 2) WG_CALL(128, 128, 2) WG_CALL(128, 64, 3)
#if defined(WG_TMA) && defined(KILN_BS)
		WG_CALL(64, 128, 3) WG_CALL(128, 128, 3)
#endif
		return true;
	}
#endif
#define PF_CALL(H)                                                                                          \
	if (hd == H) {                                                                                          \
		if (v == 0) prefill_fa<H, 2, 2, 64, 2, (2 * H <= 128)>(PF_ARGS);                                    \
		if (v == 1) prefill_fa<H, 2, 1, (2 * H <= 128 ? 64 : 32), 2, (2 * H <= 128)>(PF_ARGS);             \
		if (v == 2) prefill_fa<H, 1, 1, 64, 2, true>(PF_ARGS);                                              \
		return v < 3;                                                                                       \
	}
	PF_CALL(16) PF_CALL(32) PF_CALL(64) PF_CALL(80) PF_CALL(96) PF_CALL(128)
	if (hd == 256 && v == 2) { // past 128 one head a block alone is built
		prefill_fa<256, 1, 1, 64, 2, true>(PF_ARGS);
		return true;
	}
	return false;
}

// variants is the number of variants launch_one knows: 0-2 mma.sync's
// (four heads a block, two, one), then prefill_wg's.
#if defined(ACT_WGMMA) && !defined(KV_F8)
static const int variants = 3 + (int)(sizeof(wg_builds) / sizeof(wg_builds[0]));
#else
static const int variants = 3;
#endif

// wg_shared is prefill_wg's dynamic shared memory (wgShared in prefill.go),
// the TMA builds' mbarriers too.
static unsigned wg_shared(int hd, const WgBuild& b) {
	return 1024 + 2 * 64 * hd * 2 + 2 * b.st * b.bk * hd * 2 + (b.tma ? 16 * b.st : 0) + (b.pp ? 16 * b.st : 0);
}

static double run(const Case& c, int v, unsigned seed) {
	const int group = c.heads / c.kvHeads, hb = v == 0 ? 4 : v == 1 || v >= 3 ? 2 : 1;
	if (group % hb != 0 || (c.hd > 128 && v != 2)) return 0; // a variant the group (or head dim) does not take
	if (v >= 3 && c.hd != 64 && c.hd != 128) return 0;
	std::mt19937_64 rng(seed);
	PagedBatch pb(c.heads, c.kvHeads, c.hd, c.window, c.seqs, rng);
	const int Tn = pb.tokens();
	// Tiles: at most 64 consecutive tokens of one sequence (kernels.Pack).
	std::vector<int> tok0, cnt;
	for (int i = 0; i < Tn; i++) {
		if (i == 0 || pb.seqIndex[i] != pb.seqIndex[i - 1] || cnt.back() == PF_BQ) {
			tok0.push_back(i);
			cnt.push_back(0);
		}
		cnt.back()++;
	}
	std::vector<T> out((size_t)Tn * c.heads * c.hd);
	for (auto& x : out) x.x = 0x7fc1;
	float scale = 1.0f / sqrtf((float)c.hd);
	g_after_wait = [](const void*) { return false; }; // launched plainly: no PDL
	g_threads = 128 * (v == 0 || v >= 3 ? 2 : 1);
	g_smem_limit = v >= 3 ? wg_shared(c.hd, wg_builds[v - 3]) : 0;
	const unsigned long long slots = (unsigned long long)pb.blocks * PagedBatch::bs, es = sizeof(KV);
	g_kmap = KilnTensorMap{(const unsigned char*)pb.kc.data(), {(unsigned long long)c.hd, (unsigned long long)c.kvHeads, slots},
	                       {c.hd * es, c.kvHeads * c.hd * es}, {64, 1, (unsigned)PagedBatch::bs}, (int)es, 128};
	g_vmap = g_kmap;
	g_vmap.base = (const unsigned char*)pb.vc.data();
	const int blocks = (int)tok0.size() * c.heads / hb;
	gridDim = dim3{(unsigned)blocks, 1, 1};
	blockDim = dim3{(unsigned)g_threads, 1, 1};
	for (int bid = 0; bid < blocks; bid++) {
		for (size_t i = 0; i < sizeof(g_smem) / 2; i++) ((unsigned short*)g_smem)[i] = 0x7fc1;
		run_block(dim3{(unsigned)bid, 0, 0}, [&] {
			launch_one(c.hd, v, bid, pb.q.data(), pb.kc.data(), pb.vc.data(), out.data(), tok0.data(), cnt.data(), pb.positions.data(),
			           pb.seqIndex.data(), pb.seqBlockOff.data(), pb.bt.data(), c.heads, c.kvHeads, PagedBatch::bs, c.window, scale, c.cap);
		});
	}
	g_threads = 128;
	g_smem_limit = 0;
	double worst;
	int bad = pb.check(out, scale, c.cap, &worst);
	char build[64] = "mma";
	if (v >= 3)
		snprintf(build, sizeof build, "wg %d keys %d slots%s", wg_builds[v - 3].bk, wg_builds[v - 3].st,
		         wg_builds[v - 3].pp ? " tma ping-pong" : wg_builds[v - 3].tma ? " tma" : "");
	printf("heads %d/%d hd %d window %d cap %g tokens %d tiles %d, %s, %d heads a block: worst %.3g, %d bad\n", c.heads, c.kvHeads,
	       c.hd, c.window, c.cap, Tn, (int)tok0.size(), build, hb, worst, bad);
	fflush(stdout);
	return bad ? -1 : worst;
}

int main(int argc, char** argv) {
	// Cases of the GPU test's (prefillCases in attn_test.go) with head dims
	// the tensor cores take, small enough for the emulator.
	std::vector<Case> cases = {
		{8, 2, 128, 2, {{3, 3}}},
		{8, 1, 80, 0, {{17, 17}, {50, 3}, {1, 1}}},
		{4, 4, 64, 37, {{200, 130}, {90, 17}}},
		{6, 2, 96, 0, {{40, 1}}},
		{16, 4, 64, 100, {{129, 1}, {64, 64}, {65, 65}}},
		{4, 2, 16, 8, {{70, 70}, {33, 5}}},
		{4, 2, 32, 0, {{100, 100}, {3, 1}}},
		{3, 3, 128, 0, {{150, 77}}},
		{8, 2, 128, 0, {{160, 160}}},
		{8, 2, 128, 50, {{200, 70}, {70, 70}}},
		{8, 1, 128, 0, {{64, 64}, {129, 129}, {5, 1}}},
		{12, 4, 128, 64, {{150, 100}}},
		// Long contexts: more stages than any ring has slots (prefill_wg's
		// copies wrap around).
		{8, 2, 128, 0, {{600, 40}}},
		{4, 2, 64, 300, {{700, 70}}},
		// Soft-capped scores (Gemma 2), with and without a window.
		{8, 2, 128, 40, {{130, 130}}, 1.5f},
		{4, 2, 32, 0, {{100, 100}, {3, 1}}, 1.5f},
		// Head dim 256 (Gemma's): one head a block, with and without the cap.
		{8, 4, 256, 0, {{130, 130}, {20, 5}}},
		{4, 2, 256, 40, {{90, 90}}, 1.5f},
	};
	int fails = 0;
	for (int v = 0; v < variants; v++)
		for (size_t i = 0; i < cases.size(); i++)
			if (run(cases[i], v, 4321 + i) < 0) fails++;
	printf("%d failed\n", fails);
	return fails != 0;
}
