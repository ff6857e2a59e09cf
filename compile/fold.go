package compile

// fold-constants evaluates, at compile time, the nodes whose value does not
// depend on the step: RoPE frequency tables (RopeTable) and stacked weights
// (ConcatRows of weights or constants). Each becomes a Const node holding the
// result, and its inputs are left for deadcode.
//
// The RoPE table row p holds cos(p·f_i) for i < d/2, then sin(p·f_i), where
// f_i = θ^(-2i/d), adjusted by the model's scaling:
//   - linear: f_i / factor;
//   - llama3 (as in Hugging Face's _compute_llama3_parameters): with
//     wavelength λ_i = 2π/f_i, low = L/low_freq_factor and
//     high = L/high_freq_factor (L the original context), f_i / factor when
//     λ_i > low, f_i when λ_i < high, and between them the blend
//     (1-s)·f_i/factor + s·f_i with s = (L/λ_i - low_freq_factor) /
//     (high_freq_factor - low_freq_factor);
//   - per-pair frequency factors (GGUF rope_freqs): f_i / factor_i.
// Angles are computed in float64 and rounded once to float32.

import (
	"fmt"
	"math"
	"strings"

	"kiln/ir"
	"kiln/tensor"
)

func foldConstants(g *ir.Graph, tg Target) error {
	lazy := false
	if l, ok := tg.(LazyStacker); ok {
		lazy = l.StacksLazily()
	}
	for i, n := range g.Nodes {
		var t *tensor.Tensor
		var err error
		switch n.Op {
		case ir.RopeTable:
			t, err = ropeTable(n.Attrs.Rope)
		case ir.ConcatRows:
			t, err = concatRows(n, lazy)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("fold %v: %w", n.Op, err)
		}
		c, err := g.NewNode(ir.Const, ir.Attrs{Name: t.Name, Tensor: t})
		if err != nil {
			return err
		}
		g.Nodes[i] = c // same position: every reader still comes after it
		g.ReplaceUses(n.Out(), c.Out())
	}
	return nil
}

// RopeFrequencies returns the per-pair rotation frequencies f_i.
func RopeFrequencies(r ir.RopeParams) []float64 {
	half := r.HeadDim / 2
	freqs := make([]float64, half)
	for i := range freqs {
		f := 1 / math.Pow(r.Theta, float64(2*i)/float64(r.HeadDim))
		switch r.Scaling {
		case "linear":
			f /= r.Factor
		case "llama3":
			L := float64(r.OriginalMaxPositions)
			wavelen := 2 * math.Pi / f
			lowWave, highWave := L/r.LowFreqFactor, L/r.HighFreqFactor
			switch {
			case wavelen > lowWave:
				f /= r.Factor
			case wavelen < highWave:
			default:
				s := (L/wavelen - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				f = (1-s)*f/r.Factor + s*f
			}
		}
		if r.FreqFactors != nil {
			f /= float64(r.FreqFactors[i])
		}
		freqs[i] = f
	}
	if r.Scaling == "longrope" {
		return longRopeFrequencies(r, r.ShortFactor)
	}
	return freqs
}

// longRopeFrequencies are the base frequencies each divided by its factor
// (longrope's short or long factors).
func longRopeFrequencies(r ir.RopeParams, factors []float32) []float64 {
	freqs := make([]float64, r.HeadDim/2)
	for i := range freqs {
		freqs[i] = 1 / (float64(factors[i]) * math.Pow(r.Theta, float64(2*i)/float64(r.HeadDim)))
	}
	return freqs
}

func ropeTable(r ir.RopeParams) (*tensor.Tensor, error) {
	if r.MaxPositions <= 0 || r.HeadDim <= 0 || r.HeadDim%2 != 0 {
		return nil, fmt.Errorf("bad rope params %+v", r)
	}
	freqs, long := RopeFrequencies(r), []float64(nil)
	scale := 1.0
	if r.Scaling == "longrope" {
		long = longRopeFrequencies(r, r.LongFactor)
		scale = r.AttentionFactor
	}
	if long != nil && r.MaxPositions > r.OriginalMaxPositions {
		// A context past the original one rotates every position by the
		// long factors (llama.cpp's rule; transformers' for any sequence
		// past the original context).
		freqs = long
	}
	half := len(freqs)
	vals := make([]float32, r.MaxPositions*r.HeadDim)
	for p := 0; p < r.MaxPositions; p++ {
		row := vals[p*r.HeadDim:]
		for i, f := range freqs {
			angle := float64(p) * f
			row[i] = float32(scale * math.Cos(angle))
			row[half+i] = float32(scale * math.Sin(angle))
		}
	}
	name := fmt.Sprintf("rope_table(theta=%g,head_dim=%d,max_pos=%d", r.Theta, r.HeadDim, r.MaxPositions)
	if r.Scaling != "" {
		name += ",scaling=" + r.Scaling
	}
	return tensor.FromF32(name+")", tensor.Shape{r.MaxPositions, r.HeadDim}, vals), nil
}

// concatRows stacks its inputs' rows; FP8 matrices' scales follow their
// rows (one a row once stacked).
func concatRows(n *ir.Node, lazy bool) (*tensor.Tensor, error) {
	var parts []*tensor.Tensor
	var names []string
	var scales []float32
	rows := 0
	for _, in := range n.Inputs {
		t := in.Def.Attrs.Tensor
		if (in.Def.Op != ir.Weight && in.Def.Op != ir.Const) || t == nil {
			return nil, fmt.Errorf("input %v is not a constant", in)
		}
		parts = append(parts, t)
		names = append(names, shortName(t.Name))
		if t.DType == tensor.F8_E4M3 {
			for r := 0; r < t.Shape[0]; r++ {
				scales = append(scales, t.RowScale(r))
			}
		}
		rows += t.Shape[0]
	}
	first := n.Inputs[0].Def.Attrs.Tensor
	shape := append(tensor.Shape{rows}, first.Shape[1:]...)
	t := &tensor.Tensor{Name: "concat(" + strings.Join(names, ",") + ")", DType: first.DType, Shape: shape, Parts: parts, Scales: scales}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if !lazy {
		t.Join()
	}
	return t, nil
}

// shortName trims the common prefix of canonical names for readable dumps.
func shortName(name string) string {
	return strings.TrimSuffix(strings.TrimPrefix(name, "model."), ".weight")
}
