package engine

import (
	"container/list"
	"hash/maphash"
	"slices"
)

// blockPool hands out the KV cache's blocks. With prefix caching, a full
// block is also indexed by the hash of its tokens and of everything before
// them, so that a later sequence starting with the same tokens can share it
// instead of recomputing it. A block is shared by reference count; when the
// last sequence lets go of an indexed block, it stays cached (least recently
// released first to go) until a block is needed and none is free.
type blockPool struct {
	free   []int32 // blocks holding nothing reusable
	refs   []int32 // sequences using each block
	prefix bool    // index full blocks for reuse

	// The index: block → its key, key → block, and the unreferenced
	// indexed blocks in release order.
	keys   []blockKey
	byKey  map[uint64]int32
	unused *list.List // of int32
	elem   []*list.Element
}

// blockKey identifies a full block's contents: its chain hash, its parent's,
// and its tokens (compared on lookup, so a hash collision cannot share a
// wrong block).
type blockKey struct {
	hash, parent uint64
	tokens       []int32
}

var blockSeed = maphash.MakeSeed()

// chainHash is the hash of a block's tokens following the block of hash
// parent (0 for the first block).
func chainHash(parent uint64, tokens []int) uint64 {
	var h maphash.Hash
	h.SetSeed(blockSeed)
	var b [8]byte
	put := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	put(parent)
	for _, t := range tokens {
		put(uint64(t))
	}
	return h.Sum64() | 1 // never 0, which means "not indexed"
}

func newBlockPool(n int, prefix bool) *blockPool {
	p := &blockPool{refs: make([]int32, n), prefix: prefix, keys: make([]blockKey, n), byKey: map[uint64]int32{},
		unused: list.New(), elem: make([]*list.Element, n)}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
	}
	return p
}

// available is the number of blocks that take can hand out.
func (p *blockPool) available() int { return len(p.free) + p.unused.Len() }

// take hands out a block: a free one, else the least recently released
// cached one (its index entry dropped).
func (p *blockPool) take() (int32, bool) {
	var b int32
	switch {
	case len(p.free) > 0:
		b = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	case p.unused.Len() > 0:
		b = p.unused.Remove(p.unused.Front()).(int32)
		p.elem[b] = nil
		delete(p.byKey, p.keys[b].hash)
		p.keys[b] = blockKey{}
	default:
		return 0, false
	}
	p.refs[b] = 1
	return b, true
}

// share takes one more reference to b, which is in use.
func (p *blockPool) share(b int32) { p.refs[b]++ }

// shared reports whether more than one sequence holds b.
func (p *blockPool) shared(b int32) bool { return p.refs[b] > 1 }

// release lets go of one reference to b.
func (p *blockPool) release(b int32) {
	p.refs[b]--
	if p.refs[b] > 0 {
		return
	}
	if p.keys[b].hash != 0 {
		p.elem[b] = p.unused.PushBack(b)
		return
	}
	p.free = append(p.free, b)
}

// index records that block b holds tokens after the block of hash parent,
// and returns b's hash. A block whose contents are already indexed elsewhere
// is not indexed twice.
func (p *blockPool) index(b int32, parent uint64, tokens []int) uint64 {
	h := chainHash(parent, tokens)
	if !p.prefix || p.keys[b].hash != 0 {
		return h
	}
	if _, dup := p.byKey[h]; dup {
		return h
	}
	k := blockKey{hash: h, parent: parent, tokens: make([]int32, len(tokens))}
	for i, t := range tokens {
		k.tokens[i] = int32(t)
	}
	p.keys[b] = k
	p.byKey[h] = b
	return h
}

// lookup finds the cached block holding tokens after the block of hash
// parent and takes a reference to it.
func (p *blockPool) lookup(parent uint64, tokens []int) (int32, uint64, bool) {
	h := chainHash(parent, tokens)
	b, ok := p.byKey[h]
	if !ok {
		return 0, 0, false
	}
	k := p.keys[b]
	if k.parent != parent || !slices.EqualFunc(k.tokens, tokens, func(a int32, b int) bool { return int(a) == b }) {
		return 0, 0, false
	}
	if p.refs[b] == 0 {
		p.unused.Remove(p.elem[b])
		p.elem[b] = nil
	}
	p.refs[b]++
	return b, h, true
}

// unindex forgets that block b holds the contents of hash h (its tokens are
// about to be replaced: a speculative step's rejected drafts).
func (p *blockPool) unindex(b int32, h uint64) {
	if !p.prefix || p.keys[b].hash != h || p.byKey[h] != b {
		return
	}
	delete(p.byKey, h)
	p.keys[b] = blockKey{}
}
