package kernels

import (
	"fmt"

	"kiln/backend"
	"kiln/backend/cuda/cu"
)

// PrefillTile is the number of query tokens of one prefill attention tile
// (PF_BQ in attention.cu).
const PrefillTile = 64

// Meta is a backend.Batch packed into one int32 buffer, uploaded once per
// step. The offsets are in int32 elements from the start of Data. The block
// tables come last, so every offset depends only on T, S, R and Tiles: steps
// of the same composition can replay one captured graph.
type Meta struct {
	Data []int32

	T, S, R int // tokens, sequences, logit rows
	Tiles   int // prefill attention tiles

	Tokens      int // [T] token ids
	Positions   int // [T] positions
	SeqIndex    int // [T] sequence of each token
	Slots       int // [T] cache slot of each token: Blocks[p/bs]*bs + p%bs
	SeqBlockOff int // [S] offset of each sequence's block table in BlockTable
	SeqLen      int // [S] sequence lengths
	SeqFresh    int // [S] each sequence's first position among the batch's tokens (earlier ones are cached)
	BlockTable  int // [ΣBlocks] the sequences' block tables, one after another
	Rows        int // [R] token indices whose logits are wanted
	TileTok0    int // [Tiles] first token of each prefill tile
	TileCount   int // [Tiles] tokens in each prefill tile (1..PrefillTile)

	BlockSize int
	MaxPos    int // the largest position of the batch
}

// Pack validates b against spec and packs it. Prefill tiles are runs of at
// most PrefillTile consecutive tokens of one sequence.
func Pack(b *backend.Batch, spec backend.KVSpec) (*Meta, error) {
	if err := b.Validate(spec); err != nil {
		return nil, err
	}
	if spec.BlockSize <= 0 {
		return nil, fmt.Errorf("kernels: block size %d", spec.BlockSize)
	}
	m := &Meta{T: len(b.Tokens), S: len(b.Seqs), R: len(b.Rows), BlockSize: spec.BlockSize}
	var tok0, cnt []int32
	for i := 0; i < m.T; i++ {
		if i == 0 || b.SeqIndex[i] != b.SeqIndex[i-1] || cnt[len(cnt)-1] == PrefillTile {
			tok0 = append(tok0, int32(i))
			cnt = append(cnt, 0)
		}
		cnt[len(cnt)-1]++
	}
	m.Tiles = len(tok0)
	nblk := 0
	for _, s := range b.Seqs {
		nblk += len(s.Blocks)
	}
	d := make([]int32, 0, 4*m.T+3*m.S+nblk+m.R+2*m.Tiles)
	put := func(off *int, v []int32) {
		*off = len(d)
		d = append(d, v...)
	}
	put(&m.Tokens, b.Tokens)
	put(&m.Positions, b.Positions)
	put(&m.SeqIndex, b.SeqIndex)
	m.Slots = len(d)
	bs := spec.BlockSize
	for i, p := range b.Positions {
		s := b.Seqs[b.SeqIndex[i]]
		d = append(d, s.Blocks[int(p)/bs]*int32(bs)+p%int32(bs))
		m.MaxPos = max(m.MaxPos, int(p))
	}
	m.SeqBlockOff = len(d)
	off := 0
	for _, s := range b.Seqs {
		d = append(d, int32(off))
		off += len(s.Blocks)
	}
	m.SeqLen = len(d)
	for _, s := range b.Seqs {
		d = append(d, int32(s.Len))
	}
	m.SeqFresh = len(d)
	for _, s := range b.Seqs {
		d = append(d, int32(s.Len)) // lowered below; a sequence without tokens keeps its length
	}
	for i, p := range b.Positions {
		f := &d[m.SeqFresh+int(b.SeqIndex[i])]
		*f = min(*f, p)
	}
	put(&m.Rows, b.Rows)
	put(&m.TileTok0, tok0)
	put(&m.TileCount, cnt)
	m.BlockTable = len(d)
	for _, s := range b.Seqs {
		d = append(d, s.Blocks...)
	}
	m.Data = d
	return m, nil
}

// DecodePrefix is the number of the batch's first tokens that are each
// their sequence's only token of the step (decoding sequences), up to the
// first that is not: the rows a mixed step's decode attention takes
// (SplitDecode).
func (m *Meta) DecodePrefix() int {
	seq := m.Data[m.SeqIndex : m.SeqIndex+m.T]
	d := 0
	for d < m.T && seq[d] == int32(d) && (d+1 == m.T || seq[d+1] != int32(d)) {
		d++
	}
	return d
}

// SplitDecode splits a batch whose first d tokens (0 < d < T, at most
// DecodePrefix) are decoding sequences into what decode attention takes,
// those d tokens (their largest position as MaxPos), and what prefill
// attention takes, the tiles of the other tokens (their tile lists start
// after the first d tiles, one a decoding sequence). Both keep the
// batch's token and sequence indices and its arrays, so the attention
// kernels read and write the rows they did over the whole batch.
func (m *Meta) SplitDecode(d int) (dec, pre *Meta) {
	dm, pm := *m, *m
	dm.T, dm.S, dm.Tiles, dm.MaxPos = d, d, d, 0
	for _, p := range m.Data[m.Positions : m.Positions+d] {
		dm.MaxPos = max(dm.MaxPos, int(p))
	}
	pm.TileTok0, pm.TileCount, pm.Tiles = m.TileTok0+d, m.TileCount+d, m.Tiles-d
	return &dm, &pm
}

// DevMeta is a Meta uploaded to the device at Base.
type DevMeta struct {
	*Meta
	Base cu.Ptr
}

// At is the device address of offset off.
func (m DevMeta) At(off int) cu.Ptr { return m.Base.Add(4 * off) }

// Bytes is the packed size.
func (m *Meta) Bytes() int { return 4 * len(m.Data) }

// Upload copies m into the device buffer buf of capacity bytes.
func (m *Meta) Upload(d *cu.Device, buf cu.Ptr, capacity int) (DevMeta, error) {
	if m.Bytes() > capacity {
		return DevMeta{}, fmt.Errorf("kernels: packed batch of %d bytes, buffer of %d", m.Bytes(), capacity)
	}
	if len(m.Data) > 0 {
		if err := d.Upload(buf, cu.AsBytes(m.Data)); err != nil {
			return DevMeta{}, err
		}
	}
	return DevMeta{Meta: m, Base: buf}, nil
}
