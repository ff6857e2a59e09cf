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
		v    string
		want cuda.PeerMode
		ok   bool
	}{
		{"", cuda.PeerMode{Peers: true}, true}, {"apart", cuda.PeerMode{Peers: true, Apart: true}, true},
		{"flags", cuda.PeerMode{Peers: true, Flags: true}, true}, {"0", cuda.PeerMode{}, true},
		{"1", cuda.PeerMode{}, false}, {"nccl", cuda.PeerMode{}, false},
	} {
		got, err := cuda.PeerForm(c.v)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("PeerForm(%q) = %+v, %v; want %+v, ok %v", c.v, got, err, c.want, c.ok)
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
