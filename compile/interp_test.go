package compile

// A reference interpreter for graphs, used to check that compilation
// preserves what a graph computes. It runs one sequence, in float64, with a
// KV cache per layer; it favours being obviously right over being fast.

import (
	"fmt"
	"math"
	"testing"

	"kiln/arch"
	"kiln/internal/testmodel"
	"kiln/ir"
	"kiln/model"
)

type interp struct {
	cache map[int][][2][]float64 // layer -> position -> (k, v), each kvHeads·headDim
}

func newInterp() *interp { return &interp{cache: map[int][][2][]float64{}} }

// step runs g on tokens at positions (one sequence) and returns the graph
// outputs, each as a flat row-major slice, for the given logit rows.
func (in *interp) step(g *ir.Graph, tokens, positions []int, rows []int) ([][]float64, error) {
	T := len(tokens)
	vals := map[*ir.Value][]float64{}
	cols := func(v *ir.Value) int { return v.Shape.Last() }
	for _, n := range g.Nodes {
		x := func(i int) []float64 { return vals[n.Inputs[i]] }
		var outs [][]float64
		switch n.Op {
		case ir.Tokens, ir.Positions:
			src := tokens
			if n.Op == ir.Positions {
				src = positions
			}
			o := make([]float64, T)
			for i, t := range src {
				o[i] = float64(t)
			}
			outs = [][]float64{o}
		case ir.Weight, ir.Const:
			f, err := n.Attrs.Tensor.F32s()
			if err != nil {
				return nil, err
			}
			o := make([]float64, len(f))
			for i, v := range f {
				o[i] = float64(v)
			}
			outs = [][]float64{o}
		case ir.RopeTable:
			t, err := ropeTable(n.Attrs.Rope)
			if err != nil {
				return nil, err
			}
			f, _ := t.F32s()
			o := make([]float64, len(f))
			for i, v := range f {
				o[i] = float64(v)
			}
			outs = [][]float64{o}
		case ir.Embed:
			d := cols(n.Inputs[0])
			o := make([]float64, 0, T*d)
			for _, id := range x(1) {
				o = append(o, x(0)[int(id)*d:int(id+1)*d]...)
			}
			if sc := n.Attrs.Scale; sc != 0 {
				for i := range o {
					o[i] *= float64(sc)
				}
			}
			outs = [][]float64{o}
		case ir.RMSNorm:
			outs = [][]float64{rmsnorm(x(0), x(1), float64(n.Attrs.Eps))}
		case ir.AddRMSNorm:
			s := add(x(0), x(1))
			outs = [][]float64{s, rmsnorm(s, x(2), float64(n.Attrs.Eps))}
		case ir.MatMul:
			outs = [][]float64{matmul(x(0), x(1), cols(n.Inputs[0]))}
		case ir.Add:
			outs = [][]float64{add(x(0), x(1))}
		case ir.AddBias:
			a, b := x(0), x(1)
			o := make([]float64, len(a))
			for i := range a {
				o[i] = a[i] + b[i%len(b)]
			}
			outs = [][]float64{o}
		case ir.SiLU:
			outs = [][]float64{silu(x(0))}
		case ir.GELUTanh:
			o := make([]float64, len(x(0)))
			for i, v := range x(0) {
				o[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
			}
			outs = [][]float64{o}
		case ir.SoftCap:
			o := make([]float64, len(x(0)))
			for i, v := range x(0) {
				o[i] = float64(n.Attrs.Cap) * math.Tanh(v/float64(n.Attrs.Cap))
			}
			outs = [][]float64{o}
		case ir.Mul:
			outs = [][]float64{mul(x(0), x(1))}
		case ir.SwiGLU:
			outs = [][]float64{mul(silu(x(0)), x(1))}
		case ir.RoPE:
			outs = [][]float64{rope(x(0), x(1), x(2), n.Attrs.Heads, n.Attrs.HeadDim, n.Attrs.Interleaved)}
		case ir.MatMulBias:
			o, b := matmul(x(0), x(1), cols(n.Inputs[0])), x(2)
			for i := range o {
				o[i] += b[i%len(b)]
			}
			outs = [][]float64{o}
		case ir.SwiGLUPacked:
			gu, d := x(0), cols(n.Inputs[0])
			g, u := columns(gu, d, 0, d/2), columns(gu, d, d/2, d/2)
			outs = [][]float64{mul(silu(g), u)}
		case ir.KVWrite, ir.RoPEKVWrite, ir.RoPEQKVWrite:
			a := n.Attrs
			var k, v []float64
			switch n.Op {
			case ir.KVWrite:
				k, v = x(0), x(1)
			case ir.RoPEKVWrite:
				k, v = rope(x(0), x(2), x(3), a.KVHeads, a.HeadDim, a.Interleaved), x(1)
			case ir.RoPEQKVWrite:
				qkv, d, qw, kw := x(0), cols(n.Inputs[0]), a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
				q := rope(columns(qkv, d, 0, qw), x(1), x(2), a.Heads, a.HeadDim, a.Interleaved)
				k = rope(columns(qkv, d, qw, kw), x(1), x(2), a.KVHeads, a.HeadDim, a.Interleaved)
				v = columns(qkv, d, qw+kw, kw)
				outs = append(outs, q)
			}
			w := a.KVHeads * a.HeadDim
			for t := 0; t < T; t++ {
				p := positions[t]
				for len(in.cache[a.Layer]) <= p {
					in.cache[a.Layer] = append(in.cache[a.Layer], [2][]float64{})
				}
				in.cache[a.Layer][p] = [2][]float64{k[t*w : (t+1)*w], v[t*w : (t+1)*w]}
			}
			outs = append(outs, nil)
		case ir.Attention:
			outs = [][]float64{in.attention(x(0), positions, n.Attrs)}
		case ir.SelectRows:
			d := cols(n.Inputs[0])
			var o []float64
			for _, r := range rows {
				o = append(o, x(0)[r*d:(r+1)*d]...)
			}
			outs = [][]float64{o}
		case ir.Split:
			a, d := x(0), cols(n.Inputs[0])
			off := 0
			for _, s := range n.Attrs.Sizes {
				outs = append(outs, columns(a, d, off, s))
				off += s
			}
		case ir.ConcatRows:
			var o []float64
			for i := range n.Inputs {
				o = append(o, x(i)...)
			}
			outs = [][]float64{o}
		default:
			return nil, fmt.Errorf("interp: no %v", n.Op)
		}
		for i, o := range outs {
			vals[n.Outputs[i]] = o
		}
	}
	var res [][]float64
	for _, o := range g.Outputs {
		res = append(res, vals[o])
	}
	return res, nil
}

func (in *interp) attention(q []float64, positions []int, a ir.Attrs) []float64 {
	T := len(positions)
	w := a.Heads * a.HeadDim
	o := make([]float64, T*w)
	group := a.Heads / a.KVHeads
	for t := 0; t < T; t++ {
		p := positions[t]
		lo := 0
		if a.Window > 0 && p-a.Window+1 > 0 {
			lo = p - a.Window + 1
		}
		for h := 0; h < a.Heads; h++ {
			qh := q[t*w+h*a.HeadDim : t*w+(h+1)*a.HeadDim]
			kvh := h / group
			scores := make([]float64, 0, p+1)
			maxS := math.Inf(-1)
			for j := lo; j <= p; j++ {
				k := in.cache[a.Layer][j][0][kvh*a.HeadDim : (kvh+1)*a.HeadDim]
				s := 0.0
				for c := range qh {
					s += qh[c] * k[c]
				}
				s *= float64(a.Scale)
				if a.Cap > 0 {
					s = float64(a.Cap) * math.Tanh(s/float64(a.Cap))
				}
				scores = append(scores, s)
				maxS = math.Max(maxS, s)
			}
			sum := 0.0
			for i := range scores {
				scores[i] = math.Exp(scores[i] - maxS)
				sum += scores[i]
			}
			out := o[t*w+h*a.HeadDim : t*w+(h+1)*a.HeadDim]
			for i, j := 0, lo; j <= p; i, j = i+1, j+1 {
				v := in.cache[a.Layer][j][1][kvh*a.HeadDim : (kvh+1)*a.HeadDim]
				for c := range out {
					out[c] += scores[i] / sum * v[c]
				}
			}
		}
	}
	return o
}

// matmul returns a[r,k]·w[n,k]ᵀ.
func matmul(a, w []float64, k int) []float64 {
	r, nOut := len(a)/k, len(w)/k
	o := make([]float64, r*nOut)
	for i := 0; i < r; i++ {
		for j := 0; j < nOut; j++ {
			s := 0.0
			for c := 0; c < k; c++ {
				s += a[i*k+c] * w[j*k+c]
			}
			o[i*nOut+j] = s
		}
	}
	return o
}

// columns returns columns [off, off+n) of the row-major matrix a of d columns.
func columns(a []float64, d, off, n int) []float64 {
	var o []float64
	for r := 0; r < len(a)/d; r++ {
		o = append(o, a[r*d+off:r*d+off+n]...)
	}
	return o
}

func add(a, b []float64) []float64 {
	o := make([]float64, len(a))
	for i := range a {
		o[i] = a[i] + b[i]
	}
	return o
}

func mul(a, b []float64) []float64 {
	o := make([]float64, len(a))
	for i := range a {
		o[i] = a[i] * b[i]
	}
	return o
}

func silu(a []float64) []float64 {
	o := make([]float64, len(a))
	for i, v := range a {
		o[i] = v / (1 + math.Exp(-v))
	}
	return o
}

func rmsnorm(x, w []float64, eps float64) []float64 {
	d := len(w)
	o := make([]float64, len(x))
	for r := 0; r < len(x)/d; r++ {
		row := x[r*d : (r+1)*d]
		ss := 0.0
		for _, v := range row {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(d)+eps)
		for i, v := range row {
			o[r*d+i] = v * inv * w[i]
		}
	}
	return o
}

func rope(x, pos, table []float64, heads, hd int, interleaved bool) []float64 {
	o := make([]float64, len(x))
	w := heads * hd
	half := hd / 2
	for t := 0; t < len(x)/w; t++ {
		p := int(pos[t])
		for h := 0; h < heads; h++ {
			base := t*w + h*hd
			for i := 0; i < half; i++ {
				c, s := table[p*hd+i], table[p*hd+half+i]
				a, b := base+i, base+i+half
				if interleaved {
					a, b = base+2*i, base+2*i+1
				}
				o[a] = x[a]*c - x[b]*s
				o[b] = x[a]*s + x[b]*c
			}
		}
	}
	return o
}

// randomModel is tinyModel(c) with weights drawn from a seeded generator.
func randomModel(c model.Config, seed uint64) *model.Model { return testmodel.Random(c, seed) }

// Compiling must not change what the graph computes: the tiny Llama with
// random weights, run by the interpreter before and after compilation, over a
// prompt step and two decode steps (which read the cache the passes write).
func TestCompilePreservesResults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target Target
		edit   func(c *model.Config)
	}{
		{"llama", everything, nil},
		{"qkv bias", everything, func(c *model.Config) { c.QKVBias = true }},
		{"interleaved rope", everything, func(c *model.Config) { c.RopeStyle = model.RopeInterleaved }},
		{"sliding window", everything, func(c *model.Config) { c.SlidingWindow = 3 }},
		{"tied, llama3 scaling", everything, func(c *model.Config) {
			c.TiedEmbeddings = true
			c.RopeScaling = model.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16}
		}},
		{"three layers, 4 heads over 2", everything, func(c *model.Config) {
			c.NumLayers, c.NumHeads, c.NumKVHeads, c.HiddenSize = 3, 4, 2, 16
		}},
		{"no fused ops", targetWithout(ir.AddRMSNorm, ir.SwiGLU, ir.RoPEKVWrite, ir.Split, ir.ConcatRows), nil},
		{"gemma 2", everything, func(c *model.Config) {
			c.Arch, c.NumLayers, c.NumHeads, c.NumKVHeads, c.HiddenSize = "gemma2", 3, 4, 2, 16
			c.EmbedScale, c.NormOffset, c.PostNorms, c.GELU, c.QueryScale = 4, 1, true, true, 0.3
			c.AttnSoftCap, c.FinalSoftCap, c.LayerWindows = 5, 3, []int{3, 0, 3}
		}},
		{"gemma 3", everything, func(c *model.Config) {
			c.Arch, c.NumLayers, c.NumHeads, c.NumKVHeads, c.HiddenSize, c.TiedEmbeddings = "gemma3", 3, 4, 2, 16, true
			c.EmbedScale, c.NormOffset, c.PostNorms, c.GELU, c.QKNorm = 4, 1, true, true, true
			c.LayerWindows, c.RopeLocalTheta = []int{2, 2, 0}, 500
			c.RopeScaling = model.RopeScaling{Type: "linear", Factor: 4}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig()
			if tc.edit != nil {
				tc.edit(&c)
			}
			m := randomModel(c, 7)
			build := func() *ir.Graph {
				g, err := arch.Build(m, arch.Options{})
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			ref := build()
			comp, err := Compile(build(), tc.target, Options{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			a, b := newInterp(), newInterp()
			steps := []struct{ tokens, positions, rows []int }{
				{[]int{1, 5, 9, 2, 15}, []int{0, 1, 2, 3, 4}, []int{4, 1}},
				{[]int{3}, []int{5}, []int{0}},
				{[]int{7, 0}, []int{6, 7}, []int{0, 1}},
			}
			for i, s := range steps {
				want, err := a.step(ref, s.tokens, s.positions, s.rows)
				if err != nil {
					t.Fatal(err)
				}
				got, err := b.step(comp.Graph, s.tokens, s.positions, s.rows)
				if err != nil {
					t.Fatal(err)
				}
				if len(got[0]) != len(s.rows)*c.VocabSize {
					t.Fatalf("step %d: %d logits", i, len(got[0]))
				}
				for j := range want[0] {
					if d := math.Abs(got[0][j] - want[0][j]); d > 1e-9*(1+math.Abs(want[0][j])) {
						t.Fatalf("step %d logit %d: compiled %g, reference %g", i, j, got[0][j], want[0][j])
					}
				}
			}
		})
	}
}
