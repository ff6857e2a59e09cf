package workers

import (
	"sync/atomic"
	"testing"
	"time"
)

// countTask records how often each index was visited and checks chunk bounds.
type countTask struct {
	hits  []atomic.Int32
	grain int
	n     int
	bad   atomic.Int32
}

func (c *countTask) Do(lo, hi int) {
	if lo < 0 || hi > c.n || lo >= hi || lo%c.grain != 0 || (hi != c.n && hi%c.grain != 0) {
		c.bad.Add(1)
	}
	for i := lo; i < hi; i++ {
		c.hits[i].Add(1)
	}
}

func TestRunCoversEachIndexOnce(t *testing.T) {
	for _, size := range []int{0, 1, 2, 3, 8} {
		p := New(size)
		for _, n := range []int{0, 1, 2, 3, 7, 64, 1000, 4097} {
			for _, grain := range []int{0, 1, 3, 16, 5000} {
				for rep := 0; rep < 3; rep++ {
					g := max(grain, 1)
					c := &countTask{hits: make([]atomic.Int32, n), grain: g, n: n}
					p.Run(n, grain, c)
					if c.bad.Load() != 0 {
						t.Fatalf("size %d n %d grain %d: bad chunk bounds", size, n, grain)
					}
					for i := range c.hits {
						if h := c.hits[i].Load(); h != 1 {
							t.Fatalf("size %d n %d grain %d: index %d visited %d times", size, n, grain, i, h)
						}
					}
				}
			}
		}
		p.Close()
		p.Close()
		// Runs after Close still work (inline).
		c := &countTask{hits: make([]atomic.Int32, 10), grain: 1, n: 10}
		p.Run(10, 1, c)
		for i := range c.hits {
			if c.hits[i].Load() != 1 {
				t.Fatal("run after close")
			}
		}
	}
}

type sumTask struct {
	parts [64]int64
	xs    []int64
}

func (s *sumTask) Do(lo, hi int) {
	var acc int64
	for _, v := range s.xs[lo:hi] {
		acc += v
	}
	atomic.AddInt64(&s.parts[lo%64], acc)
}

func TestManyRunsNoAlloc(t *testing.T) {
	p := New(4)
	defer p.Close()
	s := &sumTask{xs: make([]int64, 10000)}
	for i := range s.xs {
		s.xs[i] = int64(i)
	}
	want := int64(len(s.xs)) * int64(len(s.xs)-1) / 2
	for r := 0; r < 2000; r++ {
		s.parts = [64]int64{}
		p.Run(len(s.xs), 1+r%700, s)
		var got int64
		for _, v := range s.parts {
			got += v
		}
		if got != want {
			t.Fatalf("run %d: sum %d, want %d", r, got, want)
		}
	}
	allocs := testing.AllocsPerRun(200, func() { p.Run(len(s.xs), 100, s) })
	if allocs != 0 {
		t.Fatalf("Run allocates %v times per call", allocs)
	}
}

type nopTask struct{ x atomic.Int64 }

func (t *nopTask) Do(lo, hi int) { t.x.Add(int64(hi - lo)) }

// BenchmarkRunTiny measures the fixed cost of a parallel Run whose work is
// negligible (two chunks, one per worker of a 2-worker pool).
func BenchmarkRunTiny(b *testing.B) {
	p := New(0)
	defer p.Close()
	t := &nopTask{}
	b.ReportAllocs()
	for b.Loop() {
		p.Run(2*p.Size(), 1, t)
	}
}

// BenchmarkRunTinyIdle is RunTiny with a pause between runs long enough that
// the helpers park, so it includes the wake-up latency. ns/op includes the
// pause; the metric ns/run is the Run alone.
func BenchmarkRunTinyIdle(b *testing.B) {
	p := New(0)
	defer p.Close()
	t := &nopTask{}
	var total time.Duration
	for b.Loop() {
		time.Sleep(200 * time.Microsecond)
		start := time.Now()
		p.Run(2*p.Size(), 1, t)
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/run")
}
