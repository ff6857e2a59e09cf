package kernels

// GPU benchmarks; run once each (-test.bench . -test.benchtime 1x): each
// measures itself with CUDA events (median of several groups of launches,
// queued behind a spin kernel so that the GPU runs them back to back) and
// reports its own metrics.

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"kiln/backend"
	"kiln/backend/cuda/cu"
)

const spinSrc = `extern "C" __global__ void spin(long long cycles) {
	long long t0 = clock64();
	while (clock64() - t0 < cycles) {}
}`

var (
	spinOnce sync.Once
	spinMod  *cu.Module
	spinErr  error
)

// gpuTime returns the median time in ms of one call of f, over reps groups
// of n calls (f gets the call's index, for rotating inputs).
func gpuTime(b testing.TB, n, reps int, f func(i int) error) float64 {
	d := gpu(b)
	spinOnce.Do(func() { spinMod, spinErr = d.Compile("kiln_spin", spinSrc) })
	must(b, spinErr)
	start, err := d.NewEvent(true)
	must(b, err)
	defer start.Close()
	end, err := d.NewEvent(true)
	must(b, err)
	defer end.Close()
	for i := 0; i < 3; i++ {
		must(b, f(i))
	}
	must(b, d.Sync())
	var times []float64
	for r := 0; r < reps; r++ {
		must(b, d.Do(func() error {
			if err := spinMod.Launch("spin", cu.D1(1), cu.D1(1), 0, nil, int64(4_000_000)); err != nil {
				return err
			}
			if err := start.Record(nil); err != nil {
				return err
			}
			for i := 0; i < n; i++ {
				if err := f(r*n + i); err != nil {
					return err
				}
			}
			return end.Record(nil)
		}))
		must(b, end.Sync())
		ms, err := cu.Elapsed(start, end)
		must(b, err)
		times = append(times, float64(ms)/float64(n))
	}
	slices.Sort(times)
	return times[len(times)/2]
}

var (
	copyOnce sync.Once
	copyGBs  float64
)

// copyBandwidth is the device-to-device copy bandwidth (bytes read plus
// bytes written per second, GB/s) of a 512 MiB copy.
func copyBandwidth(b testing.TB) float64 {
	copyOnce.Do(func() {
		d := gpu(b)
		const n = 512 << 20
		src, dst := alloc(b, n), alloc(b, n)
		must(b, d.Memset32(src, 0x3f803f80, n/4, nil))
		ms := gpuTime(b, 5, 5, func(int) error { return d.CopyDtoD(dst, src, n, nil) })
		copyGBs = 2 * n / (ms * 1e-3) / 1e9
		b.Logf("device %s: cuMemcpyDtoD 512 MiB: %.3f ms, %.0f GB/s (read+write)", d.Name, ms, copyGBs)
	})
	return copyGBs
}

func BenchmarkCopy(b *testing.B) {
	bw := copyBandwidth(b)
	b.ReportMetric(bw, "GB/s")
}

// BenchmarkDecodeAttention times every plan DecodePlans offers, bf16, 32
// query heads over 8 kv heads, head dim 128 (Llama-3-8B), block size 16,
// random block tables: one sequence at contexts 512 and 4096 (ctx=N), and
// batches of 16, 64 and 256 sequences at contexts 128, 512 and 2048, 64 at
// 544 and 256 at 192 (batch=B/ctx=N), one token each. Each reports µs a
// call, the GB/s of K and V read and their share of the copy bandwidth;
// sub-benchmarks chunk=N (split plans), cluster=N and mma=N (tensor cores,
// N keys a split; /heads=G with G kv heads a block).
func BenchmarkDecodeAttention(b *testing.B) {
	type bc struct{ batch, ctx int }
	cases := []bc{{1, 512}, {1, 4096}}
	for _, batch := range []int{16, 64, 256} {
		for _, ctx := range []int{128, 512, 2048} {
			cases = append(cases, bc{batch, ctx})
		}
	}
	// The contexts of batched decode as kiln bench model and serve meet
	// them: 64 sequences 544 keys deep (depth 512, midway through 64
	// tokens), 256 sequences 192 deep (256 streams of 128/128 midway).
	cases = append(cases, bc{64, 544}, bc{256, 192})
	for _, c := range cases {
		name := "ctx=" + itoa(c.ctx)
		if c.batch > 1 {
			name = "batch=" + itoa(c.batch) + "/" + name
		}
		b.Run(name, func(b *testing.B) { benchDecode(b, c.batch, c.ctx, false) })
	}
}

// BenchmarkDecodeAttentionFP8 is BenchmarkDecodeAttention's batches over an
// FP8 cache (NewFP8KV: E4M3 codes, half the bytes; the tensor-core plans
// only), reporting the same measures of the bytes it reads.
func BenchmarkDecodeAttentionFP8(b *testing.B) {
	for _, batch := range []int{16, 64, 256} {
		for _, ctx := range []int{512, 2048} {
			b.Run("batch="+itoa(batch)+"/ctx="+itoa(ctx), func(b *testing.B) { benchDecode(b, batch, ctx, true) })
		}
	}
}

// benchDecode times the decode plans on batch sequences of ctx keys. The
// K/V cache holds copies of the batch's blocks, rotated call by call so
// that L2 (50–60 MB) does not keep them: 16 at batch 1 (as in the earlier
// runs of docs/PERF.md), else as many as make 512 MiB (one copy for 512
// MiB and more; batch 256 × 2048 keys is 2.1 GB). fp8: the cache holds
// E4M3 codes (a byte an element), read by the FP8 cache's module.
func benchDecode(b *testing.B, batch, ctx int, fp8 bool) {
	const heads, kvHeads, hd, bs = 32, 8, 128, 16
	act := cu.BF16
	k, es, cache := kern(b, act), 2, "bf16"
	if fp8 {
		k, es, cache = kern8(b, act), 1, "fp8"
	}
	d := gpu(b)
	bw := copyBandwidth(b)
	rng := rand.New(rand.NewPCG(1, 2))
	nb := (ctx + bs - 1) / bs
	width := kvHeads * hd
	bytes := float64(batch) * float64(ctx) * float64(width) * 2 * float64(es) // K and V read by a call
	copies := 16
	if batch > 1 {
		copies = max(1, int(math.Ceil(float64(512<<20)/bytes)))
	}
	blocks := nb * batch * copies
	spec := backend.KVSpec{Layers: 1, Blocks: blocks, BlockSize: bs, KVHeads: kvHeads, HeadDim: hd}
	kc := randCache(b, act, blocks*bs*width, rng, fp8)
	vc := randCache(b, act, blocks*bs*width, rng, fp8)
	q := up(b, act, randn(rng, batch*heads*hd, 1))
	out := outBuf(b, act, batch*heads*hd)
	perm := rng.Perm(blocks)
	metas := make([]DevMeta, copies)
	for c := range metas {
		bt := &backend.Batch{Rows: []int32{0}}
		for s := 0; s < batch; s++ {
			seq := backend.Seq{Len: ctx}
			for i := 0; i < nb; i++ {
				seq.Blocks = append(seq.Blocks, int32(perm[(c*batch+s)*nb+i]))
			}
			bt.Seqs = append(bt.Seqs, seq)
			bt.Tokens = append(bt.Tokens, 1)
			bt.Positions = append(bt.Positions, int32(ctx-1))
			bt.SeqIndex = append(bt.SeqIndex, int32(s))
		}
		m, err := Pack(bt, spec)
		must(b, err)
		buf := alloc(b, m.Bytes())
		metas[c], err = m.Upload(d, buf, m.Bytes())
		must(b, err)
	}
	a := Attn{Out: out, Q: q, KCache: kc, VCache: vc, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd)), FP8: fp8}
	if batch == 1 {
		emptyMs := gpuTime(b, 64, 7, func(int) error {
			if err := spinMod.Launch("spin", cu.D1(1), cu.D1(1), 0, nil, int64(0)); err != nil {
				return err
			}
			return spinMod.Launch("spin", cu.D1(1), cu.D1(1), 0, nil, int64(0))
		})
		b.Logf("two empty back-to-back launches: %.2f µs", emptyMs*1e3)
	}
	plans := DecodePlans(a, metas[0].Meta, d.SMs, d.Clusters(), act)
	ws := alloc(b, PlanDecode(a, metas[0].Meta, d.SMs).WorkspaceBytes) // the most any plan needs
	counters := alloc(b, DecodeCounterBytes(batch, kvHeads))
	calls := 64
	if bytes > 64<<20 {
		calls = 16
	}
	for _, plan := range plans {
		name := "chunk=" + itoa(plan.Chunk)
		switch {
		case plan.Cluster:
			name = "cluster=" + itoa(plan.MaxSplits)
		case plan.MMA && plan.Stages != 0:
			name = "mma" + itoa(plan.Stages) + "st=" + itoa(plan.Chunk)
		case plan.MMA:
			name = "mma=" + itoa(plan.Chunk)
		}
		if plan.Heads > 1 {
			name += "/heads=" + itoa(plan.Heads)
		}
		b.Run(name, func(b *testing.B) {
			ms := gpuTime(b, calls, 7, func(i int) error { return k.DecodeAttention(nil, a, metas[i%copies], plan, ws, counters) })
			gbs := bytes / (ms * 1e-3) / 1e9
			b.ReportMetric(ms*1e3, "us/call")
			b.ReportMetric(gbs, "GB/s")
			b.ReportMetric(gbs/bw, "of-copy-bw")
			b.Logf("device %s: decode attention bf16, %s cache, batch %d ctx %d, 32/8 heads, hd 128 (%v, at most %d keys a block; %d copies of %.0f MB): %.2f µs, %.0f GB/s of K+V, %.0f%% of copy bandwidth %.0f GB/s",
				d.Name, cache, batch, ctx, plan, plan.Chunk, copies, bytes/1e6, ms*1e3, gbs, 100*gbs/bw, bw)
		})
	}
}

// randCache allocates n elements of dtype act (fp8: E4M3 codes) on the
// device, filled with random normal values: one random chunk of at most 16
// Mi elements, uploaded and repeated (drawing the 2 GB of the largest
// benchmark on the host would take minutes).
func randCache(b testing.TB, act cu.DType, n int, rng *rand.Rand, fp8 bool) cu.Ptr {
	d := gpu(b)
	es := act.Size()
	chunk := min(n, 16<<20)
	var data []byte
	if fp8 {
		es = 1
		data, _ = e4m3Codes(randn(rng, chunk, 1))
	} else {
		data = encode(act, randn(rng, chunk, 1))
	}
	p := alloc(b, n*es)
	must(b, d.Upload(p, data))
	for off := chunk; off < n; off += chunk {
		must(b, d.CopyDtoD(p.Add(off*es), p, min(chunk, n-off)*es, nil))
	}
	must(b, d.Sync())
	return p
}

// BenchmarkPrefillAttention times the prefill kernels on one sequence of
// 4096 tokens (causal, and full: every token sees all 4096 keys) and of 2048
// tokens (causal); bf16, 32/8 heads, head dim 128, block size 16.
func BenchmarkPrefillAttention(b *testing.B) {
	// The TMA builds (wgp128, wgt128, wgt) where the module holds them (one
	// built for a block size of 8 to 64 tokens, a power of two: -DWG_TMA);
	// skipped otherwise.
	benchPrefill(b, 4096, cu.BF16, "wgp128", "wgt128", "wgt", "wg128", "wg", "mma", "mma2", "mma1", "attn")
	benchPrefill(b, 4096, cu.F16, "wgp128", "wgt128", "wg128", "wg", "mma")
	benchPrefill(b, 2048, cu.BF16, "wgp128", "wgt128", "wgt", "wg128", "wg", "mma")
}

func benchPrefill(b *testing.B, T int, act cu.DType, variants ...string) {
	type vt struct {
		causal  bool
		variant string
	}
	var vs []vt
	for _, v := range variants {
		vs = append(vs, vt{true, v})
		if T == 4096 {
			vs = append(vs, vt{false, v})
		}
	}
	for _, v := range vs {
		causal, variant := v.causal, v.variant
		nm := "causal"
		if !causal {
			nm = "full"
		}
		nm += itoa(T) + "/" + variant
		if act != cu.BF16 {
			nm += "/" + cname(act)
		}
		b.Run(nm, func(b *testing.B) {
			const heads, kvHeads, hd, bs = 32, 8, 128, 16
			k := kern(b, act)
			d := gpu(b)
			rng := rand.New(rand.NewPCG(3, 4))
			nb := T / bs
			width := kvHeads * hd
			spec := backend.KVSpec{Layers: 1, Blocks: nb, BlockSize: bs, KVHeads: kvHeads, HeadDim: hd}
			seq := backend.Seq{Len: T}
			for _, p := range rng.Perm(nb) {
				seq.Blocks = append(seq.Blocks, int32(p))
			}
			bt := &backend.Batch{Seqs: []backend.Seq{seq}, Rows: []int32{int32(T - 1)}}
			flops := 0.0
			for i := 0; i < T; i++ {
				p := i
				if !causal {
					p = T - 1 // every token sees all T keys
				}
				bt.Tokens = append(bt.Tokens, 1)
				bt.Positions = append(bt.Positions, int32(p))
				bt.SeqIndex = append(bt.SeqIndex, 0)
				flops += 4 * float64(p+1) * hd * heads
			}
			m, err := Pack(bt, spec)
			must(b, err)
			buf := alloc(b, m.Bytes())
			dm, err := m.Upload(d, buf, m.Bytes())
			must(b, err)
			a := Attn{
				Out: outBuf(b, act, T*heads*hd), Q: up(b, act, randn(rng, T*heads*hd, 1)),
				KCache: up(b, act, randn(rng, nb*bs*width, 1)), VCache: up(b, act, randn(rng, nb*bs*width, 1)),
				Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd)), CacheSlots: nb * bs,
			}
			if variant != "attn" && !slices.Contains(k.PrefillVariants(a), variant) {
				b.Skipf("%s does not take the case on %s", variant, d.Name) // wgmma's builds off sm_90a
			}
			ms := gpuTime(b, 3, 5, func(int) error { return k.prefill(nil, a, dm, variant) })
			tf := flops / (ms * 1e-3) / 1e12
			b.ReportMetric(ms, "ms/call")
			b.ReportMetric(tf, "TFLOP/s")
			b.Logf("device %s: prefill attention %s %s, %d tokens, 32/8 heads, hd 128: %.3f ms, %.1f TFLOP/s", d.Name, cname(act), nm, T, ms, tf)
		})
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}
