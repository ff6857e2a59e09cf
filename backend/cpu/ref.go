package cpu

// Reference kernels: one per op, written as plainly as possible, accumulating
// in float64 where a sum is long. They define what every op means; the fast
// kernels here and on other backends are tested against them.

import (
	"math"
	"slices"

	"kiln/backend/cpu/gemm"
	"kiln/ir"
	"kiln/tensor"
)

func init() {
	ref := func(op ir.Op, name string, run kernelFunc) {
		register(op, kernel{name: name, priority: 0, run: run})
	}
	ref(ir.Tokens, "ref.tokens", func(x *execState, s *step) {
		copy(s.out[0].i, x.batch.Tokens)
	})
	ref(ir.Positions, "ref.positions", func(x *execState, s *step) {
		copy(s.out[0].i, x.batch.Positions)
	})
	ref(ir.Embed, "ref.embed", refEmbed)
	ref(ir.RMSNorm, "ref.rmsnorm", func(x *execState, s *step) {
		in, out := &s.in[0], &s.out[0]
		rows, dim := in.rows(x), in.cols
		if hd := s.node.Attrs.HeadDim; hd > 0 {
			rows, dim = rows*(dim/hd), hd // each head's elements: rows of the same data
		}
		refRMSNorm(out.f, in.f, s.in[1].f, rows, dim, s.node.Attrs.Eps)
	})
	ref(ir.MatMul, "ref.matmul", func(x *execState, s *step) {
		gemm.MatMulRef(s.out[0].f, s.in[0].f, s.in[0].rows(x), s.in[1].w)
	})
	ref(ir.MatMulBias, "ref.matmul_bias", func(x *execState, s *step) {
		gemm.MatMulRef(s.out[0].f, s.in[0].f, s.in[0].rows(x), s.in[1].w)
		addBias(s.out[0].f, s.in[2].f, s.in[0].rows(x))
	})
	ref(ir.Add, "ref.add", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		a, b, out := s.in[0].f[:n], s.in[1].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = a[i] + b[i]
		}
	})
	ref(ir.Mul, "ref.mul", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		a, b, out := s.in[0].f[:n], s.in[1].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = a[i] * b[i]
		}
	})
	ref(ir.MoE, "ref.moe", refMoE)
	ref(ir.AllReduce, "ref.all_reduce", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		copy(s.out[0].f[:n], s.in[0].f[:n])
		x.fail(x.comm().AllReduce(s.out[0].f[:n]))
	})
	ref(ir.AllGather, "ref.all_gather", func(x *execState, s *step) {
		rows, cols := s.in[0].rows(x), s.in[0].cols
		x.fail(x.comm().AllGather(s.out[0].f, s.in[0].f, rows, cols))
	})
	ref(ir.SiLU, "ref.silu", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		a, out := s.in[0].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = silu(a[i])
		}
	})
	ref(ir.GELUTanh, "ref.gelu_tanh", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		a, out := s.in[0].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = geluTanh(a[i])
		}
	})
	ref(ir.SoftCap, "ref.softcap", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		a, out := s.in[0].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = float32(softCap(float64(a[i]), s.node.Attrs.Cap))
		}
	})
	ref(ir.AddBias, "ref.add_bias", func(x *execState, s *step) {
		rows, cols := s.in[0].rows(x), s.in[0].cols
		copy(s.out[0].f[:rows*cols], s.in[0].f[:rows*cols])
		addBias(s.out[0].f, s.in[1].f, rows)
	})
	ref(ir.RoPE, "ref.rope", func(x *execState, s *step) {
		a := s.node.Attrs
		n := x.tokens * s.in[0].cols
		copy(s.out[0].f[:n], s.in[0].f[:n])
		refRoPE(s.out[0].f, s.in[1].i[:x.tokens], s.in[2].t, a.Heads, a.HeadDim, a.Interleaved)
	})
	ref(ir.KVWrite, "ref.kv_write", func(x *execState, s *step) {
		refKVWrite(x, s.node.Attrs, s.in[0].f, s.in[1].f)
	})
	ref(ir.RoPEKVWrite, "ref.rope_kv_write", func(x *execState, s *step) {
		a := s.node.Attrs
		k := append([]float32(nil), s.in[0].f[:x.tokens*s.in[0].cols]...)
		refRoPE(k, s.in[2].i[:x.tokens], s.in[3].t, a.KVHeads, a.HeadDim, a.Interleaved)
		refKVWrite(x, a, k, s.in[1].f)
	})
	ref(ir.Attention, "ref.attention", refAttention)
	ref(ir.SelectRows, "ref.select_rows", func(x *execState, s *step) {
		cols := s.in[0].cols
		for r, t := range x.batch.Rows {
			copy(s.out[0].f[r*cols:(r+1)*cols], s.in[0].f[int(t)*cols:])
		}
	})
	ref(ir.AddRMSNorm, "ref.add_rmsnorm", func(x *execState, s *step) {
		rows, cols := s.in[0].rows(x), s.in[0].cols
		sum := s.out[0].f[:rows*cols]
		for i := range sum {
			sum[i] = s.in[0].f[i] + s.in[1].f[i]
		}
		refRMSNorm(s.out[1].f, sum, s.in[2].f, rows, cols, s.node.Attrs.Eps)
	})
	ref(ir.SwiGLU, "ref.swiglu", func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		g, u, out := s.in[0].f[:n], s.in[1].f[:n], s.out[0].f[:n]
		for i := range out {
			out[i] = silu(g[i]) * u[i]
		}
	})
	ref(ir.SwiGLUPacked, "ref.swiglu_packed", func(x *execState, s *step) {
		rows, n := s.out[0].rows(x), s.out[0].cols
		for r := 0; r < rows; r++ {
			g, u, out := s.in[0].f[2*n*r:], s.in[0].f[2*n*r+n:], s.out[0].f[r*n:(r+1)*n]
			for i := range out {
				out[i] = silu(g[i]) * u[i]
			}
		}
	})
	ref(ir.RoPEQKVWrite, "ref.rope_qkv_write", func(x *execState, s *step) {
		a := s.node.Attrs
		cols, qw, kw := s.in[0].cols, a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
		q := s.out[0].f[:x.tokens*qw]
		k, v := make([]float32, x.tokens*kw), make([]float32, x.tokens*kw)
		for t := 0; t < x.tokens; t++ {
			row := s.in[0].f[t*cols : (t+1)*cols]
			copy(q[t*qw:(t+1)*qw], row[:qw])
			copy(k[t*kw:(t+1)*kw], row[qw:qw+kw])
			copy(v[t*kw:(t+1)*kw], row[qw+kw:])
		}
		pos := s.in[1].i[:x.tokens]
		refRoPE(q, pos, s.in[2].t, a.Heads, a.HeadDim, a.Interleaved)
		refRoPE(k, pos, s.in[2].t, a.KVHeads, a.HeadDim, a.Interleaved)
		refKVWrite(x, a, k, v)
	})
	ref(ir.Split, "ref.split", func(x *execState, s *step) {
		rows, cols := s.in[0].rows(x), s.in[0].cols
		for r := 0; r < rows; r++ {
			off := 0
			for _, o := range s.out {
				copy(o.f[r*o.cols:(r+1)*o.cols], s.in[0].f[r*cols+off:])
				off += o.cols
			}
		}
	})
}

// geluTanh is GELU's tanh approximation (PyTorch's gelu(approximate="tanh")).
func geluTanh(v float32) float32 {
	x := float64(v)
	return float32(0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))))
}

// softCap is cap·tanh(x/cap), or x when cap is 0.
func softCap(x float64, c float32) float64 {
	if c == 0 {
		return x
	}
	return float64(c) * math.Tanh(x/float64(c))
}

func silu(v float32) float32 { return v / (1 + float32(math.Exp(float64(-v)))) }

// refMoE runs a mixture of SwiGLU experts (ir.MoE) row by row: the
// router's logits, the routing (routeRow), and the sum of the chosen
// experts' MLPs so weighted.
func refMoE(x *execState, s *step) {
	a := s.node.Attrs
	in := &s.in[0]
	rows, d := in.rows(x), in.cols
	out := s.out[0].f[:rows*d]
	logits := make([]float32, a.Experts)
	inter := s.in[2].w.N
	g, u, y := make([]float32, inter), make([]float32, inter), make([]float32, d)
	for r := range rows {
		xr, o := in.f[r*d:(r+1)*d], out[r*d:(r+1)*d]
		gemm.MatMulRef(logits, xr, 1, s.in[1].w)
		top, weights := routeRow(logits, a.TopK, a.NormTopK)
		clear(o)
		for j, e := range top {
			gemm.MatMulRef(g, xr, 1, s.in[2+3*e].w)
			gemm.MatMulRef(u, xr, 1, s.in[3+3*e].w)
			for i := range g {
				g[i] = silu(g[i]) * u[i]
			}
			gemm.MatMulRef(y, g, 1, s.in[4+3*e].w)
			for i := range o {
				o[i] += weights[j] * y[i]
			}
		}
		if a.Shared {
			at := 2 + 3*a.Experts
			sg, su := make([]float32, s.in[at].w.N), make([]float32, s.in[at].w.N)
			gemm.MatMulRef(sg, xr, 1, s.in[at].w)
			gemm.MatMulRef(su, xr, 1, s.in[at+1].w)
			for i := range sg {
				sg[i] = silu(sg[i]) * su[i]
			}
			gemm.MatMulRef(y, sg, 1, s.in[at+2].w)
			scale := float32(1)
			if a.SharedGate {
				var l [1]float32
				gemm.MatMulRef(l[:], xr, 1, s.in[at+3].w)
				scale = sigmoid(l[0])
			}
			for i := range o {
				o[i] += scale * y[i]
			}
		}
	}
}

func sigmoid(v float32) float32 { return 1 / (1 + float32(math.Exp(float64(-v)))) }

// routeRow is one row's routing: the k experts of largest logit
// (topExperts) and their weights, the softmax of their logits when norm
// (Mixtral's), else their probabilities under the softmax over every
// expert (ir.Attrs.NormTopK).
func routeRow(logits []float32, k int, norm bool) ([]int, []float32) {
	top, weights := make([]int, k), make([]float32, k)
	routeRowInto(logits, norm, top, weights)
	return top, weights
}

// routeRowInto is routeRow into top and weights (len k each), allocating
// nothing.
func routeRowInto(logits []float32, norm bool, top []int, weights []float32) {
	topExperts(logits, top)
	exp := func(e int) float64 { return math.Exp(float64(logits[e] - logits[top[0]])) }
	sum := 0.0
	if norm {
		for _, e := range top {
			sum += exp(e)
		}
	} else {
		for e := range logits {
			sum += exp(e)
		}
	}
	for j, e := range top {
		weights[j] = float32(exp(e) / sum)
	}
}

// topExperts puts the len(top) indices of the largest logits in top,
// largest first (the lower index first among equals): a selection, as k
// is small.
func topExperts(logits []float32, top []int) {
	for j := range top {
		best := -1
		for e, l := range logits {
			if (best < 0 || l > logits[best]) && !slices.Contains(top[:j], e) {
				best = e
			}
		}
		top[j] = best
	}
}

func refEmbed(x *execState, s *step) {
	table, out := s.in[0].t, s.out[0]
	cols := out.cols
	rowBytes := len(table.Data) / table.Shape[0]
	for t, id := range s.in[1].i[:x.tokens] {
		if a := s.node.Attrs; a.Ranks > 1 {
			// A vocabulary shard: another rank's ids give zeros.
			id -= int32(a.VocabStart)
			if id < 0 || int(id) >= table.Shape[0] {
				clear(out.f[t*cols : (t+1)*cols])
				continue
			}
		}
		row := table.Data[int(id)*rowBytes : (int(id)+1)*rowBytes]
		dst := out.f[t*cols : (t+1)*cols]
		if err := tensor.ToF32(table.DType, row, dst); err != nil {
			panic(err) // the verifier admits only float tables
		}
		if sc := s.node.Attrs.Scale; sc != 0 {
			for i := range dst {
				dst[i] *= sc
			}
		}
	}
}

func refRMSNorm(out, in, w []float32, rows, cols int, eps float32) {
	for r := 0; r < rows; r++ {
		row := in[r*cols : (r+1)*cols]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		scale := float32(1 / math.Sqrt(ss/float64(cols)+float64(eps)))
		for c, v := range row {
			out[r*cols+c] = v * scale * w[c]
		}
	}
}

// refRoPE rotates, in place, each head of each token row of x by its
// position, using the folded table (cos then sin per row).
func refRoPE(x []float32, pos []int32, table *tensor.Tensor, heads, headDim int, interleaved bool) {
	tab := tensorF32(table)
	for t, p := range pos {
		rotate(x[t*heads*headDim:(t+1)*heads*headDim], tab[int(p)*headDim:(int(p)+1)*headDim], heads, headDim, interleaved)
	}
}

// rotate applies RoPE in place to the heads of one token row, with cs the
// table row of its position: pair (a, b) becomes (a·cos − b·sin, b·cos +
// a·sin), the pairs being (i, i+d/2), or (2i, 2i+1) when interleaved.
func rotate(row, cs []float32, heads, headDim int, interleaved bool) {
	half := headDim / 2
	for h := 0; h < heads; h++ {
		v := row[h*headDim : (h+1)*headDim]
		for i := 0; i < half; i++ {
			a, b := i, i+half
			if interleaved {
				a, b = 2*i, 2*i+1
			}
			c, sn := cs[i], cs[half+i]
			x1, x2 := v[a], v[b]
			v[a] = x1*c - x2*sn
			v[b] = x2*c + x1*sn
		}
	}
}

// tensorF32 views an F32 tensor's bytes as float32s.
func tensorF32(t *tensor.Tensor) []float32 {
	if t.DType != tensor.F32 {
		panic("cpu: rope table is not f32")
	}
	return bytesF32(t.Data)
}

// slot returns the index of the cache slot holding position p of sequence s.
func slot(x *execState, s int, p int) int {
	bs := x.kv.spec.BlockSize
	return int(x.batch.Seqs[s].Blocks[p/bs])*bs + p%bs
}

func refKVWrite(x *execState, a ir.Attrs, k, v []float32) {
	width := a.KVHeads * a.HeadDim
	for t := 0; t < x.tokens; t++ {
		at := slot(x, int(x.batch.SeqIndex[t]), int(x.batch.Positions[t])) * width
		x.kv.put(a.Layer, at, k[t*width:(t+1)*width], v[t*width:(t+1)*width])
	}
}

// refKV returns element i of layer l's keys (or values), widened from FP8
// or f16 when the cache holds them.
func refKV(c *kvCache, f [][]float32, q [][]byte, h [][]uint16, l, i int) float64 {
	switch {
	case c.spec.FP8:
		return float64(tensor.E4M3ToF32(q[l][i]))
	case c.spec.F16:
		return float64(tensor.F16ToF32(h[l][i]))
	}
	return float64(f[l][i])
}

// window returns the first position token at position p may attend to.
func windowStart(p, window int) int {
	if window > 0 && p-window+1 > 0 {
		return p - window + 1
	}
	return 0
}

func refAttention(x *execState, s *step) {
	a := s.node.Attrs
	q, out := s.in[0].f, s.out[0].f
	width := a.KVHeads * a.HeadDim
	group := a.Heads / a.KVHeads
	kv := x.kv
	for t := 0; t < x.tokens; t++ {
		seq, p := int(x.batch.SeqIndex[t]), int(x.batch.Positions[t])
		lo := windowStart(p, a.Window)
		for h := 0; h < a.Heads; h++ {
			qh := q[(t*a.Heads+h)*a.HeadDim : (t*a.Heads+h+1)*a.HeadDim]
			kvOff := (h / group) * a.HeadDim
			scores := make([]float64, p-lo+1)
			maxScore := math.Inf(-1)
			for j := lo; j <= p; j++ {
				at := slot(x, seq, j)*width + kvOff
				var dot float64
				for d := range qh {
					dot += float64(qh[d]) * refKV(kv, kv.k, kv.kq, kv.kh, a.Layer, at+d)
				}
				scores[j-lo] = softCap(dot*float64(a.Scale), a.Cap)
				maxScore = math.Max(maxScore, scores[j-lo])
			}
			var sum float64
			for i := range scores {
				scores[i] = math.Exp(scores[i] - maxScore)
				sum += scores[i]
			}
			oh := out[(t*a.Heads+h)*a.HeadDim : (t*a.Heads+h+1)*a.HeadDim]
			for d := range oh {
				var acc float64
				for j := lo; j <= p; j++ {
					acc += scores[j-lo] * refKV(kv, kv.v, kv.vq, kv.vh, a.Layer, slot(x, seq, j)*width+kvOff+d)
				}
				oh[d] = float32(acc / sum)
			}
		}
	}
}

// addBias adds b to each of the first rows rows of x (rows of len(b)).
func addBias(x, b []float32, rows int) {
	cols := len(b)
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		for c := range row {
			row[c] += b[c]
		}
	}
}
