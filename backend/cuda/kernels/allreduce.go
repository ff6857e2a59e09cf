package kernels

import (
	"fmt"

	"kiln/backend/cuda/cu"
)

// The one-shot all-reduce over peer memory (allreduce.cu): every rank of a
// tensor-parallel group in one process has a region on its own device
// (PeerRegionBytes, zeroed before the first call) that the others' kernels
// store into; a call passes every rank's region. Every rank must make the
// same calls, of the same sizes, in the same order: a call's blocks wait
// for the same blocks of every other rank's call.

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

// PeerRegionBytes is the size of a rank's region for a group of ranks
// whose calls move at most capBytes of partial sums a rank.
func PeerRegionBytes(ranks, capBytes int) int { return peerHeader + 2*ranks*capBytes }

// PeerGroup is one rank's view of the group's regions.
type PeerGroup struct {
	Rank     int
	Regions  []cu.Ptr // every rank's region, rank 0's first
	CapBytes int      // the most bytes of partial sums a call moves a rank (a multiple of 16)
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

// PeerAllReduceFits reports whether PeerAllReduce takes n elements of dt at
// src and dst.
func (g PeerGroup) PeerAllReduceFits(dst, src cu.Ptr, n int, dt cu.DType) bool {
	if dt != cu.F32 && dt != cu.F16 && dt != cu.BF16 {
		return false
	}
	b := n * dt.Size()
	return b > 0 && b%16 == 0 && b <= g.CapBytes && aligned16(dst, src)
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
	grid := min(PeerSlots, (nv+peerThreads-1)/peerThreads)
	args := append([]any{src, dst, int64(nv)}, g.args()...)
	return k.launchDep("peer_allreduce_"+cname(dt), cu.D1(grid), cu.D1(peerThreads), 0, s, args...)
}
