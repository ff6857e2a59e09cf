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

func BenchmarkDecodeAttention(b *testing.B) {
	for _, ctx := range []int{512, 4096} {
		b.Run("ctx="+itoa(ctx), func(b *testing.B) {
			const heads, kvHeads, hd, bs, copies = 32, 8, 128, 16, 16
			act := cu.BF16
			k := kern(b, act)
			d := gpu(b)
			bw := copyBandwidth(b)
			rng := rand.New(rand.NewPCG(1, 2))
			nb := (ctx + bs - 1) / bs
			blocks := nb * copies
			width := kvHeads * hd
			spec := backend.KVSpec{Layers: 1, Blocks: blocks, BlockSize: bs, KVHeads: kvHeads, HeadDim: hd}
			kc := up(b, act, randn(rng, blocks*bs*width, 1))
			vc := up(b, act, randn(rng, blocks*bs*width, 1))
			q := up(b, act, randn(rng, heads*hd, 1))
			out := outBuf(b, act, heads*hd)
			perm := rng.Perm(blocks)
			metas := make([]DevMeta, copies)
			for c := range metas {
				seq := backend.Seq{Len: ctx}
				for i := 0; i < nb; i++ {
					seq.Blocks = append(seq.Blocks, int32(perm[c*nb+i]))
				}
				bt := &backend.Batch{Tokens: []int32{1}, Positions: []int32{int32(ctx - 1)}, SeqIndex: []int32{0}, Seqs: []backend.Seq{seq}, Rows: []int32{0}}
				m, err := Pack(bt, spec)
				must(b, err)
				buf := alloc(b, m.Bytes())
				metas[c], err = m.Upload(d, buf, m.Bytes())
				must(b, err)
			}
			a := Attn{Out: out, Q: q, KCache: kc, VCache: vc, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}
			emptyMs := gpuTime(b, 64, 7, func(int) error {
				if err := spinMod.Launch("spin", cu.D1(1), cu.D1(1), 0, nil, int64(0)); err != nil {
					return err
				}
				return spinMod.Launch("spin", cu.D1(1), cu.D1(1), 0, nil, int64(0))
			})
			b.Logf("two empty back-to-back launches: %.2f µs", emptyMs*1e3)
			plans := DecodePlans(a, metas[0].Meta, d.SMs, d.Clusters())
			ws := alloc(b, plans[0].WorkspaceBytes)
			counters := alloc(b, DecodeCounterBytes(1, kvHeads))
			bytes := float64(ctx) * float64(width) * 2 * 2
			for _, plan := range plans {
				name := "chunk=" + itoa(plan.Chunk)
				if plan.Cluster {
					name = "cluster=" + itoa(plan.MaxSplits)
				}
				b.Run(name, func(b *testing.B) {
					ms := gpuTime(b, 64, 7, func(i int) error { return k.DecodeAttention(nil, a, metas[i%copies], plan, ws, counters) })
					gbs := bytes / (ms * 1e-3) / 1e9
					b.ReportMetric(ms*1e3, "us/call")
					b.ReportMetric(gbs, "GB/s")
					b.ReportMetric(gbs/bw, "of-copy-bw")
					b.Logf("device %s: decode attention bf16 batch 1 ctx %d, 32/8 heads, hd 128 (%v, at most %d keys a block): %.2f µs, %.0f GB/s of K+V, %.0f%% of copy bandwidth %.0f GB/s",
						d.Name, ctx, plan, plan.Chunk, ms*1e3, gbs, 100*gbs/bw, bw)
				})
			}
		})
	}
}

// BenchmarkPrefillAttention times the prefill kernels on one sequence of
// 4096 tokens (causal, and full: every token sees all 4096 keys) and of 2048
// tokens (causal); bf16, 32/8 heads, head dim 128, block size 16.
func BenchmarkPrefillAttention(b *testing.B) {
	benchPrefill(b, 4096, cu.BF16, "mma", "mma2", "mma1", "attn")
	benchPrefill(b, 4096, cu.F16, "mma")
	benchPrefill(b, 2048, cu.BF16, "mma")
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
				Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd)),
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
