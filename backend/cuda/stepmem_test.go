package cuda_test

import (
	"errors"
	"testing"

	"kiln/backend"
	"kiln/bench"
	"kiln/engine"
	"kiln/tensor"
)

// TestStepsFitAfterKVCache reproduces the out-of-memory failure of issue 15
// on the GPU: the KV cache takes nearly all the memory left once the
// engine has reserved its steps (fraction 0.99, so about 1% is left over),
// and then steps of many shapes run (prefill chunks of every bucket, with
// one and with all logit rows, decode batches of 1 to 64 sequences, mixed
// decode and prefill), then the same shapes again at longer contexts. With
// one activation arena per bucket allocated at first use (before), the
// arenas of this 128,256-token vocabulary (262 MB of logits at 512 rows
// alone) outgrew the headroom; every step must now run, and the
// device's free memory must not fall after the first round of shapes by
// more than captured graphs take (they give way when memory is short:
// a failed capture runs its step directly).
func TestStepsFitAfterKVCache(t *testing.T) {
	b := backendOf(t, "bf16")
	// 64 KiB of keys and values a token: 256 contexts of 8192 tokens
	// would take 128 GiB, so the fraction, not the sequences, sizes the
	// cache on an H100 or an H200.
	s := bench.Shape{Name: "wide-vocab", Hidden: 1024, Layers: 16, Heads: 8, KVHeads: 8, FFN: 1024, Vocab: 128256, Context: 8192}
	e := openEngine(t, randomModel(t, s, tensor.BF16, 11), b, engine.Options{MaxSeqs: 256, ContextLen: 8192, KVCacheFraction: 0.99})
	free0, total, err := b.Device.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the engine: KV cache %d MiB (%d blocks), %d of %d MiB free", e.KVBytes()>>20, e.KVSpec().Blocks, free0>>20, total>>20)
	tok := func(i int) int { return (i*7919 + 13) % s.Vocab }
	step := func(items []engine.Item) {
		t.Helper()
		if _, err := e.Step(items); err != nil {
			if errors.Is(err, backend.ErrOutOfMemory) {
				t.Fatalf("step of %d items: out of memory: %v", len(items), err)
			}
			t.Fatalf("step of %d items: %v", len(items), err)
		}
	}
	round := func(ctx int) {
		// Prefill chunks of every bucket's size (and odd ones), one row and
		// every row.
		for _, n := range []int{1, 2, 3, 4, 8, 16, 31, 64, 100, 128, 256, 300, 512} {
			for _, all := range []bool{false, true} {
				seq := e.NewSequence()
				toks := make([]int, n)
				for i := range toks {
					toks[i] = tok(i + n)
				}
				step([]engine.Item{{Seq: seq, Tokens: toks, AllRows: all}})
				e.Free(seq)
			}
		}
		// Decode batches of 1 to 64 sequences at context ctx, a few steps
		// each, then with a prefill chunk beside them.
		for _, n := range []int{1, 2, 3, 7, 16, 33, 64} {
			seqs := make([]*engine.Sequence, n)
			for i := range seqs {
				seqs[i] = e.NewSequence()
				toks := make([]int, ctx-8)
				for j := range toks {
					toks[j] = tok(i + j)
				}
				if _, err := e.Prefill(seqs[i], toks, false); err != nil {
					t.Fatalf("prefill of %d tokens: %v", len(toks), err)
				}
			}
			items := make([]engine.Item, n)
			for k := 0; k < 4; k++ {
				for i := range items {
					items[i] = engine.Item{Seq: seqs[i], Tokens: []int{tok(k + i)}}
				}
				step(items)
			}
			extra := e.NewSequence()
			chunk := make([]int, 40)
			for j := range chunk {
				chunk[j] = tok(j)
			}
			step(append(items, engine.Item{Seq: extra, Tokens: chunk}))
			e.Free(extra)
			for _, q := range seqs {
				e.Free(q)
			}
		}
	}
	round(64)
	free1, _, _ := b.Device.MemInfo()
	round(2000)
	free2, _, _ := b.Device.MemInfo()
	st := b.Stats()
	t.Logf("free after the first round %d MiB, after the second %d MiB; %d graphs captured, %d captures failed (%v)",
		free1>>20, free2>>20, st.GraphCaptures, st.GraphFailures, st.LastFailure)
}
