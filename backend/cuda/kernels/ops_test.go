package kernels

import (
	"fmt"
	"math"
	"testing"

	"kiln/backend/cuda/cu"
)

var testRows = []int{1, 3, 17, 300}

func TestEmbed(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, wt := range allDTypes {
			for _, dim := range []int{96, 4096} {
				vocab := 1000
				tab := roundTo(wt, randn(rng, vocab*dim, 1))
				ptab := up(t, wt, tab)
				for _, rows := range testRows {
					ids := make([]int32, rows)
					for i := range ids {
						ids[i] = int32(rng.IntN(vocab))
					}
					out := outBuf(t, act, rows*dim)
					must(t, k.Embed(nil, out, ptab, wt, vocab, upI32(t, ids), rows, dim))
					ref := make([]float64, rows*dim)
					for r, id := range ids {
						for c := 0; c < dim; c++ {
							ref[r*dim+c] = float64(tab[int(id)*dim+c])
						}
					}
					w := compare(t, "embed", down(t, act, out, rows*dim), ref, tol(act))
					report(t, act, fmt.Sprintf("embed w=%v rows=%d dim=%d", wt, rows, dim), w)
				}
			}
		}
	}
}

// TestEmbedShard: a vocabulary shard's rows by the ids it holds (scaled),
// zeros for the other shards' ids; and the all-gather's interleave of rank-major
// logits by rows.
func TestEmbedShard(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		const total, vocab, start, dim, rows = 1000, 250, 500, 96, 300
		tab := roundTo(cu.BF16, randn(rng, vocab*dim, 1))
		ids := make([]int32, rows)
		for i := range ids {
			ids[i] = int32(rng.IntN(total))
		}
		out := outBuf(t, act, rows*dim)
		// Scaled by 8 as Gemma's embeddings are (√64).
		must(t, k.EmbedShard(nil, out, up(t, cu.BF16, tab), cu.BF16, vocab, upI32(t, ids), rows, dim, start, total, 8))
		ref := make([]float64, rows*dim)
		for r, id := range ids {
			if id >= start && id < start+vocab {
				for c := 0; c < dim; c++ {
					ref[r*dim+c] = 8 * float64(tab[int(id-start)*dim+c])
				}
			}
		}
		compare(t, "embed shard, scaled", down(t, act, out, rows*dim), ref, tol(act))
	}
	k := kern(t, cu.BF16)
	const ranks, n = 4, 77
	for _, rows := range testRows {
		in := randn(newRNG(t), ranks*rows*n, 1)
		out := outBuf(t, cu.F32, rows*ranks*n)
		must(t, k.InterleaveRanks(nil, out, up(t, cu.F32, in), rows, n, ranks))
		ref := make([]float64, rows*ranks*n)
		for kk := 0; kk < ranks; kk++ {
			for r := 0; r < rows; r++ {
				for c := 0; c < n; c++ {
					ref[r*ranks*n+kk*n+c] = float64(in[(kk*rows+r)*n+c])
				}
			}
		}
		compare(t, "interleave", down(t, cu.F32, out, rows*ranks*n), ref, 0)
	}
}

func refRMSNorm(x []float64, w []float32, rows, dim int, eps float32) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		var ss float64
		for c := 0; c < dim; c++ {
			ss += x[r*dim+c] * x[r*dim+c]
		}
		s := 1 / math.Sqrt(ss/float64(dim)+float64(eps))
		for c := 0; c < dim; c++ {
			out[r*dim+c] = x[r*dim+c] * s * float64(w[c])
		}
	}
	return out
}

func TestRMSNorm(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, wt := range allDTypes {
			for _, dim := range []int{96, 4096, 17, 8200} {
				w := roundTo(wt, randn(rng, dim, 1))
				pw := up(t, wt, w)
				for _, rows := range testRows {
					eps := float32(1e-5)
					x := roundTo(act, randn(rng, rows*dim, 2))
					out := outBuf(t, act, rows*dim)
					must(t, k.RMSNorm(nil, out, up(t, act, x), pw, wt, rows, dim, eps))
					e := compare(t, "rmsnorm", down(t, act, out, rows*dim), refRMSNorm(f64(x), w, rows, dim, eps), tol(act))
					report(t, act, fmt.Sprintf("rmsnorm w=%v rows=%d dim=%d", wt, rows, dim), e)

					// add_rmsnorm, out of place and in place (sum over x).
					r := roundTo(act, randn(rng, rows*dim, 1))
					sum := make([]float32, rows*dim)
					refSum := make([]float64, rows*dim)
					for i := range sum {
						refSum[i] = float64(x[i]) + float64(r[i])
						sum[i] = float32(refSum[i])
					}
					roundTo(act, sum)
					refNorm := refRMSNorm(f64(sum), w, rows, dim, eps)
					for _, inPlace := range []bool{false, true} {
						px, pr := up(t, act, x), up(t, act, r)
						ps := px
						if !inPlace {
							ps = outBuf(t, act, rows*dim)
						}
						pn := outBuf(t, act, rows*dim)
						must(t, k.AddRMSNorm(nil, ps, pn, px, pr, ProductScales{}, pw, wt, rows, dim, eps))
						e1 := compare(t, "add_rmsnorm sum", down(t, act, ps, rows*dim), refSum, tol(act))
						e2 := compare(t, "add_rmsnorm normed", down(t, act, pn, rows*dim), refNorm, tol(act))
						report(t, act, fmt.Sprintf("add_rmsnorm w=%v rows=%d dim=%d in-place=%v", wt, rows, dim, inPlace), max(e1, e2))
					}
					// x an FP8 product's, with its scales.
					px, pr := up(t, act, x), up(t, act, r)
					checkScaledReader(t, k, fmt.Sprintf("%v add_rmsnorm w=%v rows=%d dim=%d", act, wt, rows, dim), px,
						productScales(t, rng, rows, dim, 3), rows, dim,
						func() []cu.Ptr { return []cu.Ptr{outBuf(t, act, rows*dim), outBuf(t, act, rows*dim)} },
						[]int{rows * dim * act.Size(), rows * dim * act.Size()},
						func(x cu.Ptr, sc ProductScales, o []cu.Ptr) error {
							return k.AddRMSNorm(nil, o[0], o[1], x, pr, sc, pw, wt, rows, dim, eps)
						})
				}
			}
		}
	}
}

func silu64(v float64) float64 { return v / (1 + math.Exp(-v)) }

func TestElementwise(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, shape := range [][2]int{{1, 96}, {3, 96}, {17, 4096}, {300, 4096}, {7, 13}} {
			rows, cols := shape[0], shape[1]
			n := rows * cols
			a, b := roundTo(act, randn(rng, n, 3)), roundTo(act, randn(rng, n, 3))
			pa, pb := up(t, act, a), up(t, act, b)
			ref := make([]float64, n)
			run := func(op string, launch func(out cu.Ptr) error, f func(i int) float64) {
				out := outBuf(t, act, n)
				must(t, launch(out))
				for i := range ref {
					ref[i] = f(i)
				}
				e := compare(t, op, down(t, act, out, n), ref, tol(act))
				report(t, act, fmt.Sprintf("%s %dx%d", op, rows, cols), e)
			}
			run("add", func(o cu.Ptr) error { return k.Add(nil, o, pa, pb, n) }, func(i int) float64 { return float64(a[i]) + float64(b[i]) })
			run("mul", func(o cu.Ptr) error { return k.Mul(nil, o, pa, pb, n) }, func(i int) float64 { return float64(a[i]) * float64(b[i]) })
			run("silu", func(o cu.Ptr) error { return k.SiLU(nil, o, pa, n) }, func(i int) float64 { return silu64(float64(a[i])) })
			run("swiglu", func(o cu.Ptr) error { return k.SwiGLU(nil, o, pa, pb, n) }, func(i int) float64 { return silu64(float64(a[i])) * float64(b[i]) })
			run("gelu_tanh", func(o cu.Ptr) error { return k.GELUTanh(nil, o, pa, n) }, func(i int) float64 {
				x := float64(a[i])
				return x / 2 * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
			})
			// The logits' soft cap, f32 whatever the activations (cap 2
			// bends these values of spread 3).
			if act == cu.F32 {
				run("softcap", func(o cu.Ptr) error { return k.SoftCap(nil, o, pa, 2, n) }, func(i int) float64 { return 2 * math.Tanh(float64(a[i])/2) })
			}
			sr, sc := randn(rng, rows, 1), randn(rng, cols, 1)
			psr, psc := up(t, cu.F32, sr), up(t, cu.F32, sc)
			for _, c := range []struct {
				what string
				sc   ProductScales
				f    func(i int) float64
			}{
				{"rows and columns", ProductScales{psr, psc}, func(i int) float64 { return float64(sr[i/cols] * sc[i%cols]) }},
				{"rows", ProductScales{Rows: psr}, func(i int) float64 { return float64(sr[i/cols]) }},
				{"columns", ProductScales{Cols: psc}, func(i int) float64 { return float64(sc[i%cols]) }},
			} {
				run("scale_rows_cols "+c.what, func(o cu.Ptr) error { return k.ScaleRowsCols(nil, o, pa, c.sc, rows, cols) },
					func(i int) float64 { return float64(a[i]) * c.f(i) })
			}
			for _, wt := range allDTypes {
				bias := roundTo(wt, randn(rng, cols, 1))
				pbias := up(t, wt, bias)
				run("add_bias w="+wt.String(), func(o cu.Ptr) error { return k.AddBias(nil, o, pa, pbias, wt, rows, cols) },
					func(i int) float64 { return float64(a[i]) + float64(bias[i%cols]) })
			}
		}
	}
}

// ropeTable builds the folded table: row p holds cos(p·f_i) then sin(p·f_i).
func ropeTable(maxPos, hd int, theta float64) []float32 {
	tab := make([]float32, maxPos*hd)
	half := hd / 2
	for p := 0; p < maxPos; p++ {
		for i := 0; i < half; i++ {
			f := math.Pow(theta, -float64(2*i)/float64(hd))
			tab[p*hd+i] = float32(math.Cos(float64(p) * f))
			tab[p*hd+half+i] = float32(math.Sin(float64(p) * f))
		}
	}
	return tab
}

func refRoPE(x []float64, pos []int32, tab []float32, heads, hd int, interleaved bool) {
	half := hd / 2
	for t, p := range pos {
		cs := tab[int(p)*hd:]
		for h := 0; h < heads; h++ {
			v := x[(t*heads+h)*hd:]
			for i := 0; i < half; i++ {
				a, b := i, i+half
				if interleaved {
					a, b = 2*i, 2*i+1
				}
				c, s := float64(cs[i]), float64(cs[half+i])
				x1, x2 := v[a], v[b]
				v[a] = x1*c - x2*s
				v[b] = x2*c + x1*s
			}
		}
	}
}

func TestRoPE(t *testing.T) {
	const maxPos = 5000
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, hs := range [][2]int{{32, 128}, {5, 80}, {4, 64}} {
			heads, hd := hs[0], hs[1]
			tab := ropeTable(maxPos, hd, 10000)
			ptab := up(t, cu.F32, tab)
			for _, rows := range testRows {
				pos := make([]int32, rows)
				for i := range pos {
					pos[i] = int32(rng.IntN(maxPos))
				}
				ppos := upI32(t, pos)
				for _, il := range []bool{false, true} {
					for _, inPlace := range []bool{false, true} {
						n := rows * heads * hd
						x := roundTo(act, randn(rng, n, 1))
						px := up(t, act, x)
						out := px
						if !inPlace {
							out = outBuf(t, act, n)
						}
						must(t, k.RoPE(nil, out, px, ppos, ptab, rows, heads, hd, il))
						ref := f64(x)
						refRoPE(ref, pos, tab, heads, hd, il)
						e := compare(t, "rope", down(t, act, out, n), ref, tol(act))
						report(t, act, fmt.Sprintf("rope rows=%d heads=%d hd=%d interleaved=%v in-place=%v", rows, heads, hd, il, inPlace), e)
					}
				}
			}
		}
	}
}

func TestKVWrite(t *testing.T) {
	const bs = 16
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, hs := range [][2]int{{8, 128}, {1, 80}, {2, 64}} {
			kvHeads, hd := hs[0], hs[1]
			width := kvHeads * hd
			tab := ropeTable(4096, hd, 500000)
			ptab := up(t, cu.F32, tab)
			for _, rows := range testRows {
				blocks := (rows+bs-1)/bs + 5
				nslot := blocks * bs
				// Tokens land on distinct random slots.
				perm := rng.Perm(nslot)
				slots := make([]int32, rows)
				pos := make([]int32, rows)
				for i := range slots {
					slots[i] = int32(perm[i])
					pos[i] = int32(rng.IntN(4096))
				}
				for _, withRoPE := range []bool{false, true} {
					for _, il := range []bool{false, true} {
						if !withRoPE && il {
							continue
						}
						kc0 := roundTo(act, randn(rng, nslot*width, 1))
						vc0 := roundTo(act, randn(rng, nslot*width, 1))
						kx := roundTo(act, randn(rng, rows*width, 1))
						vx := roundTo(act, randn(rng, rows*width, 1))
						pkc, pvc := up(t, act, kc0), up(t, act, vc0)
						if withRoPE {
							must(t, k.RoPEKVWrite(nil, pkc, pvc, up(t, act, kx), up(t, act, vx), upI32(t, pos), upI32(t, slots), ptab, rows, kvHeads, hd, il))
						} else {
							must(t, k.KVWrite(nil, pkc, pvc, up(t, act, kx), up(t, act, vx), upI32(t, slots), rows, width))
						}
						kref, vref := f64(kc0), f64(vc0)
						kr := f64(kx)
						if withRoPE {
							refRoPE(kr, pos, tab, kvHeads, hd, il)
						}
						for i, s := range slots {
							copy(kref[int(s)*width:(int(s)+1)*width], kr[i*width:])
							copy(vref[int(s)*width:(int(s)+1)*width], f64(vx[i*width:(i+1)*width]))
						}
						op := "kv_write"
						if withRoPE {
							op = fmt.Sprintf("rope_kv_write interleaved=%v", il)
						}
						e1 := compare(t, op+" k", down(t, act, pkc, nslot*width), kref, tol(act))
						e2 := compare(t, op+" v", down(t, act, pvc, nslot*width), vref, tol(act))
						report(t, act, fmt.Sprintf("%s rows=%d kvheads=%d hd=%d", op, rows, kvHeads, hd), max(e1, e2))
					}
				}
			}
		}
	}
}

func TestSplitSelectRows(t *testing.T) {
	for _, act := range allDTypes {
		k := kern(t, act)
		rng := newRNG(t)
		for _, sizes := range [][]int{{4096, 1024, 1024}, {3, 5, 7, 11, 13}, {96, 96}} {
			cols := 0
			for _, s := range sizes {
				cols += s
			}
			for _, rows := range testRows {
				x := roundTo(act, randn(rng, rows*cols, 1))
				px := up(t, act, x)
				outs := make([]cu.Ptr, len(sizes))
				for i, s := range sizes {
					outs[i] = outBuf(t, act, rows*s)
				}
				must(t, k.Split(nil, px, rows, outs, sizes))
				worst := 0.0
				off := 0
				for i, s := range sizes {
					ref := make([]float64, rows*s)
					for r := 0; r < rows; r++ {
						for c := 0; c < s; c++ {
							ref[r*s+c] = float64(x[r*cols+off+c])
						}
					}
					worst = max(worst, compare(t, "split", down(t, act, outs[i], rows*s), ref, 0))
					off += s
				}
				report(t, act, fmt.Sprintf("split rows=%d sizes=%v", rows, sizes), worst)

				nr := rng.IntN(rows) + 1
				idx := make([]int32, nr)
				ref := make([]float64, nr*cols)
				for i := range idx {
					idx[i] = int32(rng.IntN(rows))
					copy(ref[i*cols:], f64(x[int(idx[i])*cols:(int(idx[i])+1)*cols]))
				}
				out := outBuf(t, act, nr*cols)
				must(t, k.SelectRows(nil, out, px, upI32(t, idx), nr, cols))
				e := compare(t, "select_rows", down(t, act, out, nr*cols), ref, 0)
				report(t, act, fmt.Sprintf("select_rows %d of %d rows, cols=%d", nr, rows, cols), e)
			}
		}
	}
}
