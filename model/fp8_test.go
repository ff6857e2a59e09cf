package model

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"kiln/tensor"
)

// fp8Matrix returns random E4M3 codes (no NaN) for an [n,k] matrix.
func fp8Matrix(r *rand.Rand, name string, n, k int) *tensor.Tensor {
	q := make([]byte, n*k)
	for i := range q {
		q[i] = byte(r.IntN(256))
		if q[i]&0x7F == 0x7F {
			q[i] = 0x38
		}
	}
	return &tensor.Tensor{Name: name, DType: tensor.F8_E4M3, Shape: tensor.Shape{n, k}, Data: q}
}

// TestScaleFP8 keeps FP8 matrices with per-row and per-tensor scales (the
// scales in F32 and BF16) as their codes with Scales, whose F32s are
// e4m3·scale, drops the scale and input scale tensors, and names the
// tensor of every malformed case.
func TestScaleFP8(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n, k = 5, 7
	rowScales := []float32{0.5, 2, 1e-3, 3, 0.25}
	bf := make([]byte, 2)
	binary.LittleEndian.PutUint16(bf, tensor.F32ToBF16(0.125))
	ts := map[string]*tensor.Tensor{
		"a.weight":       fp8Matrix(r, "a.weight", n, k),
		"a.weight_scale": tensor.FromF32("a.weight_scale", tensor.Shape{n, 1}, rowScales),
		"a.input_scale":  tensor.FromF32("a.input_scale", tensor.Shape{1}, []float32{1}),
		"b.weight":       fp8Matrix(r, "b.weight", n, k),
		"b.weight_scale": {Name: "b.weight_scale", DType: tensor.BF16, Shape: tensor.Shape{}, Data: bf},
		"c.weight":       tensor.FromF32("c.weight", tensor.Shape{2}, []float32{1, 2}),
	}
	a, b := ts["a.weight"], ts["b.weight"]
	if err := scaleFP8(ts); err != nil {
		t.Fatal(err)
	}
	if len(ts) != 3 {
		t.Errorf("%d tensors left, want a.weight, b.weight and c.weight", len(ts))
	}
	for _, c := range []struct {
		src    *tensor.Tensor
		scales []float32
	}{{a, rowScales}, {b, []float32{0.125}}} {
		got := ts[c.src.Name]
		if got.DType != tensor.F8_E4M3 || len(got.Scales) != len(c.scales) || got.Validate() != nil {
			t.Fatalf("%s: %v with %d scales (%v), want F8_E4M3 with %d", c.src.Name, got.DType, len(got.Scales), got.Validate(), len(c.scales))
		}
		vals, _ := got.F32s()
		for i, v := range vals {
			s := c.scales[0]
			if len(c.scales) > 1 {
				s = c.scales[i/k]
			}
			if want := tensor.E4M3ToF32(c.src.Data[i]) * s; v != want {
				t.Fatalf("%s[%d] = %v, want %v", c.src.Name, i, v, want)
			}
		}
	}
	bad := []struct {
		ts   map[string]*tensor.Tensor
		want string
	}{
		{map[string]*tensor.Tensor{"x.weight": fp8Matrix(r, "x.weight", 2, 2)}, "x.weight"},
		{map[string]*tensor.Tensor{"x.weight": fp8Matrix(r, "x.weight", 2, 2),
			"x.weight_scale": tensor.FromF32("x.weight_scale", tensor.Shape{3}, []float32{1, 1, 1})}, "x.weight_scale"},
		{map[string]*tensor.Tensor{"x.weight": tensor.FromF32("x.weight", tensor.Shape{1, 1}, []float32{1}),
			"x.weight_scale": tensor.FromF32("x.weight_scale", tensor.Shape{1}, []float32{1})}, "x.weight_scale"},
		{map[string]*tensor.Tensor{"x.bias": {Name: "x.bias", DType: tensor.F8_E4M3, Shape: tensor.Shape{2}, Data: []byte{1, 2}}}, "x.bias"},
	}
	for _, c := range bad {
		if err := scaleFP8(c.ts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("scaleFP8 of %v: %v, want an error naming %s", c.ts, err, c.want)
		}
	}
}
