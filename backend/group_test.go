package backend

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	panics      bool          // every step panics
	// worker, when set, is the rank's Worker: each step must run inside
	// one of its calls (onWorker counts those that did).
	worker   *fakeWorker
	onWorker int
}

// step records whether the step runs on the rank's worker, and panics when
// told to.
func (f *fakeRank) step() {
	if f.worker != nil && f.worker.busy.Load() {
		f.onWorker++
	}
	if f.panics {
		panic("rank's step panicked")
	}
}

// fakeWorker is a rank's Loaded with a Worker: a goroutine that runs what
// Go hands it, one call at a time, as a CUDA device's worker thread does.
type fakeWorker struct {
	Loaded // nil: the group's steps only call Go
	work   chan func()
	busy   atomic.Bool // inside a call
	calls  atomic.Int32
	closed bool // Go refuses every call
}

func newFakeWorker() *fakeWorker {
	w := &fakeWorker{work: make(chan func())}
	go func() {
		for f := range w.work {
			w.busy.Store(true)
			f()
			w.busy.Store(false)
		}
	}()
	return w
}

func (w *fakeWorker) Go(f func() error) (func() error, error) {
	if w.closed {
		return nil, errors.New("worker closed")
	}
	w.calls.Add(1)
	done := make(chan error, 1)
	w.work <- func() { done <- f() }
	return func() error { return <-done }, nil
}

func (f *fakeRank) Kernels() []string { return nil }

func (f *fakeRank) Run(b *Batch, kv KVCache, logits []float32) error {
	f.runs++
	f.step()
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
	f.step()
	for i := f.rank; i < len(b.Rows); i += f.ranks {
		ids[i] = int32(100*f.rank + i)
	}
	return f.fail
}

// fakeGroup is a group of n fake ranks; with workers, each rank's Loaded
// is a Worker (as CUDA ranks are), without, none is (as CPU ranks).
func fakeGroup(n int, workers bool) (*groupExec, []*fakeRank, *groupKV) {
	fs := make([]*fakeRank, n)
	l := &groupLoaded{g: &Group{Ranks: make([]Backend, n)}, ranks: make([]Loaded, n)}
	x := &groupExec{l: l, ranks: make([]Executable, n)}
	for r := range fs {
		fs[r] = &fakeRank{rank: r, ranks: n}
		if workers {
			fs[r].worker = newFakeWorker()
			l.ranks[r] = fs[r].worker
		}
		x.ranks[r] = fs[r]
	}
	l.workers = workersOf(l.ranks)
	return x, fs, &groupKV{ranks: make([]KVCache, n)}
}

// bothForms runs test with ranks that have workers and ranks that do not.
func bothForms(t *testing.T, test func(t *testing.T, workers bool)) {
	for _, workers := range []bool{false, true} {
		t.Run(map[bool]string{false: "goroutines", true: "workers"}[workers], func(t *testing.T) { test(t, workers) })
	}
}

// TestGroupStepsMatch (no GPU): a step whose logits come back runs every
// rank's Run (rank 0's with the logits, the others' with nil), never a
// rank's RunSample, whose collectives may differ from Run's (a CUDA rank
// with peer memory exchanges the logits by rows when it samples); a
// sampled step runs every rank's RunSample with the same ids, each rank
// writing the rows it samples.
// With workers, every rank's step runs on its rank's worker.
func TestGroupStepsMatch(t *testing.T) { bothForms(t, testGroupStepsMatch) }

func testGroupStepsMatch(t *testing.T, workers bool) {
	x, fs, kv := fakeGroup(3, workers)
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
		if workers && (f.onWorker != 2 || f.worker.calls.Load() != 2) {
			t.Errorf("rank %d: %d of 2 steps on its worker, %d calls to it", r, f.onWorker, f.worker.calls.Load())
		}
	}
}

// TestGroupFirstFailure (no GPU): when one rank's step fails while the
// others wait in a collective for it, the group aborts once, with that
// failure, and reports it (not the lower ranks' failures that the abort
// caused), then fails every step after.
func TestGroupFirstFailure(t *testing.T) { bothForms(t, testGroupFirstFailure) }

func testGroupFirstFailure(t *testing.T, workers bool) {
	x, fs, kv := fakeGroup(3, workers)
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

// TestGroupRankPanics (no GPU): a rank whose step panics fails the step
// with the panic's message and aborts the group, the process going on.
func TestGroupRankPanics(t *testing.T) { bothForms(t, testGroupRankPanics) }

func testGroupRankPanics(t *testing.T, workers bool) {
	x, fs, kv := fakeGroup(2, workers)
	aborts := 0
	x.l.g.Abort = func(error) { aborts++ }
	fs[1].panics = true
	err := x.Run(&Batch{Rows: make([]int32, 1)}, kv, make([]float32, 1))
	if !errors.Is(err, ErrGroupAborted) || !strings.Contains(err.Error(), "rank 1: panic: rank's step panicked") {
		t.Errorf("error %v, want rank 1's panic", err)
	}
	if aborts != 1 {
		t.Errorf("%d aborts, want 1", aborts)
	}
}

// TestGroupWorkerClosed (no GPU): a rank whose worker refuses the step
// fails it and aborts the group at once, so that the other ranks, waiting
// in a collective for that rank, return instead of hanging.
func TestGroupWorkerClosed(t *testing.T) {
	x, fs, kv := fakeGroup(2, true)
	aborted := make(chan struct{})
	var once sync.Once
	x.l.g.Abort = func(error) { once.Do(func() { close(aborted) }) }
	fs[0].wait, fs[0].fail = aborted, errors.New("collective aborted")
	fs[1].worker.closed = true
	err := x.Run(&Batch{Rows: make([]int32, 1)}, kv, make([]float32, 1))
	if !errors.Is(err, ErrGroupAborted) || !strings.Contains(err.Error(), "rank 1: worker closed") {
		t.Errorf("error %v, want rank 1's closed worker", err)
	}
}
