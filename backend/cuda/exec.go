package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"kiln/backend"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
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
	ws     cu.Ptr
}

type node struct {
	n       *ir.Node
	kernel  string
	in, out []operand
	launch  func(x *stepState, nd *node) error
}

type executable struct {
	l      *loaded
	plan   *compile.Plan
	arena  cu.Ptr
	nodes  []node
	output operand
	vocab  int // rows of the embedding table: token ids must be below it

	// Per-step buffers, grown on demand: the packed batch (pinned and on the
	// device), the decode-attention workspace, the logits' pinned copy.
	metaHost *cu.HostBuf
	metaDev  cu.Ptr
	metaCap  int
	ws       cu.Ptr
	wsCap    int
	outHost  *cu.HostBuf
}

func (l *loaded) Executable(p *compile.Plan) (backend.Executable, error) {
	if len(p.Graph.Outputs) != 1 {
		return nil, fmt.Errorf("cuda: graph has %d outputs, want the logits", len(p.Graph.Outputs))
	}
	logits := p.Graph.Outputs[0]
	if logits.Def.Op != ir.MatMul {
		return nil, fmt.Errorf("cuda: the logits come from %v, want a matmul", logits.Def.Op)
	}
	arena, err := l.alloc(p.ArenaBytes)
	if err != nil {
		return nil, fmt.Errorf("cuda: activation arena of %d bytes: %w", p.ArenaBytes, err)
	}
	e := &executable{l: l, plan: p, arena: arena, vocab: math.MaxInt32}
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
			o.p, o.dtype, o.vocab = w.p, w.dtype, w.rows
			return o, nil
		}
		buf, ok := p.Buffers[v]
		if !ok {
			return o, fmt.Errorf("cuda: %v has no buffer in the plan", v)
		}
		o.p = arena.Add(buf.Offset)
		if v == logits {
			o.dtype = cu.F32
		}
		return o, nil
	}
	for _, n := range p.Graph.Nodes {
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
		if err := l.choose(&nd); err != nil {
			return nil, err
		}
		if n.Op == ir.Embed {
			e.vocab = nd.in[0].vocab
		}
		e.nodes = append(e.nodes, nd)
	}
	out, err := bind(logits)
	if err != nil {
		return nil, err
	}
	e.output = out
	return e, nil
}

func (e *executable) Kernels() []string {
	names := make([]string, len(e.nodes))
	for i, nd := range e.nodes {
		names[i] = nd.kernel
	}
	return names
}

// Run implements backend.Executable. The whole step is queued from the
// device's worker thread, and waits only for the logits.
func (e *executable) Run(b *backend.Batch, kv backend.KVCache, logits []float32) error {
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
	vocab := e.output.cols
	if len(logits) < r*vocab {
		return fmt.Errorf("cuda: logits buffer of %d for %d rows of %d", len(logits), r, vocab)
	}
	d := e.l.dev
	return d.Do(func() error {
		x := &stepState{kv: cache, decode: t <= 2*len(b.Seqs)}
		if err := e.upload(m, x); err != nil {
			return err
		}
		if x.decode {
			if err := e.decodeWorkspace(x); err != nil {
				return err
			}
		}
		for i := range e.nodes {
			nd := &e.nodes[i]
			if err := nd.launch(x, nd); err != nil {
				return fmt.Errorf("cuda: node %d (%v, %s): %w", nd.n.ID, nd.n.Op, nd.kernel, err)
			}
		}
		n := 4 * r * vocab
		if err := e.grow(&e.outHost, n); err != nil {
			return err
		}
		if err := d.CopyDtoHAsync(e.outHost, 0, e.output.p, n, e.l.stream); err != nil {
			return err
		}
		if err := e.l.stream.Sync(); err != nil {
			return err
		}
		copy(logits[:r*vocab], unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(e.outHost.Bytes()))), r*vocab))
		return nil
	})
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
		p, err := e.l.alloc(2 * n)
		if err != nil {
			return err
		}
		e.metaDev, e.metaCap = p, 2*n
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

// decodeWorkspace sizes the flash-decoding workspace for the step's largest
// attention layer.
func (e *executable) decodeWorkspace(x *stepState) error {
	need := 0
	for i := range e.nodes {
		if nd := &e.nodes[i]; nd.n.Op == ir.Attention {
			p := kernels.PlanDecode(e.l.attn(x, nd), x.m.Meta, e.l.dev.SMs)
			need = max(need, p.WorkspaceBytes)
		}
	}
	if need > e.wsCap {
		if err := e.l.stream.Sync(); err != nil {
			return err
		}
		p, err := e.l.alloc(2 * need)
		if err != nil {
			return err
		}
		e.ws, e.wsCap = p, 2*need
	}
	x.ws = e.ws
	return nil
}
