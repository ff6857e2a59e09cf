package tokenizer

// BPE merging, shared by every vocabulary kind. A word starts as a list of
// symbols (one per byte, per character, or per llama2.c code point group);
// the engine then repeatedly merges the adjacent pair with the lowest rank,
// the leftmost one on ties, until no mergeable pair is left. Ranks come from
// the merges list (Hugging Face, GGUF "gpt2") or from the scores of the merged
// token (llama2.c, GGUF "llama": a higher score is a lower rank, equal scores
// share a rank), which makes the two algorithms the same loop.
//
// The loop keeps the symbols in a doubly linked list over a slice and the
// candidate pairs in a binary min-heap keyed by (rank, position); entries
// made stale by an earlier merge are recognized and skipped when popped, so a
// word of n symbols costs O(n log n).

import "sync"

// mergeInfo says what an adjacent pair of ids merges into and how early.
type mergeInfo struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type symbol struct {
	id         int32
	prev, next int32
}

type heapItem struct {
	rank, pos, id int32
}

func (a heapItem) less(b heapItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// workspace holds the per-call buffers; pooled so that encoding does not
// allocate in the inner loop.
type workspace struct {
	syms  []symbol
	heap  []heapItem
	spans [][2]int
	tmp   [][2]int
	buf   []byte
}

var wsPool = sync.Pool{New: func() any { return new(workspace) }}

func (w *workspace) push(it heapItem) {
	h := append(w.heap, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	w.heap = h
}

func (w *workspace) pop() heapItem {
	h := w.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	w.heap = h
	return top
}

// mergeSymbols runs BPE over w.syms (linked in order) and appends the
// resulting ids to out.
func mergeSymbols(merges map[uint64]mergeInfo, w *workspace, out []int) []int {
	syms := w.syms
	n := len(syms)
	if n == 0 {
		return out
	}
	for i := range syms {
		syms[i].prev = int32(i - 1)
		syms[i].next = int32(i + 1)
	}
	syms[n-1].next = -1
	w.heap = w.heap[:0]
	if n > 1 {
		for i := 0; i+1 < n; i++ {
			if m, ok := merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
				w.heap = append(w.heap, heapItem{m.rank, int32(i), m.id})
			}
		}
		// heapify
		h := w.heap
		for i := len(h)/2 - 1; i >= 0; i-- {
			j := i
			for {
				l := 2*j + 1
				if l >= len(h) {
					break
				}
				m := l
				if r := l + 1; r < len(h) && h[r].less(h[l]) {
					m = r
				}
				if !h[m].less(h[j]) {
					break
				}
				h[j], h[m] = h[m], h[j]
				j = m
			}
		}
		for len(w.heap) > 0 {
			top := w.pop()
			s := &syms[top.pos]
			if s.id < 0 || s.next < 0 {
				continue
			}
			right := &syms[s.next]
			m, ok := merges[pairKey(s.id, right.id)]
			if !ok || m.id != top.id {
				continue // stale
			}
			s.id = top.id
			right.id = -1
			s.next = right.next
			if s.next >= 0 {
				syms[s.next].prev = top.pos
			}
			if s.prev >= 0 {
				if m, ok := merges[pairKey(syms[s.prev].id, s.id)]; ok {
					w.push(heapItem{m.rank, s.prev, m.id})
				}
			}
			if s.next >= 0 {
				if m, ok := merges[pairKey(s.id, syms[s.next].id)]; ok {
					w.push(heapItem{m.rank, top.pos, m.id})
				}
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, int(syms[i].id))
	}
	return out
}
