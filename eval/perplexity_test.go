package eval

import (
	"math"
	"testing"

	"kiln/backend/cpu"
	"kiln/bench"
	"kiln/engine"
	"kiln/model"
	"kiln/tensor"
)

func tinyEngine(t *testing.T) *engine.Engine {
	dir := t.TempDir()
	if err := bench.WriteRandomModel(dir, bench.Shapes["tiny"], tensor.F32, 5); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.New(m, &cpu.Backend{}, engine.Options{ContextLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// bruteForce scores each token once, from the first window that covers it
// (and not as that window's first token), running the window's prefix up to
// the token as its own sequence: independent of SlidingPerplexity's
// bookkeeping of which rows of a window's logits to read.
func bruteForce(t *testing.T, e *engine.Engine, ids []int, window, stride int) (float64, int) {
	scored := make([]bool, len(ids))
	var nll float64
	n := 0
	for begin := 0; begin < len(ids); begin += stride {
		end := min(begin+window, len(ids))
		for i := begin + 1; i < end; i++ {
			if scored[i] {
				continue
			}
			scored[i] = true
			seq := e.NewSequence()
			logits, err := e.Prefill(seq, ids[begin:i], false)
			e.Free(seq)
			if err != nil {
				t.Fatal(err)
			}
			nll -= logSoftmaxAt(logits, ids[i])
			n++
		}
		if end == len(ids) {
			break
		}
	}
	return nll, n
}

func TestSlidingPerplexityMatchesBruteForce(t *testing.T) {
	e := tinyEngine(t)
	ids := make([]int, 50)
	for i := range ids {
		ids[i] = (i*37 + 11) % e.Vocab()
	}
	for _, c := range []struct{ window, stride int }{{16, 8}, {16, 16}, {16, 5}, {64, 32}, {7, 3}} {
		got, err := SlidingPerplexity(e, ids, c.window, c.stride)
		if err != nil {
			t.Fatal(err)
		}
		nll, n := bruteForce(t, e, ids, c.window, c.stride)
		// With stride < window every token but the first is scored; with
		// stride == window the first token of each window is not.
		want := len(ids) - 1
		if c.stride == c.window {
			want = len(ids) - (len(ids)+c.window-1)/c.window
		}
		if got.Predicted != n || got.Predicted != want {
			t.Errorf("window %d stride %d: %d predicted, brute force %d, want %d", c.window, c.stride, got.Predicted, n, want)
		}
		if math.Abs(got.NLL-nll) > 1e-4*math.Abs(nll) {
			t.Errorf("window %d stride %d: nll %g, brute force %g", c.window, c.stride, got.NLL, nll)
		}
		if math.Abs(got.PPL-math.Exp(nll/float64(n))) > 1e-4*got.PPL {
			t.Errorf("perplexity %g, want %g", got.PPL, math.Exp(nll/float64(n)))
		}
	}
}

func TestSlidingPerplexityErrors(t *testing.T) {
	e := tinyEngine(t)
	for _, c := range []struct {
		ids            []int
		window, stride int
	}{{[]int{1}, 8, 4}, {[]int{1, 2, 3}, 1, 1}, {[]int{1, 2, 3}, 65, 8}, {[]int{1, 2, 3}, 8, 0}, {[]int{1, 2, 3}, 8, 9}} {
		if _, err := SlidingPerplexity(e, c.ids, c.window, c.stride); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestKLDivergence checks KLDivergence on rows worked by hand: identical
// rows (0, all agree), a shift of every logit (the same distribution), and
// two-token rows with known divergence and a disagreeing top token.
func TestKLDivergence(t *testing.T) {
	p := []float32{1, 2, 3, 0, 0, 5}
	if kl, top := KLDivergence(p, p, 3); kl != 0 || top != 1 {
		t.Errorf("identical rows: KL %g, agreement %g", kl, top)
	}
	shifted := []float32{11, 12, 13, -4, -4, 1}
	if kl, top := KLDivergence(p, shifted, 3); math.Abs(kl) > 1e-12 || top != 1 {
		t.Errorf("shifted rows: KL %g, agreement %g", kl, top)
	}
	// Row 1: p = (0.5, 0.5), q = softmax(0, ln 3) = (0.25, 0.75):
	// KL = 0.5·ln 2 + 0.5·ln(2/3). Row 2 the same with q's top token
	// different from p's (p = softmax(ln 3, 0)).
	a := []float32{0, 0, float32(math.Log(3)), 0}
	b := []float32{0, float32(math.Log(3)), 0, 0}
	kl, top := KLDivergence(a, b, 2)
	want := (0.5*math.Log(2) + 0.5*math.Log(2.0/3)) / 2 // row 2: KL(0.75,0.25 ‖ 0.5,0.5)
	want += (0.75*math.Log(1.5) + 0.25*math.Log(0.5)) / 2
	if math.Abs(kl-want) > 1e-6 || top != 0.5 {
		t.Errorf("KL %g (want %g), agreement %g (want 0.5)", kl, want, top)
	}
	if kl, _ := KLDivergence(a, b[:2], 2); !math.IsNaN(kl) {
		t.Errorf("rows of different lengths: KL %g", kl)
	}
}
