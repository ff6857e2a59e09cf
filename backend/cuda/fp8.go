package cuda

import (
	"errors"
	"fmt"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
)

// FP8 products. A matrix kept in E4M3 (weightDTypes) is multiplied as
// vLLM multiplies an FP8 checkpoint's weights on Hopper:
//
//   - up to kernels.GEMVVectorMaxT rows (decode steps), weight-only: the
//     GEMV streams the E4M3 weights (half the bytes of bf16) and scales
//     each output by its row's scale (GEMV.RunF8);
//   - beyond, the activation is quantized to E4M3 with one dynamic scale
//     (max|x|/448, Kernels.QuantizeE4M3) and cuBLASLt multiplies in FP8
//     with float32 accumulation, writing the compute dtype; a per-tensor
//     weight scale goes to cuBLASLt as the weights' scale, scales a row are
//     applied to the product's columns after it (Kernels.ScaleCols):
//     cuBLASLt 13.0 on the H200 refuses both its per-row scale mode and
//     scales a row as the alpha vector (pointer mode
//     ALPHA_DEVICE_VECTOR_BETA_ZERO) for FP8 products.
//
// Activations are scaled per tensor, not per token as vLLM's "FP8
// dynamic" does: cuBLASLt on Hopper takes one scale an operand.

// fp8XOffset is where the activation's E4M3 copy starts in the FP8
// scratch, after its scale (at 0) and absolute maximum (at 16), both
// 16-byte aligned as cuBLASLt wants its scales.
const fp8XOffset = 256

// fp8Product runs out[T,N] = x[T,K]·w[N,K]ᵀ for E4M3 weights w (with
// their scales) into out of the compute dtype, as the comment above says.
// It notes the kernel that ran on x.
func (l *loaded) fp8Product(x *stepState, s *cu.Stream, w *operand, t, k, n int, X, out cu.Ptr) error {
	if t <= kernels.GEMVVectorMaxT && l.gemv != nil {
		err := l.gemv.RunF8(s, out, X, w.p, w.scales, t, k, n, false)
		if err == nil || !errors.Is(err, kernels.ErrGEMVShape) {
			x.noteProduct(cu.Matmul{T: t, K: k, N: n}, "gemv FP8")
			return err
		}
	}
	if err := l.ensureQuant(x, fp8XOffset+t*k, 0); err != nil {
		return err
	}
	scale, amax, q := l.qs, l.qs.Add(16), l.qs.Add(fp8XOffset)
	if err := l.k.QuantizeE4M3(s, q, scale, amax, X, t*k); err != nil {
		return err
	}
	mm := cu.Matmul{T: t, K: k, N: n, In: cu.F8E4M3, Out: l.act, X: q, W: w.p, Dst: out, XScale: scale, WScale: l.f8One, Stream: s}
	if w.perTensor {
		mm.WScale = w.scales
	}
	mm.Algo = l.algorithm(x, mm)
	x.noteProduct(mm, "cuBLASLt FP8")
	if err := l.lt.Matmul(mm); err != nil {
		return err
	}
	if w.perTensor {
		return nil
	}
	return l.k.ScaleCols(s, out, out, w.scales, t, n)
}

// chooseFP8 binds a MatMul or MatMulBias node whose weight is E4M3 on the
// device (fp8Product, the bias by its kernel after).
func (l *loaded) chooseFP8(nd *node, s *cu.Stream) error {
	in, out := nd.in, nd.out
	if out[0].dtype != l.act {
		return fmt.Errorf("cuda: FP8 product %q into %v, want the compute dtype %v", in[1].v.Def.Attrs.Name, out[0].dtype, l.act)
	}
	kernel := fmt.Sprintf("FP8 weights: gemv (T ≤ %d) | E4M3 activation + cuBLASLt FP8", kernels.GEMVVectorMaxT)
	l.bindWeightProduct(nd, s, kernel, func(x *stepState, t, k, n int, _ *operand) (bool, error) {
		return false, l.fp8Product(x, s, &in[1], t, k, n, in[0].p, out[0].p)
	})
	return nil
}
