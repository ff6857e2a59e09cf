package compile

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"kiln/ir"
	"kiln/tensor"
)

// plainFreq is θ^(-2i/d), computed differently from the code under test.
func plainFreq(theta float64, i, d int) float64 {
	return math.Exp(-float64(2*i) / float64(d) * math.Log(theta))
}

// llama3Freqs follows Hugging Face's _compute_llama3_parameters step by step
// (torch.where over the whole vector).
func llama3Freqs(theta float64, d int, factor, low, high float64, orig int) []float64 {
	half := d / 2
	inv := make([]float64, half)
	wavelen := make([]float64, half)
	for i := range inv {
		inv[i] = plainFreq(theta, i, d)
		wavelen[i] = 2 * math.Pi / inv[i]
	}
	lowWavelen := float64(orig) / low
	highWavelen := float64(orig) / high
	out := make([]float64, half)
	for i := range inv {
		llama := inv[i]
		if wavelen[i] > lowWavelen {
			llama = inv[i] / factor
		}
		smooth := (float64(orig)/wavelen[i] - low) / (high - low)
		smoothed := (1-smooth)*llama/factor + smooth*llama
		isMedium := !(wavelen[i] < highWavelen) && !(wavelen[i] > lowWavelen)
		if isMedium {
			out[i] = smoothed
		} else {
			out[i] = llama
		}
	}
	return out
}

// foldTable builds a graph around one RopeTable, folds it and returns the
// constant's values.
func foldTable(t *testing.T, r ir.RopeParams) []float32 {
	t.Helper()
	b := newBuilder(t)
	pos := b.Op(ir.Positions, ir.Attrs{})
	tableNode := b.Node(ir.RopeTable, ir.Attrs{Rope: r})
	x := b.act(r.HeadDim)
	rope := b.Node(ir.RoPE, ir.Attrs{Heads: 1, HeadDim: r.HeadDim}, x, pos, tableNode.Out())
	g := b.outputs(rope.Out())
	at := indexOf(g, tableNode)
	run(t, g, "fold-constants", foldConstants, everything)
	c := g.Nodes[at]
	if c.Op != ir.Const || inGraph(g, tableNode) {
		t.Fatalf("rope table not replaced in place:\n%v", g)
	}
	if rope.Inputs[2] != c.Out() {
		t.Fatalf("rope reads %v, want the constant", rope.Inputs[2])
	}
	if !c.Out().Shape.Equal(ir.Shape{ir.Dim(r.MaxPositions), ir.Dim(r.HeadDim)}) || c.Out().DType != tensor.F32 {
		t.Fatalf("constant is %v%v", c.Out().DType, c.Out().Shape)
	}
	if !strings.HasPrefix(c.Attrs.Name, "rope_table(") || c.Attrs.Tensor.Name != c.Attrs.Name {
		t.Errorf("constant named %q / %q", c.Attrs.Name, c.Attrs.Tensor.Name)
	}
	if err := c.Attrs.Tensor.Validate(); err != nil {
		t.Fatal(err)
	}
	return f32s(t, c.Attrs.Tensor)
}

// checkTable compares rows of a folded table with cos/sin of p·freqs.
func checkTable(t *testing.T, table []float32, d int, freqs []float64, positions []int) {
	t.Helper()
	half := d / 2
	for _, p := range positions {
		for i, f := range freqs {
			cos, sin := table[p*d+i], table[p*d+half+i]
			wc, ws := math.Cos(float64(p)*f), math.Sin(float64(p)*f)
			if math.Abs(float64(cos)-wc) > 1e-6 || math.Abs(float64(sin)-ws) > 1e-6 {
				t.Errorf("position %d pair %d: cos %g sin %g, want %g %g (f=%g)", p, i, cos, sin, wc, ws, f)
			}
		}
	}
}

func TestFoldRopeTablePlain(t *testing.T) {
	r := ir.RopeParams{Theta: 10000, MaxPositions: 64, HeadDim: 8}
	table := foldTable(t, r)
	freqs := make([]float64, 4)
	for i := range freqs {
		freqs[i] = plainFreq(r.Theta, i, r.HeadDim)
	}
	checkTable(t, table, r.HeadDim, freqs, []int{0, 1, 2, 7, 33, 63})
	for i := range 4 { // position 0: no rotation
		if table[i] != 1 || table[4+i] != 0 {
			t.Errorf("row 0 = %v, want cos 1 and sin 0", table[:8])
		}
	}
	if got := RopeFrequencies(r); !closeAll(got, freqs, 1e-12) {
		t.Errorf("RopeFrequencies = %v, want %v", got, freqs)
	}
}

func closeAll(got, want []float64, rel float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > rel*math.Abs(want[i]) {
			return false
		}
	}
	return true
}

func TestFoldRopeTableLinear(t *testing.T) {
	plain := ir.RopeParams{Theta: 10000, MaxPositions: 64, HeadDim: 8}
	linear := plain
	linear.Scaling, linear.Factor = "linear", 2
	pt, lt := foldTable(t, plain), foldTable(t, linear)
	freqs := make([]float64, 4)
	for i := range freqs {
		freqs[i] = plainFreq(plain.Theta, i, plain.HeadDim) / 2
	}
	checkTable(t, lt, 8, freqs, []int{0, 1, 5, 40, 63})
	// Halved frequencies: position 2p of the scaled table is position p of
	// the plain one, exactly (halving is exact in binary).
	for p := 0; 2*p < 64; p++ {
		if !slices.Equal(lt[2*p*8:2*p*8+8], pt[p*8:p*8+8]) {
			t.Errorf("linear row %d = %v, plain row %d = %v", 2*p, lt[2*p*8:2*p*8+8], p, pt[p*8:p*8+8])
		}
	}
}

func TestFoldRopeTableLlama3(t *testing.T) {
	// Llama 3.1's parameters with a head dim of 16: pairs 0-3 have
	// wavelengths under 8192/4 (high frequency), pair 4 lies between
	// (medium), pairs 5-7 are over 8192/1 (low frequency).
	r := ir.RopeParams{
		Theta: 500000, MaxPositions: 256, HeadDim: 16,
		Scaling: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192,
	}
	want := llama3Freqs(r.Theta, r.HeadDim, r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalMaxPositions)
	plain := RopeFrequencies(ir.RopeParams{Theta: r.Theta, HeadDim: r.HeadDim})
	got := RopeFrequencies(r)
	regimes := []string{"high", "high", "high", "high", "medium", "low", "low", "low"}
	for i, reg := range regimes {
		wavelen := 2 * math.Pi / plain[i]
		switch reg {
		case "high":
			if wavelen >= 8192/4 || got[i] != plain[i] {
				t.Errorf("pair %d (wavelength %g): %g, want unchanged %g", i, wavelen, got[i], plain[i])
			}
		case "low":
			if wavelen <= 8192 || got[i] != plain[i]/8 {
				t.Errorf("pair %d (wavelength %g): %g, want %g/8", i, wavelen, got[i], plain[i])
			}
		case "medium":
			if wavelen < 8192/4 || wavelen > 8192 || !(got[i] > plain[i]/8 && got[i] < plain[i]) {
				t.Errorf("pair %d (wavelength %g): %g, want a blend strictly between %g and %g", i, wavelen, got[i], plain[i]/8, plain[i])
			}
		}
	}
	if !closeAll(got, want, 1e-12) {
		t.Errorf("RopeFrequencies = %v, want (Hugging Face) %v", got, want)
	}
	checkTable(t, foldTable(t, r), r.HeadDim, want, []int{0, 1, 3, 100, 255})
}

func TestFoldRopeTableFreqFactors(t *testing.T) {
	r := ir.RopeParams{Theta: 10000, MaxPositions: 32, HeadDim: 8, FreqFactors: []float32{1, 2, 4, 40}}
	freqs := make([]float64, 4)
	for i := range freqs {
		freqs[i] = plainFreq(r.Theta, i, r.HeadDim) / float64(r.FreqFactors[i])
	}
	checkTable(t, foldTable(t, r), r.HeadDim, freqs, []int{0, 1, 9, 31})
	// Factors apply on top of linear scaling.
	r.Scaling, r.Factor = "linear", 4
	for i := range freqs {
		freqs[i] /= 4
	}
	if got := RopeFrequencies(r); !closeAll(got, freqs, 1e-12) {
		t.Errorf("linear with factors: %v, want %v", got, freqs)
	}
}

func TestRopeTableBadParams(t *testing.T) {
	for _, r := range []ir.RopeParams{
		{Theta: 1e4, HeadDim: 4},
		{Theta: 1e4, MaxPositions: 4, HeadDim: 3},
		{Theta: 1e4, MaxPositions: 4},
	} {
		if _, err := ropeTable(r); err == nil {
			t.Errorf("ropeTable(%+v) accepted", r)
		}
	}
}

func TestFoldConcatRows(t *testing.T) {
	raw := func(name string, d tensor.DType, rows, cols int, fill byte) *tensor.Tensor {
		n, _ := d.Bytes(int64(rows * cols))
		data := make([]byte, n)
		for i := range data {
			data[i] = fill + byte(i)
		}
		return &tensor.Tensor{Name: name, DType: d, Shape: tensor.Shape{rows, cols}, Data: data}
	}
	for _, d := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q8_0, tensor.Q4_0} {
		t.Run(d.String(), func(t *testing.T) {
			b := newBuilder(t)
			ts := []*tensor.Tensor{raw("model.a.weight", d, 2, 64, 0), raw("b", d, 3, 64, 100), raw("c", d, 1, 64, 200)}
			var ws []*ir.Value
			for _, tt := range ts {
				ws = append(ws, b.Op(ir.Weight, ir.Attrs{Name: tt.Name, Tensor: tt}))
			}
			cat := b.Node(ir.ConcatRows, ir.Attrs{}, ws...)
			// (matmul takes float weights only: read the stack as an output)
			g := b.outputs(cat.Out())
			at := indexOf(g, cat)
			run(t, g, "fold-constants", foldConstants, everything)
			c := g.Nodes[at]
			if c.Op != ir.Const || g.Outputs[0] != c.Out() {
				t.Fatalf("concat not folded in place:\n%v", g)
			}
			tt := c.Attrs.Tensor
			if tt.DType != d || !tt.Shape.Equal(tensor.Shape{6, 64}) || !c.Out().Shape.Equal(ir.Shape{6, 64}) {
				t.Errorf("folded %v%v / %v", tt.DType, tt.Shape, c.Out().Shape)
			}
			want := slices.Concat(ts[0].Data, ts[1].Data, ts[2].Data)
			if !bytes.Equal(tt.Data, want) {
				t.Errorf("folded bytes differ from the concatenation")
			}
			if tt.Name != "concat(a,b,c)" || c.Attrs.Name != tt.Name {
				t.Errorf("folded name %q", tt.Name)
			}
			// The inputs are untouched (they may be file mappings).
			if ts[0].Data[0] != 0 || len(ts[0].Data) != len(raw("", d, 2, 64, 0).Data) {
				t.Errorf("input modified")
			}
		})
	}
}

// Folding runs in graph order, so a stack of rope tables folds after them.
func TestFoldChained(t *testing.T) {
	b := newBuilder(t)
	r1 := ir.RopeParams{Theta: 10000, MaxPositions: 4, HeadDim: 8}
	r2 := ir.RopeParams{Theta: 500, MaxPositions: 2, HeadDim: 8}
	t1 := b.Op(ir.RopeTable, ir.Attrs{Rope: r1})
	t2 := b.Op(ir.RopeTable, ir.Attrs{Rope: r2})
	cat := b.Op(ir.ConcatRows, ir.Attrs{}, t1, t2)
	y := b.Op(ir.MatMul, ir.Attrs{}, b.act(8), cat)
	g := b.outputs(y)
	run(t, g, "fold-constants", foldConstants, everything)
	n := countOps(g)
	if n[ir.RopeTable] != 0 || n[ir.ConcatRows] != 0 || n[ir.Const] != 3 {
		t.Fatalf("after folding:\n%v", g)
	}
	c := y.Def.Inputs[1].Def
	want1, _ := ropeTable(r1)
	want2, _ := ropeTable(r2)
	if !bytes.Equal(c.Attrs.Tensor.Data, slices.Concat(want1.Data, want2.Data)) || !c.Out().Shape.Equal(ir.Shape{6, 8}) {
		t.Errorf("stacked tables folded wrong: %v", c)
	}
	run(t, g, "deadcode", deadcode, everything)
	if n := countOps(g); n[ir.Const] != 1 {
		t.Errorf("%d constants after deadcode, want 1", n[ir.Const])
	}
}

func TestConcatRowsOfNonConstant(t *testing.T) {
	b := newBuilder(t)
	t1 := b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 1e4, MaxPositions: 4, HeadDim: 8}})
	w := b.weight("w", 0, 2, 8)
	cat := b.Node(ir.ConcatRows, ir.Attrs{}, w, t1)
	_, err := concatRows(cat, false)
	wantErr(t, err, "not a constant")
}

// lazyTarget is everything, stacking lazily (a LazyStacker).
type lazyTarget struct{ Target }

func (lazyTarget) StacksLazily() bool { return true }

// TestFoldStacksLazily: for a LazyStacker, a folded stack of weights is a
// tensor of Parts (the weights themselves, no host copy) that decodes,
// and joins, to the stack the eager fold makes.
func TestFoldStacksLazily(t *testing.T) {
	stacked := func(tg Target) *tensor.Tensor {
		b := newBuilder(t)
		w1 := b.weight("w1", 0, 2, 8)
		w2 := b.weight("w2", 100, 3, 8)
		cat := b.Op(ir.ConcatRows, ir.Attrs{}, w1, w2)
		y := b.Op(ir.MatMul, ir.Attrs{}, b.act(8), cat)
		g := b.outputs(y)
		run(t, g, "fold-constants", foldConstants, tg)
		return y.Def.Inputs[1].Def.Attrs.Tensor
	}
	eager, lazy := stacked(everything), stacked(lazyTarget{everything})
	if len(eager.Parts) != 0 || len(lazy.Parts) != 2 || lazy.Data != nil || !lazy.Shape.Equal(tensor.Shape{5, 8}) {
		t.Fatalf("eager %d parts, lazy %d parts, %d bytes, shape %v", len(eager.Parts), len(lazy.Parts), len(lazy.Data), lazy.Shape)
	}
	if err := lazy.Validate(); err != nil {
		t.Fatal(err)
	}
	want, err := eager.F32s()
	if err != nil {
		t.Fatal(err)
	}
	got, err := lazy.F32s()
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("lazy stack decodes to %v (%v), want %v", got, err, want)
	}
	lazy.Join()
	if len(lazy.Parts) != 0 || !bytes.Equal(lazy.Data, eager.Data) {
		t.Fatal("the joined stack differs from the eager one")
	}
}

// TestLongRopeTable: longrope's table rotates positions below the original
// context by the short factors and the rest by the long ones, cos and sin
// scaled by the attention factor (each entry against the formula, float64).
func TestLongRopeTable(t *testing.T) {
	// A context within the original one takes the short factors, one past
	// it the long factors at every position; cos and sin scaled by the
	// attention factor either way.
	for _, c := range []struct {
		ctx  int
		long bool
	}{{16, false}, {12, false}, {17, true}, {48, true}} {
		r := ir.RopeParams{Theta: 10000, MaxPositions: c.ctx, HeadDim: 8, Scaling: "longrope", OriginalMaxPositions: 16,
			ShortFactor: []float32{1, 1.5, 2, 4}, LongFactor: []float32{3, 5, 7, 11}, AttentionFactor: 1.2}
		tab, err := ropeTable(r)
		if err != nil {
			t.Fatal(err)
		}
		vals, _ := tab.F32s()
		factors := r.ShortFactor
		if c.long {
			factors = r.LongFactor
		}
		for p := 0; p < r.MaxPositions; p++ {
			for i := 0; i < 4; i++ {
				f := 1 / (float64(factors[i]) * math.Pow(10000, float64(2*i)/8))
				cos, sin := 1.2*math.Cos(float64(p)*f), 1.2*math.Sin(float64(p)*f)
				if math.Abs(float64(vals[p*8+i])-cos) > 1e-6 || math.Abs(float64(vals[p*8+4+i])-sin) > 1e-6 {
					t.Fatalf("context %d position %d pair %d: cos %g sin %g, want %g %g", c.ctx, p, i, vals[p*8+i], vals[p*8+4+i], cos, sin)
				}
			}
		}
	}
}
