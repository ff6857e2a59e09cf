package cuda

import (
	"math"

	"kiln/backend/cuda/cu"
)

// streamTimer times device work queued on its own stream with a pair of
// events: what the benchmark probes (Memory, GEMM) measure with.
type streamTimer struct {
	s          *cu.Stream
	start, end *cu.Event
}

func newStreamTimer(d *cu.Device) (streamTimer, error) {
	var t streamTimer
	var err error
	if t.s, err = d.NewStream(); err != nil {
		return t, err
	}
	if t.start, err = d.NewEvent(true); err != nil {
		t.close()
		return t, err
	}
	if t.end, err = d.NewEvent(true); err != nil {
		t.close()
		return t, err
	}
	return t, nil
}

// time is the stream time of the work f queues on t.s, in ms.
func (t streamTimer) time(f func() error) (float32, error) {
	if err := t.start.Record(t.s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := t.end.Record(t.s); err != nil {
		return 0, err
	}
	if err := t.end.Sync(); err != nil {
		return 0, err
	}
	return cu.Elapsed(t.start, t.end)
}

func (t streamTimer) close() {
	if t.s != nil {
		t.s.Close()
	}
	for _, e := range []*cu.Event{t.start, t.end} {
		if e != nil {
			e.Close()
		}
	}
}

// Memory measures the device's memory bandwidth, for the roofline of a
// benchmark: device-to-device copies of a buffer far larger than the L2
// cache, timed with events.
type Memory struct {
	d        *cu.Device
	n        int
	src, dst cu.Ptr
	timer    streamTimer
}

// NewMemory allocates two buffers of n bytes for the measurements.
func (b *Backend) NewMemory(n int) (*Memory, error) {
	m := &Memory{d: b.Device, n: n}
	var err error
	if m.src, err = b.Device.Alloc(n); err != nil {
		return nil, err
	}
	if m.dst, err = b.Device.Alloc(n); err != nil {
		m.Close()
		return nil, err
	}
	if m.timer, err = newStreamTimer(b.Device); err != nil {
		m.Close()
		return nil, err
	}
	if err := b.Device.Memset8(m.src, 1, n, m.timer.s); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// CopyRate is the best of reps device-to-device copies, in bytes read plus
// bytes written per second (NaN if the device failed).
func (m *Memory) CopyRate(reps int) float64 {
	best := 0.0
	for i := 0; i <= reps; i++ { // the first copy warms up
		ms, err := m.timer.time(func() error { return m.d.CopyDtoD(m.dst, m.src, m.n, m.timer.s) })
		if err != nil {
			return math.NaN()
		}
		if i > 0 {
			best = math.Max(best, 2*float64(m.n)/(float64(ms)/1e3))
		}
	}
	return best
}

// ReadRate is not measured on the GPU: 0.
func (m *Memory) ReadRate(int) float64 { return 0 }

// Close frees the buffers.
func (m *Memory) Close() {
	for _, p := range []cu.Ptr{m.src, m.dst} {
		if p != 0 {
			m.d.Free(p)
		}
	}
	m.timer.close()
}
