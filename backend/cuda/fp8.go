package cuda

import (
	"errors"
	"fmt"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/ir"
)

// FP8 products. A matrix kept in E4M3 (weightDTypes) is multiplied as
// vLLM multiplies an FP8 checkpoint's weights on Hopper ("FP8 dynamic"):
//
//   - up to kernels.GEMVVectorMaxT rows (decode steps), weight-only: the
//     GEMV streams the E4M3 weights (half the bytes of bf16) and scales
//     each output by its row's scale (GEMV.RunF8);
//   - beyond, the activation is quantized to E4M3 with a dynamic scale a
//     token (max|x|/448 of its row, Kernels.QuantizeRowsE4M3, one launch)
//     and cuBLASLt multiplies in FP8 with float32 accumulation and unit
//     scales (a per-tensor weight scale excepted), writing the compute
//     dtype; the rows' scales and the weight's scales a row are then
//     applied by the product's sole reader when it is SwiGLU, RoPE with
//     the cache writes or the residual add and norm (Kernels.SwiGLUPacked,
//     RoPEQKVWrite and AddRMSNorm take them), else by
//     Kernels.ScaleRowsCols in place. cuBLASLt 13.0 on the H200 refuses
//     scales a row or a token for FP8 products (its outer-vector scale
//     mode and the alpha vector), so they cannot go to cuBLASLt itself.
//
// Where a product's activation comes from RMSNorm, AddRMSNorm (normed) or
// SwiGLUPacked and nothing else reads it (markFP8Fusions), that kernel
// writes it in FP8 form for the product (fp8Output), which then skips the
// quantization: no bf16 copy is written or read.

// fp8XOffset is where the activation's E4M3 copy starts in the FP8
// scratch: after its rows' scales (a float32 a row at 0), rounded up to
// 256 bytes.
func fp8XOffset(rows int) int { return (4*rows + 255) &^ 255 }

// fp8Product runs out[T,N] = x[T,K]·w[N,K]ᵀ for E4M3 weights w (with
// their scales) into out of the compute dtype, as the comment above says.
// ep, when not nil, is the product's sole reader taking the scales
// (node.scaled): it runs here, in place of the pass that scales out, and
// is marked done for the step. It notes the kernel that ran on x.
func (l *loaded) fp8Product(x *stepState, s *cu.Stream, w *operand, t, k, n int, X, out cu.Ptr, ep *node) error {
	if !l.fp8Activation(t) {
		err := l.gemv.RunF8(s, out, X, w.p, w.scales, t, k, n, false)
		if err == nil || !errors.Is(err, kernels.ErrGEMVShape) {
			x.noteProduct(cu.Matmul{T: t, K: k, N: n}, "gemv FP8")
			return err
		}
	}
	q, err := l.fp8Rows(x, t, k)
	if err != nil {
		return err
	}
	if x.fp8In != X {
		if err := l.k.QuantizeRowsE4M3(s, q.Q, q.Scales, X, t, k); err != nil {
			return err
		}
	}
	x.fp8In = 0
	sc := kernels.ProductScales{Rows: q.Scales}
	mm := cu.Matmul{T: t, K: k, N: n, In: cu.F8E4M3, Out: l.act, X: q.Q, W: w.p, Dst: out, XScale: l.f8One, WScale: l.f8One, Stream: s}
	if w.perTensor {
		mm.WScale = w.scales
	} else {
		sc.Cols = w.scales
	}
	mm.Algo = l.algorithm(x, mm)
	x.noteProduct(mm, "cuBLASLt FP8")
	if err := l.lt.Matmul(mm); err != nil {
		return err
	}
	if ep != nil && ep.scaled != nil {
		if err := ep.scaled(x, ep, sc); err != nil {
			return err
		}
		l.b.stats.FP8Scaled++
		x.done = ep
		return nil
	}
	return l.k.ScaleRowsCols(s, out, out, sc, t, n)
}

// chooseFP8 binds a MatMul or MatMulBias node whose weight is E4M3 on the
// device (fp8Product, the bias by its kernel after).
func (l *loaded) chooseFP8(nd *node, s *cu.Stream) error {
	in, out := nd.in, nd.out
	if out[0].dtype != l.act {
		return fmt.Errorf("cuda: FP8 product %q into %v, want the compute dtype %v", in[1].v.Def.Attrs.Name, out[0].dtype, l.act)
	}
	kernel := fmt.Sprintf("FP8 weights: gemv (T ≤ %d) | E4M3 activation a token + cuBLASLt FP8 + the scales (in the reader's kernel where it takes them)", kernels.GEMVVectorMaxT)
	l.bindWeightProduct(nd, s, kernel, func(x *stepState, nd *node, t, k, n int, bias *operand) (bool, error) {
		var ep *node
		if bias == nil {
			ep = nd.scaledReader
		}
		return false, l.fp8Product(x, s, &in[1], t, k, n, in[0].p, out[0].p, ep)
	})
	return nil
}

// fp8Activation reports whether an FP8 product of t rows quantizes its
// activation for cuBLASLt (fp8Product) rather than running on the GEMV.
func (l *loaded) fp8Activation(t int) bool { return t > kernels.GEMVVectorMaxT || l.gemv == nil }

// fp8Rows is where the FP8 form of an activation of t rows of k values
// goes for a product: in the FP8 scratch (grown outside a capture), its
// rows' scales first.
func (l *loaded) fp8Rows(x *stepState, t, k int) (kernels.E4M3Rows, error) {
	if err := l.ensureQuant(x, fp8XOffset(t)+t*k, 0); err != nil {
		return kernels.E4M3Rows{}, err
	}
	return kernels.E4M3Rows{Q: l.qs.Add(fp8XOffset(t)), Scales: l.qs}, nil
}

// fp8Output reports whether node nd writes its output o (t rows) in FP8
// form for the product after it, and where: when that product alone reads
// o (markFP8Fusions) and quantizes its activation in this step. The
// product then finds it there (stepState.fp8In) and skips the
// quantization. The scales may overwrite those of the product nd reads
// (SwiGLU in an FP8 product's epilogue): each of their rows is read before
// it is written.
func (l *loaded) fp8Output(x *stepState, nd *node, o operand, t int) (kernels.E4M3Rows, bool, error) {
	if !nd.fp8Out || !l.fp8Activation(t) {
		return kernels.E4M3Rows{}, false, nil
	}
	q, err := l.fp8Rows(x, t, o.cols)
	if err != nil {
		return q, false, err
	}
	x.fp8In = o.p
	l.b.stats.FP8Written++
	return q, true, nil
}

// markFP8Fusions links the FP8 products and their neighbours: fp8Out on
// each node whose output (RMSNorm's, AddRMSNorm's normed, SwiGLUPacked's)
// only the next node reads, a product of E4M3 weights without a bias; and
// scaledReader on each product of E4M3 weights whose output only the next
// node reads, one that takes the product's scales (node.scaled) on that
// input (SwiGLUPacked's and RoPEQKVWrite's first, either of AddRMSNorm's
// two).
func markFP8Fusions(nodes []node, g *ir.Graph) {
	readers := map[*ir.Value]int{}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			readers[v]++
		}
	}
	for _, v := range g.Outputs {
		readers[v]++
	}
	for i := 0; i+1 < len(nodes); i++ {
		nd, next := &nodes[i], &nodes[i+1]
		if len(nd.n.Outputs) == 0 {
			continue
		}
		var o *ir.Value
		switch nd.n.Op {
		case ir.RMSNorm, ir.SwiGLUPacked:
			o = nd.n.Outputs[0]
		case ir.AddRMSNorm:
			o = nd.n.Outputs[1]
		case ir.MatMul:
			if p := nd.n.Outputs[0]; nd.in[1].dtype == cu.F8E4M3 && readers[p] == 1 && next.scaled != nil {
				for j, v := range next.n.Inputs {
					if v == p && (j == 0 || j == 1 && next.n.Op == ir.AddRMSNorm) {
						nd.scaledReader, next.scaledIn = next, j
						nd.kernel += fmt.Sprintf(" (the scales in %s after it)", next.kernel)
					}
				}
			}
			continue
		default:
			continue
		}
		if next.n.Op == ir.MatMul && next.n.Inputs[0] == o && next.in[1].dtype == cu.F8E4M3 && readers[o] == 1 {
			nd.fp8Out = true
			nd.kernel += " (its output in FP8 form when the FP8 product after it quantizes)"
		}
	}
}
