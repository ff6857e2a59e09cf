package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
)

// Norms folded into the products after them. A decoder layer runs
//
//	m: x = a·Wm          (the attention's output or the down projection)
//	n: sum = x + r; h = RMSNorm(sum, g)
//	p: y = h·W           (Q/K/V, or gate/up)
//	e: RoPE with the cache writes, or SwiGLU, of y
//
// and the norm, a kernel of its own between two products, costs its
// launch and latency more than its bytes (backend/cuda/NOTES.md, session
// 28). Since RMSNorm(sum, g)·W = (sum·(g⊙W))/rms(sum) row by row, the gain
// is folded into W once, at load (g⊙W rounded to the activation dtype, g
// then ones), and in a step where m and p run as plain products:
//
//   - m adds r in its epilogue (cuBLASLt's beta = 1) and writes sum;
//   - n does not run;
//   - p reads sum itself;
//   - e divides each row of y by rms(sum), computing it from sum's row
//     (kernels.RowRMS).
//
// The GEMV's CUDA-core kernels (up to kernels.GEMVVectorMaxT rows) and
// its tile kernels (up to kernels.GEMVMaxT) take the fold too
// (kernels.Fold): as m they add r to their sums and write sum; as p, plain
// or running e in their epilogue, they sum the squares of the sum rows
// they stream and multiply their sums by 1/rms, and e (when not in their
// epilogue) runs as after the norm. Elsewhere (the GEMV's tensor-core
// kernels running e in their epilogue, or an external kernel for m) the
// norm runs with its unit gain and p reads its output: the same values,
// rounded once more. A plain RMSNorm (the first
// layer's, of the embeddings) folds the same way without m.
//
// Products of weights in GGUF K-quant blocks (Q4_K, Q6_K) fold too, in
// decode steps the K-quant GEMV runs (kernels.BlocksFold): as m it adds r;
// as p the gain cannot go into its blocks, so it stays a vector (of the
// activation dtype: gainX), by which p multiplies sum's rows before it
// rounds them to int8, and e divides by rms(sum) as after cuBLASLt.
type normFold struct {
	m, n, p, e *node // m nil: a plain RMSNorm
	// rows are the norm's input rows p reads instead of its output
	// (AddRMSNorm's sum, RMSNorm's x); resid AddRMSNorm's other input;
	// gain the norm's gain (ones once folded into p's weights).
	rows, resid, gain operand
	eps               float32
	// sync: m is an all-reduce whose sum overlaps its partials otherwise
	// than exactly (kernels.PeerAllReduceAdd's sync).
	sync bool
	// on: in the running step the norm did not run (decided at m, or at
	// n without m); normed: p's GEMV applied the 1/rms (kernels.Fold), so
	// e runs as it would after the norm.
	on, normed bool
	// gainX: p's weights are K-quant blocks (blocksOf), which multiply x
	// by gainX itself: the norm's gain in the activation dtype.
	gainX cu.Ptr
}

// markNormFolds marks the chains findNormFolds finds on the executable's
// nodes, and folds their gains into their products' weights (once per
// weight), unless Backend.NoFoldNorms. Under tensor parallelism only with
// peer memory: there the norms follow all-reduces, which add the residual
// in the one-shot form (kernels.PeerAllReduceAdd); a call that takes two
// shots runs the norm in its own kernel instead where it is marked
// (markPeerNorms; with its unit gain), and NCCL's all-reduce adds nothing
// (the norm then runs as a kernel of its own).
func (l *loaded) markNormFolds(nodes []node, p *compile.Plan) error {
	peerAdd := l.b.Peers != nil
	if l.b.NoFoldNorms || l.b.Comm != nil && !peerAdd {
		return nil
	}
	for _, f := range findNormFolds(nodes, p, l.act, peerAdd) {
		var err error
		if blocksOf(f.p) {
			f.gainX, err = l.gainAsAct(f.gain)
		} else {
			err = l.foldGain(f.p.in[1], f.gain)
		}
		if err != nil {
			return err
		}
		for _, nd := range []*node{f.m, f.n, f.p, f.e} {
			if nd != nil {
				nd.fold = f
			}
		}
		f.n.kernel += " (folded into the product after it where both products run plainly)"
	}
	return nil
}

// findNormFolds finds the chains above among nodes (in order, adjacent,
// bound to plan p's buffers; activations act; peerAdd: m may be an
// all-reduce, which then adds r). A chain qualifies when:
//   - the activations are bf16 (f16's range is too narrow for unnormalized
//     rows), m's and p's weights are bf16 or K-quant blocks (blocksOf) and
//     p has no bias;
//   - the norm's output is read by p alone, p's by e alone (its first
//     input), and m's by the norm alone; the gain and p's weights are read
//     by nothing else;
//   - e writes no FP8 form (fp8Out) and is not fused with an FP8 product;
//   - the norm's input rows are read after e (so the memory plan keeps them
//     until then), and, with m, sum's buffer does not overlap m's input
//     (m writes it while reading that);
//   - the rows, and e's output rows, split into 16-byte vectors.
func findNormFolds(nodes []node, p *compile.Plan, act cu.DType, peerAdd bool) []*normFold {
	if act != cu.BF16 {
		return nil
	}
	g := p.Graph
	readers := readerCounts(nodes, g)
	last := map[*ir.Value]int{} // the last node (index into nodes) reading each value
	for i := range nodes {
		for _, v := range nodes[i].n.Inputs {
			last[v] = i
		}
	}
	for _, v := range g.Outputs {
		last[v] = len(nodes)
	}
	epilogues := compile.EpilogueReaders(g)
	overlap := func(a, b *ir.Value) bool {
		x, okx := p.Buffers[a]
		y, oky := p.Buffers[b]
		return !okx || !oky || x.Offset < y.Offset+y.Bytes && y.Offset < x.Offset+x.Bytes
	}
	apartOrOn := func(a, b *ir.Value) bool {
		x, okx := p.Buffers[a]
		y, oky := p.Buffers[b]
		return okx && oky && (x == y || !overlap(a, b))
	}
	weightOnce := func(o operand) bool {
		d := o.v.Def.Op
		return (d == ir.Weight || d == ir.Const) && readers[o.v] == 1
	}
	var folds []*normFold
	for i := range nodes {
		f := &normFold{n: &nodes[i], eps: nodes[i].n.Attrs.Eps}
		var normed *ir.Value
		switch n := f.n; n.n.Op {
		case ir.RMSNorm:
			if n.n.Attrs.HeadDim > 0 {
				continue
			}
			normed, f.gain, f.rows = n.n.Outputs[0], n.in[1], n.in[0]
		case ir.AddRMSNorm:
			if i == 0 {
				continue
			}
			m := &nodes[i-1]
			reduce := peerAdd && m.n.Op == ir.AllReduce && m.in[0].dtype == act
			if !reduce && (m.n.Op != ir.MatMul || m.in[1].dtype != cu.BF16 && !blocksOf(m) || m.scaledReader != nil) || readers[m.n.Outputs[0]] != 1 {
				continue
			}
			switch m.n.Outputs[0] {
			case n.n.Inputs[0]:
				f.resid = n.in[1]
			case n.n.Inputs[1]:
				f.resid = n.in[0]
			default:
				continue
			}
			// m writes sum while it reads its input, and adds r: sum in
			// r's place or apart from it.
			sum, r := n.n.Outputs[0], f.resid.v
			switch {
			case reduce:
				// The all-reduce's threads each read a vector of its
				// partials and of r and write the same vector of sum;
				// over the partials otherwise, every block of the rank
				// reads before any writes (sync).
				if !apartOrOn(sum, r) {
					continue
				}
				f.sync = !apartOrOn(sum, m.n.Inputs[0])
			case overlap(sum, m.n.Inputs[0]) || overlap(sum, r) && p.Buffers[sum] != p.Buffers[r]:
				continue
			}
			f.m, normed, f.gain, f.rows = m, n.n.Outputs[1], n.in[2], n.out[0]
		default:
			continue
		}
		if i+2 >= len(nodes) {
			continue
		}
		pn, en := &nodes[i+1], &nodes[i+2]
		if pn.n.Op != ir.MatMul || pn.n.Inputs[0] != normed || readers[normed] != 1 || pn.in[1].dtype != cu.BF16 && !blocksOf(pn) ||
			!weightOnce(pn.in[1]) || !weightOnce(f.gain) {
			continue
		}
		if epilogues[pn.n] != en.n || en.fp8Out || pn.scaledReader != nil ||
			en.n.Op != ir.RoPEQKVWrite && en.n.Op != ir.SwiGLUPacked {
			continue
		}
		if last[f.rows.v] <= i+2 || f.rows.cols%16 != 0 || f.rows.dtype != cu.BF16 || en.out[0].cols%16 != 0 {
			continue
		}
		f.p, f.e = pn, en
		folds = append(folds, f)
	}
	return folds
}

// blocksFoldRows is the most rows at which norms fold into K-quant
// products: past it the folded step measured slower than the unfolded one
// (docs/PERF.md, "Norms folded into the K-quant GEMV").
const blocksFoldRows = 4

// blocksOf reports whether product nd's weights are GGUF blocks the
// K-quant GEMV reads (kernels.TakesBlocks), which fold a norm in decode
// steps (kernels.BlocksFold).
func blocksOf(nd *node) bool {
	w := nd.in[1]
	return w.dtype == devBlocks && kernels.TakesBlocks(w.blocks)
}

// gainAsAct is the norm gain g in the activation dtype, for a K-quant p to
// multiply x by (normFold.gainX): g itself, or a copy of it rounded (once
// per gain: the executables of every bucket share it).
func (l *loaded) gainAsAct(g operand) (cu.Ptr, error) {
	if g.dtype == l.act {
		return g.p, nil
	}
	if p, ok := l.gainCopies[g.p]; ok {
		return p, nil
	}
	if g.dtype != cu.F32 {
		return 0, fmt.Errorf("cuda: a folded norm's gain of %v", g.dtype)
	}
	raw := make([]byte, g.cols*4)
	if err := l.stream.Sync(); err != nil {
		return 0, err
	}
	if err := l.dev.Download(raw, g.p); err != nil {
		return 0, err
	}
	vals := make([]float32, g.cols)
	for i := range vals {
		vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	out := make([]byte, g.cols*l.act.Size())
	encode(vals, l.act, out)
	p, err := l.alloc(len(out))
	if err != nil {
		return 0, err
	}
	if err := l.dev.Upload(p, out); err != nil {
		return 0, err
	}
	if l.gainCopies == nil {
		l.gainCopies = map[cu.Ptr]cu.Ptr{}
	}
	l.gainCopies[g.p] = p
	return p, nil
}

// foldGain folds the norm gain g into the weights w[N, K] of the product
// reading the norm (w·g column by column), and sets g to ones, once: the
// executables of every bucket share the weights.
func (l *loaded) foldGain(w, g operand) error {
	if l.foldedGains[w.p] {
		return nil
	}
	rows := int(w.v.Shape[0])
	if g.cols != w.cols || rows <= 0 {
		return fmt.Errorf("cuda: gain of %d for weights of %d columns", g.cols, w.cols)
	}
	if err := l.k.FoldGain(l.stream, w.p, g.p, g.dtype, rows, w.cols); err != nil {
		return err
	}
	// Marked at once: w must never be folded twice, even where setting g
	// fails below (the executable then fails to load).
	if l.foldedGains == nil {
		l.foldedGains = map[cu.Ptr]bool{}
	}
	l.foldedGains[w.p] = true
	// g's ones, after the fold on the same stream: the 32-bit word of ones
	// of its dtype (g's bytes are whole words: findNormFolds takes rows of
	// 16-byte vectors).
	var one [4]byte
	encode([]float32{1, 1, 1, 1}[:4/g.dtype.Size()], g.dtype, one[:])
	return l.dev.Memset32(g.p, binary.LittleEndian.Uint32(one[:]), g.cols*g.dtype.Size()/4, l.stream)
}

// decide sets f.on for the running step: p's way at its rows is known (it
// has run at that shape before) and is not a GEMV running e in its
// epilogue unless the GEMV's CUDA-core or tile kernels, which apply the
// 1/rms themselves (kernels.GEMV.Folds), run it, and e's kernel takes the
// rows (kernels.MaxRMSRows).
func (f *normFold) decide(l *loaded, x *stepState) bool {
	p := f.p
	mm := cu.Matmul{T: p.in[0].rows(x), K: p.in[0].cols, N: p.out[0].cols, In: l.act, Out: p.out[0].dtype}
	if f.gainX != 0 {
		// p's K-quant GEMV takes the gain; beyond it p dequantizes its
		// blocks for cuBLASLt, which would not.
		f.on = mm.T <= blocksFoldRows && l.gemv.TakesBlocksProduct(p.in[1].blocks, mm.T, mm.K, mm.N)
		return f.on
	}
	ep := l.epilogueOf(x, p, mm.Out, false)
	way, known := l.knownWay(mm, ep)
	keeps := !(way.gemv && ep != nil) || l.gemv.Folds(mm.T, mm.K, mm.N)
	f.on = known && keeps && mm.T <= kernels.MaxRMSRows
	return f.on
}

// knownWay is productWay's choice for mm when this executable has made it
// already (at an earlier step of that shape), or when there is no choice
// (the product is not one productWay chooses for, or Products is
// "cublaslt"): no race, nothing launched. A tune cache's or the defaults'
// choice is not read here: a shape's first step keeps its norm even then.
func (l *loaded) knownWay(mm cu.Matmul, ep *node) (productWay, bool) {
	key, chosen := l.wayKey(mm, ep)
	if !chosen || l.b.Products == "cublaslt" {
		return productWay{}, true
	}
	way, ok := l.gemvChoice[key]
	return way, ok
}

// rowRMS is what e divides the product's rows by when the norm was
// folded.
func (f *normFold) rowRMS() kernels.RowRMS {
	return kernels.RowRMS{X: f.rows.p, Dim: f.rows.cols, Eps: f.eps}
}

// readerCounts is how many of nodes read each value, the graph's outputs
// counting as one more reader each.
func readerCounts(nodes []node, g *ir.Graph) map[*ir.Value]int {
	readers := map[*ir.Value]int{}
	for i := range nodes {
		for _, v := range nodes[i].n.Inputs {
			readers[v]++
		}
	}
	for _, v := range g.Outputs {
		readers[v]++
	}
	return readers
}
