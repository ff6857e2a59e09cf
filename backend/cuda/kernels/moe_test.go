package kernels

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"kiln/backend/cuda/cu"
)

// TestMoE runs a mixture-of-experts layer (Kernels.MoE) on fresh random
// inputs in every activation dtype and compares it with float64: the
// router's TopK (the larger logit first, the lower index among equals),
// the softmax over the chosen or over every expert, each expert's SwiGLU
// MLP, a shared expert with and without its sigmoid gate; batches of one
// row (decode) to 300 (prefill), lists longer than a warp's group. In f16
// and bf16 the cases whose widths are multiples of 64 run again on the
// tensor-core tiles (moe_tile.cu: TileMinRows 1), lists longer than a
// tile's 64 entries among them.
func TestMoE(t *testing.T) {
	cases := []struct {
		rows, e, k         int
		norm               bool
		dim, inter, shared int
		sharedGate         bool
	}{
		{1, 8, 2, true, 256, 128, 0, false},
		{7, 16, 4, false, 128, 64, 96, true},
		{64, 64, 8, false, 256, 64, 0, false},
		{300, 8, 2, true, 128, 96, 64, false},
		{5, 256, 8, true, 64, 32, 0, false},
		{200, 8, 2, true, 128, 128, 64, true},
		{130, 64, 8, false, 256, 64, 0, false},
		{16, 4, 2, false, 64, 192, 128, false},
	}
	type run struct {
		c     int // the case
		tiled bool
	}
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		var runs []run
		for i, c := range cases {
			runs = append(runs, run{i, false})
			if act != cu.F32 && c.dim%64 == 0 && c.inter%64 == 0 && c.shared%64 == 0 {
				runs = append(runs, run{i, true})
			}
		}
		for _, r := range runs {
			c := cases[r.c]
			x := roundTo(act, randn(rng, c.rows*c.dim, 1))
			router := roundTo(act, randn(rng, c.e*c.dim, 0.3))
			type mats struct{ g, u, d []float32 }
			expert := func(w int) (mats, [3]cu.Ptr) {
				m := mats{roundTo(act, randn(rng, w*c.dim, 0.1)), roundTo(act, randn(rng, w*c.dim, 0.1)), roundTo(act, randn(rng, c.dim*w, 0.1))}
				return m, [3]cu.Ptr{up(t, act, m.g), up(t, act, m.u), up(t, act, m.d)}
			}
			es := make([]mats, c.e)
			tab := make([]uint64, 3*c.e+3)
			for e := range es {
				var p [3]cu.Ptr
				es[e], p = expert(c.inter)
				for j := range 3 {
					tab[j*c.e+e] = uint64(p[j])
				}
			}
			var sh mats
			var sgate []float32
			m := MoE{X: up(t, act, x), Router: up(t, act, router), E: c.e, K: c.k, Dim: c.dim, Inter: c.inter, Norm: c.norm,
				Out: outBuf(t, act, c.rows*c.dim), SharedInter: c.shared}
			if c.shared > 0 {
				var p [3]cu.Ptr
				sh, p = expert(c.shared)
				for j := range 3 {
					tab[3*c.e+j] = uint64(p[j])
				}
				if c.sharedGate {
					sgate = roundTo(act, randn(rng, c.dim, 0.3))
					m.SharedScale = up(t, act, sgate)
				}
			}
			pt := alloc(t, 8*len(tab))
			must(t, gpu(t).Upload(pt, cu.AsBytes(tab)))
			m.Gate, m.Up, m.Down = pt, pt.Add(8*c.e), pt.Add(16*c.e)
			s := pt.Add(24 * c.e)
			m.SharedGate, m.SharedUp, m.SharedDown = s, s.Add(8), s.Add(16)
			if r.tiled {
				m.Tiles, m.TileMinRows = gemvMod(t, act, false), 1
				if !m.tiled(c.rows) {
					t.Fatalf("case %d does not take the tiles", r.c)
				}
			}
			must(t, k.MoE(nil, m, c.rows, alloc(t, m.ScratchBytes(c.rows, act))))

			dot := func(a, b []float32) float64 {
				var v float64
				for i := range a {
					v += float64(a[i]) * float64(b[i])
				}
				return v
			}
			ref := make([]float64, c.rows*c.dim)
			for r := range c.rows {
				xr := x[r*c.dim : (r+1)*c.dim]
				o := ref[r*c.dim : (r+1)*c.dim]
				lg := make([]float64, c.e)
				idx := make([]int, c.e)
				for e := range lg {
					lg[e], idx[e] = dot(xr, router[e*c.dim:(e+1)*c.dim]), e
				}
				slices.SortStableFunc(idx, func(a, b int) int { return -cmpFloat(lg[a], lg[b]) })
				sum := 0.0
				for j := range c.e {
					if j < c.k || !c.norm {
						sum += math.Exp(lg[idx[j]] - lg[idx[0]])
					}
				}
				mlp := func(w mats, width int, p float64) {
					h := make([]float64, width)
					for n := range h {
						g, u := dot(xr, w.g[n*c.dim:(n+1)*c.dim]), dot(xr, w.u[n*c.dim:(n+1)*c.dim])
						h[n] = g / (1 + math.Exp(-g)) * u
					}
					for d := range o {
						var v float64
						for n := range h {
							v += float64(w.d[d*width+n]) * h[n]
						}
						o[d] += p * v
					}
				}
				for j := range c.k {
					mlp(es[idx[j]], c.inter, math.Exp(lg[idx[j]]-lg[idx[0]])/sum)
				}
				if c.shared > 0 {
					p := 1.0
					if c.sharedGate {
						p = 1 / (1 + math.Exp(-dot(xr, sgate)))
					}
					mlp(sh, c.shared, p)
				}
			}
			what := fmt.Sprintf("moe rows=%d experts=%d/%d norm=%v dim=%d width=%d shared=%d gate=%v tiled=%v", c.rows, c.k, c.e, c.norm, c.dim, c.inter, c.shared, c.sharedGate, r.tiled)
			// h is rounded to the activation dtype between the products.
			report(t, act, what, compare(t, what, down(t, act, m.Out, c.rows*c.dim), ref, 2*tol(act)))
		}
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
