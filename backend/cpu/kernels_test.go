package cpu

// Every fast kernel is checked against the reference kernel of its op on fresh
// random inputs (the seed is printed on failure), with outputs poisoned with
// NaN beforehand so that an element left unwritten fails.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"kiln/backend"
	"kiln/backend/cpu/workers"
	"kiln/ir"
	"kiln/tensor"
)

func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed %d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, 1))
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func poisoned(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	return s
}

// maxRelErr is ‖a−b‖∞ / max(‖b‖∞, tiny), failing on any NaN.
func maxRelErr(a, b []float32) float64 {
	var diff, norm float64
	for i := range a {
		if math.IsNaN(float64(a[i])) || math.IsNaN(float64(b[i])) {
			return math.Inf(1)
		}
		diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
		norm = math.Max(norm, math.Abs(float64(b[i])))
	}
	return diff / math.Max(norm, 1e-30)
}

// attnCase describes a batch over a paged cache.
type attnCase struct {
	heads, kvHeads, headDim, window int
	blockSize                       int
	seqs                            []struct{ past, new int } // tokens already cached, tokens in this step
}

func (c attnCase) String() string {
	return fmt.Sprintf("h%d/kv%d/d%d/w%d/bs%d/%v", c.heads, c.kvHeads, c.headDim, c.window, c.blockSize, c.seqs)
}

// setup builds a batch whose sequences use shuffled cache blocks, and a cache
// filled with random keys and values.
func (c attnCase) setup(r *rand.Rand) (*execState, backend.KVSpec) {
	blocksNeeded := 0
	for _, s := range c.seqs {
		blocksNeeded += (s.past + s.new + c.blockSize - 1) / c.blockSize
	}
	spec := backend.KVSpec{Layers: 1, Blocks: blocksNeeded + 3, BlockSize: c.blockSize, KVHeads: c.kvHeads, HeadDim: c.headDim}
	kv := &kvCache{spec: spec}
	per := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim
	kv.k = [][]float32{randSlice(r, per)}
	kv.v = [][]float32{randSlice(r, per)}
	free := r.Perm(spec.Blocks)
	b := &backend.Batch{}
	for i, s := range c.seqs {
		n := s.past + s.new
		var blocks []int32
		for len(blocks)*c.blockSize < n {
			blocks = append(blocks, int32(free[0]))
			free = free[1:]
		}
		b.Seqs = append(b.Seqs, backend.Seq{Blocks: blocks, Len: n})
		for p := s.past; p < n; p++ {
			b.Tokens = append(b.Tokens, int32(r.IntN(100)))
			b.Positions = append(b.Positions, int32(p))
			b.SeqIndex = append(b.SeqIndex, int32(i))
		}
	}
	if err := b.Validate(spec); err != nil {
		panic(err)
	}
	return &execState{batch: b, kv: kv, tokens: len(b.Tokens), l: &loaded{pool: workers.New(0)}}, spec
}

func node(op ir.Op, a ir.Attrs, shape ir.Shape) *ir.Node {
	n := &ir.Node{Op: op, Attrs: a}
	n.Outputs = []*ir.Value{{Shape: shape, DType: tensor.F32, Def: n}}
	return n
}

func operandOf(f []float32, cols int) operand {
	n := &ir.Node{Op: ir.Embed}
	return operand{v: &ir.Value{Shape: ir.Shape{ir.TokenDim, ir.Dim(cols)}, Def: n}, f: f, cols: cols}
}

// fastKernel returns the highest-priority kernel of op, failing if it is the
// reference itself (the test would compare the reference with itself).
func fastKernel(t *testing.T, op ir.Op) kernel {
	k, ok := choose(op, false)
	if !ok || k.priority == 0 {
		t.Fatalf("%v has no fast kernel", op)
	}
	return k
}

func runKernel(k kernel, x *execState, s *step) {
	s.kernel = k
	if k.prepare != nil {
		k.prepare(x.l, s)
	}
	k.run(x, s)
}

var attnCases = []attnCase{
	{heads: 4, kvHeads: 4, headDim: 8, blockSize: 4, seqs: []struct{ past, new int }{{0, 5}}},
	{heads: 8, kvHeads: 2, headDim: 64, blockSize: 16, seqs: []struct{ past, new int }{{37, 1}, {0, 1}, {100, 1}}},
	{heads: 6, kvHeads: 1, headDim: 16, blockSize: 8, seqs: []struct{ past, new int }{{3, 20}, {50, 2}}},
	{heads: 4, kvHeads: 2, headDim: 128, window: 7, blockSize: 16, seqs: []struct{ past, new int }{{30, 12}, {2, 3}}},
	{heads: 3, kvHeads: 3, headDim: 80, window: 1, blockSize: 5, seqs: []struct{ past, new int }{{9, 4}}},
}

func TestAttentionFastMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, c := range attnCases {
		t.Run(c.String(), func(t *testing.T) {
			x, _ := c.setup(r)
			a := ir.Attrs{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim, Window: c.window, Scale: float32(1 / math.Sqrt(float64(c.headDim)))}
			width := c.heads * c.headDim
			q := randSlice(r, x.tokens*width)
			want := poisoned(x.tokens * width)
			got := poisoned(x.tokens * width)
			n := node(ir.Attention, a, ir.Shape{ir.TokenDim, ir.Dim(width)})
			ref, _ := referenceKernel(ir.Attention)
			runKernel(ref, x, &step{node: n, in: []operand{operandOf(q, width), {}}, out: []operand{operandOf(want, width)}})
			runKernel(fastKernel(t, ir.Attention), x, &step{node: n, in: []operand{operandOf(q, width), {}}, out: []operand{operandOf(got, width)}})
			// Tolerance: float32 online softmax against a float64 reference.
			if e := maxRelErr(got, want); e > 1e-5 {
				t.Errorf("relative error %g > 1e-5", e)
			}
		})
	}
}

func TestRoPEKVWriteFastMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, c := range attnCases {
		for _, interleaved := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/interleaved=%v", c, interleaved), func(t *testing.T) {
				x, spec := c.setup(r)
				maxPos := 0
				for _, s := range x.batch.Seqs {
					maxPos = max(maxPos, s.Len)
				}
				table, err := testRopeTable(maxPos, c.headDim)
				if err != nil {
					t.Fatal(err)
				}
				width := c.kvHeads * c.headDim
				k, v := randSlice(r, x.tokens*width), randSlice(r, x.tokens*width)
				pos := operand{i: x.batch.Positions}
				tab := operand{t: table}
				a := ir.Attrs{KVHeads: c.kvHeads, HeadDim: c.headDim, Interleaved: interleaved}
				n := node(ir.RoPEKVWrite, a, nil)
				run := func(kern kernel) (kc, vc []float32) {
					per := spec.Blocks * spec.BlockSize * width
					x.kv.k, x.kv.v = [][]float32{poisoned(per)}, [][]float32{poisoned(per)}
					runKernel(kern, x, &step{node: n, in: []operand{operandOf(k, width), operandOf(v, width), pos, tab}})
					return x.kv.k[0], x.kv.v[0]
				}
				ref, _ := referenceKernel(ir.RoPEKVWrite)
				wk, wv := run(ref)
				gk, gv := run(fastKernel(t, ir.RoPEKVWrite))
				// Both write the same slots (unwritten ones stay NaN in both).
				for i := range wk {
					same := func(a, b float32) bool {
						return (math.IsNaN(float64(a)) && math.IsNaN(float64(b))) || math.Abs(float64(a-b)) <= 1e-6*math.Max(1, math.Abs(float64(b)))
					}
					if !same(gk[i], wk[i]) || !same(gv[i], wv[i]) {
						t.Fatalf("cache element %d: fast k=%g v=%g, reference k=%g v=%g", i, gk[i], gv[i], wk[i], wv[i])
					}
				}
				written := 0
				for _, f := range wk {
					if !math.IsNaN(float64(f)) {
						written++
					}
				}
				if written != x.tokens*width {
					t.Errorf("%d key elements written, want %d", written, x.tokens*width)
				}
			})
		}
	}
}

// TestSwiGLUFastMatchesReference: the SwiGLU kernels on expf against the
// reference's math.Exp, element by element within 2e-6 relative (expf is
// accurate to about 1 ulp), over gates from -100 to 100, where silu
// saturates at both ends.
func TestSwiGLUFastMatchesReference(t *testing.T) {
	r := newRand(t)
	x := &execState{tokens: 3}
	const n = 333
	g, u := randSlice(r, x.tokens*n), randSlice(r, x.tokens*n)
	for i := range g {
		g[i] *= float32(r.IntN(4)*r.IntN(4)*r.IntN(4) + 1) // up to 28σ
	}
	g[0], g[1], g[2] = -100, 100, 0
	packed := make([]float32, 2*x.tokens*n)
	for tk := 0; tk < x.tokens; tk++ {
		copy(packed[2*n*tk:], g[n*tk:n*(tk+1)])
		copy(packed[2*n*tk+n:], u[n*tk:n*(tk+1)])
	}
	for _, c := range []struct {
		op ir.Op
		in []operand
	}{
		{ir.SwiGLU, []operand{operandOf(g, n), operandOf(u, n)}},
		{ir.SwiGLUPacked, []operand{operandOf(packed, 2*n)}},
	} {
		nd := node(c.op, ir.Attrs{}, ir.Shape{ir.TokenDim, n})
		want, got := poisoned(x.tokens*n), poisoned(x.tokens*n)
		ref, _ := referenceKernel(c.op)
		runKernel(ref, x, &step{node: nd, in: c.in, out: []operand{operandOf(want, n)}})
		runKernel(fastKernel(t, c.op), x, &step{node: nd, in: c.in, out: []operand{operandOf(got, n)}})
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); math.IsNaN(float64(got[i])) || d > 2e-6*math.Abs(float64(want[i]))+1e-30 {
				t.Fatalf("%v: element %d (gate %g): %g, reference %g", c.op, i, g[i], got[i], want[i])
			}
		}
	}
}

// testRopeTable is a plain θ=10000 table in the layout the compiler folds.
func testRopeTable(maxPos, headDim int) (*tensor.Tensor, error) {
	half := headDim / 2
	vals := make([]float32, maxPos*headDim)
	for p := 0; p < maxPos; p++ {
		for i := 0; i < half; i++ {
			f := math.Pow(10000, -float64(2*i)/float64(headDim))
			vals[p*headDim+i] = float32(math.Cos(float64(p) * f))
			vals[p*headDim+half+i] = float32(math.Sin(float64(p) * f))
		}
	}
	t := tensor.FromF32("rope", tensor.Shape{maxPos, headDim}, vals)
	return t, t.Validate()
}

// TestEveryFastKernelIsTested fails when a fast kernel is registered that no
// test above compares with its reference.
func TestEveryFastKernelIsTested(t *testing.T) {
	// MatMul: package gemm's tests; MatMulBias: the same product and the
	// reference's bias loop, and the HF fixtures (qwen2-bias) run both.
	tested := map[ir.Op]bool{ir.Attention: true, ir.RoPEKVWrite: true, ir.SwiGLU: true, ir.SwiGLUPacked: true, ir.MatMul: true, ir.MatMulBias: true}
	for op, ks := range registry {
		for _, k := range ks {
			if k.priority > 0 && !tested[op] {
				t.Errorf("fast kernel %s for %v has no test against the reference", k.name, op)
			}
		}
		if _, ok := referenceKernel(op); !ok {
			t.Errorf("%v has no reference kernel", op)
		}
	}
	for _, op := range ir.AllOps() {
		if op == ir.Weight || op == ir.Const || op == ir.RopeTable || op == ir.ConcatRows {
			continue // read in place, or folded by the compiler
		}
		if _, ok := referenceKernel(op); !ok {
			t.Errorf("%v has no reference kernel", op)
		}
	}
}
