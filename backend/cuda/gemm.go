package cuda

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"kiln/backend/cuda/cu"
)

// GEMM is the device's large-matrix-product rate, the limit a prefill is
// compared with: n×n×n products through cuBLASLt in the compute dtype, on
// random data (constant or zero inputs draw less power and can run faster
// than real data), with the fastest of the algorithms cuBLASLt's heuristic
// offers for the shape, so that the reference is the best cuBLASLt does
// rather than its first guess.
type GEMM struct {
	d     *cu.Device
	lt    *cu.BlasLt
	bufs  [3]cu.Ptr
	timer streamTimer
	mm    cu.Matmul
	// Choice says which algorithm was kept and what the others gave.
	Choice string
}

// NewGEMM prepares the n×n×n product in dtype act and picks its fastest
// algorithm (each candidate timed over 3 runs after a warm-up).
func (b *Backend) NewGEMM(act cu.DType, n int) (*GEMM, error) {
	d := b.Device
	g := &GEMM{d: d}
	var err error
	if g.lt, err = d.NewBlasLt(32 << 20); err != nil {
		return nil, err
	}
	for i := range g.bufs {
		if g.bufs[i], err = d.Alloc(n * n * act.Size()); err != nil {
			g.Close()
			return nil, err
		}
	}
	if g.timer, err = newStreamTimer(d); err != nil {
		g.Close()
		return nil, err
	}
	if err := g.fill(act, n*n); err != nil {
		g.Close()
		return nil, err
	}
	g.mm = cu.Matmul{T: n, K: n, N: n, In: act, Out: act, X: g.bufs[0], W: g.bufs[1], Dst: g.bufs[2], Stream: g.timer.s}
	if err := g.choose(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// fill writes N(0,1) values into both inputs: a random block of 1M values
// uploaded over and over (the block length is not a multiple of a row, so
// rows differ).
func (g *GEMM) fill(act cu.DType, elems int) error {
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]float32, 1<<20+17)
	for i := range vals {
		vals[i] = float32(r.NormFloat64())
	}
	block := make([]byte, len(vals)*act.Size())
	encode(vals, act, block)
	bytes := elems * act.Size()
	for _, p := range g.bufs[:2] {
		for off := 0; off < bytes; off += len(block) {
			if err := g.d.Upload(p.Add(off), block[:min(len(block), bytes-off)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// choose times each candidate algorithm and keeps the fastest.
func (g *GEMM) choose() error {
	n, err := g.lt.Algorithms(g.mm)
	if err != nil {
		return err
	}
	rates := make([]float64, n)
	best := -1
	for i := range rates {
		g.mm.Algo = i
		if rates[i], err = g.median(3); err != nil {
			continue // an algorithm that fails to run is not chosen
		}
		if best < 0 || rates[i] > rates[best] {
			best = i
		}
	}
	if best < 0 {
		return fmt.Errorf("cuda: no cuBLASLt algorithm ran the %d³ product: %w", g.mm.T, err)
	}
	g.mm.Algo = best
	g.Choice = fmt.Sprintf("cuBLASLt algorithm %d of the heuristic's %d: %.1f TFLOP/s (its first choice: %.1f)",
		best, n, rates[best]/1e12, rates[0]/1e12)
	return nil
}

// Rate is the median FLOP/s of 5 products (after a warm-up) with the chosen
// algorithm.
func (g *GEMM) Rate() (float64, error) { return g.median(5) }

func (g *GEMM) median(reps int) (float64, error) {
	var ms []float64
	for i := 0; i <= reps; i++ { // the first run warms up
		t, err := g.timer.time(func() error { return g.lt.Matmul(g.mm) })
		if err != nil {
			return 0, err
		}
		if i > 0 {
			ms = append(ms, float64(t))
		}
	}
	slices.Sort(ms)
	n := float64(g.mm.T)
	return 2 * n * n * n / (ms[len(ms)/2] / 1e3), nil
}

// Close frees the buffers, the timer and the handle.
func (g *GEMM) Close() {
	for _, p := range g.bufs {
		if p != 0 {
			g.d.Free(p)
		}
	}
	g.timer.close()
	if g.lt != nil {
		g.lt.Close()
	}
}
