package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"kiln/backend"
)

// Comm is one rank's side of a tensor-parallel group's collectives, as the
// CPU backend's AllReduce and AllGather kernels call them. Every rank of the
// group calls each collective in the same order.
type Comm interface {
	Rank() int
	Ranks() int
	// AllReduce replaces buf by the sum of every rank's buf, added in rank
	// order (so that every rank gets the same bits).
	AllReduce(buf []float32) error
	// AllGather writes into dst[rows, Ranks·cols] each rank's src[rows, cols]
	// side by side, rank 0's columns first.
	AllGather(dst, src []float32, rows, cols int) error
	// Abort fails every collective waiting or to come, on every rank: a rank
	// whose step failed calls it so that the others do not wait forever.
	Abort(err error)
}

// ErrAborted is returned by the collectives of an aborted group.
var ErrAborted = errors.New("tensor parallel group aborted")

// LocalGroup returns the Comms of n ranks in one process, which exchange
// through shared memory: the group kiln runs tensor parallelism on the CPU
// with (tests of the sharding plan, and --tensor-parallel-size with
// --device cpu).
func LocalGroup(n int) []Comm {
	g := &localGroup{n: n, bufs: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	cs := make([]Comm, n)
	for i := range cs {
		cs[i] = &localComm{g: g, rank: i}
	}
	return cs
}

type localGroup struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	phase   uint64
	err     error
	bufs    [][]float32 // each rank's published buffer in the current collective
}

// wait is a barrier of the group's n ranks.
func (g *localGroup) wait() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	phase := g.phase
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.phase++
		g.cond.Broadcast()
		return nil
	}
	for g.phase == phase && g.err == nil {
		g.cond.Wait()
	}
	return g.err
}

type localComm struct {
	g    *localGroup
	rank int
	tmp  []float32
}

func (c *localComm) Rank() int  { return c.rank }
func (c *localComm) Ranks() int { return c.g.n }

func (c *localComm) Abort(err error) {
	c.g.mu.Lock()
	if c.g.err == nil {
		c.g.err = fmt.Errorf("%w: rank %d: %v", ErrAborted, c.rank, err)
	}
	c.g.cond.Broadcast()
	c.g.mu.Unlock()
}

// exchange publishes buf, waits for every rank's, runs read over them, and
// waits until every rank has read before anyone writes again.
func (c *localComm) exchange(buf []float32, read func(bufs [][]float32)) error {
	c.g.bufs[c.rank] = buf
	if err := c.g.wait(); err != nil {
		return err
	}
	read(c.g.bufs)
	return c.g.wait()
}

func (c *localComm) AllReduce(buf []float32) error {
	if cap(c.tmp) < len(buf) {
		c.tmp = make([]float32, len(buf))
	}
	sum := c.tmp[:len(buf)]
	err := c.exchange(buf, func(bufs [][]float32) {
		copy(sum, bufs[0][:len(buf)])
		for _, b := range bufs[1:] {
			for i, v := range b[:len(buf)] {
				sum[i] += v
			}
		}
	})
	if err != nil {
		return err
	}
	copy(buf, sum)
	return nil
}

func (c *localComm) AllGather(dst, src []float32, rows, cols int) error {
	n := c.g.n
	return c.exchange(src, func(bufs [][]float32) {
		for r := 0; r < rows; r++ {
			for k, b := range bufs {
				copy(dst[(r*n+k)*cols:(r*n+k+1)*cols], b[r*cols:(r+1)*cols])
			}
		}
	})
}

// NewGroup is a tensor-parallel group of n CPU backends configured as like
// is, in this process (LocalGroup), the cores shared among them.
func NewGroup(n int, like Backend) *backend.Group {
	comms := LocalGroup(n)
	threads := like.Threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	g := &backend.Group{Abort: func(err error) { comms[0].Abort(err) }}
	for _, c := range comms {
		b := like
		b.Comm, b.Threads = c, max(1, threads/n)
		g.Ranks = append(g.Ranks, &b)
	}
	return g
}
