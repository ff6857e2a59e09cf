package compile

// Memory planning gives every activation value of the compiled graph an
// offset in one arena, for one bucket's concrete sizes. Values are live from
// the node that produces them to the last node that reads them (graph outputs
// to the end, a product's inputs through the op its epilogue may compute:
// EpilogueReaders); walking the nodes in order, a node's outputs are allocated
// before the inputs it reads for the last time are freed, so a kernel never
// writes over its own inputs. Allocation is best fit over a free list of
// coalesced intervals, growing the arena only when nothing fits.

import (
	"fmt"
	"sort"

	"kiln/ir"
)

// Align is the byte alignment of every buffer in the arena.
const Align = 64

// Buffer is one value's place in the arena.
type Buffer struct{ Offset, Bytes int }

// Plan is a compiled graph with its memory plan for one bucket.
type Plan struct {
	Graph    *ir.Graph
	Bucket   Bucket
	Bindings ir.Bindings
	Buffers  map[*ir.Value]Buffer
	// ArenaBytes is the peak activation memory: the arena's size.
	ArenaBytes int
	// UnsharedBytes is what the activations would take without reuse.
	UnsharedBytes int
}

// elemBytes is the size of one element of an activation.
func elemBytes(v *ir.Value) int {
	n, err := v.DType.Bytes(1)
	if err != nil {
		return 4
	}
	return int(n)
}

// needsBuffer reports whether v lives in the arena (weights and constants
// live in the model; states carry no data).
func needsBuffer(v *ir.Value) bool {
	return !ir.IsState(v) && v.Def.Op != ir.Weight && v.Def.Op != ir.Const
}

func planMemory(g *ir.Graph, b Bucket) (*Plan, error) {
	if b.Tokens <= 0 || b.Rows <= 0 || b.Rows > b.Tokens {
		return nil, fmt.Errorf("plan: bad bucket %+v", b)
	}
	bind := ir.Bindings{Tokens: b.Tokens, Rows: b.Rows}
	last := map[*ir.Value]int{}
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			last[in] = i
		}
	}
	for _, o := range g.Outputs {
		last[o] = len(g.Nodes)
	}
	// A product's inputs stay live through the op its epilogue may compute
	// (EpilogueReaders), and through the norm whose residual add it may
	// compute (ResidualReaders).
	index := map[*ir.Node]int{}
	for i, n := range g.Nodes {
		index[n] = i
	}
	for _, readers := range liveThrough(g) {
		for prod, reader := range readers {
			for _, in := range prod.Inputs {
				last[in] = max(last[in], index[reader])
			}
		}
	}
	p := &Plan{Graph: g, Bucket: b, Bindings: bind, Buffers: map[*ir.Value]Buffer{}}
	var free freeList
	for i, n := range g.Nodes {
		for _, out := range n.Outputs {
			if !needsBuffer(out) {
				continue
			}
			size := roundUp(out.Shape.Elements(bind)*elemBytes(out), Align)
			off := free.take(size, &p.ArenaBytes)
			p.Buffers[out] = Buffer{Offset: off, Bytes: size}
			p.UnsharedBytes += size
		}
		release := func(v *ir.Value) {
			if buf, ok := p.Buffers[v]; ok {
				free.give(buf.Offset, buf.Bytes)
			}
		}
		for _, out := range n.Outputs {
			if _, used := last[out]; !used {
				release(out) // never read: its space is free after the node
			}
		}
		seen := map[*ir.Value]bool{}
		for _, in := range n.Inputs {
			if last[in] == i && !seen[in] {
				seen[in] = true
				release(in)
			}
		}
	}
	return p, nil
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// freeList holds free intervals of the arena, sorted and coalesced.
type freeList []Buffer

// take returns the offset of size bytes, best fit, growing the arena (whose
// current size is *end) when nothing fits.
func (f *freeList) take(size int, end *int) int {
	best := -1
	for i, b := range *f {
		if b.Bytes >= size && (best < 0 || b.Bytes < (*f)[best].Bytes) {
			best = i
		}
	}
	if best >= 0 {
		b := (*f)[best]
		if b.Bytes == size {
			*f = append((*f)[:best], (*f)[best+1:]...)
		} else {
			(*f)[best] = Buffer{Offset: b.Offset + size, Bytes: b.Bytes - size}
		}
		return b.Offset
	}
	// Extend a free tail interval if there is one.
	if n := len(*f); n > 0 && (*f)[n-1].Offset+(*f)[n-1].Bytes == *end {
		off := (*f)[n-1].Offset
		*f = (*f)[:n-1]
		*end = off + size
		return off
	}
	off := *end
	*end += size
	return off
}

func (f *freeList) give(off, size int) {
	*f = append(*f, Buffer{Offset: off, Bytes: size})
	sort.Slice(*f, func(i, j int) bool { return (*f)[i].Offset < (*f)[j].Offset })
	merged := (*f)[:1]
	for _, b := range (*f)[1:] {
		lastB := &merged[len(merged)-1]
		if lastB.Offset+lastB.Bytes == b.Offset {
			lastB.Bytes += b.Bytes
		} else {
			merged = append(merged, b)
		}
	}
	*f = merged
}
