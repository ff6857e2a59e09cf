package cuda_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/backend/cuda"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/bench"
	"kiln/engine"
	"kiln/internal/hffixture"
	"kiln/model"
	"kiln/tensor"
	"kiln/tune"
)

var (
	groupMu    sync.Mutex
	groupDevs  []*cu.Device           // devices 1… (device 0 is the shared test device)
	groupComms = map[int][]*cu.Comm{} // the communicators of each group size, made once
	groupPeers = map[int][]*kernels.PeerGroup{}
)

// groupOf is a tensor-parallel group of n backends of compute dtype dtype
// on devices 0…n-1, or skips on a machine of fewer GPUs. Its all-reduces
// run as cuda.OpenGroup's do under the same KILN_PEER_ALLREDUCE.
func groupOf(t *testing.T, dtype string, n int) *backend.Group {
	return groupMode(t, dtype, n, os.Getenv("KILN_PEER_ALLREDUCE"))
}

// groupMode is groupOf with the all-reduces as KILN_PEER_ALLREDUCE=mode
// makes OpenGroup's: "" over peer memory (where the devices reach each
// other's) in the Lamport form with the add and norm after it; "apart"
// without; "flags" in the flag form; "0" NCCL's alone.
func groupMode(t *testing.T, dtype string, n int, mode string) *backend.Group {
	t.Helper()
	pm, err := cuda.PeerForm(mode)
	if err != nil {
		t.Fatal(err)
	}
	b0 := backendOf(t, dtype)
	count, err := cu.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if count < n {
		t.Skipf("%d GPUs: a group of %d needs more", count, n)
	}
	groupMu.Lock()
	defer groupMu.Unlock()
	for len(groupDevs) < n-1 {
		d, err := cu.Open(len(groupDevs) + 1)
		if err != nil {
			t.Fatal(err)
		}
		groupDevs = append(groupDevs, d)
	}
	devs := append([]*cu.Device{b0.Device}, groupDevs[:n-1]...)
	comms, ok := groupComms[n]
	if !ok {
		if comms, err = cu.NewComms(devs); err != nil {
			t.Fatal(err)
		}
		groupComms[n] = comms
		if groupPeers[n], err = cuda.NewPeers(devs); err != nil {
			t.Fatal(err)
		}
	}
	g := &backend.Group{Abort: func(error) {
		for _, c := range comms {
			c.Abort()
		}
	}}
	for i, d := range devs {
		b := &cuda.Backend{Device: d, DType: dtype, Tune: tune.Off, Comm: comms[i]}
		if p := groupPeers[n]; p != nil && pm.Peers {
			pg := *p[i]
			pg.Flags, pg.Apart = pm.Flags, pm.Apart
			b.Peers = &pg
		}
		g.Ranks = append(g.Ranks, b)
	}
	return g
}

// TestTensorParallelFixtures runs the transformers fixtures sharded over
// 2 GPUs (and 4 where there are): within the single-GPU limits of
// transformers' logits (‖Δ‖₂/‖ref‖₂ ≤ 1e-3 in f32, 2e-2 in bf16), the same
// argmax (bf16: but at near-ties), transformers' greedy ids in f32, and in
// bf16 within 2e-2 of one GPU's logits.
func TestTensorParallelFixtures(t *testing.T) {
	for dir, f := range hffixture.Load(t, "../../testdata/hf") {
		for _, n := range []int{2, 4} {
			for _, dtype := range []string{"f32", "bf16"} {
				t.Run(fmt.Sprintf("%s/tp%d/%s", f.Variant, n, dtype), func(t *testing.T) {
					g := groupOf(t, dtype, n)
					mf, err := model.Load(dir)
					if err != nil {
						t.Fatal(err)
					}
					m := mf.Config
					mf.Close()
					if m.NumHeads%n != 0 || m.NumKVHeads%n != 0 || m.IntermediateSize%n != 0 {
						t.Skipf("%d heads, %d KV heads, MLP %d over %d ranks", m.NumHeads, m.NumKVHeads, m.IntermediateSize, n)
					}
					if m.NumExperts > 0 && ((m.IntermediateSize/n)%8 != 0 || (m.SharedExpertSize/n)%8 != 0) {
						// The expert kernels load rows of 16 bytes: a rank's
						// widths must be multiples of 8, or the model is
						// refused at load, by name (real models' are).
						mf, err := model.Load(dir)
						if err != nil {
							t.Fatal(err)
						}
						defer mf.Close()
						e, err := engine.New(mf, g, engine.Options{})
						if err == nil {
							e.Close()
						}
						if err == nil || !strings.Contains(err.Error(), "must be multiples of 8") {
							t.Fatalf("experts' widths %d and %d over %d ranks: %v, want a refusal", m.IntermediateSize, m.SharedExpertSize, n, err)
						}
						return
					}
					if m.QKNormWhole {
						t.Skip("q and k normalized over all heads at once (OLMoE): refused by the sharding (engine's TestTensorParallelFixtures)")
					}
					e := openEngine(t, dir, g, engine.Options{})
					logits := f.Prefill(t, e)
					limit := 1e-3
					if dtype == "bf16" {
						limit = 2e-2
					}
					got := relL2(logits, f.Logits)
					t.Logf("‖Δ‖₂/‖ref‖₂ = %.3g (limit %g)", got, limit)
					if dtype == "bf16" && m.NumExperts > 0 {
						got = withoutRoutingFlips(t, logits, f.Logits, f.LogitsShape[1], limit)
					}
					if !(got <= limit) { // NaN fails too
						t.Errorf("logits: ‖Δ‖₂/‖ref‖₂ = %.3g > %g", got, limit)
					}
					checkArgmax(t, logits, f.Logits, f.LogitsShape[1], dtype == "f32")
					if dtype == "bf16" {
						l1 := f.Prefill(t, openEngine(t, dir, backendOf(t, dtype), engine.Options{}))
						d := relL2(logits, l1)
						t.Logf("‖tp%d−tp1‖₂/‖tp1‖₂ = %.3g", n, d)
						if !(d <= 2e-2) {
							t.Errorf("‖tp%d−tp1‖₂/‖tp1‖₂ = %.3g > 2e-2", n, d)
						}
						return
					}
					f.CheckGreedy(t, e)
				})
			}
		}
	}
}

// TestTensorParallelBatched: three sequences prefilled together then
// decoded 20 steps (captured CUDA graphs, the collectives in them) over 2
// and 4 GPUs give the CPU's logits within 1e-4 in f32, with each of the
// all-reduces (groupMode); every rank replays its graphs.
func TestTensorParallelBatched(t *testing.T) {
	s := bench.Shape{Name: "tp", Hidden: 512, Layers: 2, Heads: 8, KVHeads: 4, FFN: 384, Vocab: 1000, Context: 512, Tied: true}
	for _, n := range []int{2, 4} {
		for _, mode := range []string{"", "flags", "0"} {
			t.Run(fmt.Sprintf("tp%d/mode=%q", n, mode), func(t *testing.T) {
				g := groupMode(t, "f32", n, mode)
				if mode != "0" && cuda.GroupRanks(g)[0].Peers == nil {
					t.Skip("the devices do not reach each other's memory: NCCL's all-reduce alone")
				}
				dir := randomModel(t, s, tensor.F32, 9)
				got, ref := batchedSteps(t, dir, g, s.Vocab), batchedSteps(t, dir, &cpu.Backend{}, s.Vocab)
				for i := range ref {
					if e := relL2(got[i], ref[i]); e > 1e-4 {
						t.Errorf("step %d: ‖Δ‖₂/‖ref‖₂ = %.3g > 1e-4", i, e)
					}
				}
				for r, b := range cuda.GroupRanks(g) {
					st := b.Stats()
					t.Logf("rank %d: %d steps, %d graph replays, %d captures, %d failures (%v)", r, st.Steps, st.GraphReplays, st.GraphCaptures, st.GraphFailures, st.LastFailure)
					if st.GraphReplays == 0 {
						t.Errorf("rank %d replayed no graph", r)
					}
				}
			})
		}
	}
}

// TestPeerFormsMatch: over 2 and 4 GPUs in bf16, the all-reduce over peer
// memory in the Lamport form with the residual add and RMSNorm after it in
// its kernel where it takes two shots (the default), apart from it, and in
// the flag form give the same logits bit for bit (each sums the ranks'
// partials in rank order in float32, and the norm its row's squares in
// the same order), through a batched prefill (203 rows of 1,536: two shots
// over four ranks) and 20 decode steps replayed from graphs (every
// all-reduce within the group's capacity: all over peer memory), under
// tune.Defaults (the same kernels every run). The default must have run
// the norms in its kernel over four.
func TestPeerFormsMatch(t *testing.T) {
	s := bench.Shape{Name: "tp", Hidden: 1536, Layers: 3, Heads: 12, KVHeads: 4, FFN: 384, Vocab: 1000, Context: 512}
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("tp%d", n), func(t *testing.T) {
			dir := randomModel(t, s, tensor.BF16, 13)
			var ref [][]float32
			for _, mode := range []string{"", "apart", "flags"} {
				g := groupMode(t, "bf16", n, mode)
				bs := cuda.GroupRanks(g)
				if bs[0].Peers == nil {
					t.Skip("the devices do not reach each other's memory: NCCL's all-reduce alone")
				}
				for _, b := range bs {
					// The norms apart from the all-reduce in every form
					// (folded, the one-shot form adds the residual and the
					// flag form does not).
					b.Tune, b.NoFoldNorms = tune.Defaults, true
				}
				got := batchedSteps(t, dir, g, s.Vocab)
				// Over four ranks the prefill's all-reduces take two shots,
				// which run the norm (over two, none do).
				if norms := bs[0].Stats().PeerNorms; (mode == "" && n > 2) != (norms > 0) {
					t.Errorf("KILN_PEER_ALLREDUCE=%q over %d: %d all-reduces ran the norm after them", mode, n, norms)
				}
				if ref == nil {
					ref = got
					continue
				}
				for i := range ref {
					if !slices.Equal(got[i], ref[i]) {
						t.Errorf("step %d: KILN_PEER_ALLREDUCE=%q's logits differ from the default's (‖Δ‖₂/‖ref‖₂ = %.3g)", i, mode, relL2(got[i], ref[i]))
					}
				}
			}
		})
	}
}

// TestTensorParallelSampledRows: over 2 and 4 GPUs with peer memory, seven
// sequences with as many sampling settings (greedy, temperatures, top-k,
// top-p, min-p, penalties), prefilled then decoded 20 steps, choose the
// same tokens when each rank samples its share of the rows on the device
// (the logits exchanged by rows, kernels.PeerScatterRows; 7 rows split 4
// / 3 or 2 / 2 / 2 / 1) as when the logits are gathered whole and sampled
// on the host from the same seeds (engine.StepSampleLogits): the device
// sampler reproduces engine.Sampler (TestDeviceSampling), so any row that
// reached the wrong rank, or params or history of another row, shows.
func TestTensorParallelSampledRows(t *testing.T) {
	s := bench.Shape{Name: "tps", Hidden: 256, Layers: 2, Heads: 8, KVHeads: 4, FFN: 384, Vocab: 1024, Context: 256}
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("tp%d", n), func(t *testing.T) {
			g := groupOf(t, "f32", n)
			if cuda.GroupRanks(g)[0].Peers == nil {
				t.Skip("the devices do not reach each other's memory: NCCL's all-gather alone")
			}
			dir := randomModel(t, s, tensor.F32, 21)
			gen := func(host bool) [][]int {
				e := openEngine(t, dir, g, engine.Options{MaxSeqs: len(samplingSettings)})
				var items []engine.Item
				var samplers []*engine.Sampler
				for i, p := range samplingSettings {
					prompt := []int{1, 17 + i, 400, 17, 9 + 3*i}
					items = append(items, engine.Item{Seq: e.NewSequence(), Tokens: prompt})
					samplers = append(samplers, engine.NewSampler(p, s.Vocab, prompt))
				}
				out := make([][]int, len(items))
				for range 21 {
					var ids []int
					var err error
					if host {
						ids, _, err = e.StepSampleLogits(items, samplers)
					} else {
						ids, err = e.StepSample(items, samplers)
					}
					if err != nil {
						t.Fatal(err)
					}
					for i, id := range ids {
						out[i] = append(out[i], id)
						samplers[i].Accept(id)
						items[i].Tokens = []int{id}
					}
				}
				return out
			}
			before := cuda.GroupRanks(g)[n-1].Stats().SampledShares
			device := gen(false)
			if got := cuda.GroupRanks(g)[n-1].Stats().SampledShares - before; got != 21 {
				t.Errorf("the last rank sampled its share in %d of 21 steps", got)
			}
			host := gen(true)
			for i := range samplingSettings {
				if !slices.Equal(device[i], host[i]) {
					t.Errorf("%+v:\ndevice %v\n  host %v", samplingSettings[i], device[i], host[i])
				}
			}
		})
	}
}
