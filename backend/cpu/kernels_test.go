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
	"kiln/backend/cpu/gemm"
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
// (float32, or FP8 when fp8) filled with random keys and values.
func (c attnCase) setup(r *rand.Rand, fp8 bool) (*execState, backend.KVSpec) {
	blocksNeeded := 0
	for _, s := range c.seqs {
		blocksNeeded += (s.past + s.new + c.blockSize - 1) / c.blockSize
	}
	spec := backend.KVSpec{Layers: 1, Blocks: blocksNeeded + 3, BlockSize: c.blockSize, KVHeads: c.kvHeads, HeadDim: c.headDim, FP8: fp8}
	kv := newKVCache(spec)
	per := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim
	if fp8 {
		encodeE4M3(kv.kq[0], randSlice(r, per))
		encodeE4M3(kv.vq[0], randSlice(r, per))
	} else {
		kv.k = [][]float32{randSlice(r, per)}
		kv.v = [][]float32{randSlice(r, per)}
	}
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

// TestAttentionFastMatchesReference: over float32 and FP8 caches (the
// reference widens each FP8 code, the fast kernel a block's rows at a time).
func TestAttentionFastMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, fp8 := range []bool{false, true} {
		attentionFastMatchesReference(t, r, fp8)
	}
}

func attentionFastMatchesReference(t *testing.T, r *rand.Rand, fp8 bool) {
	for _, c := range attnCases {
		t.Run(fmt.Sprintf("%v/fp8=%v", c, fp8), func(t *testing.T) {
			x, _ := c.setup(r, fp8)
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

// TestRoPEKVWriteFastMatchesReference: the fast kernel writes the slots the
// reference does with its values (within 1e-6 relative, or, in an FP8
// cache, the same code or its neighbour: the two rotate in float32 in
// different orders, and a key within 1e-6 of a rounding boundary may land
// on either side of it), and no other slot.
func TestRoPEKVWriteFastMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, c := range attnCases {
		for _, interleaved := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/interleaved=%v", c, interleaved), func(t *testing.T) {
				x, spec := c.setup(r, false)
				table, k, v := ropeInputs(t, r, c, x)
				width := c.kvHeads * c.headDim
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

// ropeInputs is a RoPE table for x's positions and random keys and values
// for its tokens.
func ropeInputs(t *testing.T, r *rand.Rand, c attnCase, x *execState) (table *tensor.Tensor, k, v []float32) {
	t.Helper()
	maxPos := 0
	for _, s := range x.batch.Seqs {
		maxPos = max(maxPos, s.Len)
	}
	table, err := testRopeTable(maxPos, c.headDim)
	if err != nil {
		t.Fatal(err)
	}
	width := c.kvHeads * c.headDim
	return table, randSlice(r, x.tokens*width), randSlice(r, x.tokens*width)
}

// TestRoPEKVWriteFP8FastMatchesReference is TestRoPEKVWriteFastMatchesReference
// on an FP8 cache: every slot either kernel writes holds the same code, or
// codes one apart (see above), and the unwritten ones keep NaN's code.
func TestRoPEKVWriteFP8FastMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, c := range attnCases {
		t.Run(c.String(), func(t *testing.T) {
			x, spec := c.setup(r, true)
			table, k, v := ropeInputs(t, r, c, x)
			width := c.kvHeads * c.headDim
			a := ir.Attrs{KVHeads: c.kvHeads, HeadDim: c.headDim}
			n := node(ir.RoPEKVWrite, a, nil)
			run := func(kern kernel) (kq, vq []byte) {
				per := spec.Blocks * spec.BlockSize * width
				kq, vq = make([]byte, per), make([]byte, per)
				for i := range kq {
					kq[i], vq[i] = 0x7F, 0x7F
				}
				x.kv.kq, x.kv.vq = [][]byte{kq}, [][]byte{vq}
				runKernel(kern, x, &step{node: n, in: []operand{operandOf(k, width), operandOf(v, width), {i: x.batch.Positions}, {t: table}}})
				return kq, vq
			}
			ref, _ := referenceKernel(ir.RoPEKVWrite)
			wk, wv := run(ref)
			gk, gv := run(fastKernel(t, ir.RoPEKVWrite))
			near := func(a, b byte) bool {
				d := int(a&0x7F) - int(b&0x7F)
				return a == b || a&0x80 == b&0x80 && (d == 1 || d == -1)
			}
			written := 0
			for i := range wk {
				if !near(gk[i], wk[i]) || gv[i] != wv[i] {
					t.Fatalf("cache element %d: fast k=%#02x v=%#02x, reference k=%#02x v=%#02x", i, gk[i], gv[i], wk[i], wv[i])
				}
				if wv[i] != 0x7F {
					written++
				}
			}
			if written != x.tokens*width {
				t.Errorf("%d value elements written, want %d", written, x.tokens*width)
			}
		})
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
	tested := map[ir.Op]bool{ir.Attention: true, ir.RoPEKVWrite: true, ir.SwiGLU: true, ir.SwiGLUPacked: true, ir.MatMul: true, ir.MatMulBias: true,
		ir.MoE: true}
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

// TestMoEReference: the mixture-of-experts kernels (ir.MoE), the reference
// and the grouped fast one, against a float64 computation written apart:
// each row's router logits, its TopK experts by logit, their weights (the
// softmax over the chosen, Mixtral's, or over every expert), and the
// weighted sum of their SwiGLU MLPs; for one of one expert, two of four
// and three of five.
func TestMoEReference(t *testing.T) {
	r := newRand(t)
	const d, inter = 24, 40
	x := &execState{tokens: 5, l: &loaded{pool: workers.New(0)}}
	for _, c := range []struct {
		experts, topK      int
		norm               bool
		shared, sharedGate bool // a shared expert (of 16 rows), and its sigmoid gate
	}{{1, 1, true, false, false}, {4, 2, true, false, false}, {5, 3, true, false, false}, {4, 2, false, false, false},
		{6, 1, false, false, false}, {4, 2, false, true, true}, {3, 1, true, true, false}} {
		mat := func(n, k int) ([]float32, gemm.Weights) {
			v := randSlice(r, n*k)
			return v, gemm.Weights{DType: tensor.F32, Data: tensor.FromF32("m", tensor.Shape{n, k}, v).Data, N: n, K: k}
		}
		xs := randSlice(r, x.tokens*d)
		rv, rw := mat(c.experts, d)
		in := []operand{operandOf(xs, d), {w: rw}}
		type expert struct{ g, u, dn []float32 }
		var es []expert
		for range c.experts {
			g, gw := mat(inter, d)
			u, uw := mat(inter, d)
			dn, dw := mat(d, inter)
			es = append(es, expert{g, u, dn})
			in = append(in, operand{w: gw}, operand{w: uw}, operand{w: dw})
		}
		const sharedInter = 16
		var shared expert
		var sharedGate []float32
		if c.shared {
			g, gw := mat(sharedInter, d)
			u, uw := mat(sharedInter, d)
			dn, dw := mat(d, sharedInter)
			shared = expert{g, u, dn}
			in = append(in, operand{w: gw}, operand{w: uw}, operand{w: dw})
		}
		if c.sharedGate {
			var w gemm.Weights
			sharedGate, w = mat(1, d)
			in = append(in, operand{w: w})
		}
		got, fast := poisoned(x.tokens*d), poisoned(x.tokens*d)
		nd := node(ir.MoE, ir.Attrs{Experts: c.experts, TopK: c.topK, NormTopK: c.norm, Shared: c.shared, SharedGate: c.sharedGate}, ir.Shape{ir.TokenDim, d})
		ref, _ := referenceKernel(ir.MoE)
		runKernel(ref, x, &step{node: nd, in: in, out: []operand{operandOf(got, d)}})
		runKernel(fastKernel(t, ir.MoE), x, &step{node: nd, in: in, out: []operand{operandOf(fast, d)}})
		dot := func(a []float32, b []float32) float64 {
			s := 0.0
			for i := range a {
				s += float64(a[i]) * float64(b[i])
			}
			return s
		}
		want := make([]float32, x.tokens*d)
		for tk := range x.tokens {
			xr := xs[tk*d : (tk+1)*d]
			logits := make([]float64, c.experts)
			for e := range logits {
				logits[e] = dot(xr, rv[e*d:(e+1)*d])
			}
			chosen := map[int]bool{}
			var top []int
			for range c.topK {
				best := -1
				for e := range logits {
					if !chosen[e] && (best < 0 || logits[e] > logits[best]) {
						best = e
					}
				}
				chosen[best] = true
				top = append(top, best)
			}
			sum := 0.0
			for e := range logits {
				if chosen[e] || !c.norm {
					sum += math.Exp(logits[e])
				}
			}
			mlp := func(ex expert, width int, p float64) {
				h := make([]float32, width)
				for i := range h {
					g := dot(xr, ex.g[i*d:(i+1)*d])
					h[i] = float32(g / (1 + math.Exp(-g)) * dot(xr, ex.u[i*d:(i+1)*d]))
				}
				for j := range d {
					want[tk*d+j] += float32(p * dot(h, ex.dn[j*width:(j+1)*width]))
				}
			}
			for _, e := range top {
				mlp(es[e], inter, math.Exp(logits[e])/sum)
			}
			if c.shared {
				p := 1.0
				if c.sharedGate {
					p = 1 / (1 + math.Exp(-dot(xr, sharedGate)))
				}
				mlp(shared, sharedInter, p)
			}
		}
		if e := maxRelErr(got, want); !(e <= 1e-5) {
			t.Errorf("%+v: the reference's max relative error %.3g", c, e)
		}
		if e := maxRelErr(fast, want); !(e <= 1e-5) {
			t.Errorf("%+v: the grouped kernel's max relative error %.3g", c, e)
		}
	}
}
