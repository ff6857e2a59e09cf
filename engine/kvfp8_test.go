package engine_test

import (
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/eval"
	"kiln/internal/testshared"
	"kiln/model"
)

// TestFP8KVCache runs a real trained model (stories260K) with its KV cache
// in float32 and in FP8 (E4M3, scale 1): a block takes a quarter of the
// bytes; teacher-forced on the float32 cache's 200-token greedy text, the
// FP8 cache's next-token distributions stay within a KL divergence bound
// of the float32 ones (measured 2026-11-25 below), and the greedy texts
// agree for at least the first fp8GreedySame tokens.
func TestFP8KVCache(t *testing.T) {
	dir := testshared.Path(t, "models", "stories260K")
	m, err := model.Load(dir + "/stories260K.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	engines := map[bool]*engine.Engine{}
	for _, fp8 := range []bool{false, true} {
		e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 256, KVCacheFP8: fp8})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines[fp8] = e
	}
	f32, fp8 := engines[false], engines[true]
	if !fp8.KVSpec().FP8 || f32.KVSpec().FP8 {
		t.Fatalf("specs %+v and %+v", f32.KVSpec(), fp8.KVSpec())
	}
	if a, b := f32.KVBytes()/int64(f32.KVSpec().Blocks), fp8.KVBytes()/int64(fp8.KVSpec().Blocks); a != 4*b {
		t.Errorf("a block takes %d bytes in float32 and %d in FP8, want a quarter", a, b)
	}
	greedy := map[bool][]int{}
	for k, e := range engines {
		ids := []int{1}
		if _, err := e.Generate([]int{1}, engine.SamplingParams{MaxTokens: 200}, func(id int) bool {
			ids = append(ids, id)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		greedy[k] = ids
	}
	same := 0
	for same < min(len(greedy[false]), len(greedy[true])) && greedy[false][same] == greedy[true][same] {
		same++
	}
	logits := map[bool][]float32{}
	for k, e := range engines {
		s := e.NewSequence()
		l, err := e.Prefill(s, greedy[false], true)
		if err != nil {
			t.Fatal(err)
		}
		logits[k] = append([]float32(nil), l...)
		e.Free(s)
	}
	kl, top := eval.KLDivergence(logits[false], logits[true], f32.Vocab())
	t.Logf("FP8 KV cache: greedy text equal to float32's for %d of %d tokens; over those %d tokens KL(f32‖fp8) %.6f nats a token, top-1 agreement %.2f%%",
		same, len(greedy[false]), len(greedy[false]), kl, 100*top)
	if same < fp8GreedySame {
		t.Errorf("greedy texts part at token %d, want at least %d the same", same, fp8GreedySame)
	}
	if !(kl <= fp8KVBound) {
		t.Errorf("KL divergence %.6f nats a token, bound %g", kl, fp8KVBound)
	}
}

// The FP8 cache's bounds. Measured 2026-11-25 (this machine, Zen 4): the
// greedy texts agree for 107 tokens, KL 0.00849 nats a token, top-1 98.0%;
// the bounds leave room for other CPUs' kernels (AVX2 against AVX-512 sum
// in other orders, which can move where the texts part).
const (
	fp8GreedySame = 32
	fp8KVBound    = 0.02
)
