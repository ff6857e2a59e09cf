package cpu

// Fast kernels. Matrix products go to package gemm (SIMD, all cores);
// attention runs one (token, head) pair per task item with an online softmax
// (a running maximum and sum rescale the output as keys stream past, so no
// score row is stored, as in FlashAttention); RoPE on keys is applied in the
// cache slot they are written to. None allocates while running.

import (
	"math"

	"kiln/backend/cpu/gemm"
	"kiln/ir"
)

const fastPriority = 10

func init() {
	register(ir.MatMul, kernel{name: "gemm.matmul", priority: fastPriority, run: func(x *execState, s *step) {
		gemm.MatMul(x.l.pool, s.out[0].f, s.in[0].f, s.in[0].rows(x), s.in[1].w)
	}})
	register(ir.MatMulBias, kernel{name: "gemm.matmul_bias", priority: fastPriority, run: func(x *execState, s *step) {
		gemm.MatMul(x.l.pool, s.out[0].f, s.in[0].f, s.in[0].rows(x), s.in[1].w)
		addBias(s.out[0].f, s.in[2].f, s.in[0].rows(x))
	}})
	register(ir.Attention, kernel{name: "cpu.attention_online_softmax", priority: fastPriority,
		prepare: func(l *loaded, s *step) { s.task = &attnTask{} },
		run: func(x *execState, s *step) {
			t := s.task.(*attnTask)
			t.x, t.s = x, s
			x.l.pool.Run(x.tokens*s.node.Attrs.Heads, 1, t)
			t.x, t.s = nil, nil
		}})
	register(ir.MoE, kernel{name: "cpu.moe_grouped", priority: fastPriority, run: moeGrouped})
	register(ir.SwiGLU, kernel{name: "cpu.swiglu_expf", priority: fastPriority, run: func(x *execState, s *step) {
		n := s.out[0].rows(x) * s.out[0].cols
		gemm.SwiGLU(s.out[0].f[:n], s.in[0].f[:n], s.in[1].f[:n])
	}})
	register(ir.SwiGLUPacked, kernel{name: "cpu.swiglu_packed_expf", priority: fastPriority, run: func(x *execState, s *step) {
		rows, n := s.out[0].rows(x), s.out[0].cols
		for r := 0; r < rows; r++ {
			gemm.SwiGLU(s.out[0].f[r*n:(r+1)*n], s.in[0].f[2*n*r:2*n*r+n], s.in[0].f[2*n*r+n:2*n*(r+1)])
		}
	}})
	register(ir.RoPEKVWrite, kernel{name: "cpu.rope_kv_write", priority: fastPriority, run: func(x *execState, s *step) {
		a := s.node.Attrs
		width := a.KVHeads * a.HeadDim
		table := tensorF32(s.in[3].t)
		k := x.kv.row[:width]
		for t := 0; t < x.tokens; t++ {
			p := x.batch.Positions[t]
			at := slot(x, int(x.batch.SeqIndex[t]), int(p)) * width
			copy(k, s.in[0].f[t*width:(t+1)*width])
			rotate(k, table[int(p)*a.HeadDim:(int(p)+1)*a.HeadDim], a.KVHeads, a.HeadDim, a.Interleaved)
			x.kv.put(a.Layer, at, k, s.in[1].f[t*width:(t+1)*width])
		}
	}})
}

type attnTask struct {
	x *execState
	s *step
}

// attnBlock is how many keys' scores are held at once.
const attnBlock = 64

func (t *attnTask) Do(lo, hi int) {
	x, s := t.x, t.s
	a := s.node.Attrs
	q, out := s.in[0].f, s.out[0].f
	width := a.KVHeads * a.HeadDim
	group := a.Heads / a.KVHeads
	kv := x.kv
	var scores [attnBlock]float32
	for item := lo; item < hi; item++ {
		tok, h := item/a.Heads, item%a.Heads
		seq, p := int(x.batch.SeqIndex[tok]), int(x.batch.Positions[tok])
		qh := q[item*a.HeadDim : (item+1)*a.HeadDim]
		acc := out[item*a.HeadDim : (item+1)*a.HeadDim]
		clear(acc)
		kvOff := (h / group) * a.HeadDim
		maxScore := float32(math.Inf(-1))
		var sum float32
		// Keys stream past in blocks: score a block, rescale what has been
		// accumulated if the block raised the maximum, then add the block's
		// values weighted by exp(score - max).
		// A run of keys in one cache block are consecutive slots, width
		// apart: one gemm.Dots (gemm.Axpys) call each.
		bs := x.kv.spec.BlockSize
		for j0 := windowStart(p, a.Window); j0 <= p; j0 += attnBlock {
			n := min(attnBlock, p+1-j0)
			for i := 0; i < n; {
				run := min(n-i, bs-(j0+i)%bs)
				at := slot(x, seq, j0+i)*width + kvOff
				switch {
				case kv.spec.FP8:
					gemm.DotsE4M3(scores[i:i+run], qh, kv.kq[a.Layer][at:], width)
				case kv.spec.F16:
					gemm.DotsF16(scores[i:i+run], qh, kv.kh[a.Layer][at:], width)
				default:
					gemm.Dots(scores[i:i+run], qh, kv.k[a.Layer][at:], width)
				}
				i += run
			}
			blockMax := maxScore
			for i := range scores[:n] {
				scores[i] *= a.Scale
				if a.Cap != 0 {
					scores[i] = a.Cap * float32(math.Tanh(float64(scores[i]/a.Cap)))
				}
				blockMax = max(blockMax, scores[i])
			}
			if blockMax > maxScore {
				corr := gemm.Expf(maxScore - blockMax)
				for d := range acc {
					acc[d] *= corr
				}
				sum *= corr
				maxScore = blockMax
			}
			for i := range scores[:n] {
				scores[i] = gemm.Expf(scores[i] - maxScore)
				sum += scores[i]
			}
			for i := 0; i < n; {
				run := min(n-i, bs-(j0+i)%bs)
				at := slot(x, seq, j0+i)*width + kvOff
				switch {
				case kv.spec.FP8:
					gemm.AxpysE4M3(scores[i:i+run], kv.vq[a.Layer][at:], width, acc)
				case kv.spec.F16:
					gemm.AxpysF16(scores[i:i+run], kv.vh[a.Layer][at:], width, acc)
				default:
					gemm.Axpys(scores[i:i+run], kv.v[a.Layer][at:], width, acc)
				}
				i += run
			}
		}
		inv := 1 / sum
		for d := range acc {
			acc[d] *= inv
		}
	}
}

// moeGrouped runs ir.MoE as refMoE defines it, expert by expert: the rows
// routed to an expert (routeRow) gathered, their products on the workers
// (gemm.MatMul, gemm.SwiGLU), and the results added back to their rows so
// weighted.
func moeGrouped(x *execState, s *step) {
	a := s.node.Attrs
	in := &s.in[0]
	rows, d := in.rows(x), in.cols
	out := s.out[0].f[:rows*d]
	clear(out)
	// The step's buffers, kept from one call to the next (a node runs on
	// one goroutine at a time).
	sc, _ := s.task.(*moeScratch)
	if sc == nil {
		sc = &moeScratch{byExpert: make([][]routed, a.Experts), top: make([]int, a.TopK), weights: make([]float32, a.TopK)}
		s.task = sc
	}
	logits := grow(&sc.logits, rows*a.Experts)
	gemm.MatMul(x.l.pool, logits, in.f[:rows*d], rows, s.in[1].w)
	byExpert := sc.byExpert
	for e := range byExpert {
		byExpert[e] = byExpert[e][:0]
	}
	for r := range rows {
		routeRowInto(logits[r*a.Experts:(r+1)*a.Experts], a.NormTopK, sc.top, sc.weights)
		for j, e := range sc.top {
			byExpert[e] = append(byExpert[e], routed{r, sc.weights[j]})
		}
	}
	inter := s.in[2].w.N
	for e, rs := range byExpert {
		if len(rs) == 0 {
			continue
		}
		n := len(rs)
		xs := in.f[rs[0].row*d : (rs[0].row+1)*d]
		if n > 1 { // gathered; one row is read where it is
			xs = grow(&sc.xs, n*d)
			for i, rt := range rs {
				copy(xs[i*d:(i+1)*d], in.f[rt.row*d:(rt.row+1)*d])
			}
		}
		g, u, y := grow(&sc.g, n*inter), grow(&sc.u, n*inter), grow(&sc.y, n*d)
		gemm.MatMul(x.l.pool, g, xs, n, s.in[2+3*e].w)
		gemm.MatMul(x.l.pool, u, xs, n, s.in[3+3*e].w)
		gemm.SwiGLU(g, g, u)
		gemm.MatMul(x.l.pool, y, g, n, s.in[4+3*e].w)
		for i, rt := range rs {
			o := out[rt.row*d : (rt.row+1)*d]
			for j := range o {
				o[j] += rt.w * y[i*d+j]
			}
		}
	}
	if a.Shared {
		moeShared(x, s, rows, d, out)
	}
}

// routed is a row routed to an expert, with its weight.
type routed struct {
	row int
	w   float32
}

// moeScratch is moeGrouped's buffers, kept in its step.
type moeScratch struct {
	logits, xs, g, u, y []float32
	byExpert            [][]routed
	top                 []int
	weights             []float32
}

// grow returns (*b)[:n], reallocating *b when it is short.
func grow(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	return (*b)[:n]
}

// moeShared adds ir.MoE's shared expert to out: every row's SwiGLU MLP
// (on the workers), scaled by sigmoid(x·w) with SharedGate.
func moeShared(x *execState, s *step, rows, d int, out []float32) {
	a := s.node.Attrs
	at := 2 + 3*a.Experts
	xs := s.in[0].f[:rows*d]
	inter := s.in[at].w.N
	g, u, y := make([]float32, rows*inter), make([]float32, rows*inter), make([]float32, rows*d)
	gemm.MatMul(x.l.pool, g, xs, rows, s.in[at].w)
	gemm.MatMul(x.l.pool, u, xs, rows, s.in[at+1].w)
	gemm.SwiGLU(g, g, u)
	gemm.MatMul(x.l.pool, y, g, rows, s.in[at+2].w)
	scales := make([]float32, rows)
	if a.SharedGate {
		gemm.MatMul(x.l.pool, scales, xs, rows, s.in[at+3].w)
	}
	for r := range rows {
		scale := float32(1)
		if a.SharedGate {
			scale = sigmoid(scales[r])
		}
		o := out[r*d : (r+1)*d]
		for j := range o {
			o[j] += scale * y[r*d+j]
		}
	}
}
