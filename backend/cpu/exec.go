package cpu

import (
	"fmt"
	"math"
	"unsafe"

	"kiln/backend"
	"kiln/backend/cpu/gemm"
	"kiln/compile"
	"kiln/ir"
	"kiln/tensor"
)

// operand is one input or output of a step, bound to its storage.
type operand struct {
	v    *ir.Value
	f    []float32      // float32 activations (arena), or a decoded 1-D weight
	i    []int32        // int32 activations (arena)
	t    *tensor.Tensor // weights and constants
	w    gemm.Weights   // matrices, for matmul
	cols int            // innermost dimension
}

// rows returns the number of rows of a 2-D operand in the running step.
func (o *operand) rows(x *execState) int {
	switch o.v.Shape[0] {
	case ir.TokenDim:
		return x.tokens
	case ir.RowDim:
		return len(x.batch.Rows)
	}
	return int(o.v.Shape[0])
}

type step struct {
	node    *ir.Node
	kernel  kernel
	in, out []operand
	task    any // a kernel's preallocated parallel task
}

type execState struct {
	batch  *backend.Batch
	kv     *kvCache
	tokens int
	l      *loaded
	err    error // the step's first failed collective
}

// comm is the rank's side of its tensor-parallel group.
func (x *execState) comm() Comm { return x.l.backend.Comm }

// fail keeps a kernel's error (a collective's) for Run to return.
func (x *execState) fail(err error) {
	if err != nil && x.err == nil {
		x.err = err
	}
}

type executable struct {
	l      *loaded
	plan   *compile.Plan
	arena  []float32
	steps  []step
	output operand
	state  execState
	vocab  int // rows of the embedding table: token ids must be below it
}

func (l *loaded) Executable(p *compile.Plan) (backend.Executable, error) {
	e := &executable{l: l, plan: p, arena: make([]float32, p.ArenaBytes/4+1)}
	bind := func(v *ir.Value) (operand, error) {
		o := operand{v: v, cols: v.Shape.Last()}
		if ir.IsState(v) {
			return o, nil
		}
		switch v.Def.Op {
		case ir.Weight, ir.Const:
			t := v.Def.Attrs.Tensor
			o.t = t
			switch len(t.Shape) {
			case 1:
				f, ok := l.vectors[v.Def]
				if !ok {
					var err error
					if f, err = t.F32s(); err != nil {
						return o, err
					}
					l.vectors[v.Def] = f
				}
				o.f = f
			case 2:
				w, ok := l.matrices[v.Def]
				if !ok {
					var err error
					if w, err = l.matrix(t); err != nil {
						return o, err
					}
					l.matrices[v.Def] = w
				}
				o.w = w
			}
			return o, nil
		}
		buf, ok := p.Buffers[v]
		if !ok {
			return o, fmt.Errorf("cpu: %v has no buffer in the plan", v)
		}
		n := v.Shape.Elements(p.Bindings)
		off := buf.Offset / 4
		switch v.DType {
		case tensor.F32:
			o.f = e.arena[off : off+n : off+n]
		case tensor.I32:
			f := e.arena[off : off+n : off+n]
			o.i = unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(f))), n)
		default:
			return o, fmt.Errorf("cpu: activation %v of dtype %v", v, v.DType)
		}
		return o, nil
	}
	for _, n := range p.Graph.Nodes {
		if n.Op == ir.Weight || n.Op == ir.Const {
			continue
		}
		k, ok := choose(n.Op, l.backend.Reference)
		if !ok {
			return nil, fmt.Errorf("cpu: no kernel for %v", n.Op)
		}
		s := step{node: n, kernel: k}
		for _, v := range n.Inputs {
			o, err := bind(v)
			if err != nil {
				return nil, err
			}
			s.in = append(s.in, o)
		}
		for _, v := range n.Outputs {
			o, err := bind(v)
			if err != nil {
				return nil, err
			}
			s.out = append(s.out, o)
		}
		e.steps = append(e.steps, s)
	}
	for i := range e.steps {
		if prep := e.steps[i].kernel.prepare; prep != nil {
			prep(l, &e.steps[i])
		}
	}
	if len(p.Graph.Outputs) != 1 {
		return nil, fmt.Errorf("cpu: graph has %d outputs, want the logits", len(p.Graph.Outputs))
	}
	out, err := bind(p.Graph.Outputs[0])
	if err != nil {
		return nil, err
	}
	e.output = out
	e.vocab = math.MaxInt32
	for _, s := range e.steps {
		if s.node.Op == ir.Embed {
			e.vocab = s.in[0].t.Shape[0] * max(1, s.node.Attrs.Ranks)
		}
	}
	return e, nil
}

func (e *executable) Kernels() []string {
	names := make([]string, len(e.steps))
	for i, s := range e.steps {
		names[i] = s.kernel.name
	}
	return names
}

func (e *executable) Run(b *backend.Batch, kv backend.KVCache, logits []float32) error {
	cache, ok := kv.(*kvCache)
	if !ok {
		return fmt.Errorf("cpu: kv cache %T is not a CPU cache", kv)
	}
	t, r := len(b.Tokens), len(b.Rows)
	if t > e.plan.Bucket.Tokens || r > e.plan.Bucket.Rows {
		return fmt.Errorf("cpu: step of %d tokens, %d rows exceeds bucket %+v", t, r, e.plan.Bucket)
	}
	if err := b.Validate(cache.spec); err != nil {
		return err
	}
	vocab := e.output.cols
	if logits != nil && len(logits) < r*vocab {
		return fmt.Errorf("cpu: logits buffer of %d for %d rows of %d", len(logits), r, vocab)
	}
	for _, id := range b.Tokens {
		if id < 0 || int(id) >= e.vocab {
			return fmt.Errorf("cpu: token id %d out of range [0,%d)", id, e.vocab)
		}
	}
	e.state = execState{batch: b, kv: cache, tokens: t, l: e.l}
	for i := range e.steps {
		s := &e.steps[i]
		s.kernel.run(&e.state, s)
		if e.state.err != nil {
			return e.state.err
		}
	}
	copy(logits, e.output.f[:r*vocab])
	return nil
}
