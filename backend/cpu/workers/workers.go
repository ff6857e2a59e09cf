// Package workers is a small, zero-allocation parallel-for pool for the CPU
// backend: Run splits an index range [0,n) into chunks and executes them on a
// fixed set of goroutines, the calling goroutine being one of them.
//
// Algorithm. The pool keeps n-1 helper goroutines. A Run publishes its task
// (Task, range, chunk size) in plain fields and then makes the chunks
// claimable by storing the chunk count in an atomic counter `left`. Every
// participant (the caller and the helpers) claims chunks by a compare-and-swap
// that decrements `left` while it is positive; chunk i = total-left. Since a
// Run cannot return before each of its chunks has been executed and counted
// down in `pending`, any participant holding a claimed chunk can read the task
// fields safely, and the fields are only rewritten when `left` is zero. Helpers
// between runs spin on `left` for a short while (a Run typically follows the
// previous one by microseconds) and then park on a per-helper channel; the
// publisher wakes parked helpers after publishing, using a Dekker-style
// "sleeping" flag (set flag, recheck work / publish work, check flag) so that a
// wake-up is never lost. The caller works on chunks too and finally waits
// (spin, then park) until `pending` reaches zero.
//
// Invariants: Run allocates nothing (pass a pointer to a preallocated Task),
// tiny ranges (one chunk, or a pool of size 1) run inline on the caller, and
// Run must not be called from more than one goroutine at a time per Pool.
package workers

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Task is work split into index ranges. Do(lo, hi) processes the indices
// lo <= i < hi; it is called concurrently for disjoint ranges.
type Task interface{ Do(lo, hi int) }

// spinFor is how long an idle participant polls before parking.
const spinFor = 50 * time.Microsecond

// maxChunksPerWorker bounds the number of chunks per participant; a few
// chunks each lets fast workers take over from slow (descheduled) ones.
const maxChunksPerWorker = 4

// Pool is a fixed set of workers. It must not be copied. Run may only be
// called by one goroutine at a time.
type Pool struct {
	size int

	// Published state of the current run; written only while left == 0.
	task   Task
	n      int
	chunk  int
	chunks int64

	left    atomic.Int64 // chunks not yet claimed
	pending atomic.Int64 // chunks claimed or not, not yet finished
	closed  atomic.Bool

	helpers []helper

	callerSleeping atomic.Int32
	callerWake     chan struct{}

	wg sync.WaitGroup
}

type helper struct {
	sleeping atomic.Int32
	wake     chan struct{}
	_        [48]byte // keep helpers' flags on separate cache lines
}

// New starts a pool of n workers (n <= 0: runtime.GOMAXPROCS(0)); the
// goroutine calling Run counts as one of them.
func New(n int) *Pool {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{size: n, helpers: make([]helper, n-1), callerWake: make(chan struct{}, 1)}
	for i := range p.helpers {
		p.helpers[i].wake = make(chan struct{}, 1)
		p.wg.Add(1)
		go p.loop(&p.helpers[i])
	}
	return p
}

// Size returns the number of workers, the caller of Run included.
func (p *Pool) Size() int { return p.size }

// Close stops the helper goroutines. The pool must be idle; after Close, Run
// executes everything on the caller.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	for i := range p.helpers {
		h := &p.helpers[i]
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	p.wg.Wait()
}

// Run splits [0,n) into chunks of at least grain indices (chunk bounds are
// multiples of grain, except the final n), executes t.Do on each chunk using
// all workers, and returns when all chunks are done. A range that fits in one
// chunk runs inline. Run must not be called concurrently on the same Pool,
// nor from inside a Task running on it.
func (p *Pool) Run(n int, grain int, t Task) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	units := (n + grain - 1) / grain
	if units <= 1 || p.size <= 1 || p.closed.Load() {
		t.Do(0, n)
		return
	}
	chunks := min(units, p.size*maxChunksPerWorker)
	per := (units + chunks - 1) / chunks // grains per chunk
	chunks = (units + per - 1) / per

	p.task, p.n, p.chunk, p.chunks = t, n, per*grain, int64(chunks)
	p.pending.Store(int64(chunks))
	p.left.Store(int64(chunks)) // publish
	for i := range p.helpers {
		h := &p.helpers[i]
		if h.sleeping.Load() != 0 && h.sleeping.CompareAndSwap(1, 0) {
			h.wake <- struct{}{}
		}
	}
	p.work()
	p.waitDone()
	p.task = nil
}

// work claims and runs chunks until none are left.
func (p *Pool) work() {
	for {
		l := p.left.Load()
		if l <= 0 {
			return
		}
		if !p.left.CompareAndSwap(l, l-1) {
			continue
		}
		i := int(p.chunks - l)
		lo := i * p.chunk
		hi := min(lo+p.chunk, p.n)
		p.task.Do(lo, hi)
		if p.pending.Add(-1) == 0 {
			if p.callerSleeping.Load() != 0 && p.callerSleeping.CompareAndSwap(1, 0) {
				p.callerWake <- struct{}{}
			}
		}
	}
}

// waitDone blocks the caller until every chunk of the current run is done.
func (p *Pool) waitDone() {
	if spin(func() bool { return p.pending.Load() == 0 }) {
		return
	}
	p.callerSleeping.Store(1)
	if p.pending.Load() == 0 {
		if p.callerSleeping.CompareAndSwap(1, 0) {
			return
		}
		// The finisher took the flag and is sending a token: consume it.
	}
	<-p.callerWake
}

// loop is a helper goroutine's body.
func (p *Pool) loop(h *helper) {
	defer p.wg.Done()
	for {
		if !spin(func() bool { return p.left.Load() > 0 || p.closed.Load() }) {
			h.sleeping.Store(1)
			if p.left.Load() > 0 || p.closed.Load() {
				if !h.sleeping.CompareAndSwap(1, 0) {
					<-h.wake // a publisher took the flag: consume its token
				}
			} else {
				<-h.wake
			}
		}
		if p.closed.Load() {
			return
		}
		p.work()
	}
}

// spin polls cond for up to spinFor and reports whether it became true.
func spin(cond func() bool) bool {
	var start time.Time
	for i := 0; ; i++ {
		if cond() {
			return true
		}
		if i&63 == 63 {
			if i == 63 {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				return false
			}
			runtime.Gosched()
		}
	}
}
