package kernels

import (
	"slices"
	"testing"

	"kiln/backend"
	"kiln/backend/cuda/cu"
)

func TestPack(t *testing.T) {
	spec := backend.KVSpec{Layers: 1, Blocks: 10, BlockSize: 4, KVHeads: 1, HeadDim: 8}
	b := &backend.Batch{
		Tokens:    make([]int32, 70+3+1),
		Positions: make([]int32, 0, 74),
		SeqIndex:  make([]int32, 0, 74),
		Seqs: []backend.Seq{
			{Blocks: []int32{9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, Len: 70}, // positions 0..69
			{Blocks: []int32{3, 1}, Len: 6}, // 3 tokens, positions 3..5
			{Blocks: []int32{2}, Len: 1},
		},
		Rows: []int32{69, 72, 73},
	}
	for i := 0; i < 70; i++ {
		b.Positions = append(b.Positions, int32(i))
		b.SeqIndex = append(b.SeqIndex, 0)
	}
	for i := 3; i < 6; i++ {
		b.Positions = append(b.Positions, int32(i))
		b.SeqIndex = append(b.SeqIndex, 1)
	}
	b.Positions = append(b.Positions, 0)
	b.SeqIndex = append(b.SeqIndex, 2)
	for i := range b.Tokens {
		b.Tokens[i] = int32(100 + i)
	}
	m, err := Pack(b, spec)
	if err != nil {
		t.Fatal(err)
	}
	get := func(off, n int) []int32 { return m.Data[off : off+n] }
	if !slices.Equal(get(m.Tokens, m.T), b.Tokens) || !slices.Equal(get(m.Positions, m.T), b.Positions) ||
		!slices.Equal(get(m.SeqIndex, m.T), b.SeqIndex) || !slices.Equal(get(m.Rows, m.R), b.Rows) {
		t.Fatal("tokens, positions, sequence indices or rows differ")
	}
	if m.Tiles != 4 || !slices.Equal(get(m.TileTok0, 4), []int32{0, 64, 70, 73}) || !slices.Equal(get(m.TileCount, 4), []int32{64, 6, 3, 1}) {
		t.Fatalf("tiles %d %v %v", m.Tiles, get(m.TileTok0, m.Tiles), get(m.TileCount, m.Tiles))
	}
	if !slices.Equal(get(m.SeqBlockOff, 3), []int32{0, 18, 20}) || !slices.Equal(get(m.SeqLen, 3), []int32{70, 6, 1}) {
		t.Fatalf("block offsets %v lengths %v", get(m.SeqBlockOff, 3), get(m.SeqLen, 3))
	}
	if !slices.Equal(get(m.SeqFresh, 3), []int32{0, 3, 0}) {
		t.Fatalf("first positions in the batch %v", get(m.SeqFresh, 3))
	}
	bt := get(m.BlockTable, 21)
	for i := 0; i < m.T; i++ {
		s := b.Seqs[b.SeqIndex[i]]
		p := b.Positions[i]
		want := s.Blocks[p/4]*4 + p%4
		if got := m.Data[m.Slots+i]; got != want {
			t.Fatalf("slot of token %d: %d, want %d", i, got, want)
		}
		off := m.Data[m.SeqBlockOff+int(b.SeqIndex[i])]
		if bt[int(off)+int(p/4)]*4+p%4 != want {
			t.Fatalf("block table of token %d", i)
		}
	}
	if m.MaxPos != 69 || m.Bytes() != 4*len(m.Data) {
		t.Fatalf("max pos %d", m.MaxPos)
	}
	// A bad batch is refused.
	b.Positions[0] = 80
	if _, err := Pack(b, spec); err == nil {
		t.Fatal("bad batch packed")
	}
}

func TestPlanDecode(t *testing.T) {
	for _, c := range []struct{ T, heads, kv, ctx, window, sms int }{
		{1, 32, 8, 4096, 0, 132}, {1, 32, 8, 512, 0, 132}, {64, 32, 8, 4096, 0, 132}, {1, 32, 1, 4100, 0, 132}, {3, 8, 8, 1, 0, 132}, {1, 32, 8, 4096, 300, 132},
		{256, 32, 8, 128, 0, 132}, {64, 32, 8, 544, 0, 132}, {128, 64, 8, 200, 0, 132},
	} {
		a := Attn{Heads: c.heads, KVHeads: c.kv, HeadDim: 128, Window: c.window}
		p := PlanDecode(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, c.sms)
		ctx := c.ctx
		if c.window > 0 {
			ctx = min(ctx, c.window)
		}
		if p.Chunk < 32 || p.Chunk > 128 || p.MaxSplits*p.Chunk < ctx || (p.MaxSplits-1)*p.Chunk >= ctx || (c.heads/c.kv)*p.Chunk > 4096 {
			t.Errorf("%+v: plan %+v", c, p)
		}
		for _, act := range []cu.DType{cu.BF16, cu.F32} {
			for _, q := range []DecodePlan{{Chunk: 128}, {Chunk: 128, Cluster: true}} {
				if sh := decodeShared(act, a, q); sh > decodeMaxShared {
					t.Errorf("%+v: %d bytes of %v shared memory for %+v", c, sh, act, q)
				}
			}
		}
		// The candidates: PlanDecode's first, then longer chunks up to 128,
		// none needing more workspace than the first; then, with clusters,
		// clusters of 2, 4, 8 and 16 blocks where their blocks take at most
		// 128 keys.
		plans := DecodePlans(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, c.sms, false, cu.F32)
		if plans[0] != p || plans[len(plans)-1].Chunk != 128 {
			t.Errorf("%+v: candidates %+v", c, plans)
		}
		for i, q := range plans[1:] {
			if q.Chunk != 2*plans[i].Chunk || q.WorkspaceBytes > p.WorkspaceBytes || q.MaxSplits*q.Chunk < ctx || (q.MaxSplits-1)*q.Chunk >= ctx || q.Cluster {
				t.Errorf("%+v: candidate %+v after %+v", c, q, plans[i])
			}
		}
		withClusters := DecodePlans(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, c.sms, true, cu.F32)
		var want []DecodePlan
		for n := 2; n <= 16; n *= 2 {
			if chunk := (ctx + n - 1) / n; chunk <= 128 {
				want = append(want, DecodePlan{Chunk: chunk, MaxSplits: n, Cluster: true})
			}
		}
		if !slices.Equal(withClusters[len(plans):], want) || !slices.Equal(withClusters[:len(plans)], plans) {
			t.Errorf("%+v: candidates with clusters %+v, want %+v then %+v", c, withClusters, plans, want)
		}
		// bf16 adds the tensor-core plans (decodeMMAPlans): powers of two
		// from 128 keys a split, ending at the first covering the context
		// or 4096, at most one wave-shaped chunk, then the powers of two of
		// 256 keys and more with 2 stages where the grid has more than two
		// blocks an SM; each within the first plan's
		// workspace and the shared memory bound. The scale must be positive
		// (decodeMMAOK): none without.
		if got := DecodePlans(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, c.sms, true, cu.BF16); !slices.Equal(got, withClusters) {
			t.Errorf("%+v: scale 0 gave tensor-core plans %+v", c, got[len(withClusters):])
		}
		a.Scale = 0.125
		mma := DecodePlans(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, c.sms, true, cu.BF16)
		if !slices.Equal(mma[:len(withClusters)], withClusters) || len(mma) == len(withClusters) || len(mma)-len(withClusters) > 13 {
			t.Fatalf("%+v: bf16 candidates %+v", c, mma)
		}
		var pow, s2 []int
		wave, heads := 0, 0
		for i, q := range mma[len(withClusters):] {
			// Several kv heads a block (last): the 3-stage plan of one
			// split, 2 or 4 dividing the kv heads, a block for every SM.
			if q.Heads > 1 || heads > 0 {
				th := c.T * c.kv
				if q.Heads != 2 && q.Heads != 4 || q.Stages != 0 || q.MaxSplits != 1 || !q.MMA || c.kv%q.Heads != 0 || th/q.Heads < c.sms ||
					c.heads/c.kv > 16 || q.Heads <= heads || decodeShared(cu.BF16, a, q) > decodeMaxShared {
					t.Errorf("%+v: tensor-core candidate %+v (after %d kv heads a block)", c, q, heads)
				}
				heads = q.Heads
				continue
			}
			if !q.MMA || q.Cluster || q.Chunk < decodeMMAMinChunk || q.Chunk > decodeMMAMaxChunk || q.MaxSplits != (ctx+q.Chunk-1)/q.Chunk ||
				q.WorkspaceBytes > p.WorkspaceBytes || q.WorkspaceBytes != decodePartialBytes(a, c.T, q.MaxSplits) ||
				decodeShared(cu.BF16, a, q) > decodeMaxShared || slices.Contains(mma[len(withClusters):i+len(withClusters)], q) {
				t.Errorf("%+v: tensor-core candidate %+v (%d bytes of shared memory)", c, q, decodeShared(cu.BF16, a, q))
			}
			switch {
			case q.Stages == 2:
				s2 = append(s2, q.Chunk)
			case q.Stages != 0:
				t.Errorf("%+v: tensor-core candidate %+v", c, q)
			case q.Chunk&(q.Chunk-1) == 0 && wave == 0 && len(s2) == 0:
				if len(pow) > 0 && q.Chunk <= pow[len(pow)-1] {
					t.Errorf("%+v: tensor-core candidates %+v", c, mma)
				}
				pow = append(pow, q.Chunk)
			case wave == 0 && len(s2) == 0 && q.Chunk%decodeMMAKeys == 0 && q.Chunk >= 256:
				wave = q.Chunk
			default:
				t.Errorf("%+v: tensor-core candidate %+v out of order", c, q)
			}
		}
		var want2 []int
		for _, ch := range pow {
			if ch >= 256 && c.T*c.kv*((ctx+ch-1)/ch) > 2*c.sms {
				want2 = append(want2, ch)
			}
		}
		if len(pow) == 0 || pow[len(pow)-1] < min(ctx, decodeMMAMaxChunk) || !slices.Equal(s2, want2) {
			t.Errorf("%+v: tensor-core candidates %+v", c, mma[len(withClusters):])
		}
		if wantHeads := c.heads/c.kv <= 16 && pow[len(pow)-1] >= ctx && c.T*c.kv/2 >= c.sms && c.kv%2 == 0; wantHeads != (heads > 0) {
			t.Errorf("%+v: %d kv heads a block at most, want some %v", c, heads, wantHeads)
		}
	}
}

// TestDecodeMMAPlansPrune checks the tensor-core candidates of the batches
// measured (H200, 132 SMs, 32/8 heads, hd 128): every plan that was fastest
// there stays a candidate (a 3-stage plan of best keys a split, heads kv
// heads a block: session 27 measured those with several), and the list is
// short.
func TestDecodeMMAPlansPrune(t *testing.T) {
	a := Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.1}
	for _, c := range []struct{ T, ctx, best, heads, most int }{
		{16, 2048, 1024, 0, 7}, {64, 512, 512, 2, 5}, {64, 2048, 2048, 0, 5}, {256, 128, 128, 4, 3}, {256, 512, 512, 0, 4}, {256, 2048, 2048, 0, 4},
		{1, 32768, 4096, 0, 7}, {64, 1024, 1024, 2, 5},
	} {
		plans := decodeMMAPlans(a, &Meta{T: c.T, MaxPos: c.ctx - 1}, 132)
		found := false
		for _, p := range plans {
			found = found || (p.Chunk == c.best && p.Stages == 0 && p.Heads == c.heads)
		}
		if !found || len(plans) > c.most {
			t.Errorf("%+v: %d candidates %+v", c, len(plans), plans)
		}
		t.Logf("batch %d ctx %d: %v", c.T, c.ctx, plans)
	}
}

// TestDecodeMMAShapes checks which attention shapes the tensor-core decode
// takes, and its shared memory: at most two blocks' worth of the
// multiprocessor's 228 KiB with 3 stages at head dim 128, 3 blocks with 2.
func TestDecodeMMAShapes(t *testing.T) {
	for _, c := range []struct {
		heads, kv, hd int
		scale         float32
		ok            bool
		kernelRows    int
	}{
		{32, 8, 128, 0.1, true, 16}, {32, 32, 64, 0.1, true, 16}, {16, 2, 80, 0.1, true, 16}, {32, 4, 96, 0.1, true, 16},
		{32, 1, 64, 0.1, true, 32}, {24, 1, 128, 0.1, true, 32}, {16, 1, 128, 0.1, true, 16}, {12, 4, 96, 0.1, true, 16},
		{64, 1, 128, 0.1, false, 0}, {8, 4, 8, 0.1, false, 0}, {32, 8, 128, 0, false, 0}, {32, 8, 72, 0.1, false, 0},
	} {
		a := Attn{Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, Scale: c.scale}
		if decodeMMAOK(a) != c.ok {
			t.Errorf("%+v: decodeMMAOK %v", c, !c.ok)
		}
		if !c.ok {
			continue
		}
		if r := decodeMMARows(a); r != c.kernelRows {
			t.Errorf("%+v: %d rows", c, r)
		}
		if c.hd == 128 && c.kernelRows == 16 {
			if sh := decodeMMAShared(a, DecodePlan{Chunk: 4096, MMA: true}); 2*(sh+1024) > 228<<10 {
				t.Errorf("%+v: %d bytes of shared memory with 3 stages", c, sh)
			}
			if sh := decodeMMAShared(a, DecodePlan{Chunk: 128, MMA: true}); 3*(sh+1024) > 228<<10 {
				t.Errorf("%+v: %d bytes of shared memory with 2 stages", c, sh)
			}
			if sh := decodeMMAShared(a, DecodePlan{Chunk: 4096, MMA: true, Stages: 2}); 3*(sh+1024) > 228<<10 {
				t.Errorf("%+v: %d bytes of shared memory with Stages 2", c, sh)
			}
		}
	}
	// q and out must be 16-byte aligned.
	a := Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.1, Q: 16, Out: 32}
	if !decodeMMAOK(a) {
		t.Error("aligned pointers refused")
	}
	a.Out = 40
	if decodeMMAOK(a) {
		t.Error("misaligned out taken")
	}
}

// TestDecodePlanForBatch: a plan kept for a bucket of batches, run on
// another batch, keeps its split and needs the workspace of that batch's
// tokens (none for a cluster plan).
func TestDecodePlanForBatch(t *testing.T) {
	a := Attn{Heads: 32, KVHeads: 8, HeadDim: 128}
	small, large := &Meta{T: 33, MaxPos: 1023}, &Meta{T: 64, MaxPos: 1023}
	for _, p := range DecodePlans(a, small, 132, true, cu.BF16) {
		q := p.ForBatch(a, large)
		if q.Chunk != p.Chunk || q.MaxSplits != p.MaxSplits || q.Cluster != p.Cluster || q.MMA != p.MMA {
			t.Errorf("%v: split changed to %+v", p, q)
		}
		want := 0
		if !p.Cluster {
			want = decodePartialBytes(a, 64, p.MaxSplits)
		}
		if q.WorkspaceBytes != want {
			t.Errorf("%v: workspace %d for 64 tokens, want %d", p, q.WorkspaceBytes, want)
		}
	}
}

// TestSplitDecode: a mixed step's decoding sequences (each one token, at
// the batch's front) go to decode attention and its prompt chunks' tiles
// to prefill attention; batches that do not start with a decoding
// sequence have no decode prefix.
func TestSplitDecode(t *testing.T) {
	spec := backend.KVSpec{Layers: 1, Blocks: 64, BlockSize: 16, KVHeads: 1, HeadDim: 8}
	pack := func(runs ...int) *Meta {
		b := &backend.Batch{}
		for s, n := range runs {
			blocks := []int32{int32(8 * s), int32(8*s + 1), int32(8*s + 2), int32(8*s + 3), int32(8*s + 4), int32(8*s + 5), int32(8*s + 6), int32(8*s + 7)}
			b.Seqs = append(b.Seqs, backend.Seq{Blocks: blocks[:(10*s+n+15)/16], Len: 10*s + n})
			for j := range n {
				b.Tokens = append(b.Tokens, 1)
				b.Positions = append(b.Positions, int32(10*s+j))
				b.SeqIndex = append(b.SeqIndex, int32(s))
			}
			b.Rows = append(b.Rows, int32(len(b.Tokens)-1))
		}
		m, err := Pack(b, spec)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, c := range []struct {
		runs []int
		want int
	}{
		{[]int{1, 1, 1, 40}, 3},
		{[]int{1, 1, 1, 1}, 4},
		{[]int{40, 1, 1}, 0},
		{[]int{1, 2, 1}, 1},
		{[]int{1, 1, 100, 1}, 2},
	} {
		m := pack(c.runs...)
		d := m.DecodePrefix()
		if d != c.want {
			t.Errorf("runs %v: decode prefix %d, want %d", c.runs, d, c.want)
			continue
		}
		if d == 0 || d == m.T {
			continue
		}
		dec, pre := m.SplitDecode(d)
		if dec.T != d || dec.Tiles != d || dec.MaxPos != 10*(d-1) {
			t.Errorf("runs %v: decode part T %d tiles %d max position %d", c.runs, dec.T, dec.Tiles, dec.MaxPos)
		}
		tok0 := m.Data[pre.TileTok0 : pre.TileTok0+pre.Tiles]
		var count int32
		for _, n := range m.Data[pre.TileCount : pre.TileCount+pre.Tiles] {
			count += n
		}
		if pre.Tiles != m.Tiles-d || tok0[0] != int32(d) || int(count) != m.T-d || pre.T != m.T {
			t.Errorf("runs %v: prefill part %d tiles from token %d, %d tokens (of %d)", c.runs, pre.Tiles, tok0[0], count, m.T)
		}
	}
}
