package gemm

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSwiGLU compares SwiGLU, on the SIMD path and the pure Go one, with
// g/(1 + e^−g)·u in float64 on fresh random inputs (normal, and spread
// over ±100 past Expf's range) and at the edges (0, ±Inf, NaN), lengths
// with and without a tail past the groups of 8: within 4e-7 of the
// reference relative to max(|ref|, |u|·1e-30) (a few ulps), a NaN or
// infinite gate as the formula gives it (NaN for −Inf), and nothing
// written past out.
func TestSwiGLU(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %#x", seed)
	for _, pure := range []bool{false, true} {
		if !pure && !SIMD() {
			continue
		}
		forcePure.Store(pure)
		for _, n := range []int{1, 7, 8, 13, 64, 1003} {
			g, u := make([]float32, n), make([]float32, n)
			for i := range g {
				g[i], u[i] = float32(rng.NormFloat64()*3), float32(rng.NormFloat64())
				if i%5 == 0 {
					g[i] = float32(rng.Float64()*200 - 100)
				}
			}
			edges := []float32{0, float32(math.Inf(1)), float32(math.Inf(-1)), -87.2, -87.4, 88.6, 88.8, float32(math.NaN())}
			for i, e := range edges {
				if i < n {
					g[i] = e
				}
			}
			out := make([]float32, n+1)
			out[n] = 42
			SwiGLU(out[:n], g, u)
			if out[n] != 42 {
				t.Errorf("pure=%v n=%d: wrote past out", pure, n)
			}
			for i := range n {
				gv, uv := float64(g[i]), float64(u[i])
				want, got := gv/(1+math.Exp(-gv))*uv, float64(out[i])
				switch {
				case math.IsNaN(want) || math.IsInf(want, 0): // NaN, ±Inf gates: as the formula gives them
					if !(math.IsNaN(want) && math.IsNaN(got)) && got != want {
						t.Errorf("pure=%v n=%d: SwiGLU(%g, %g) = %g, want %g", pure, n, gv, uv, got, want)
					}
				case !(math.Abs(got-want) <= 4e-7*max(math.Abs(want), math.Abs(uv)*1e-30)):
					t.Errorf("pure=%v n=%d: SwiGLU(%g, %g) = %g, want %g", pure, n, gv, uv, got, want)
				}
			}
		}
	}
	forcePure.Store(false)
}
