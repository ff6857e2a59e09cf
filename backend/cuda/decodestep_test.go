package cuda

import (
	"testing"

	"kiln/backend"
)

// TestDecodeStep: steps of one or two tokens a sequence on average, and
// steps whose every sequence brings at most decodeMaxRun tokens (a
// speculative step's last token and drafts), run as decode steps, wherever
// in the batch a sequence's tokens are; a step with a sequence of more does
// not.
func TestDecodeStep(t *testing.T) {
	batch := func(runs ...int) *backend.Batch {
		b := &backend.Batch{}
		for s, n := range runs {
			b.Seqs = append(b.Seqs, backend.Seq{})
			for range n {
				b.Tokens = append(b.Tokens, 0)
				b.SeqIndex = append(b.SeqIndex, int32(s))
			}
		}
		return b
	}
	for _, c := range []struct {
		runs []int
		want bool
	}{
		{[]int{1}, true},
		{[]int{1, 1, 1}, true},
		{[]int{2}, true},
		{[]int{5}, true},                         // a verifying step of 4 drafts
		{[]int{5, 9, 1}, true},                   // several
		{[]int{decodeMaxRun}, true},              // the longest run
		{[]int{decodeMaxRun + 1}, false},         // a prefill chunk
		{[]int{100, 1, 1, 1, 1}, false},          // a chunk among decoders
		{append([]int{100}, make99()...), false}, // a chunk among decoders, two a sequence on average
	} {
		if got := decodeStep(batch(c.runs...)); got != c.want {
			t.Errorf("runs %v: decode %v, want %v", c.runs, got, c.want)
		}
	}
	// A sequence's tokens need not be together; its count is what matters.
	apart := batch(3, 3)
	apart.SeqIndex = []int32{0, 1, 0, 1, 0, 1}
	if !decodeStep(apart) {
		t.Error("a step of 3 tokens a sequence, interleaved, did not run as a decode step")
	}
	split := batch(decodeMaxRun, decodeMaxRun, 0)
	for i := range split.SeqIndex[decodeMaxRun:] {
		split.SeqIndex[decodeMaxRun+i] = 0 // sequence 0 brings all of them, sequence 2 none
	}
	if decodeStep(split) {
		t.Errorf("a step with a sequence of %d tokens ran as a decode step", 2*decodeMaxRun)
	}
}

// make99 is 99 runs of one token.
func make99() []int {
	r := make([]int, 99)
	for i := range r {
		r[i] = 1
	}
	return r
}
