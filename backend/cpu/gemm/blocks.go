package gemm

import (
	"sync"

	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// Products with weights in a GGML block type (Q4_0, Q8_0, the k-quants,
// ...), read in place from the model file: each block of a row is decoded
// into a buffer (tensor.BlockDecoder: ggml's own arithmetic) and
// dotted with every token's matching slice of x (Dot, SIMD where there is
// one). Work units are groups of 4 rows, each for all T tokens, so a row's
// blocks are decoded once a call. This is the portable path: kernels that
// compute from the blocks without decoding them are issue 16's next step.

// blockTask is one matMulBlocks call's shared state (recycled).
type blockTask struct {
	out, x []float32
	T      int
	w      Weights
}

var blockTasks = sync.Pool{New: func() any { return new(blockTask) }}

// blockBufs holds the decoded-block buffers of running work units (a
// buffer on the stack would escape through the decoder's call).
var blockBufs = sync.Pool{New: func() any { return new([256]float32) }}

func matMulBlocks(p *workers.Pool, out, x []float32, T int, w Weights) {
	if T == 0 || w.N == 0 {
		return
	}
	t := blockTasks.Get().(*blockTask)
	*t = blockTask{out: out, x: x, T: T, w: w}
	runRowGroups(p, w, T, t)
	*t = blockTask{}
	blockTasks.Put(t)
}

// runRowGroups runs t over w's rows in groups of 4 (t.Do(lo, hi) computes
// rows [4·lo, 4·hi) for T tokens), at least w.grainBytes(T) of weights a
// chunk, on the workers of p (nil: on the caller).
func runRowGroups(p *workers.Pool, w Weights, T int, t workers.Task) {
	units := (w.N + 3) / 4
	grain := max(1, w.grainBytes(T)/max(1, 4*w.rowBytes()))
	if p == nil {
		t.Do(0, units)
	} else {
		p.Run(units, grain, t)
	}
}

// Do computes rows [4·lo, 4·hi) for every token.
func (t *blockTask) Do(lo, hi int) {
	w := t.w
	bs, bb, rb := w.DType.BlockSize(), w.DType.BlockBytes(), w.rowBytes()
	decode := tensor.BlockDecoder(w.DType)
	buf := blockBufs.Get().(*[256]float32) // the largest block
	defer blockBufs.Put(buf)
	y := buf[:bs]
	for n := 4 * lo; n < min(4*hi, w.N); n++ {
		for tk := 0; tk < t.T; tk++ {
			t.out[tk*w.N+n] = 0
		}
		row := w.Data[n*rb : (n+1)*rb]
		for b := 0; b < w.K/bs; b++ {
			decode(row[b*bb:(b+1)*bb], y) // check made sure of the sizes
			for tk := 0; tk < t.T; tk++ {
				t.out[tk*w.N+n] += Dot(y, t.x[tk*w.K+b*bs:tk*w.K+(b+1)*bs])
			}
		}
	}
}
