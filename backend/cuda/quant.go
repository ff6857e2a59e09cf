package cuda

import (
	"errors"
	"fmt"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
	"kiln/tensor"
)

// Products of GGUF matrices kept in their blocks (weightDTypes: the
// formats of kernels.DequantFormats), as llama.cpp's CUDA backend runs
// them: a Q4_K or Q6_K matrix's products of up to kernels.GEMVVectorMaxT
// rows on the GEMV straight from the blocks (GEMV.RunBlocks, x
// rounded to int8 per 32 values as llama.cpp's MMVQ does, in the kernel's
// shared memory); every other
// product dequantized, at
// most dqLimit bytes of rows at a time, into the dq scratch
// (Kernels.Dequantize, bit for bit the host's widening) and multiplied by
// cuBLASLt into its columns of the output.

// dqLimit bounds the dequantized rows of one product's chunk.
const dqLimit = 128 << 20

// dqChunkRows is how many rows of a matrix of k columns one chunk
// dequantizes: dqLimit's worth, a multiple of 16.
func dqChunkRows(k, elemSize int) int {
	r := dqLimit / (k * elemSize)
	return max(16, r-r%16)
}

// quantNeeds is the scratch plan p's quantized products need: qs for the
// activation's copies (an FP8 product beyond GEMVVectorMaxT rows: its
// E4M3 copy), dq for a chunk of dequantized rows.
func (l *loaded) quantNeeds(p *compile.Plan) (qs, dq int) {
	rows := p.Bucket.Tokens
	for _, n := range p.Graph.Nodes {
		if (n.Op != ir.MatMul && n.Op != ir.MatMulBias) || len(n.Inputs) < 2 {
			continue
		}
		w, ok := l.weights[n.Inputs[1].Def]
		k := n.Inputs[0].Shape.Last()
		switch {
		case !ok:
		case w.dtype == cu.F8E4M3 && l.fp8Activation(rows):
			qs = max(qs, fp8XOffset(rows)+rows*k)
		case w.dtype == devBlocks:
			if !l.blockGEMV(w.blocks) || rows > kernels.GEMVVectorMaxT {
				dq = max(dq, min(w.rows, dqChunkRows(k, l.act.Size()))*k*l.act.Size())
			}
		}
	}
	return qs, dq
}

// growQuant makes the quantized products' scratch at least qs and dq
// bytes. Growing either drops every executable's captured graphs, which
// bake in their addresses.
func (l *loaded) growQuant(qs, dq int) error {
	if qs <= l.qsCap && dq <= l.dqCap {
		return nil
	}
	if err := l.stream.Sync(); err != nil {
		return err
	}
	for _, e := range l.execs {
		e.dropGraphs()
	}
	grow := func(p *cu.Ptr, capacity *int, n int, what string) error {
		if n <= *capacity {
			return nil
		}
		if *p != 0 {
			if err := l.free(*p); err != nil {
				return err
			}
			*p, *capacity = 0, 0
		}
		q, err := l.alloc(n)
		if err != nil {
			return fmt.Errorf("cuda: %s scratch of %d bytes: %w", what, n, err)
		}
		*p, *capacity = q, n
		return nil
	}
	if err := grow(&l.qs, &l.qsCap, qs, "quantized activation"); err != nil {
		return err
	}
	if l.fp8 && l.f8One == 0 && qs > 0 {
		p, err := l.alloc(4)
		if err != nil {
			return err
		}
		if err := l.dev.Upload(p, cu.AsBytes([]float32{1})); err != nil {
			return err
		}
		l.f8One = p
	}
	return grow(&l.dq, &l.dqCap, dq, "dequantized weight")
}

// ensureQuant grows the scratch for a product about to run, or, inside a
// capture (which must not allocate), reports what is missing.
func (l *loaded) ensureQuant(x *stepState, qs, dq int) error {
	if qs <= l.qsCap && dq <= l.dqCap {
		return nil
	}
	if x.capturing {
		return fmt.Errorf("cuda: quantized products' scratch of %d and %d bytes, %d and %d reserved", qs, dq, l.qsCap, l.dqCap)
	}
	return oom(l.growQuant(qs, dq))
}

// bindWeightProduct binds a MatMul or MatMulBias node whose weight the
// device holds in a form of its own (E4M3, GGUF blocks), kernel naming it:
// run computes the product of t rows, k columns and n outputs into the
// node's output, adding bias itself where it can (it reports whether it
// did); otherwise the bias kernel adds it after. The reader a GEMV
// epilogue would take runs as its own kernel.
func (l *loaded) bindWeightProduct(nd *node, s *cu.Stream, kernel string, run func(x *stepState, nd *node, t, k, n int, bias *operand) (bool, error)) {
	in, out := nd.in, nd.out
	nd.kernel = kernel
	var bias *operand
	if nd.n.Op == ir.MatMulBias {
		bias = &in[2]
		nd.kernel += " + bias"
	}
	nd.launch = func(x *stepState, nd *node) error {
		t, k, n := in[0].rows(x), in[0].cols, out[0].cols
		biased, err := run(x, nd, t, k, n, bias)
		if err != nil || bias == nil || biased {
			return err
		}
		return l.k.AddBias(s, out[0].p, out[0].p, bias.p, bias.dtype, t, n)
	}
}

// chooseBlocks binds a MatMul or MatMulBias node whose weight is in GGUF
// blocks on the device (the comment above); the bias is added by
// cuBLASLt's epilogue where its dtype is the output's, else by a kernel.
func (l *loaded) chooseBlocks(nd *node, s *cu.Stream) error {
	in, out := nd.in, nd.out
	w := &in[1]
	rowBytes, err := w.blocks.Bytes(int64(in[0].cols))
	if err != nil {
		return fmt.Errorf("cuda: matmul weight %q: %w", w.v.Def.Attrs.Name, err)
	}
	gemv := l.blockGEMV(w.blocks)
	kernel := fmt.Sprintf("%v blocks: dequantized rows + cuBLASLt", w.blocks)
	if gemv {
		kernel = fmt.Sprintf("%v blocks: gemv (T ≤ %d) | dequantized rows + cuBLASLt", w.blocks, kernels.GEMVVectorMaxT)
	}
	l.bindWeightProduct(nd, s, kernel, func(x *stepState, nd *node, t, k, n int, bias *operand) (bool, error) {
		if f := nd.fold; f != nil && f.p == nd && f.on {
			// The norm did not run: its rows, times its gain here, and
			// its 1/rms applied by the reader (normFold.decide took this
			// product for the K-quant GEMV).
			f.normed = false
			x.noteProduct(cu.Matmul{T: t, K: k, N: n}, fmt.Sprintf("gemv %v + a folded norm's gain", w.blocks))
			return false, l.gemv.RunBlocksFolded(s, w.blocks, out[0].p, f.rows.p, w.p, t, k, n, out[0].dtype == cu.F32, kernels.BlocksFold{Gain: f.gainX})
		}
		if t <= kernels.GEMVVectorMaxT && gemv {
			dst, fold, what := out[0].p, kernels.BlocksFold{}, fmt.Sprintf("gemv %v", w.blocks)
			if f := nd.fold; f != nil && f.m == nd {
				f.on = false
				if bias == nil && out[0].dtype == l.act && f.decide(l, x) {
					// The norm's residual added here, into its sum.
					dst, fold.Add, what = f.rows.p, f.resid.p, what+" + a folded norm's residual"
				}
			}
			err := l.gemv.RunBlocksFolded(s, w.blocks, dst, in[0].p, w.p, t, k, n, out[0].dtype == cu.F32, fold)
			if err == nil || !errors.Is(err, kernels.ErrGEMVShape) {
				x.noteProduct(cu.Matmul{T: t, K: k, N: n}, what)
				return false, err
			}
			if fold.Add != 0 {
				nd.fold.on = false // the norm runs after the plain product below
			}
		} else if f := nd.fold; f != nil && f.m == nd {
			f.on = false
		}
		es, oes := l.act.Size(), out[0].dtype.Size()
		rows := min(n, dqChunkRows(k, es))
		if err := l.ensureQuant(x, 0, rows*k*es); err != nil {
			return false, err
		}
		epilogue := bias != nil && bias.dtype == out[0].dtype
		for n0 := 0; n0 < n; n0 += rows {
			nc := min(rows, n-n0)
			if err := l.k.Dequantize(s, l.dq, w.p.Add(n0*int(rowBytes)), w.blocks, nc*k); err != nil {
				return false, err
			}
			mm := cu.Matmul{T: t, K: k, N: nc, LDD: n, In: l.act, Out: out[0].dtype, X: in[0].p, W: l.dq,
				Dst: out[0].p.Add(n0 * oes), Stream: s}
			if epilogue {
				mm.Bias = bias.p.Add(n0 * oes)
			}
			mm.Algo = l.algorithm(x, mm)
			x.noteProduct(mm, fmt.Sprintf("%v dequantized + cuBLASLt", w.blocks))
			if err := l.lt.Matmul(mm); err != nil {
				return false, err
			}
		}
		return epilogue, nil
	})
	return nil
}

// blockGEMV reports whether the GEMV computes decode steps' products
// straight from matrices of GGUF format f (GEMV.RunBlocks).
func (l *loaded) blockGEMV(f tensor.DType) bool { return l.gemv != nil && kernels.TakesBlocks(f) }
