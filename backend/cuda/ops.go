package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/ir"
	"kiln/tune"
)

// choose binds a node to its kernel: sets nd.kernel (the name Kernels
// reports) and nd.launch.
func (l *loaded) choose(nd *node) error {
	k, s := l.k, l.stream
	a := nd.n.Attrs
	in, out := nd.in, nd.out
	ws := func(o operand) string { return "_w" + o.dtype.String() }
	switch nd.n.Op {
	case ir.Embed:
		nd.kernel = "embed" + ws(in[0])
		start, total := 0, in[0].vocab
		if a.Ranks > 1 {
			nd.kernel += " (vocabulary shard)"
			start, total = a.VocabStart, in[0].vocab*a.Ranks
		}
		scale := float32(1)
		if a.Scale != 0 { // Gemma's √dim
			scale = a.Scale
		}
		nd.launch = func(x *stepState, nd *node) error {
			return k.EmbedShard(s, out[0].p, in[0].p, in[0].dtype, in[0].vocab, in[1].ptr(x), x.m.T, out[0].cols, start, total, scale)
		}
	case ir.AllReduce:
		nd.kernel = "nccl all-reduce"
		if p := l.b.Peers; p != nil {
			nd.kernel = fmt.Sprintf("peer all-reduce (nccl past %d bytes)", p.CapBytes)
			if p.TwoShot(p.CapBytes) {
				nd.kernel = fmt.Sprintf("peer all-reduce (two shots past %d bytes, nccl past %d)", kernels.PeerOneShotBytes, p.CapBytes)
			}
		}
		nd.launch = func(x *stepState, nd *node) error {
			n := in[0].rows(x) * in[0].cols
			if p := l.b.Peers; p != nil {
				if f := nd.fold; f != nil && f.m == nd {
					// The norm's residual added here, into its sum, where
					// the one-shot form runs and the product after the
					// norm takes the rest (normFold.decide).
					f.on = false
					if p.PeerAddFits(f.rows.p, in[0].p, f.resid.p, n, in[0].dtype, f.sync) && f.decide(l, x) {
						return k.PeerAllReduceAdd(s, *p, f.rows.p, in[0].p, f.resid.p, n, in[0].dtype, f.sync)
					}
				}
				if ok, err := l.runPeerNorm(x, nd); ok || err != nil {
					return err
				}
				if p.PeerAllReduceFits(out[0].p, in[0].p, n, in[0].dtype) {
					return k.PeerAllReduce(s, *p, out[0].p, in[0].p, n, in[0].dtype)
				}
				x.ran = "nccl all-reduce"
			}
			return l.b.Comm.AllReduce(out[0].p, in[0].p, n, in[0].dtype, s)
		}
	case ir.AllGather:
		nd.kernel = "nccl all-gather"
		nd.launch = func(x *stepState, nd *node) error {
			rows, n := in[0].rows(x), in[0].cols
			if x.sampling && nd.scatters(l.b.Peers, rows) {
				x.ran = "peer scatter of the logits by rows"
				return k.PeerScatterRows(s, *l.b.Peers, in[0].p, rows, n)
			}
			if rows == 1 { // rank-major is row-major
				return l.b.Comm.AllGather(out[0].p, in[0].p, n, in[0].dtype, s)
			}
			if err := l.b.Comm.AllGather(x.gather, in[0].p, rows*n, in[0].dtype, s); err != nil {
				return err
			}
			return k.InterleaveRanks(s, out[0].p, x.gather, rows, n, a.Ranks)
		}
	case ir.RMSNorm:
		nd.kernel = "rmsnorm" + ws(in[1])
		nd.launch = func(x *stepState, nd *node) error {
			t, dim := in[0].rows(x), in[0].cols
			if a.HeadDim > 0 {
				// A norm of heads (Qwen3's q/k norms): each head's
				// elements are a row of the same data.
				t, dim = t*(dim/a.HeadDim), a.HeadDim
				return k.RMSNorm(s, out[0].p, in[0].p, in[1].p, in[1].dtype, t, dim, a.Eps)
			}
			if f := nd.fold; f != nil && f.decide(l, x) {
				l.b.stats.NormFolds++
				return nil
			}
			q, ok, err := l.fp8Output(x, nd, out[0], t)
			if err != nil {
				return err
			}
			if ok {
				return k.RMSNormE4M3(s, q, out[0].p, in[0].p, in[1].p, in[1].dtype, t, dim, a.Eps)
			}
			run := func() error { return k.RMSNorm(s, out[0].p, in[0].p, in[1].p, in[1].dtype, t, dim, a.Eps) }
			if k.NormRegisterPath(dim, out[0].p, in[0].p) {
				o := output{p: out[0].p, rows: t, cols: dim, ld: dim, dt: out[0].dtype}
				l.normPath(x, normKey{pow2(t), dim, in[1].dtype}, t, out[0].p, t*dim*out[0].dtype.Size(), o, run)
			}
			return run()
		}
	case ir.AddRMSNorm:
		nd.kernel = "add_rmsnorm" + ws(in[2])
		nd.scaled = func(x *stepState, nd *node, sc kernels.ProductScales) error {
			t := in[0].rows(x)
			// The scales are those of input scaledIn (the sum is the same
			// either way round).
			a0, a1 := in[0].p, in[1].p
			if nd.scaledIn == 1 {
				a0, a1 = a1, a0
			}
			q, ok, err := l.fp8Output(x, nd, out[1], t)
			if err != nil {
				return err
			}
			if ok {
				return k.AddRMSNormE4M3(s, out[0].p, out[1].p, q, a0, a1, sc, in[2].p, in[2].dtype, t, in[0].cols, a.Eps)
			}
			run := func() error {
				return k.AddRMSNorm(s, out[0].p, out[1].p, a0, a1, sc, in[2].p, in[2].dtype, t, in[0].cols, a.Eps)
			}
			if k.NormRegisterPath(in[0].cols, out[0].p, out[1].p, a0, a1, sc.Cols) {
				o := output{p: out[1].p, rows: t, cols: in[0].cols, ld: in[0].cols, dt: out[1].dtype}
				l.normPath(x, normKey{pow2(t), in[0].cols, in[2].dtype}, t, out[0].p, t*in[0].cols*out[0].dtype.Size(), o, run)
			}
			return run()
		}
	case ir.MatMul, ir.MatMulBias:
		w := in[1]
		if w.v.Def.Op != ir.Weight && w.v.Def.Op != ir.Const {
			return fmt.Errorf("cuda: matmul of two activations")
		}
		if w.dtype == cu.F8E4M3 {
			return l.chooseFP8(nd, s)
		}
		if w.dtype == devBlocks {
			return l.chooseBlocks(nd, s)
		}
		if w.dtype != l.act {
			return fmt.Errorf("cuda: matmul weight %q is %v on the device, compute dtype %v", w.v.Def.Attrs.Name, w.dtype, l.act)
		}
		var bias *operand
		epilogue := false // cuBLASLt adds the bias (of the output's dtype)
		if nd.n.Op == ir.MatMulBias {
			bias = &in[2]
			epilogue = bias.dtype == out[0].dtype
		}
		nd.kernel = fmt.Sprintf("cublasLt %v→%v (gemv when measured faster, T ≤ %d)", l.act, out[0].dtype, kernels.GEMVMaxT)
		if bias != nil {
			nd.kernel += " + bias"
		}
		nd.launch = func(x *stepState, nd *node) error {
			mm := cu.Matmul{T: in[0].rows(x), K: in[0].cols, N: out[0].cols, In: l.act, Out: out[0].dtype,
				X: in[0].p, W: w.p, Dst: out[0].p, Stream: s}
			f := nd.fold
			switch {
			case f == nil:
			case f.m == nd:
				f.on = false // until the plain product below decides
			case f.p == nd && f.on:
				mm.X = f.rows.p // the norm's rows, its gain in w
				f.normed = false
			}
			ep := l.epilogueOf(x, nd, mm.Out, bias != nil)
			way := l.productWay(x, mm, ep)
			gemv := way.gemv
			// A folded norm's 1/rms applied by the GEMV (its CUDA-core
			// or tile kernels), rather than by the reader after it.
			var normEps float32
			if f != nil && f.p == nd && f.on && gemv && l.gemv.Folds(mm.T, mm.K, mm.N) {
				normEps = f.eps
			}
			if gemv && ep != nil {
				err := l.gemvEpilogue(x, nd.epilogue, mm, normEps)
				if err == nil {
					if normEps > 0 { // f is p's chain
						f.normed = true
					}
					x.noteProduct(mm, "gemv")
					x.done = nd.epilogue
					l.b.stats.Epilogues++
					return nil
				}
				if !errors.Is(err, kernels.ErrGEMVShape) {
					return err
				}
				// A shape the epilogue does not take: the plain product,
				// then the reader's own kernel.
			}
			var err error
			switch {
			case way.ext != nil:
				x.noteProduct(mm, "external "+way.ext.Spec.Name)
				err = way.ext.Run(s, mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N)
			case gemv:
				fold := kernels.Fold{Eps: normEps}
				what := "gemv"
				if f != nil && f.m == nd && mm.Out == l.act && l.gemv.Folds(mm.T, mm.K, mm.N) && f.decide(l, x) {
					// The norm's residual added here, into its sum.
					fold.Add, mm.Dst = f.resid.p, f.rows.p
					what = "gemv + a folded norm's residual"
				}
				x.noteProduct(mm, what)
				err = l.gemv.RunFolded(s, mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, mm.Out == cu.F32, fold)
				if err == nil && normEps > 0 {
					f.normed = true
				}
			case epilogue:
				mm.Bias = bias.p
				mm.Algo = l.algorithm(x, mm)
				x.noteProduct(mm, "cuBLASLt + bias")
				return l.lt.Matmul(mm)
			default:
				mm.Algo = l.algorithm(x, mm)
				if f != nil && f.m == nd && f.decide(l, x) {
					// The norm's residual added here, into its sum; the
					// algorithm is the plain product's (raced without the
					// addend, which may be the output itself).
					mm.Accumulate, mm.Add, mm.Dst = true, f.resid.p, f.rows.p
					mm.Algo = l.algorithm(x, mm)
					x.noteProduct(mm, "cuBLASLt + a folded norm's residual")
					return l.lt.Matmul(mm)
				}
				x.noteProduct(mm, "cuBLASLt")
				err = l.lt.Matmul(mm)
			}
			if err != nil || bias == nil {
				return err
			}
			return k.AddBias(s, mm.Dst, mm.Dst, bias.p, bias.dtype, mm.T, mm.N)
		}
	case ir.Add:
		nd.kernel = "add"
		nd.launch = func(x *stepState, nd *node) error {
			return k.Add(s, out[0].p, in[0].p, in[1].p, in[0].rows(x)*in[0].cols)
		}
	case ir.Mul:
		nd.kernel = "mul"
		nd.launch = func(x *stepState, nd *node) error {
			return k.Mul(s, out[0].p, in[0].p, in[1].p, in[0].rows(x)*in[0].cols)
		}
	case ir.SiLU:
		nd.kernel = "silu"
		nd.launch = func(x *stepState, nd *node) error {
			return k.SiLU(s, out[0].p, in[0].p, in[0].rows(x)*in[0].cols)
		}
	case ir.MoE:
		m, err := l.moeOf(nd)
		if err != nil {
			return err
		}
		nd.kernel = fmt.Sprintf("moe (%d experts, %d a row)", m.E, m.K)
		nd.launch = func(x *stepState, nd *node) error {
			if l.b.poisonExpertScratch && l.moeScratchBytes > 0 {
				// NaN in every matrix of the scratch: what the step
				// does not widen must not be read (TestGGUFExperts).
				if err := l.dev.Memset8(l.moeScratch, 0xff, l.moeScratchBytes, s); err != nil {
					return err
				}
			}
			return k.MoE(s, m, in[0].rows(x), x.moe)
		}
	case ir.GELUTanh:
		nd.kernel = "gelu_tanh"
		nd.launch = func(x *stepState, nd *node) error {
			return k.GELUTanh(s, out[0].p, in[0].p, in[0].rows(x)*in[0].cols)
		}
	case ir.SoftCap:
		if in[0].dtype != cu.F32 || out[0].dtype != cu.F32 {
			return fmt.Errorf("cuda: soft cap of %v, want the f32 logits", in[0].dtype)
		}
		nd.kernel = "softcap"
		nd.launch = func(x *stepState, nd *node) error {
			return k.SoftCap(s, out[0].p, in[0].p, a.Cap, in[0].rows(x)*in[0].cols)
		}
	case ir.SwiGLU:
		nd.kernel = "swiglu"
		nd.launch = func(x *stepState, nd *node) error {
			return k.SwiGLU(s, out[0].p, in[0].p, in[1].p, in[0].rows(x)*in[0].cols)
		}
	case ir.SwiGLUPacked:
		nd.kernel = "swiglu_packed"
		nd.scaled = func(x *stepState, nd *node, sc kernels.ProductScales) error {
			t := in[0].rows(x)
			q, ok, err := l.fp8Output(x, nd, out[0], t)
			if err != nil {
				return err
			}
			if ok {
				return k.SwiGLUPackedE4M3(s, q, out[0].p, in[0].p, sc, t, out[0].cols)
			}
			return k.SwiGLUPacked(s, out[0].p, in[0].p, sc, t, out[0].cols)
		}
		nd.rms = func(x *stepState, nd *node, nx kernels.RowRMS) error {
			return k.SwiGLUPackedRMS(s, out[0].p, in[0].p, nx, in[0].rows(x), out[0].cols)
		}
	case ir.AddBias:
		nd.kernel = "add_bias" + ws(in[1])
		nd.launch = func(x *stepState, nd *node) error {
			return k.AddBias(s, out[0].p, in[0].p, in[1].p, in[1].dtype, in[0].rows(x), in[0].cols)
		}
	case ir.RoPE:
		if in[2].dtype != cu.F32 {
			return fmt.Errorf("cuda: rope table is %v", in[2].dtype)
		}
		nd.kernel = "rope"
		nd.launch = func(x *stepState, nd *node) error {
			return k.RoPE(s, out[0].p, in[0].p, in[1].ptr(x), in[2].p, in[0].rows(x), a.Heads, a.HeadDim, a.Interleaved)
		}
	case ir.KVWrite:
		nd.kernel = "kv_write"
		nd.launch = func(x *stepState, nd *node) error {
			return x.kv.kern.KVWrite(s, x.kv.k[a.Layer], x.kv.v[a.Layer], in[0].p, in[1].p, x.m.At(x.m.Slots), x.m.T, a.KVHeads*a.HeadDim)
		}
	case ir.RoPEKVWrite:
		if in[3].dtype != cu.F32 {
			return fmt.Errorf("cuda: rope table is %v", in[3].dtype)
		}
		nd.kernel = "rope_kv_write"
		nd.launch = func(x *stepState, nd *node) error {
			return x.kv.kern.RoPEKVWrite(s, x.kv.k[a.Layer], x.kv.v[a.Layer], in[0].p, in[1].p, in[2].ptr(x), x.m.At(x.m.Slots), in[3].p,
				x.m.T, a.KVHeads, a.HeadDim, a.Interleaved)
		}
	case ir.RoPEQKVWrite:
		if in[2].dtype != cu.F32 {
			return fmt.Errorf("cuda: rope table is %v", in[2].dtype)
		}
		if in[1].meta != 2 {
			// The GEMV's RoPE epilogue reads the positions before the PDL
			// wait: only the step's uploaded batch may be read so, never
			// an earlier kernel's output.
			return fmt.Errorf("cuda: rope_qkv_write's positions are not the step's uploaded positions")
		}
		nd.kernel = "rope_qkv_write"
		nd.scaled = func(x *stepState, nd *node, sc kernels.ProductScales) error {
			return x.kv.kern.RoPEQKVWrite(s, out[0].p, x.kv.k[a.Layer], x.kv.v[a.Layer], in[0].p, sc, in[1].ptr(x), x.m.At(x.m.Slots), in[2].p,
				x.m.T, a.Heads, a.KVHeads, a.HeadDim, a.Interleaved)
		}
		nd.rms = func(x *stepState, nd *node, nx kernels.RowRMS) error {
			return x.kv.kern.RoPEQKVWriteRMS(s, out[0].p, x.kv.k[a.Layer], x.kv.v[a.Layer], in[0].p, nx, in[1].ptr(x), x.m.At(x.m.Slots), in[2].p,
				x.m.T, a.Heads, a.KVHeads, a.HeadDim, a.Interleaved)
		}
	case ir.Attention:
		if err := checkHeadDim(a.HeadDim); err != nil {
			return err
		}
		prefill := "prefill_mma"
		if l.act == cu.F32 {
			prefill = "prefill_attn"
		}
		nd.kernel = fmt.Sprintf("decode_attn_%d | %s_%d", a.HeadDim, prefill, a.HeadDim)
		nd.launch = func(x *stepState, nd *node) error {
			at := l.attn(x, nd)
			if x.decode || x.mixed {
				// Planned by decodeWorkspace.
				if err := x.kv.kern.DecodeAttention(s, at, x.dm, nd.plan, x.ws, x.counters); err != nil || x.decode {
					return err
				}
			}
			return x.kv.kern.PrefillAttentionWith(s, at, x.pm, l.prefillVariant(x, nd, at))
		}
	case ir.SelectRows:
		nd.kernel = "select_rows"
		nd.launch = func(x *stepState, nd *node) error {
			return k.SelectRows(s, out[0].p, in[0].p, x.m.At(x.m.Rows), x.m.R, in[0].cols)
		}
	case ir.Split:
		nd.kernel = "split"
		outs := make([]cu.Ptr, len(out))
		for i := range out {
			outs[i] = out[i].p
		}
		nd.launch = func(x *stepState, nd *node) error {
			return k.Split(s, in[0].p, in[0].rows(x), outs, a.Sizes)
		}
	default:
		return fmt.Errorf("cuda: no kernel for %v", nd.n.Op)
	}
	if nd.scaled != nil {
		nd.launch = func(x *stepState, nd *node) error {
			if f := nd.fold; f != nil && f.on {
				switch nd {
				case f.n: // folded: no kernel
					l.b.stats.NormFolds++
					return nil
				case f.e:
					if !f.normed {
						return nd.rms(x, nd, f.rowRMS())
					}
				}
			}
			return nd.scaled(x, nd, kernels.ProductScales{})
		}
	}
	return nil
}

// epilogueOf is the reader of product nd (of dtype out, with a bias or
// not) that the GEMV would run in its epilogue: not with a bias or an f32
// product, nor RoPE into an FP8 cache (the epilogue writes the cache in
// the activation dtype). Nil: none.
func (l *loaded) epilogueOf(x *stepState, nd *node, out cu.DType, bias bool) *node {
	if nd.epilogue != nil && !bias && out == l.act && !(x.kv.spec.FP8 && nd.epilogue.n.Op == ir.RoPEQKVWrite) {
		return nd.epilogue
	}
	return nil
}

func checkHeadDim(hd int) error {
	for _, d := range kernels.HeadDims {
		if d == hd {
			return nil
		}
	}
	return fmt.Errorf("cuda: attention head dim %d has no kernel (built for %v)", hd, kernels.HeadDims)
}

// attn describes an attention node's call for the running step.
func (l *loaded) attn(x *stepState, nd *node) kernels.Attn {
	a := nd.n.Attrs
	return kernels.Attn{Out: nd.out[0].p, Q: nd.in[0].p, KCache: x.kv.k[a.Layer], VCache: x.kv.v[a.Layer],
		Heads: a.Heads, KVHeads: a.KVHeads, HeadDim: a.HeadDim, Window: a.Window, Scale: a.Scale, Cap: a.Cap, FP8: x.kv.spec.FP8,
		CacheSlots: x.kv.spec.Blocks * x.kv.spec.BlockSize}
}

// gemvEpilogue runs product mm on the GEMV with the op of node ep (its
// sole reader, compile.EpilogueReaders) in its epilogue, writing ep's
// outputs instead of the product. Shapes the epilogue does not take get an
// error wrapping kernels.ErrGEMVShape before anything is queued.
func (l *loaded) gemvEpilogue(x *stepState, ep *node, mm cu.Matmul, normEps float32) error {
	if mm.Out != l.act {
		return fmt.Errorf("%w: product of %v", kernels.ErrGEMVShape, mm.Out)
	}
	a := ep.n.Attrs
	switch ep.n.Op {
	case ir.SwiGLUPacked:
		if 2*ep.out[0].cols != mm.N {
			return fmt.Errorf("%w: swiglu of %d columns from %d", kernels.ErrGEMVShape, ep.out[0].cols, mm.N)
		}
		return l.gemv.RunSwiGLU(mm.Stream, ep.out[0].p, mm.X, mm.W, mm.T, mm.K, ep.out[0].cols, normEps)
	case ir.RoPEQKVWrite:
		if (a.Heads+2*a.KVHeads)*a.HeadDim != mm.N {
			return fmt.Errorf("%w: rope of %d columns from %d", kernels.ErrGEMVShape, (a.Heads+2*a.KVHeads)*a.HeadDim, mm.N)
		}
		r := kernels.RoPEQKV{Q: ep.out[0].p, KCache: x.kv.k[a.Layer], VCache: x.kv.v[a.Layer], Pos: ep.in[1].ptr(x),
			Slots: x.m.At(x.m.Slots), Table: ep.in[2].p, Heads: a.Heads, KVHeads: a.KVHeads, HeadDim: a.HeadDim, Interleaved: a.Interleaved,
			NormEps: normEps}
		return l.gemv.RunRoPEQKV(mm.Stream, r, mm.X, mm.W, mm.T, mm.K)
	}
	return fmt.Errorf("%w: no epilogue for %v", kernels.ErrGEMVShape, ep.n.Op)
}

// wayKey is the key of product mm's way (its reader ep run in the GEMV's
// epilogue or not), and whether its way is chosen at all: without the GEMV
// or past its rows, cuBLASLt runs it.
func (l *loaded) wayKey(mm cu.Matmul, ep *node) (mmKey, bool) {
	if l.gemv == nil || mm.T > kernels.GEMVMaxT {
		return mmKey{}, false
	}
	rows := mm.T
	if rows > kernels.GEMVVectorMaxT {
		rows = pow2(rows)
	}
	return mmKey{rows, mm.K, mm.N, mm.Out == cu.F32, ep != nil}, true
}

// mmKey identifies a product shape for the GEMV-or-cuBLASLt choice, and
// whether the GEMV would run its reader in the epilogue.
type mmKey struct {
	t, k, n  int
	outF32   bool
	epilogue bool
}

// productWay is how a product runs: on the GEMV, on an external kernel
// (kernels.External), or (neither) on cuBLASLt.
type productWay struct {
	gemv bool
	ext  *kernels.External
}

// productWay decides how product mm runs: for at most kernels.GEMVMaxT
// rows, the first time a shape (its exact rows up to
// kernels.GEMVVectorMaxT, beyond a power-of-two bucket of rows, as the
// tile kernels are built for) is seen, the tune cache's choice for it,
// else the choice of a race on the stream (raceGEMV: cuBLASLt the
// default, the GEMV or an external kernel kept only if it beats it as
// tune.Race requires). With ep, the product's reader that the GEMV runs in its
// epilogue (gemvEpilogue), the GEMV's time is that of the fused kernel
// and the others' that of the product followed by ep's own kernel: what
// each way costs the step. Inside a graph capture an unmeasured shape
// takes cuBLASLt (a capture cannot wait for timings; the warm-up step
// before it measures).
func (l *loaded) productWay(x *stepState, mm cu.Matmul, ep *node) productWay {
	key, chosen := l.wayKey(mm, ep)
	if !chosen {
		return productWay{}
	}
	rows := key.t
	if way, ok := l.gemvChoice[key]; ok {
		return way
	}
	if way, ok := l.forcedVectorWay(mm); ok {
		l.gemvChoice[key] = way
		return way
	}
	epi := ""
	if ep != nil {
		epi = ep.kernel
	}
	tk := gemvKey(l.act, key, epi)
	if l.b.Products == "" {
		if name, ok := l.cachedChoice(tk); ok {
			if way, valid := l.cachedWay(mm, rows, name); valid {
				l.noteCached(tk, name)
				l.gemvChoice[key] = way
				return way
			}
		}
	}
	if x.capturing || l.b.Products == "cublaslt" {
		return productWay{}
	}
	var way productWay
	fits := l.gemv.Check(mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, mm.Out == cu.F32) == nil
	switch {
	case fits && l.b.Products == "gemv":
		way.gemv = true
	case l.b.Tune == tune.Defaults && l.b.Products == "":
		// cuBLASLt: the race's default
	case fits || len(l.externalsFor(mm, rows)) > 0:
		way = l.raceGEMV(x, mm, rows, fits, ep, tk)
	}
	l.gemvChoice[key] = way
	return way
}

// forcedVectorWay makes product mm of at most kernels.GEMVVectorMaxT rows
// run the GEMV's way Backend.VectorWay, without a race or the tune cache,
// where that is set and the GEMV takes the product (ok false otherwise):
// to compare the ways inside a step, where a way's loads before its
// programmatic-launch wait count and the race's back-to-back timings do
// not show them.
func (l *loaded) forcedVectorWay(mm cu.Matmul) (productWay, bool) {
	if l.b.VectorWay == "" || mm.T > kernels.GEMVVectorMaxT ||
		l.gemv.Check(mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, mm.Out == cu.F32) != nil ||
		l.gemv.SetVectorWay(mm.T, mm.K, mm.N, l.b.VectorWay) != nil {
		return productWay{}, false
	}
	return productWay{gemv: true}, true
}

// externalsFor lists the external kernels that take product mm for up to
// rows rows.
func (l *loaded) externalsFor(mm cu.Matmul, rows int) []*kernels.External {
	var es []*kernels.External
	for _, e := range l.externals {
		if e.Spec.Takes(rows, mm.K, mm.N, mm.In, mm.Out) {
			es = append(es, e)
		}
	}
	return es
}

// cachedWay reads a cached choice for product mm (rows its bucket of
// rows) back, if it still holds: the GEMV takes the product (and the
// split of K is one the tile kernels offer for it), or the external
// kernel it names, unchanged, is loaded and takes it.
func (l *loaded) cachedWay(mm cu.Matmul, rows int, name string) (productWay, bool) {
	for _, e := range l.externalsFor(mm, rows) {
		if e.Spec.ChoiceName() == name {
			return productWay{ext: e}, true
		}
	}
	c, valid := parseGEMVChoice(name)
	if !valid || !l.gemvTakes(mm, c) {
		return productWay{}, false
	}
	if c.split > 0 {
		l.gemv.SetTileSplits(mm.T, mm.K, mm.N, c.split)
	}
	if ways := l.gemv.VectorWays(mm.T); c.use && len(ways) > 0 {
		// The default way too: another choice of the shape may have set one.
		l.gemv.SetVectorWay(mm.T, mm.K, mm.N, cmp.Or(c.way, ways[0]))
	}
	return productWay{gemv: c.use}, true
}

// gemvTakes reports whether a cached GEMV-or-cuBLASLt choice still holds
// for product mm: the GEMV takes the product, a split of K is one the
// tile kernels offer for it, and a way one the vector products take.
func (l *loaded) gemvTakes(mm cu.Matmul, c gemvChoice) bool {
	if !c.use {
		return true
	}
	if l.gemv.Check(mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, mm.Out == cu.F32) != nil {
		return false
	}
	if c.way != "" && !slices.Contains(l.gemv.VectorWays(mm.T), c.way) {
		return false
	}
	return c.split == 0 || slices.Contains(l.gemv.TileSplits(mm.T, mm.K, mm.N), c.split)
}

// algoKey identifies a cuBLASLt product for the choice of its algorithm:
// its shape, with the rows rounded up to a power of two.
type algoKey struct {
	rows, k, n int
	in, out    cu.DType
	bias       bool
	ldd        int // the output's row length (cu.Matmul.LDD)
}

// algorithm picks cuBLASLt's algorithm for product mm: the first time a
// shape and bucket of rows are seen (and the tune cache has no choice for
// it), the candidates (cu.BlasLt.Algorithms: the heuristic's within the
// whole workspace, and under kiln tune those within smaller workspaces)
// race on the step's operands (writing the product's own output before
// the product runs) against the heuristic's first choice, which is kept
// unless one beats it as tune.Race requires (race); each is first checked
// against the first choice (verifyProduct). The choice is kept by its
// configuration, found again among each product's candidates (algoIndex).
// Rows up to kernels.GEMVVectorMaxT, captures (which cannot wait for
// timings), a fixed Backend.Products and tune.Defaults take the first
// choice.
func (l *loaded) algorithm(x *stepState, mm cu.Matmul) int {
	if mm.T <= kernels.GEMVVectorMaxT || l.b.Products != "" || l.b.Tune == tune.Defaults {
		return 0
	}
	key := algoKey{pow2(mm.T), mm.K, mm.N, mm.In, mm.Out, mm.Bias != 0, mm.LDD}
	if name, ok := l.algoChoice[key]; ok {
		return l.algoIndex(mm, name)
	}
	tk := algoTuneKey(key)
	if name, ok := l.cachedChoice(tk); ok {
		// The choice names the algorithm by its configuration: its place
		// in the heuristic's list moves with the rows and the operands'
		// alignment.
		if a, err := l.lt.Find(mm, name); err == nil && a >= 0 {
			l.noteCached(tk, name)
			l.algoChoice[key] = name
			return a
		}
	}
	if x.capturing {
		return 0
	}
	best := 0
	if n, err := l.lt.Algorithms(mm); err == nil && n > 1 {
		if l.b.Tune != tune.Full {
			// At first use the heuristic's own candidates (its first 8,
			// within the whole workspace); kiln tune (tune.Full) searches
			// the smaller workspaces' too, which doubles a race's time.
			n = min(n, firstUseAlgorithms)
		}
		cands := make([]candidate, n)
		for i := range n {
			m := mm
			m.Algo = i
			name := strconv.Itoa(i)
			if c, err := l.lt.Config(m, i); err == nil && c.SplitK > 1 {
				name += fmt.Sprintf(" (K in %d)", c.SplitK)
			}
			cands[i] = candidate{name: name, id: algoName(l.lt, mm, i), run: func() error { return l.lt.Matmul(m) }}
		}
		l.forTrials(tk, cands)
		l.verifyProduct(mm, cands)
		r := l.race(cands)
		if r.Best >= 0 {
			best = r.Best
		}
		kept := fmt.Sprint(best)
		if c, err := l.lt.Config(mm, best); err == nil {
			kept += fmt.Sprintf(" (%v)", c)
		}
		l.b.raced(fmt.Sprintf("T=%d (rows ≤ %d) K=%d N=%d: cuBLASLt algorithms%s: %s kept", mm.T, key.rows, mm.K, mm.N, r.line(cands), kept))
		if name := algoName(l.lt, mm, best); r.Best >= 0 && name != "" {
			l.keep(tk, name, algoName(l.lt, mm, 0), r, cands)
		}
	}
	l.algoChoice[key] = algoName(l.lt, mm, best)
	return best
}

// firstUseAlgorithms bounds the cuBLASLt candidates a race at first use
// times (cu.BlasLt.Algorithms lists the heuristic's first 8 first).
const firstUseAlgorithms = 8

// algoIndex is the index among product mm's candidates of the algorithm
// configured as name (the choice made for its shape and bucket of rows,
// maybe at other rows or alignments, where the heuristic lists other
// candidates), or the heuristic's first when mm's list lacks it.
func (l *loaded) algoIndex(mm cu.Matmul, name string) int {
	if name == "" {
		return 0
	}
	if a, err := l.lt.Find(mm, name); err == nil && a >= 0 {
		return a
	}
	return 0
}

// algoName names candidate a of product mm for the tune cache: its
// configuration (cu.AlgoConfig.Key), "" when cuBLASLt cannot say.
func algoName(lt *cu.BlasLt, mm cu.Matmul, a int) string {
	c, err := lt.Config(mm, a)
	if err != nil {
		return ""
	}
	return c.Key()
}

// prefillKey identifies a prefill attention call for the choice of its
// build: the shape and the step's tokens (rounded up to a power of two).
type prefillKey struct {
	heads, kvHeads, headDim, window int
	t                               int
	fp8                             bool
}

// prefillVariant picks the build of prefill attention at for step x
// among kernels.PrefillVariants: the first time a shape and bucket of
// tokens are seen (and the tune cache has no choice for it) the builds
// race on the step's operands against the first (race), each first
// checked against it on random queries (verifyAttention); inside a capture,
// or with one build, the first.
func (l *loaded) prefillVariant(x *stepState, nd *node, at kernels.Attn) string {
	a := nd.n.Attrs
	key := prefillKey{a.Heads, a.KVHeads, a.HeadDim, a.Window, pow2(x.m.T), at.FP8}
	if v, ok := l.prefillChoice[key]; ok {
		return v
	}
	vs := x.kv.kern.PrefillVariants(at)
	if len(vs) == 1 || x.capturing || l.b.Products != "" || l.b.Tune == tune.Defaults {
		return vs[0]
	}
	tk := tune.Key{Family: "prefill attention", DType: l.act.String(),
		Shape: fmt.Sprintf("T≤%d heads %d/%d ×%d window %d fp8 cache %v", key.t, key.heads, key.kvHeads, key.headDim, key.window, key.fp8)}
	if name, ok := l.cachedChoice(tk); ok && slices.Contains(vs, name) {
		l.noteCached(tk, name)
		l.prefillChoice[key] = name
		return name
	}
	cands := make([]candidate, len(vs))
	for i, v := range vs {
		cands[i] = candidate{name: v, run: func() error { return x.kv.kern.PrefillAttentionWith(l.stream, at, x.pm, v) }}
	}
	l.forTrials(tk, cands)
	l.verifyAttention(at, x.m.T, nd.in[0].dtype, cands)
	r := l.race(cands)
	best := 0
	if r.Best > 0 {
		best = r.Best
	}
	l.b.raced(fmt.Sprintf("prefill attention T=%d (≤ %d) %d/%d heads ×%d:%s: %s kept", x.m.T, key.t, a.Heads, a.KVHeads, a.HeadDim, r.line(cands), vs[best]))
	if r.Best >= 0 {
		l.keep(tk, vs[best], vs[0], r, cands)
	}
	l.prefillChoice[key] = vs[best]
	return vs[best]
}

// decodeKey identifies a decode attention call for the choice of its split.
type decodeKey struct {
	heads, kvHeads, headDim, window int
	t, ctx                          int // tokens (rounded up to a power of two), context bucket
	fp8                             bool
}

// decodePlan picks attention node nd's split for step x among
// kernels.DecodePlans: the first time a shape and context bucket are seen
// (and the tune cache has no choice for it) the candidates race on the
// step's batch against the first (race; decodeWorkspace runs before the
// step's kernels, so what the runs write is overwritten), each first
// checked against it (verifyAttention); a cluster plan whose launch is
// refused, or a plan whose result is wrong, is passed over.
func (l *loaded) decodePlan(x *stepState, nd *node) (kernels.DecodePlan, error) {
	a := nd.n.Attrs
	key := decodeKey{a.Heads, a.KVHeads, a.HeadDim, a.Window, pow2(x.planMeta.T), x.planMeta.MaxPos + 1, x.kv.spec.FP8}
	if p, ok := l.decodeChoice[key]; ok {
		return p.ForBatch(l.attn(x, nd), x.planMeta), nil
	}
	at := l.attn(x, nd)
	cands := kernels.DecodePlans(at, x.planMeta, l.dev.SMs, l.dev.Clusters(), l.k.Act)
	if len(cands) == 0 {
		return kernels.DecodePlan{}, fmt.Errorf("cuda: no decode attention plan for %d/%d heads of %d (FP8 cache %v)", a.Heads, a.KVHeads, a.HeadDim, at.FP8)
	}
	best := cands[0]
	tk := decodeTuneKey(l.k.Act, key)
	if !l.b.FixedDecodePlan && l.b.Tune != tune.Defaults && len(cands) > 1 {
		if name, ok := l.cachedChoice(tk); ok {
			if p, ok := cachedPlan(cands, name); ok {
				l.noteCached(tk, name)
				l.decodeChoice[key] = p
				return p.ForBatch(at, x.planMeta), nil
			}
		}
		cs := make([]candidate, len(cands))
		for i, p := range cands {
			cs[i] = candidate{name: p.String(), run: func() error { return x.kv.kern.DecodeAttention(l.stream, at, x.dm, p, x.ws, x.counters) }}
		}
		l.forTrials(tk, cs)
		l.verifyAttention(at, x.dm.T, nd.in[0].dtype, cs)
		r := l.race(cs)
		for i, err := range r.Errs {
			// A cluster the device cannot place (a launch error, not a
			// fault) is no candidate, nor is a plan verify rejected; any
			// other failure is the step's.
			if err != nil && !cands[i].Cluster && !isRejection(err) {
				return cands[i], err
			}
		}
		if r.Best < 0 {
			return cands[0], r.Errs[0]
		}
		best = cands[r.Best]
		line := fmt.Sprintf("decode attention T=%d ctx≤%d %d/%d heads ×%d%s:", key.t, key.ctx, a.Heads, a.KVHeads, a.HeadDim, map[bool]string{true: " (FP8 cache)"}[at.FP8])
		l.b.raced(fmt.Sprintf("%s%s: %v kept", line, r.line(cs), best))
		l.keep(tk, planName(best), planName(cands[0]), r, cs)
	}
	l.decodeChoice[key] = best
	return best, nil
}

// timeOn is the stream time of 5 runs of f after one warm-up, in ms.
func (l *loaded) timeOn(f func() error) (float32, error) {
	if err := l.timer(); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := l.events[2].Record(l.stream); err != nil {
		return 0, err
	}
	for i := 0; i < 5; i++ {
		if err := f(); err != nil {
			return 0, err
		}
	}
	if err := l.events[3].Record(l.stream); err != nil {
		return 0, err
	}
	if err := l.events[3].Sync(); err != nil {
		return 0, err
	}
	return cu.Elapsed(l.events[2], l.events[3])
}
