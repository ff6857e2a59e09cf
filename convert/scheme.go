package convert

import (
	"fmt"
	"strconv"
	"strings"

	"kiln/tensor"
)

// A Scheme says which dtype each matrix of a model is stored in: Base for
// all, except in the mixed schemes, which follow llama-quantize.
type Scheme struct {
	Name string       // as `kiln quantize --to` takes it
	Base tensor.DType // the dtype of most matrices
	// medium (q4_k_m, q5_k_m): the output matrix (the embedding where it
	// is tied) in Q6_K, and the value and down projections of the layers
	// that useMoreBits names, as llama-quantize's Q4_K_M and Q5_K_M do.
	medium bool
	// fileType is llama.cpp's general.file_type (llama_ftype), 0 for none:
	// pure Q4_K and Q5_K have no ftype of their own.
	fileType uint32
}

// Schemes are the schemes kiln quantize writes.
var Schemes = []Scheme{
	{Name: "f32", Base: tensor.F32, fileType: 0},
	{Name: "f16", Base: tensor.F16, fileType: 1},
	{Name: "bf16", Base: tensor.BF16, fileType: 32},
	{Name: "q8_0", Base: tensor.Q8_0, fileType: 7},
	{Name: "q6_k", Base: tensor.Q6_K, fileType: 18},
	{Name: "q5_k_m", Base: tensor.Q5_K, medium: true, fileType: 17},
	{Name: "q5_k", Base: tensor.Q5_K},
	{Name: "q4_k_m", Base: tensor.Q4_K, medium: true, fileType: 15},
	{Name: "q4_k", Base: tensor.Q4_K},
	{Name: "q4_0", Base: tensor.Q4_0, fileType: 2},
}

// SchemeNames lists the schemes' names.
func SchemeNames() []string {
	var s []string
	for _, x := range Schemes {
		s = append(s, x.Name)
	}
	return s
}

// ParseScheme returns the scheme called name (case-insensitive).
func ParseScheme(name string) (Scheme, error) {
	for _, s := range Schemes {
		if s.Name == strings.ToLower(name) {
			return s, nil
		}
	}
	return Scheme{}, fmt.Errorf("convert: no scheme %q (want one of %s)", name, strings.Join(SchemeNames(), ", "))
}

// Pure returns the scheme that stores every matrix as d (one of the
// schemes' Base dtypes).
func Pure(d tensor.DType) (Scheme, error) {
	for _, s := range Schemes {
		if s.Base == d && !s.medium {
			return s, nil
		}
	}
	return Scheme{}, fmt.Errorf("convert: cannot store matrices as %v (want one of %s)", d, strings.Join(SchemeNames(), ", "))
}

// dtype is the dtype of matrix name in a model of layers layers whose
// embedding is also its output matrix when tied.
func (s Scheme) dtype(name string, layers int, tied bool) tensor.DType {
	if !s.medium {
		return s.Base
	}
	if name == "lm_head.weight" || (tied && name == "model.embed_tokens.weight") {
		return tensor.Q6_K
	}
	if strings.HasSuffix(name, ".self_attn.v_proj.weight") || strings.HasSuffix(name, ".mlp.down_proj.weight") {
		if i, ok := layerOf(name); ok && useMoreBits(i, layers) {
			return tensor.Q6_K
		}
	}
	return s.Base
}

// useMoreBits is llama-quantize's choice of the layers whose value and
// down projections get more bits: the first and last eighth, and every
// third between them.
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// layerOf parses the layer index of a "model.layers.N." name.
func layerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(num)
	return i, err == nil
}
