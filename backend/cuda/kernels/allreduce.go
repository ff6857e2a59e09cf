package kernels

import (
	"fmt"

	"kiln/backend/cuda/cu"
)

// The one-shot all-reduce over peer memory (allreduce.cu): every rank of a
// tensor-parallel group in one process has a region on its own device
// (PeerRegionBytes, ClearPeerRegion before the first call) that the
// others' kernels store into; a call passes every rank's region. Every
// rank must make the same calls, of the same sizes, in the same order: a
// call's blocks wait for the same blocks (flag form) or vectors (Lamport
// form) of every other rank's call.

// PeerMaxRanks is the largest group the kernels take (AR_MAX_RANKS).
const PeerMaxRanks = 8

// PeerSlots is the most blocks of a call (AR_SLOTS).
const PeerSlots = 64

const (
	peerThreads   = 256                          // AR_THREADS
	peerHeader    = 4096                         // AR_HDR
	peerDiag      = 4*PeerSlots*PeerMaxRanks + 8 // AR_DIAG
	peerRegionArg = PeerMaxRanks
)

// PeerOneShotBytes is the most bytes of partial sums a call of a group of
// more than two ranks sums in one shot in the Lamport form; past it, in
// two (peer_lamport2: a reduce-scatter and an all-gather in one kernel,
// 2(n-1)/n of the partials pushed instead of n-1 times them; vLLM's and
// TensorRT-LLM's custom all-reduces make the same switch near this size).
// Over two ranks both forms push the same bytes, and one shot waits once.
const PeerOneShotBytes = 512 << 10

// PeerRegionBytes is the size of a rank's region for a group of ranks
// whose calls move at most capBytes of partial sums a rank: the header,
// the flag form's two parities of buffers and the Lamport form's two
// (allreduce.cu).
func PeerRegionBytes(ranks, capBytes int) int { return peerHeader + 4*ranks*capBytes }

// peerEmpty is LP_EMPTY, the word of an unused Lamport buffer.
const peerEmpty = 0x80008000

// ClearPeerRegion readies region p (PeerRegionBytes(ranks, capBytes) on
// device d) for its first call: the header and the flag form's buffers
// zero, the Lamport form's buffers empty. Queued on s.
func ClearPeerRegion(d *cu.Device, p cu.Ptr, ranks, capBytes int, s *cu.Stream) error {
	flags := peerHeader + 2*ranks*capBytes // where the Lamport buffers start
	if err := d.Memset8(p, 0, flags, s); err != nil {
		return err
	}
	return d.Memset32(p+cu.Ptr(flags), peerEmpty, (PeerRegionBytes(ranks, capBytes)-flags)/4, s)
}

// PeerGroup is one rank's view of the group's regions.
type PeerGroup struct {
	Rank     int
	Regions  []cu.Ptr // every rank's region, rank 0's first
	CapBytes int      // the most bytes of partial sums a call moves a rank (a multiple of 16)
	// StagingBytes is the staging for PeerScatterRows that each region
	// holds past its PeerRegionBytes (0: none).
	StagingBytes int
	// Blocks is the most blocks a call of the Lamport forms takes (0:
	// PeerSlots; the flag form and PeerScatterRows, whose flags are a
	// block's, take at most PeerSlots). A block waits for the peers'
	// vectors, so every rank's grid must be resident on its device at
	// once: NewPeers gives each device's multiprocessors.
	Blocks int
	// Apart keeps the residual add and RMSNorm after an all-reduce in a
	// kernel of their own (PeerAllReduceNormFits false), for comparisons.
	Apart bool
	// Flags makes PeerAllReduce take the flag form (flags released and
	// acquired over the group, after a system-scope fence) instead of
	// the Lamport form (the data its own flag), for comparisons; every
	// rank of a group must take the same form.
	Flags bool
}

func (g PeerGroup) check() error {
	if len(g.Regions) < 2 || len(g.Regions) > PeerMaxRanks || g.Rank < 0 || g.Rank >= len(g.Regions) || g.CapBytes%16 != 0 {
		return fmt.Errorf("kernels: peer all-reduce: rank %d of %d regions, capacity %d", g.Rank, len(g.Regions), g.CapBytes)
	}
	return nil
}

// args are the kernel's trailing arguments: rank, ranks, capacity, and the
// regions r0…r7 (null past the group).
func (g PeerGroup) args() []any {
	a := []any{int32(g.Rank), int32(len(g.Regions)), int64(g.CapBytes)}
	for i := range peerRegionArg {
		var p cu.Ptr
		if i < len(g.Regions) {
			p = g.Regions[i]
		}
		a = append(a, p)
	}
	return a
}

// blocks is the most blocks a call takes: PeerSlots in the flag form,
// Blocks (or PeerSlots) in the Lamport forms.
func (g PeerGroup) blocks() int {
	if g.Blocks > 0 && !g.Flags {
		return g.Blocks
	}
	return PeerSlots
}

// peerGrid is the grid of a call over nv 16-byte vectors, a thread each,
// of at most most blocks.
func peerGrid(nv, most int) int { return min(most, (nv+peerThreads-1)/peerThreads) }

// PeerAllReduceFits reports whether PeerAllReduce takes n elements of dt at
// src and dst.
func (g PeerGroup) PeerAllReduceFits(dst, src cu.Ptr, n int, dt cu.DType) bool {
	if dt != cu.F32 && dt != cu.F16 && dt != cu.BF16 {
		return false
	}
	b := n * dt.Size()
	return b > 0 && b%16 == 0 && b <= g.CapBytes && aligned16(dst, src)
}

// TwoShot reports whether a call moving bytes of partial sums a rank sums
// in two shots (PeerOneShotBytes): in the Lamport form, over more than two
// ranks, past PeerOneShotBytes (where every rank's chunk holds vectors).
func (g PeerGroup) TwoShot(bytes int) bool {
	n := len(g.Regions)
	return !g.Flags && n > 2 && bytes > PeerOneShotBytes && bytes/16 >= n*n
}

// PeerAllReduce queues on s dst = the sum over the group's ranks of n
// elements of dt at src (dst may be src), in rank order in float32 (every
// rank gets the same bits).
func (k *Kernels) PeerAllReduce(s *cu.Stream, g PeerGroup, dst, src cu.Ptr, n int, dt cu.DType) error {
	if err := g.check(); err != nil {
		return err
	}
	if !g.PeerAllReduceFits(dst, src, n, dt) {
		return fmt.Errorf("kernels: peer all-reduce of %d %v (capacity %d bytes, 16-byte aligned operands)", n, dt, g.CapBytes)
	}
	nv := n * dt.Size() / 16
	args := append([]any{src, dst, int64(nv)}, g.args()...)
	// At most PeerSlots blocks in the flag form, which has that many
	// flags a rank, g.Blocks in the Lamport forms: in each a block waits
	// for the peers' same blocks or vectors, so every rank's blocks must
	// fit on its device at once (the tests' ranks are streams of one
	// device).
	grid := peerGrid(nv, g.blocks())
	name := "peer_lamport_"
	switch {
	case g.Flags:
		name = "peer_allreduce_"
	case g.TwoShot(n * dt.Size()):
		name = "peer_lamport2_"
	}
	return k.launchDep(name+cname(dt), cu.D1(grid), cu.D1(peerThreads), 0, s, args...)
}

// peerAddMaxV is the most vectors a thread of PeerAllReduceAdd keeps with
// sync (AR_ADD_MAXV).
const peerAddMaxV = 4

// PeerAddFits reports whether PeerAllReduceAdd takes n elements of dt at
// dst, src and r (sync: dst overlaps src otherwise than on it): the
// one-shot Lamport form runs such a call, and with sync its threads keep
// every vector they take.
func (g PeerGroup) PeerAddFits(dst, src, r cu.Ptr, n int, dt cu.DType, sync bool) bool {
	nv := n * dt.Size() / 16
	return !g.Flags && !g.TwoShot(n*dt.Size()) && g.PeerAllReduceFits(dst, src, n, dt) && aligned16(r) &&
		(!sync || nv <= peerAddMaxV*peerThreads*peerGrid(nv, g.blocks()))
}

// PeerAllReduceAdd is PeerAllReduce with r (n elements of dt, the same on
// every rank) added to each sum, in float32 after the ranks' partials,
// before the store into dst: a norm's residual add, folded into the
// all-reduce before it. dst may lie on src or r, or apart from both;
// where it overlaps src otherwise, sync must be set (every block of the
// rank pushes its partials before any stores). The one-shot Lamport form
// alone takes it (PeerAddFits).
func (k *Kernels) PeerAllReduceAdd(s *cu.Stream, g PeerGroup, dst, src, r cu.Ptr, n int, dt cu.DType, sync bool) error {
	if err := g.check(); err != nil {
		return err
	}
	if !g.PeerAddFits(dst, src, r, n, dt, sync) {
		return fmt.Errorf("kernels: peer all-reduce with an add of %d %v (the one-shot Lamport form, capacity %d bytes, 16-byte aligned operands)", n, dt, g.CapBytes)
	}
	nv := n * dt.Size() / 16
	args := append([]any{src, r, dst, int64(nv), b2i(sync)}, g.args()...)
	return k.launchDep("peer_lamport_add_"+cname(dt), cu.D1(peerGrid(nv, g.blocks())), cu.D1(peerThreads), 0, s, args...)
}

// PeerRowShare is the rows [lo, hi) of a step's rows that rank samples
// after PeerScatterRows: ⌈rows/ranks⌉ a rank, the last ranks' fewer or
// none.
func PeerRowShare(rows, rank, ranks int) (lo, hi int) {
	share := (rows + ranks - 1) / ranks
	return min(rows, rank*share), min(rows, (rank+1)*share)
}

// PeerScatterFits reports whether PeerScatterRows takes rows of a shard of
// n f32 logits a rank: the staging holds a rank's share of the rows whole
// (ranks·n columns), n is a multiple of 4, and src is 16-byte aligned.
func (g PeerGroup) PeerScatterFits(src cu.Ptr, rows, n int) bool {
	ranks := len(g.Regions)
	_, share := PeerRowShare(rows, 0, ranks)
	return rows > 0 && n > 0 && n%4 == 0 && aligned16(src) && share*ranks*n*4 <= g.StagingBytes
}

// PeerStaging is this rank's staging: after PeerScatterRows, the rows
// PeerRowShare gives it, whole, [hi-lo][ranks·n] f32.
func (g PeerGroup) PeerStaging() cu.Ptr {
	return g.Regions[g.Rank] + cu.Ptr(PeerRegionBytes(len(g.Regions), g.CapBytes))
}

// PeerScatterRows queues on s the vocabulary-parallel logits' exchange by
// rows (allreduce.cu's peer_scatter_rows): src[rows, n] is this rank's
// shard (f32, columns rank·n… of the whole); when every rank's call is done,
// each rank's staging (PeerStaging) holds its rows (PeerRowShare) whole.
// A rank receives (ranks−1)/ranks² of the whole logits, where an all-gather
// brings it (ranks−1)/ranks of them. Every rank must make the call, as
// with PeerAllReduce.
func (k *Kernels) PeerScatterRows(s *cu.Stream, g PeerGroup, src cu.Ptr, rows, n int) error {
	if err := g.check(); err != nil {
		return err
	}
	if !g.PeerScatterFits(src, rows, n) {
		return fmt.Errorf("kernels: peer scatter of %d rows of %d logits (staging %d bytes, 16-byte aligned shard)", rows, n, g.StagingBytes)
	}
	nv := rows * n / 4
	grid := peerGrid(nv, PeerSlots)
	args := append([]any{src, int32(rows), int32(n)}, g.args()...)
	return k.launchDep("peer_scatter_rows", cu.D1(grid), cu.D1(peerThreads), 0, s, args...)
}

// pnMaxVectors is the most 16-byte vectors a row of PeerAllReduceNorm may
// hold (PN_MAXV·AR_THREADS).
const pnMaxVectors = 4 * peerThreads

// PeerAllReduceNormFits reports whether PeerAllReduceNorm takes rows of dim
// at the pointers ptrs: the Lamport form (not Apart) taking two shots
// (TwoShot; in one shot, where a block sums a row to normalize it, the
// kernel was slower than the all-reduce and the norm apart: docs/PERF.md,
// "Tensor parallelism", session 34), rows of 16-byte vectors (at most
// pnMaxVectors), the partials within the capacity, every pointer 16-byte
// aligned.
func (k *Kernels) PeerAllReduceNormFits(g PeerGroup, rows, dim int, ptrs ...cu.Ptr) bool {
	v, b := k.vec(), rows*dim*k.Act.Size()
	return !g.Flags && !g.Apart && g.TwoShot(b) && rows > 0 && dim%v == 0 && dim/v <= pnMaxVectors && b <= g.CapBytes && aligned16(ptrs...)
}

// PeerAllReduceNorm queues on s, in one kernel (allreduce.cu's
// peer_lamport2_norm_w*), what PeerAllReduce of the partials src[rows,
// dim] into x, then AddRMSNorm(sum, normed, x, r, w) compute: every rank
// gets the same bits. Each of sum and normed may lie exactly on src or r,
// or apart from them; where one overlaps src otherwise, sync must be set
// (the rank's blocks then all read src before any writes). Every rank must
// make the same calls, as with PeerAllReduce.
func (k *Kernels) PeerAllReduceNorm(s *cu.Stream, g PeerGroup, sum, normed, src, r, w cu.Ptr, wt cu.DType, rows, dim int, eps float32, sync bool) error {
	if err := g.check(); err != nil {
		return err
	}
	if !k.PeerAllReduceNormFits(g, rows, dim, sum, normed, src, r) {
		return fmt.Errorf("kernels: peer all-reduce and norm of %d×%d %v (two shots, capacity %d bytes, 16-byte aligned operands)", rows, dim, k.Act, g.CapBytes)
	}
	nv := rows * dim / k.vec()
	grid := peerGrid(nv, g.blocks())
	args := append([]any{src, r, w, sum, normed, int32(rows), int32(dim), eps, b2i(sync)}, g.args()...)
	return k.launchDep("peer_lamport2_norm"+wsuffix(wt), cu.D1(grid), cu.D1(peerThreads), 0, s, args...)
}
