package backend

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fakeRank is one rank's executable: it records how each step reached it
// and, when sampling, writes the ids of its share of the rows (rank r the
// rows r, r+ranks, …), as a CUDA rank that splits the rows does.
type fakeRank struct {
	rank, ranks int
	runs        int
	nilLogits   int
	samples     int
	fail        error         // returned by every step
	wait        chan struct{} // closed by the group's Abort: the step waits for it first
}

func (f *fakeRank) Kernels() []string { return nil }

func (f *fakeRank) Run(b *Batch, kv KVCache, logits []float32) error {
	f.runs++
	if logits == nil {
		f.nilLogits++
	}
	if f.wait != nil {
		<-f.wait
	}
	return f.fail
}

func (f *fakeRank) RunSample(b *Batch, kv KVCache, params []SampleParams, ids []int32) error {
	f.samples++
	for i := f.rank; i < len(b.Rows); i += f.ranks {
		ids[i] = int32(100*f.rank + i)
	}
	return f.fail
}

func fakeGroup(n int) (*groupExec, []*fakeRank, *groupKV) {
	fs := make([]*fakeRank, n)
	x := &groupExec{l: &groupLoaded{g: &Group{Ranks: make([]Backend, n)}}, ranks: make([]Executable, n)}
	for r := range fs {
		fs[r] = &fakeRank{rank: r, ranks: n}
		x.ranks[r] = fs[r]
	}
	return x, fs, &groupKV{ranks: make([]KVCache, n)}
}

// TestGroupStepsMatch (no GPU): a step whose logits come back runs every
// rank's Run (rank 0's with the logits, the others' with nil), never a
// rank's RunSample, whose collectives may differ from Run's (a CUDA rank
// with peer memory exchanges the logits by rows when it samples); a
// sampled step runs every rank's RunSample with the same ids, each rank
// writing the rows it samples.
func TestGroupStepsMatch(t *testing.T) {
	x, fs, kv := fakeGroup(3)
	b := &Batch{Rows: make([]int32, 7)}
	logits := make([]float32, 7)
	if err := x.Run(b, kv, logits); err != nil {
		t.Fatal(err)
	}
	for r, f := range fs {
		if f.runs != 1 || f.samples != 0 || (f.nilLogits == 1) != (r > 0) {
			t.Errorf("rank %d: %d runs (%d with nil logits), %d sampled steps", r, f.runs, f.nilLogits, f.samples)
		}
	}
	ids := make([]int32, 7)
	if err := (&samplingGroupExec{x}).RunSample(b, kv, make([]SampleParams, 7), ids); err != nil {
		t.Fatal(err)
	}
	want := []int32{0, 101, 202, 3, 104, 205, 6}
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v (each rank's rows)", ids, want)
	}
	for r, f := range fs {
		if f.runs != 1 || f.samples != 1 {
			t.Errorf("rank %d: %d runs, %d sampled steps after one of each", r, f.runs, f.samples)
		}
	}
}

// TestGroupFirstFailure (no GPU): when one rank's step fails while the
// others wait in a collective for it, the group aborts once, with that
// failure, and reports it (not the lower ranks' failures that the abort
// caused), then fails every step after.
func TestGroupFirstFailure(t *testing.T) {
	x, fs, kv := fakeGroup(3)
	aborted := make(chan struct{})
	var once sync.Once
	var reasons []error
	x.l.g.Abort = func(err error) {
		reasons = append(reasons, err)
		once.Do(func() { close(aborted) })
	}
	cause := errors.New("rank 2's kernel failed")
	for r, f := range fs {
		if r < 2 {
			f.wait, f.fail = aborted, errors.New("collective aborted")
		} else {
			f.fail = cause
		}
	}
	err := x.Run(&Batch{Rows: make([]int32, 1)}, kv, make([]float32, 1))
	if !errors.Is(err, cause) || !errors.Is(err, ErrGroupAborted) || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("error %v, want rank 2's failure", err)
	}
	if len(reasons) != 1 || !errors.Is(reasons[0], cause) {
		t.Errorf("aborted with %v, want once with rank 2's failure", reasons)
	}
	if err2 := x.Run(&Batch{Rows: make([]int32, 1)}, kv, make([]float32, 1)); !errors.Is(err2, cause) {
		t.Errorf("the step after: %v, want the group's failure", err2)
	}
}
