package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"kiln/backend"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
	"kiln/tensor"
)

// operand is an input or output of a node, bound to its device memory: a
// weight, a buffer of the arena, or a field of the step's packed batch.
type operand struct {
	v     *ir.Value
	p     cu.Ptr // weights and arena buffers
	meta  int    // 1: the batch's token ids, 2: its positions (set per step)
	dtype cu.DType
	vocab int // rows of a weight (embedding tables)
	cols  int
	// An E4M3 weight's scales (deviceTensor).
	scales    cu.Ptr
	perTensor bool
	blocks    tensor.DType // a weight in GGUF blocks (dtype devBlocks)
}

func (o *operand) ptr(x *stepState) cu.Ptr {
	switch o.meta {
	case 1:
		return x.m.At(x.m.Tokens)
	case 2:
		return x.m.At(x.m.Positions)
	}
	return o.p
}

// rows is the operand's first dimension in the running step.
func (o *operand) rows(x *stepState) int {
	switch o.v.Shape[0] {
	case ir.TokenDim:
		return x.m.T
	case ir.RowDim:
		return x.m.R
	}
	return int(o.v.Shape[0])
}

// stepState is what a running step's launches read.
type stepState struct {
	m      kernels.DevMeta
	kv     *kvCache
	decode bool // attention through the flash-decoding kernel
	// mixed: a step of decoding sequences (the batch's first dm.T tokens)
	// and prompt chunks: decode attention takes the first (dm), prefill
	// attention the others' tiles (pm). Otherwise both are m.
	mixed  bool
	dm, pm kernels.DevMeta
	// planMeta is the batch as the decode attention is planned for: its
	// largest position rounded up to a power of two, so that a captured
	// graph serves every step up to that context (splits past a sequence's
	// end exit at once).
	planMeta  *kernels.Meta
	ws        cu.Ptr // decode attention's partial results
	counters  cu.Ptr // and its split counters
	capturing bool   // the launches are being captured into a graph
	// done is a node whose outputs the product before it wrote in its
	// epilogue: not launched.
	done *node
	// fp8In is the activation whose FP8 form the node before the FP8
	// product reading it wrote into the FP8 scratch (fp8Output).
	fp8In cu.Ptr
	// prof names the kernels the events of a profiled step end
	// (Backend.Profile; nil: not profiled); ran is what the last product
	// ran on.
	prof []string
	ran  string
	// gather is the arena's scratch of a tensor-parallel all-gather of
	// several rows (gatherBytes); moe the MoE layers' (moeBytes).
	gather, moe cu.Ptr
	// sampling: the step's ids are chosen on the device (RunSample), so
	// its logits need not reach every rank whole (node.scatterRows).
	sampling bool
}

// unlessFused marks the kernel of a node a GEMV may compute in its
// epilogue.
const unlessFused = " (unless in the gemv's epilogue)"

// noteProduct names the kernel that ran product mm, for a profiled step.
func (x *stepState) noteProduct(mm cu.Matmul, kernel string) {
	if x.prof != nil {
		x.ran = fmt.Sprintf("product %d×%d×%d %s", mm.T, mm.K, mm.N, kernel)
	}
}

// scatters reports whether the node (an all-gather of the logits) sends a
// sampled step's rows of rows to the ranks that sample them (PeerScatterRows)
// rather than gathering them: the one decision of both the node's launch
// and RunSample, which reads the rows where the scatter left them.
func (nd *node) scatters(p *kernels.PeerGroup, rows int) bool {
	return nd.scatterRows && p.PeerScatterFits(nd.in[0].p, rows, nd.in[0].cols)
}

// graphKey identifies the steps one captured graph can replay: the same
// composition (so the same packed offsets, grids and product shapes), the
// same context bucket and the same cache.
type graphKey struct {
	t, s, r, tiles, ctx int
	kv                  *kvCache
	copyLogits          bool // ends with the logits' copy to the host
	sampling            bool // its ids chosen on the device (stepState.sampling)
}

// graphState is a decode composition's graph: seen once (run directly, as a
// warm-up), then captured; failed: capture is not attempted again.
type graphState struct {
	g      *cu.Graph
	failed error
}

type node struct {
	n       *ir.Node
	kernel  string
	in, out []operand
	plan    kernels.DecodePlan // attention: this step's flash-decoding split
	launch  func(x *stepState, nd *node) error
	// scaled (the readers of products that can take an FP8 product's
	// scales: SwiGLU, RoPE with the cache writes, the residual add and
	// norm) launches the node on a product whose scales are still to be
	// applied, its input scaledIn; launch is scaled with none. Like
	// launch it is given the node it runs (the executable's copy, which
	// markFP8Fusions marks, not the one choose bound).
	scaled   func(x *stepState, nd *node, sc kernels.ProductScales) error
	scaledIn int
	// scaledReader (FP8 products): the next node, the product's sole
	// reader, which takes its scales (markFP8Fusions).
	scaledReader *node
	// fp8Out: the node's output is read only by the next node, a product
	// of E4M3 weights (markFP8Fusions), for which it may write it in FP8
	// form (fp8Output).
	fp8Out bool
	// epilogue (products): the next node, which takes this product apart
	// and which the GEMV computes in its epilogue when it runs the product
	// (compile.EpilogueReaders).
	epilogue *node
	// scatterRows (the all-gather of a tensor-parallel rank's logits, the
	// step's output, on a group with peer memory): in sampled steps each
	// rank gets only the rows it samples, whole (kernels.PeerScatterRows),
	// instead of every row.
	scatterRows bool
	// peerNorm (all-reduces): the AddRMSNorm after it, which its kernel
	// runs where it takes the step (markPeerNorms, runPeerNorm; nil:
	// none).
	peerNorm *peerNorm
	// fold: the chain of a norm folded into the product after it that
	// the node is part of (markNormFolds; nil: none).
	fold *normFold
	// rms (SwiGLUPacked, RoPEQKVWrite) launches the node on a product whose
	// rows are still to be divided by rms(nx) (a folded norm's).
	rms func(x *stepState, nd *node, nx kernels.RowRMS) error
}

type executable struct {
	l      *loaded
	plan   *compile.Plan
	arena  cu.Ptr
	nodes  []node
	output operand
	vocab  int // rows of the embedding table: token ids must be below it
	// scatter is the node that exchanges the logits by rows in sampled
	// steps (node.scatterRows; nil: none).
	scatter *node

	// Per-step buffers: the packed batch (pinned and on the device), grown
	// on demand (dropping the graphs), and the logits' pinned copy. The
	// arena and the decode attention workspace are the model's (stepmem.go).
	metaHost *cu.HostBuf
	metaDev  cu.Ptr
	metaCap  int
	outHost  *cu.HostBuf

	graphs    map[graphKey]*graphState
	attention []int // indices of the attention nodes
	// RunSample's converted parameters, reused.
	sp      []kernels.SampleParams
	hist    [][]kernels.HistoryEntry
	entries []kernels.HistoryEntry
}

func (l *loaded) Executable(p *compile.Plan) (backend.Executable, error) {
	if len(p.Graph.Outputs) != 1 {
		return nil, fmt.Errorf("cuda: graph has %d outputs, want the logits", len(p.Graph.Outputs))
	}
	logits := p.Graph.Outputs[0]
	chain, err := logitsChain(p.Graph)
	if err != nil {
		return nil, err
	}
	if err := l.growArena(arenaBytes(p)); err != nil {
		return nil, err
	}
	if err := l.growQuant(l.quantNeeds(p)); err != nil {
		return nil, err
	}
	arena := l.arena
	e := &executable{l: l, plan: p, arena: arena, vocab: math.MaxInt32, graphs: map[graphKey]*graphState{}}
	bind := func(v *ir.Value) (operand, error) {
		o := operand{v: v, dtype: l.act, cols: v.Shape.Last()}
		if ir.IsState(v) {
			return o, nil
		}
		switch v.Def.Op {
		case ir.Tokens:
			o.meta = 1
			return o, nil
		case ir.Positions:
			o.meta = 2
			return o, nil
		case ir.Weight, ir.Const:
			w, ok := l.weights[v.Def]
			if !ok {
				return o, fmt.Errorf("cuda: weight %q was not uploaded", v.Def.Attrs.Name)
			}
			o.p, o.dtype, o.vocab, o.scales, o.perTensor, o.blocks = w.p, w.dtype, w.rows, w.scales, w.perTensor, w.blocks
			return o, nil
		}
		buf, ok := p.Buffers[v]
		if !ok {
			return o, fmt.Errorf("cuda: %v has no buffer in the plan", v)
		}
		o.p = arena.Add(buf.Offset)
		if slices.Contains(chain, v) {
			o.dtype = cu.F32
		}
		return o, nil
	}
	nodes, err := bindNodes(p.Graph, bind)
	if err != nil {
		return nil, err
	}
	for _, nd := range nodes {
		if err := l.choose(&nd); err != nil {
			return nil, err
		}
		if nd.n.Op == ir.Embed {
			e.vocab = nd.in[0].vocab * max(1, nd.n.Attrs.Ranks)
		}
		if nd.n.Op == ir.Attention {
			e.attention = append(e.attention, len(e.nodes))
		}
		e.nodes = append(e.nodes, nd)
	}
	markFP8Fusions(e.nodes, p.Graph)
	if err := l.markNormFolds(e.nodes, p); err != nil {
		return nil, err
	}
	l.markPeerNorms(e.nodes, p)
	epilogues := compile.EpilogueReaders(p.Graph)
	for i := 0; i+1 < len(e.nodes); i++ {
		if nd, next := &e.nodes[i], &e.nodes[i+1]; epilogues[nd.n] == next.n && l.gemv != nil && !l.b.NoEpilogues {
			nd.epilogue = next
			nd.kernel += fmt.Sprintf(" (gemv: + %s in its epilogue)", next.kernel)
			next.kernel += unlessFused
		}
	}
	out, err := bind(logits)
	if err != nil {
		return nil, err
	}
	e.output = out
	if last := &e.nodes[len(e.nodes)-1]; l.b.Peers != nil && last.n.Op == ir.AllGather && last.out[0].p == out.p && last.in[0].dtype == cu.F32 {
		last.scatterRows = true
		last.kernel += " (sampled steps: peer scatter by rows)"
		e.scatter = last
	}
	// The logits' pinned copy is sized for the bucket once: captured graphs
	// write to it.
	if e.outHost, err = l.dev.AllocHost(4 * p.Bucket.Rows * out.cols); err != nil {
		return nil, err
	}
	l.hosts = append(l.hosts, e.outHost)
	l.execs = append(l.execs, e)
	if l.b.HostSampling {
		return runOnly{e}, nil
	}
	return e, nil
}

// bindNodes makes the nodes of g that launch kernels (not weights,
// constants or the step's inputs), their operands bound by bind.
func bindNodes(g *ir.Graph, bind func(*ir.Value) (operand, error)) ([]node, error) {
	var nodes []node
	for _, n := range g.Nodes {
		switch n.Op {
		case ir.Weight, ir.Const, ir.Tokens, ir.Positions:
			continue
		}
		nd := node{n: n}
		for _, v := range n.Inputs {
			o, err := bind(v)
			if err != nil {
				return nil, err
			}
			nd.in = append(nd.in, o)
		}
		for _, v := range n.Outputs {
			o, err := bind(v)
			if err != nil {
				return nil, err
			}
			nd.out = append(nd.out, o)
		}
		nodes = append(nodes, nd)
	}
	return nodes, nil
}

// runOnly hides RunSample.
type runOnly struct{ backend.Executable }

func (e *executable) Kernels() []string {
	names := make([]string, len(e.nodes))
	for i, nd := range e.nodes {
		names[i] = nd.kernel
	}
	return names
}

// Run implements backend.Executable. The whole step is queued from the
// device's worker thread, and waits only for the logits. Nil logits (a
// tensor-parallel rank other than the one whose logits the group returns)
// run the step without copying them.
func (e *executable) Run(b *backend.Batch, kv backend.KVCache, logits []float32) error {
	if logits == nil {
		return e.step(b, kv, nil, nil)
	}
	vocab := e.output.cols
	if len(logits) < len(b.Rows)*vocab {
		return fmt.Errorf("cuda: logits buffer of %d for %d rows of %d", len(logits), len(b.Rows), vocab)
	}
	return e.step(b, kv, nil, func() error {
		n := len(b.Rows) * vocab
		copy(logits[:n], unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(e.outHost.Bytes()))), n))
		return nil
	})
}

// RunSample implements backend.SamplingExecutable: the step's logits stay on
// the device, where each row's token is chosen; only the ids come back. A
// rank of a tensor-parallel group writes the ids of the rows it samples:
// with peer memory, its share of them (kernels.PeerRowShare), the step's
// scatter having brought it those rows whole; without, rank 0 samples
// every row and the other ranks none (backend.Group's contract).
func (e *executable) RunSample(b *backend.Batch, kv backend.KVCache, params []backend.SampleParams, ids []int32) error {
	r := len(b.Rows)
	if len(params) != r || len(ids) < r {
		return fmt.Errorf("cuda: %d rows with %d sampling parameters and %d ids", r, len(params), len(ids))
	}
	return e.step(b, kv, func() error {
		s, err := e.l.sampler()
		if err != nil {
			return err
		}
		e.sp, e.hist, e.entries = e.sp[:0], e.hist[:0], e.entries[:0]
		for _, p := range params {
			e.sp = append(e.sp, kernels.SampleParams{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
				RepetitionPenalty: p.RepetitionPenalty, FrequencyPenalty: p.FrequencyPenalty, PresencePenalty: p.PresencePenalty, U: p.U})
			for _, h := range p.History {
				e.entries = append(e.entries, kernels.HistoryEntry{ID: h.ID, Count: h.Count, Seen: h.Seen, Banned: h.Banned})
			}
		}
		at := 0
		for _, p := range params {
			e.hist = append(e.hist, e.entries[at:at+len(p.History)])
			at += len(p.History)
		}
		lo, hi, logits := 0, r, e.output.p
		if p := e.l.b.Peers; e.scatter != nil && e.scatter.scatters(p, r) {
			// The step's scatter left this rank's rows in its staging.
			lo, hi = kernels.PeerRowShare(r, p.Rank, len(p.Regions))
			logits = p.PeerStaging()
			e.l.b.stats.SampledShares++
		} else if c := e.l.b.Comm; c != nil && c.Rank > 0 {
			return nil // rank 0 samples every row for the group
		}
		if hi == lo {
			return nil
		}
		out, err := s.SampleIDs(e.l.stream, logits, hi-lo, e.output.cols, e.sp[lo:hi], e.hist[lo:hi], ids[lo:lo])
		if err == nil && len(out) != hi-lo {
			err = fmt.Errorf("cuda: sampler returned %d ids for %d rows", len(out), hi-lo)
		}
		return err
	}, nil)
}

// step runs one step: the nodes (a captured graph for decode), then either
// sample (the logits stay on the device) or the copy of the logits to the
// pinned buffer and done once the stream has finished.
func (e *executable) step(b *backend.Batch, kv backend.KVCache, sample, done func() error) error {
	cache, ok := kv.(*kvCache)
	if !ok || cache.l != e.l {
		return fmt.Errorf("cuda: kv cache %T does not belong to this model", kv)
	}
	t, r := len(b.Tokens), len(b.Rows)
	if t > e.plan.Bucket.Tokens || r > e.plan.Bucket.Rows {
		return fmt.Errorf("cuda: step of %d tokens, %d rows exceeds bucket %+v", t, r, e.plan.Bucket)
	}
	m, err := kernels.Pack(b, cache.spec) // validates the batch
	if err != nil {
		return err
	}
	for _, id := range b.Tokens {
		if id < 0 || int(id) >= e.vocab {
			return fmt.Errorf("cuda: token id %d out of range [0,%d)", id, e.vocab)
		}
	}
	d := e.l.dev
	err = d.Do(func() error {
		x := &stepState{kv: cache, decode: decodeStep(b), gather: e.arena.Add(gatherOffset(e.plan)),
			moe: e.arena.Add(moeOffset(e.plan)), sampling: sample != nil}
		if e.l.b.Profile {
			x.prof = []string{}
		}
		timing := e.l.b.Timing
		if timing {
			if err := e.l.timer(); err != nil {
				return err
			}
			if err := e.l.events[0].Record(e.l.stream); err != nil {
				return err
			}
		}
		if err := e.upload(m, x); err != nil {
			return err
		}
		key := graphKey{copyLogits: done != nil, sampling: x.sampling}
		x.dm, x.pm = x.m, x.m
		if !x.decode {
			if d := m.DecodePrefix(); d > 0 && d < m.T {
				dec, pre := m.SplitDecode(d)
				x.mixed, x.dm, x.pm = true, kernels.DevMeta{Meta: dec, Base: x.m.Base}, kernels.DevMeta{Meta: pre, Base: x.m.Base}
			}
		}
		if x.decode || x.mixed {
			pm := *x.dm.Meta
			pm.MaxPos = contextBucket(pm.MaxPos) - 1
			x.planMeta = &pm
			if err := e.decodeWorkspace(x); err != nil {
				return err
			}
		}
		if x.decode {
			key = graphKey{t: m.T, s: m.S, r: m.R, tiles: m.Tiles, ctx: x.planMeta.MaxPos + 1, kv: cache, copyLogits: key.copyLogits, sampling: x.sampling}
		}
		if err := e.launch(x, key, 4*r*e.output.cols); err != nil {
			return err
		}
		if sample != nil {
			if err := sample(); err != nil {
				return err
			}
			if x.prof != nil {
				x.prof = append(x.prof, "sampler")
				if err := e.l.profEvents[len(x.prof)].Record(e.l.stream); err != nil {
					return err
				}
			}
		}
		if timing {
			if err := e.l.events[1].Record(e.l.stream); err != nil {
				return err
			}
		}
		if err := e.l.stream.Sync(); err != nil {
			return err
		}
		if x.prof != nil {
			if err := e.l.addProfile(x.prof); err != nil {
				return err
			}
		}
		if timing {
			ms, err := cu.Elapsed(e.l.events[0], e.l.events[1])
			if err != nil {
				return err
			}
			e.l.b.stats.DeviceTime += time.Duration(float64(ms) * 1e6)
		}
		if done != nil {
			return done()
		}
		return nil
	})
	if err = oom(err); errors.Is(err, backend.ErrOutOfMemory) {
		// Give back what captured graphs hold, so that a retry (smaller,
		// or after a preemption) may fit; they are captured again.
		if serr := e.l.stream.Sync(); serr == nil {
			for _, x := range e.l.execs {
				x.dropGraphs()
			}
		}
	}
	return err
}

// launch queues the step: its nodes and the copy of the logits (n bytes) to
// the pinned buffer. A decode step replays its composition's graph, capturing
// it the second time the composition is seen; prefill steps and
// compositions whose capture failed launch node by node.
func (e *executable) launch(x *stepState, key graphKey, n int) error {
	direct := func() error {
		for i := range e.nodes {
			nd := &e.nodes[i]
			if nd == x.done {
				continue
			}
			if err := nd.launch(x, nd); err != nil {
				return fmt.Errorf("cuda: node %d (%v, %s): %w", nd.n.ID, nd.n.Op, nd.kernel, err)
			}
		}
		if !key.copyLogits {
			return nil
		}
		return e.l.dev.CopyDtoHAsync(e.outHost, 0, e.output.p, n, e.l.stream)
	}
	stats := &e.l.b.stats
	e.l.b.graphWork[0].Add(1)
	if x.prof != nil {
		if !key.copyLogits {
			n = 0
		}
		return e.profiled(x, n)
	}
	if !x.decode || e.l.b.NoGraphs {
		return direct()
	}
	st := e.graphs[key]
	switch {
	case st == nil:
		e.graphs[key] = &graphState{}
		return direct()
	case st.failed != nil:
		return direct()
	case st.g == nil:
		if err := e.l.stream.BeginCapture(); err != nil {
			st.failed = err
			stats.GraphFailures++
			stats.LastFailure = err
			return direct()
		}
		x.capturing = true
		err := direct()
		x.capturing = false
		g, cerr := e.l.stream.EndCapture()
		if err != nil || cerr != nil {
			// Nothing ran: run the step directly, and never capture this
			// composition again.
			st.failed = errors.Join(err, cerr)
			stats.GraphFailures++
			stats.LastFailure = st.failed
			return direct()
		}
		st.g = g
		e.l.b.graphWork[1].Add(1)
	}
	e.l.b.graphWork[2].Add(1)
	return st.g.Launch(e.l.stream)
}

// dropGraphs forgets every captured graph (a buffer they bake in moved).
func (e *executable) dropGraphs() {
	for k, st := range e.graphs {
		if st.g != nil {
			st.g.Close()
		}
		delete(e.graphs, k)
	}
}

// grow makes *h a pinned buffer of at least n bytes.
func (e *executable) grow(h **cu.HostBuf, n int) error {
	if *h != nil && len((*h).Bytes()) >= n {
		return nil
	}
	if *h != nil {
		if err := e.l.stream.Sync(); err != nil {
			return err
		}
		(*h).Free()
		*h = nil
	}
	nb, err := e.l.dev.AllocHost(max(n, 4096) * 2)
	if err != nil {
		return err
	}
	*h = nb
	e.l.hosts = append(e.l.hosts, nb)
	return nil
}

// upload copies the packed batch to the device.
func (e *executable) upload(m *kernels.Meta, x *stepState) error {
	n := m.Bytes()
	if n > e.metaCap {
		if err := e.l.stream.Sync(); err != nil {
			return err
		}
		// Room for a batch of the bucket's tokens, one sequence each, with
		// block tables covering the whole cache.
		bk := e.plan.Bucket
		want := max(2*n, 4*(8*bk.Tokens+bk.Rows+x.kv.spec.Blocks))
		if e.metaDev != 0 {
			if err := e.l.free(e.metaDev); err != nil {
				return err
			}
			e.metaDev, e.metaCap = 0, 0
		}
		p, err := e.l.alloc(want)
		if err != nil {
			return err
		}
		e.metaDev, e.metaCap = p, want
		e.dropGraphs()
	}
	if err := e.grow(&e.metaHost, n); err != nil {
		return err
	}
	copy(e.metaHost.Bytes(), cu.AsBytes(m.Data))
	if err := e.l.dev.CopyHtoDAsync(e.metaDev, e.metaHost, 0, n, e.l.stream); err != nil {
		return err
	}
	x.m = kernels.DevMeta{Meta: m, Base: e.metaDev}
	return nil
}

// decodeWorkspace plans each attention layer's flash-decoding split for the
// step (consecutive layers of the same shape share one) and sizes the
// workspace for the plans it may choose from: PlanDecode's has the most
// splits.
func (e *executable) decodeWorkspace(x *stepState) error {
	need, kvHeads := 0, 0
	var last *node
	for _, i := range e.attention {
		nd := &e.nodes[i]
		if !sameAttn(nd, last) {
			// PlanDecode's plan needs the most of the candidates
			// (kernels.DecodePlans; TestPlanDecode checks it).
			need = max(need, kernels.PlanDecode(e.l.attn(x, nd), x.planMeta, e.l.dev.SMs).WorkspaceBytes)
			kvHeads = max(kvHeads, nd.n.Attrs.KVHeads)
		}
		last = nd
	}
	// Shared by every executable (zeroed when allocated: the kernel leaves
	// its split counters at zero); without ReserveSteps it grows here.
	l := e.l
	if err := l.growWorkspace(kernels.DecodeCounterBytes(e.plan.Bucket.Tokens, kvHeads), need); err != nil {
		return err
	}
	x.counters, x.ws = l.ws, l.ws.Add(l.wsCounters)
	last = nil
	kept := 0 // the workspace of the plans kept
	for _, i := range e.attention {
		nd := &e.nodes[i]
		if sameAttn(nd, last) {
			nd.plan = last.plan
		} else {
			plan, err := e.l.decodePlan(x, nd)
			if err != nil {
				return err
			}
			nd.plan = plan
			kept = max(kept, plan.WorkspaceBytes)
		}
		last = nd
	}
	// A plan kept for the bucket of tokens since a smaller batch may take
	// more splits than any offered for this one.
	if kept > need {
		if err := l.growWorkspace(0, kept); err != nil {
			return err
		}
		x.counters, x.ws = l.ws, l.ws.Add(l.wsCounters)
	}
	return nil
}

// sameAttn reports whether attention nodes a and b (nil: none) have the
// same shape, and so the same decode plan.
func sameAttn(a, b *node) bool {
	if a == nil || b == nil {
		return false
	}
	x, y := a.n.Attrs, b.n.Attrs
	return x.Window == y.Window && x.Heads == y.Heads && x.KVHeads == y.KVHeads && x.HeadDim == y.HeadDim
}

// decodeMaxRun is the most tokens a sequence may bring to a decode step
// beyond decodeStep's average of two: a speculative step's last token and
// drafts (engine's verifying steps, k+1 ≤ 9).
const decodeMaxRun = 16

// decodeStep reports whether the step of batch b (validated) runs as a
// decode step (decode attention, each token over its own context; captured
// graphs): no sequence with more than decodeMaxRun tokens in the step.
// Other steps take prefill attention, kernel by kernel: a mixed step's
// decoding sequences at the batch's front take decode attention, its
// prompt chunks prefill attention (kernels.Meta.SplitDecode: a chunk's
// tokens under decode attention, each its own query row, cost more;
// docs/PERF.md, issue 15, session 38). ReserveSteps
// reserves the decode workspace of every bucket of up to decodeMaxRun
// tokens a sequence accordingly.
func decodeStep(b *backend.Batch) bool {
	if len(b.Tokens) > decodeMaxRun*len(b.Seqs) {
		return false
	}
	counts := make([]int, len(b.Seqs))
	for _, s := range b.SeqIndex {
		if counts[s]++; counts[s] > decodeMaxRun {
			return false
		}
	}
	return true
}
