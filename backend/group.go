package backend

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"kiln/compile"
	"kiln/ir"
)

// Group is a tensor-parallel group: one backend per rank, rank 0 first. The
// engine compiles rank r's shard of the graph (compile.Options.Shard) for
// Ranks[r] and loads the shards together with LoadShards; every step then
// runs on every rank at once, each rank's collectives meeting the others',
// and rank 0 returns the logits or ids.
type Group struct {
	Ranks []Backend
	// Abort, when set, fails every rank's collectives now and to come: the
	// group calls it when a rank's step fails, so that the other ranks
	// return instead of waiting for it. The group is unusable after.
	Abort func(error)
}

// Name implements compile.Target: rank 0's, times the ranks.
func (g *Group) Name() string { return fmt.Sprintf("%s×%d", g.Ranks[0].Name(), len(g.Ranks)) }

// Supports implements compile.Target: the ops every rank implements.
func (g *Group) Supports(op ir.Op) bool {
	for _, b := range g.Ranks {
		if !b.Supports(op) {
			return false
		}
	}
	return true
}

// Load implements Backend; a group loads shards (LoadShards) instead.
func (g *Group) Load(*compile.Compiled) (Loaded, error) {
	return nil, errors.New("backend: a tensor-parallel group loads one shard a rank (LoadShards)")
}

// LoadShards loads cs[r] on rank r, each rank at once.
func (g *Group) LoadShards(cs []*compile.Compiled) (Loaded, error) {
	if len(cs) != len(g.Ranks) {
		return nil, fmt.Errorf("backend: %d shards for %d ranks", len(cs), len(g.Ranks))
	}
	l := &groupLoaded{g: g, cs: cs, ranks: make([]Loaded, len(cs))}
	err := l.each(false, func(r int) error {
		var err error
		l.ranks[r], err = g.Ranks[r].Load(cs[r])
		return err
	})
	if err != nil {
		l.Close()
		return nil, err
	}
	l.workers = workersOf(l.ranks)
	return l, nil
}

type groupLoaded struct {
	g     *Group
	cs    []*compile.Compiled
	ranks []Loaded
	// workers are the ranks' Workers, nil unless every rank has one
	// (workersOf): each's steps go to them.
	workers []Worker
	// failed is why the group's collectives were aborted (a rank's step
	// failed while the others could wait in a collective): every step
	// after fails with it (ErrGroupAborted).
	failed error
}

// ErrGroupAborted marks the error of a step on a tensor-parallel group
// whose collectives were aborted after a rank's step failed: the group
// cannot run steps any more (the process must start again).
var ErrGroupAborted = errors.New("tensor-parallel group aborted")

// each runs f for every rank at once and returns the first failure (the
// first in time: a rank whose collective another rank's failure aborted
// fails after it); when steps is set, a failure aborts the group's
// collectives (the other ranks may be waiting in one for the rank that
// failed) and the group fails every step after. A step is handed to each
// rank's own worker where every rank has one (Worker), else run on a
// goroutine a rank.
func (l *groupLoaded) each(steps bool, f func(r int) error) error {
	if steps && l.failed != nil {
		return l.failed
	}
	var (
		mu    sync.Mutex
		first = -1
		errs  = make([]error, len(l.g.Ranks))
	)
	record := func(r int, err error) {
		mu.Lock()
		errs[r] = err
		isFirst := first < 0
		if isFirst {
			first = r
		}
		mu.Unlock()
		if isFirst && steps && l.g.Abort != nil {
			l.g.Abort(err)
		}
	}
	run := func(r int) {
		defer func() {
			if p := recover(); p != nil {
				record(r, fmt.Errorf("panic: %v", p))
			}
		}()
		if err := f(r); err != nil {
			record(r, err)
		}
	}
	if ws := l.workers; steps && ws != nil {
		// A rank whose worker cannot take the step fails it at once, so
		// that the abort frees the ranks already waiting for it.
		waits := make([]func() error, len(ws))
		for r, w := range ws {
			wait, err := w.Go(func() error { run(r); return nil })
			if err != nil {
				record(r, err)
				continue
			}
			waits[r] = wait
		}
		for _, wait := range waits {
			if wait != nil {
				wait() // run recorded f's error
			}
		}
	} else {
		var wg sync.WaitGroup
		for r := range errs {
			wg.Go(func() { run(r) })
		}
		wg.Wait()
	}
	if first < 0 {
		return nil
	}
	err := fmt.Errorf("rank %d: %w", first, errs[first])
	if steps && l.g.Abort != nil {
		l.failed = fmt.Errorf("%w: %w", ErrGroupAborted, err)
		return l.failed
	}
	return err
}

// workersOf returns every rank's Worker, or nil unless every rank has one.
func workersOf(ranks []Loaded) []Worker {
	ws := make([]Worker, len(ranks))
	for r, x := range ranks {
		w, ok := x.(Worker)
		if !ok {
			return nil
		}
		ws[r] = w
	}
	return ws
}

func (l *groupLoaded) Close() error {
	var errs []error
	for _, x := range l.ranks {
		if x != nil {
			errs = append(errs, x.Close())
		}
	}
	return errors.Join(errs...)
}

func (l *groupLoaded) NewKVCache(spec KVSpec) (KVCache, error) {
	kv := &groupKV{ranks: make([]KVCache, len(l.ranks))}
	for r, x := range l.ranks {
		var err error
		if kv.ranks[r], err = x.NewKVCache(spec); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return kv, nil
}

// Executable builds the bucket of p on every rank (each from its own
// shard's plan of that bucket).
func (l *groupLoaded) Executable(p *compile.Plan) (Executable, error) {
	x := &groupExec{l: l, ranks: make([]Executable, len(l.ranks))}
	sampling := true
	for r, lr := range l.ranks {
		pr, err := l.cs[r].Plan(p.Bucket)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		if x.ranks[r], err = lr.Executable(pr); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		_, ok := x.ranks[r].(SamplingExecutable)
		sampling = sampling && ok
	}
	if sampling {
		return &samplingGroupExec{x}, nil
	}
	return x, nil
}

// ReserveSteps implements StepReserver for ranks that reserve (the others,
// such as the CPU, allocate nothing a step).
func (l *groupLoaded) ReserveSteps(plans []*compile.Plan, maxSeqs, context int) error {
	return l.each(false, func(r int) error {
		sr, ok := l.ranks[r].(StepReserver)
		if !ok {
			return nil
		}
		var ps []*compile.Plan
		for _, p := range plans {
			pr, err := l.cs[r].Plan(p.Bucket)
			if err != nil {
				return err
			}
			ps = append(ps, pr)
		}
		return sr.ReserveSteps(ps, maxSeqs, context)
	})
}

// FreeMemory implements MemoryReporter: the least any rank has (every
// rank's cache is the same size), divided among the ranks when they share
// one memory (SharedMemory: CPU ranks).
func (l *groupLoaded) FreeMemory() (int64, error) {
	var least int64 = -1
	shared := true
	for r, x := range l.ranks {
		sm, ok := x.(SharedMemory)
		shared = shared && ok && sm.SharesHostMemory()
		m, ok := x.(MemoryReporter)
		if !ok {
			return 0, fmt.Errorf("rank %d reports no memory", r)
		}
		f, err := m.FreeMemory()
		if err != nil {
			return 0, fmt.Errorf("rank %d: %w", r, err)
		}
		if least < 0 || f < least {
			least = f
		}
	}
	if shared {
		least /= int64(len(l.ranks))
	}
	return least, nil
}

// KVBytes implements MemoryReporter: one rank's cache.
func (l *groupLoaded) KVBytes(spec KVSpec) int64 {
	if m, ok := l.ranks[0].(MemoryReporter); ok {
		return m.KVBytes(spec)
	}
	return spec.Bytes()
}

// Shards returns the loaded shard of each rank, rank 0 first.
func (l *groupLoaded) Shards() []Loaded { return slices.Clone(l.ranks) }

type groupKV struct{ ranks []KVCache }

// Spec is one rank's cache (each holds its KVHeads).
func (kv *groupKV) Spec() KVSpec { return kv.ranks[0].Spec() }

func (kv *groupKV) CopyBlocks(pairs [][2]int32) error {
	for r, c := range kv.ranks {
		if err := c.CopyBlocks(pairs); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

type groupExec struct {
	l     *groupLoaded
	ranks []Executable
}

func (x *groupExec) Kernels() []string { return x.ranks[0].Kernels() }

func (x *groupExec) cache(kv KVCache) (*groupKV, error) {
	g, ok := kv.(*groupKV)
	if !ok || len(g.ranks) != len(x.ranks) {
		return nil, fmt.Errorf("backend: kv cache %T is not this group's", kv)
	}
	return g, nil
}

// Run runs the step on every rank; rank 0 copies the logits, the others
// run it with nil logits (every rank's step the same, only the copy left
// out: their collectives must match rank 0's).
func (x *groupExec) Run(b *Batch, kv KVCache, logits []float32) error {
	g, err := x.cache(kv)
	if err != nil {
		return err
	}
	return x.l.each(true, func(r int) error {
		if r == 0 {
			return x.ranks[0].Run(b, g.ranks[0], logits)
		}
		return x.ranks[r].Run(b, g.ranks[r], nil)
	})
}

type samplingGroupExec struct{ *groupExec }

// RunSample runs the step on every rank, each given ids, params and the
// draws whole: each rank writes the ids of the rows it samples, no two
// ranks the same row (a rank may sample every row, a share of them, or
// none; CUDA ranks split the rows where they reach each other's memory,
// else rank 0 samples them all).
func (x *samplingGroupExec) RunSample(b *Batch, kv KVCache, params []SampleParams, ids []int32) error {
	g, err := x.cache(kv)
	if err != nil {
		return err
	}
	return x.l.each(true, func(r int) error {
		return x.ranks[r].(SamplingExecutable).RunSample(b, g.ranks[r], params, ids)
	})
}
