package cuda_test

import (
	"testing"

	"kiln/backend/cuda"
	"kiln/backend/cuda/kernels"
)

// TestPeerSettings (no GPU): the values KILN_PEER_ALLREDUCE and
// KILN_PEER_BLOCKS take, and the clear errors of the others.
func TestPeerSettings(t *testing.T) {
	for _, c := range []struct {
		v            string
		peers, flags bool
		ok           bool
	}{{"", true, false, true}, {"flags", true, true, true}, {"0", false, false, true}, {"1", false, false, false}, {"nccl", false, false, false}} {
		peers, flags, err := cuda.PeerForm(c.v)
		if (err == nil) != c.ok || err == nil && (peers != c.peers || flags != c.flags) {
			t.Errorf("PeerForm(%q) = %v, %v, %v; want %v, %v, ok %v", c.v, peers, flags, err, c.peers, c.flags, c.ok)
		}
	}
	for _, c := range []struct {
		v    string
		want int // 0: an error
	}{{"", 264}, {"64", kernels.PeerSlots}, {"sm", 132}, {"2sm", 264}, {"100", 100}, {"528", 528}, {"529", 0}, {"0", 0}, {"-3", 0}, {"many", 0}} {
		got, err := cuda.PeerBlocks(c.v, 132)
		if (err == nil) != (c.want > 0) || got != c.want {
			t.Errorf("PeerBlocks(%q, 132) = %d, %v; want %d", c.v, got, err, c.want)
		}
	}
}
