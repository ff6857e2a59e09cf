package cu

import (
	"encoding/binary"
	"math"
	"sync"
	"testing"
)

// groupDevices opens every device for a collective test, or skips with
// fewer than two or no NCCL.
func groupDevices(t *testing.T) []*Device {
	t.Helper()
	n, err := DeviceCount()
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	if n < 2 {
		t.Skipf("%d device: collectives need two", n)
	}
	if err := NCCLAvailable(); err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	path, v := NCCLLibrary()
	t.Logf("nccl %s (version %d), %d devices", path, v, n)
	devs := []*Device{gpu(t)}
	for i := 1; i < n; i++ {
		d, err := Open(i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	return devs
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// TestNCCLCollectives: an all-reduce and an all-gather over every device,
// queued directly and replayed from captured graphs, give the exact sums
// (small integers) and the ranks' data in rank order.
func TestNCCLCollectives(t *testing.T) {
	devs := groupDevices(t)
	comms, err := NewComms(devs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := CloseComms(comms); err != nil {
			t.Error(err)
		}
	}()
	const n = 1000
	ranks := len(devs)
	type rankBufs struct {
		s          *Stream
		src, red   Ptr
		gath       Ptr
		graph      *Graph
		host       []byte
		replayRed  []byte
		replayGath []byte
	}
	bufs := make([]rankBufs, ranks)
	for r, d := range devs {
		b := &bufs[r]
		if b.s, err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
		for _, p := range []*Ptr{&b.src, &b.red} {
			if *p, err = d.Alloc(4 * n); err != nil {
				t.Fatal(err)
			}
		}
		if b.gath, err = d.Alloc(4 * n * ranks); err != nil {
			t.Fatal(err)
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((r + 1) * (i % 7))
		}
		if err := d.Upload(b.src, f32Bytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(f func(r int) error) {
		var wg sync.WaitGroup
		errs := make([]error, ranks)
		for r := range ranks {
			wg.Go(func() { errs[r] = f(r) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	check := func(what string, red, gath func(r int) []byte) {
		for r := range ranks {
			rb, gb := red(r), gath(r)
			for i := 0; i < n; i++ {
				want := float32(ranks * (ranks + 1) / 2 * (i % 7)) // Σ (r+1)·(i%7)
				if got := math.Float32frombits(binary.LittleEndian.Uint32(rb[4*i:])); got != want {
					t.Fatalf("%s: rank %d all-reduce element %d is %g, want %g", what, r, i, got, want)
				}
				for k := range ranks {
					want := float32((k + 1) * (i % 7))
					if got := math.Float32frombits(binary.LittleEndian.Uint32(gb[4*(k*n+i):])); got != want {
						t.Fatalf("%s: rank %d all-gather of rank %d element %d is %g, want %g", what, r, k, i, got, want)
					}
				}
			}
		}
	}
	download := func(r int, p Ptr, size int) []byte {
		b := make([]byte, size)
		if err := devs[r].Download(b, p); err != nil {
			t.Fatal(err)
		}
		return b
	}
	queue := func(r int) error {
		b := &bufs[r]
		if err := comms[r].AllReduce(b.red, b.src, n, F32, b.s); err != nil {
			return err
		}
		return comms[r].AllGather(b.gath, b.src, n, F32, b.s)
	}
	run(func(r int) error {
		if err := queue(r); err != nil {
			return err
		}
		return bufs[r].s.Sync()
	})
	check("direct", func(r int) []byte { return download(r, bufs[r].red, 4*n) }, func(r int) []byte { return download(r, bufs[r].gath, 4*n*ranks) })
	// Captured: clear the outputs, capture on every rank, replay twice.
	run(func(r int) error {
		b := &bufs[r]
		if err := devs[r].Upload(b.red, make([]byte, 4*n)); err != nil {
			return err
		}
		if err := devs[r].Upload(b.gath, make([]byte, 4*n*ranks)); err != nil {
			return err
		}
		return devs[r].Do(func() error {
			if err := b.s.BeginCapture(); err != nil {
				return err
			}
			if err := queue(r); err != nil {
				b.s.EndCapture()
				return err
			}
			g, err := b.s.EndCapture()
			b.graph = g
			return err
		})
	})
	for range 2 {
		run(func(r int) error {
			if err := bufs[r].graph.Launch(bufs[r].s); err != nil {
				return err
			}
			return bufs[r].s.Sync()
		})
	}
	check("graph", func(r int) []byte { return download(r, bufs[r].red, 4*n) }, func(r int) []byte { return download(r, bufs[r].gath, 4*n*ranks) })
	for r := range bufs {
		bufs[r].graph.Close()
	}
}
