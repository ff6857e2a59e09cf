package kernels

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"kiln/backend/cuda/cu"
)

// BenchmarkPeerAllReduce: the all-reduce over peer memory of the machine's
// GPUs, one rank a device (two, and every device when there are more), of
// the Llama-3-8B shape's bf16 rows of 4096 (a decode row, 64, 256 and 512
// rows: the sizes a tensor-parallel step sums), in grids of PeerSlots
// blocks, one a multiprocessor and two. Each rank queues its calls behind a
// spin, so that they run back to back, between two events on its stream;
// the time of a call is the median over groups of the slowest rank's, and
// busGB/s is NCCL's bus rate (2(n-1)/n of a rank's bytes over that time).
// Run it once (-test.bench PeerAllReduce -test.benchtime 1x).
func BenchmarkPeerAllReduce(b *testing.B) {
	rs := peerRanks(b)
	sizes := []int{2}
	if len(rs) > 2 {
		sizes = append(sizes, len(rs))
	}
	sms := rs[0].d.SMs
	for _, ranks := range sizes {
		for _, rows := range []int{1, 64, 256, 512} {
			for _, blocks := range []int{PeerSlots, sms, 2 * sms} {
				b.Run(fmt.Sprintf("ranks=%d/rows=%d/blocks=%d", ranks, rows, blocks), func(b *testing.B) {
					benchPeerAllReduce(b, rs[:ranks], rows*4096, blocks)
				})
			}
		}
	}
}

func benchPeerAllReduce(b *testing.B, rs []arRank, n, blocks int) {
	const capBytes = 4 << 20
	const calls, groups = 200, 5
	ranks := len(rs)
	regions := make([]cu.Ptr, ranks)
	streams := make([]*cu.Stream, ranks)
	srcs := make([]cu.Ptr, ranks)
	starts := make([]*cu.Event, ranks)
	ends := make([]*cu.Event, ranks)
	for i, r := range rs {
		regions[i] = allocOn(b, r.d, PeerRegionBytes(ranks, capBytes))
		must(b, ClearPeerRegion(r.d, regions[i], ranks, capBytes, nil))
		srcs[i] = allocOn(b, r.d, 2*n)
		must(b, r.d.Memset32(srcs[i], 0x3f803f80, n/2, nil)) // 1.0 in bf16
		s, err := r.d.NewStream()
		must(b, err)
		b.Cleanup(func() { s.Close() })
		streams[i] = s
		for _, e := range []**cu.Event{&starts[i], &ends[i]} {
			*e, err = r.d.NewEvent(true)
			must(b, err)
			ev := *e
			b.Cleanup(func() { ev.Close() })
		}
		must(b, r.d.Sync())
	}
	// run queues a group of calls on every rank at once, each rank from
	// its own device's thread, and returns the slowest rank's ms a call.
	run := func(count int) float64 {
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() {
				g := PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes, Blocks: blocks}
				errs[i] = r.d.Do(func() error {
					if err := r.k.Spin(streams[i], 3*time.Millisecond); err != nil {
						return err
					}
					if err := starts[i].Record(streams[i]); err != nil {
						return err
					}
					for range count {
						if err := r.k.PeerAllReduce(streams[i], g, srcs[i], srcs[i], n, cu.BF16); err != nil {
							return err
						}
					}
					return ends[i].Record(streams[i])
				})
			})
		}
		wg.Wait()
		slowest := 0.0
		for i := range rs {
			must(b, errs[i])
			must(b, ends[i].Sync())
			ms, err := cu.Elapsed(starts[i], ends[i])
			must(b, err)
			slowest = max(slowest, float64(ms)/float64(count))
		}
		return slowest
	}
	run(10)
	var times []float64
	for range groups {
		times = append(times, run(calls))
	}
	slices.Sort(times)
	ms := times[len(times)/2]
	b.ReportMetric(ms*1e3, "µs/call")
	bus := 2 * float64(ranks-1) / float64(ranks) * float64(2*n)
	b.ReportMetric(bus/(ms*1e-3)/1e9, "busGB/s")
}

// peerRanks opens every GPU of the machine (up to PeerMaxRanks) with bf16
// kernels and enables peer access between each pair, or skips the test
// when there are fewer than two or they do not reach each other's memory.
func peerRanks(t testing.TB) []arRank {
	d := gpu(t)
	count, err := cu.DeviceCount()
	if err != nil || count < 2 {
		t.Skipf("one GPU (%v)", err)
	}
	rs := []arRank{{d: d, k: kern(t, cu.BF16)}}
	for i := 1; i < min(count, PeerMaxRanks); i++ {
		di, err := cu.Open(i)
		must(t, err)
		t.Cleanup(func() { di.Close() })
		ki, err := New(di, cu.BF16)
		must(t, err)
		rs = append(rs, arRank{d: di, k: ki})
	}
	for _, a := range rs {
		for _, b := range rs {
			if a.d == b.d {
				continue
			}
			ok, err := a.d.EnablePeerAccess(b.d)
			must(t, err)
			if !ok {
				t.Skip("the devices do not reach each other's memory")
			}
		}
	}
	return rs
}
