package cuda

import (
	"math"

	"kiln/backend/cuda/cu"
)

// Memory measures the device's memory bandwidth, for the roofline of a
// benchmark: device-to-device copies of a buffer far larger than the L2
// cache, timed with events.
type Memory struct {
	d          *cu.Device
	n          int
	src, dst   cu.Ptr
	start, end *cu.Event
	s          *cu.Stream
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
	if m.s, err = b.Device.NewStream(); err != nil {
		m.Close()
		return nil, err
	}
	if m.start, err = b.Device.NewEvent(true); err != nil {
		m.Close()
		return nil, err
	}
	if m.end, err = b.Device.NewEvent(true); err != nil {
		m.Close()
		return nil, err
	}
	if err := b.Device.Memset8(m.src, 1, n, m.s); err != nil {
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
		ms, err := m.time()
		if err != nil {
			return math.NaN()
		}
		if i > 0 {
			best = math.Max(best, 2*float64(m.n)/(float64(ms)/1e3))
		}
	}
	return best
}

func (m *Memory) time() (float32, error) {
	if err := m.start.Record(m.s); err != nil {
		return 0, err
	}
	if err := m.d.CopyDtoD(m.dst, m.src, m.n, m.s); err != nil {
		return 0, err
	}
	if err := m.end.Record(m.s); err != nil {
		return 0, err
	}
	if err := m.end.Sync(); err != nil {
		return 0, err
	}
	return cu.Elapsed(m.start, m.end)
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
	if m.s != nil {
		m.s.Close()
	}
	for _, e := range []*cu.Event{m.start, m.end} {
		if e != nil {
			e.Close()
		}
	}
}
