package cuda

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"kiln/backend"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/compile"
	"kiln/ir"
)

// Step memory. Steps run one at a time on the model's stream, so every
// executable shares one activation arena (sized for the largest plan) and
// one decode attention workspace (split counters, then partial results),
// and the device sampler's scratch serves every step. ReserveSteps sizes
// all three for every step the engine can form before the engine sizes the
// KV cache from the memory left (as vLLM profiles its largest step), so
// that serving never allocates device memory for a step: a per-bucket
// arena allocated on first use once failed a step with the KV cache
// already holding 0.9 of the memory (issue 15). Without a reservation
// (tests, direct users) each grows on first need.

// ReserveSteps implements backend.StepReserver: the activation arena for
// the largest of plans, the quantized products' scratch for it, the decode attention workspace for decode steps of
// up to maxSeqs sequences (decodeStep's: up to decodeMaxRun tokens each)
// at contexts up to context, and the sampler's scratch for maxSeqs rows.
func (l *loaded) ReserveSteps(plans []*compile.Plan, maxSeqs, context int) error {
	if len(plans) == 0 || maxSeqs <= 0 || context <= 0 {
		return fmt.Errorf("cuda: reserve for %d plans, %d sequences, context %d", len(plans), maxSeqs, context)
	}
	arena, maxT := 0, 0
	for _, p := range plans {
		arena = max(arena, arenaBytes(p))
		maxT = max(maxT, p.Bucket.Tokens)
	}
	if err := l.growArena(arena); err != nil {
		return err
	}
	qs, dq := 0, 0
	for _, p := range plans {
		q, d := l.quantNeeds(p)
		qs, dq = max(qs, q), max(dq, d)
	}
	if err := l.growQuant(qs, dq); err != nil {
		return err
	}
	counters, partials := l.decodeNeeds(plans, maxSeqs, context)
	if err := l.growWorkspace(counters, partials); err != nil {
		return err
	}
	vocab := plans[0].Graph.Outputs[0].Shape.Last()
	if l.b.HostSampling {
		return nil
	}
	s, err := l.sampler()
	if err != nil {
		return err
	}
	// Penalties' history: at most every token of every row's context.
	return oom(s.Reserve(min(maxSeqs, maxT), vocab, maxSeqs*context))
}

// decodeNeeds is the decode workspace for the steps plans can run: split
// counters for the largest bucket's tokens, and the partials of the plan
// among kernels.DecodePlans that needs most, over the decode batches of up
// to maxSeqs sequences (up to decodeMaxRun tokens each: decodeStep) and the
// context bucket of context; each distinct attention shape and token count
// is planned once.
func (l *loaded) decodeNeeds(plans []*compile.Plan, maxSeqs, context int) (counters, partials int) {
	maxT := 0
	sizes := map[int]bool{}
	for _, p := range plans {
		maxT = max(maxT, p.Bucket.Tokens)
		if p.Bucket.Tokens <= decodeMaxRun*maxSeqs {
			sizes[p.Bucket.Tokens] = true
		}
	}
	kvHeads := 0
	shapes := map[kernels.Attn]bool{}
	for _, n := range plans[0].Graph.Nodes {
		if n.Op != ir.Attention {
			continue
		}
		a := n.Attrs
		kvHeads = max(kvHeads, a.KVHeads)
		shapes[kernels.Attn{Heads: a.Heads, KVHeads: a.KVHeads, HeadDim: a.HeadDim, Window: a.Window, Scale: a.Scale, Cap: a.Cap}] = true
	}
	for at := range shapes {
		// A plan is chosen once per power-of-two bucket of tokens (at the
		// first batch seen in it) and kept for the bucket: the fewer the
		// tokens, the more splits PlanDecode takes, so the plans offered at
		// the bucket's smallest batch, run on its largest, need most.
		for t := range sizes {
			full := kernels.Meta{T: t, MaxPos: contextBucket(context-1) - 1}
			for _, t0 := range []int{t/2 + 1, t} {
				m := full
				m.T = t0
				for _, c := range kernels.DecodePlans(at, &m, l.dev.SMs, l.dev.Clusters(), l.k.Act) {
					partials = max(partials, c.ForBatch(at, &full).WorkspaceBytes)
				}
			}
		}
	}
	return kernels.DecodeCounterBytes(maxT, kvHeads), partials
}

// pow2 rounds n (≥ 1) up to a power of two: the buckets of rows and
// tokens that a product's algorithm and decode attention's plan are chosen
// for.
func pow2(n int) int { return 1 << bits.Len(uint(n-1)) }

// contextBucket is the context a decode step whose largest position is
// maxPos is planned (and its graph captured) for: maxPos+1 rounded up to a
// power of two, at least 64.
func contextBucket(maxPos int) int { return max(64, pow2(maxPos+1)) }

// gatherOffset is where a plan's all-gather scratch starts in the arena:
// after its activations, 256-byte aligned.
func gatherOffset(p *compile.Plan) int { return (p.ArenaBytes + 255) &^ 255 }

// gatherBytes is the scratch a tensor-parallel plan's all-gather of its
// logits needs (the ranks' rows one rank after another, before they are
// laid out by rows); 0 for any other plan.
func gatherBytes(p *compile.Plan) int {
	chain, err := logitsChain(p.Graph)
	if err != nil {
		return 0 // Executable refuses the plan
	}
	for _, v := range chain {
		if v.Def.Op == ir.AllGather {
			return 4 * p.Bucket.Rows * v.Shape.Last()
		}
	}
	return 0
}

// logitsChain is what a graph's logits come from, in f32 each: the LM
// head's product, then a tensor-parallel rank's all-gather of it and the
// soft cap (Gemma 2), when the graph has them; the logits last.
func logitsChain(g *ir.Graph) ([]*ir.Value, error) {
	v := g.Outputs[0]
	chain := []*ir.Value{v}
	if v.Def.Op == ir.SoftCap {
		v = v.Def.Inputs[0]
		chain = append(chain, v)
	}
	if v.Def.Op == ir.AllGather {
		v = v.Def.Inputs[0]
		chain = append(chain, v)
	}
	if v.Def.Op != ir.MatMul && v.Def.Op != ir.MatMulBias {
		return nil, fmt.Errorf("cuda: the logits come from %v, want a matmul", v.Def.Op)
	}
	slices.Reverse(chain)
	return chain, nil
}

// arenaBytes is the arena a plan needs: its activations, its gather
// scratch and its MoE layers' scratch.
func arenaBytes(p *compile.Plan) int { return moeOffset(p) + moeBytes(p) }

// moeOffset is where a plan's MoE scratch starts in the arena: after its
// gather scratch, 256-byte aligned.
func moeOffset(p *compile.Plan) int {
	end := p.ArenaBytes
	if g := gatherBytes(p); g > 0 {
		end = gatherOffset(p) + g
	}
	return (end + 255) &^ 255
}

// moeBytes is the scratch of a plan's largest MoE layer (they run one
// after another) for the bucket's tokens, sized for f32 activations.
func moeBytes(p *compile.Plan) int {
	n := 0
	for _, nd := range p.Graph.Nodes {
		if nd.Op == ir.MoE {
			n = max(n, moeShape(nd).ScratchBytes(p.Bucket.Tokens, cu.F32))
		}
	}
	return n
}

// growArena makes the shared activation arena at least n bytes. Executables
// built earlier keep the arena they were bound to (it stays allocated).
func (l *loaded) growArena(n int) error {
	if n <= l.arenaCap {
		return nil
	}
	if l.arena != 0 && len(l.execs) == 0 {
		if err := l.free(l.arena); err != nil {
			return err
		}
	}
	l.arena, l.arenaCap = 0, 0
	p, err := l.alloc(n)
	if err != nil {
		return fmt.Errorf("cuda: activation arena of %d bytes: %w", n, err)
	}
	l.arena, l.arenaCap = p, n
	return nil
}

// growWorkspace makes the shared decode workspace hold at least counters
// bytes of split counters and partials bytes of partial results after them.
// Growing it drops every executable's captured graphs (they bake in its
// address) and zeroes it (a launch leaves its counters at zero).
func (l *loaded) growWorkspace(counters, partials int) error {
	counters = (max(counters, l.wsCounters) + 255) &^ 255
	if counters == l.wsCounters && counters+partials <= l.wsCap {
		return nil
	}
	if err := l.stream.Sync(); err != nil {
		return err
	}
	l.b.stats.WorkspaceGrowths++
	for _, e := range l.execs {
		e.dropGraphs()
	}
	size := counters + max(partials, l.wsCap-l.wsCounters)
	if l.ws != 0 {
		if err := l.free(l.ws); err != nil {
			return err
		}
		l.ws, l.wsCap, l.wsCounters = 0, 0, 0
	}
	p, err := l.alloc(size)
	if err != nil {
		return fmt.Errorf("cuda: decode attention workspace of %d bytes: %w", size, err)
	}
	if err := l.dev.Memset8(p, 0, size, l.stream); err != nil {
		return err
	}
	l.ws, l.wsCap, l.wsCounters = p, size, counters
	return nil
}

// oom marks an error that a failed device allocation caused with
// backend.ErrOutOfMemory, so that the scheduler can retry the step smaller
// or preempt instead of failing its requests.
func oom(err error) error {
	if err == nil || errors.Is(err, backend.ErrOutOfMemory) {
		return err
	}
	var ce *cu.Error
	if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" {
		return fmt.Errorf("%w: %w", backend.ErrOutOfMemory, err)
	}
	return err
}
