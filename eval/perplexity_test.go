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
