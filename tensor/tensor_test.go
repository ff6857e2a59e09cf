package tensor

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestF16RoundTripAllValues(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			if back := F32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

func TestBF16RoundTripAllValues(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		back := F32ToBF16(f)
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(BF16ToF32(back))) {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

func TestRoundingToNearestEven(t *testing.T) {
	cases := []struct {
		f          float32
		bf16, fp16 uint16
	}{
		{1, 0x3f80, 0x3c00},
		{-2, 0xc000, 0xc000},
		{65504, 0x4780, 0x7bff},
		{1e6, 0x4974, 0x7c00},                              // f16 overflows to infinity
		{math.Float32frombits(0x3f808000), 0x3f80, 0x3c04}, // bf16 tie goes to even
		{math.Float32frombits(0x3f818000), 0x3f82, 0x3c0c}, // bf16 tie goes to even (up)
		{5.9604645e-08, 0x3380, 0x0001},                    // smallest f16 subnormal
		{float32(math.Inf(-1)), 0xff80, 0xfc00},
	}
	for _, c := range cases {
		if got := F32ToBF16(c.f); got != c.bf16 {
			t.Errorf("bf16(%g) = %#04x, want %#04x", c.f, got, c.bf16)
		}
		if got := F32ToF16(c.f); got != c.fp16 {
			t.Errorf("f16(%g) = %#04x, want %#04x", c.f, got, c.fp16)
		}
	}
}

func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 32*40)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, c := range []struct {
		d   DType
		tol float64 // of each block's largest magnitude
	}{{Q8_0, 0.5 / 127 * 1.01}, {Q4_0, 1.0 / 8 * 1.01}} {
		data, err := Quantize(c.d, x)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := c.d.Bytes(int64(len(x))); int64(len(data)) != n {
			t.Fatalf("%v: %d bytes, want %d", c.d, len(data), n)
		}
		back := make([]float32, len(x))
		if err := ToF32(c.d, data, back); err != nil {
			t.Fatal(err)
		}
		for b := 0; b < len(x)/32; b++ {
			var amax float64
			for _, v := range x[b*32 : b*32+32] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			for i := b * 32; i < b*32+32; i++ {
				if d := math.Abs(float64(back[i] - x[i])); d > c.tol*amax+1e-3*amax {
					t.Fatalf("%v element %d: %g came back %g", c.d, i, x[i], back[i])
				}
			}
		}
	}
	if _, err := Quantize(Q8_0, x[:31]); err == nil {
		t.Error("31 values quantized to Q8_0")
	}
	if _, err := Quantize(F32, x); err == nil {
		t.Error("quantized to F32")
	}
}

func TestValidate(t *testing.T) {
	ok := &Tensor{Name: "a", DType: BF16, Shape: Shape{2, 3}, Data: make([]byte, 12)}
	if err := ok.Validate(); err != nil {
		t.Error(err)
	}
	bad := []*Tensor{
		{Name: "short", DType: F32, Shape: Shape{2, 3}, Data: make([]byte, 20)},
		{Name: "neg", DType: F32, Shape: Shape{-1, 3}, Data: nil},
		{Name: "q8 partial block", DType: Q8_0, Shape: Shape{33}, Data: make([]byte, 68)},
		{Name: "dtype", DType: DType(99), Shape: Shape{1}, Data: make([]byte, 4)},
	}
	for _, b := range bad {
		if b.Validate() == nil {
			t.Errorf("%s accepted", b.Name)
		}
	}
}

// TestQuantizeParallel: Quantize splits a large input over goroutines in
// runs of whole blocks; the bytes must be those of one goroutine.
func TestQuantizeParallel(t *testing.T) {
	n := 2*quantizeRun + 3*256 // more than one run, a tail of blocks
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7)
	}
	for _, d := range []DType{Q8_0, Q4_0, Q4_K, Q6_K} {
		got, err := Quantize(d, x)
		if err != nil {
			t.Fatal(err)
		}
		want, err := quantizeBlocks(d, x)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%v: parallel quantization differs from one goroutine's", d)
		}
	}
}

// TestEncodeF32: EncodeF32 then ToF32 gives back values the dtype holds
// exactly, and the nearest one for others; block types are refused.
func TestEncodeF32(t *testing.T) {
	vals := []float32{1.5, -2, 0, 0.25, 1.0 / 3}
	for _, tc := range []struct {
		d    DType
		last float32 // what 1/3 comes back as
	}{{F32, 1.0 / 3}, {F16, F16ToF32(F32ToF16(1.0 / 3))}, {BF16, BF16ToF32(F32ToBF16(1.0 / 3))}, {F8_E4M3, E4M3ToF32(F32ToE4M3(1.0 / 3))}} {
		b, err := EncodeF32(tc.d, vals)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(vals))
		if err := ToF32(tc.d, b, got); err != nil {
			t.Fatal(err)
		}
		want := append(vals[:4:4], tc.last)
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%v: element %d is %v, want %v", tc.d, i, got[i], want[i])
			}
		}
		if tc.d != F32 && tc.last == 1.0/3 {
			t.Errorf("%v holds 1/3 exactly", tc.d)
		}
	}
	if _, err := EncodeF32(Q4_0, vals); err == nil {
		t.Error("Q4_0 encoded")
	}
}

// TestParts: a tensor of Parts validates when its parts are rows of its
// dtype and row shape summing to its rows, and not otherwise; Join gives
// it the parts' bytes.
func TestParts(t *testing.T) {
	a := FromF32("a", Shape{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	b := FromF32("b", Shape{1, 3}, []float32{7, 8, 9})
	ok := &Tensor{Name: "ab", DType: F32, Shape: Shape{3, 3}, Parts: []*Tensor{a, b}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	f, err := ok.F32s()
	if err != nil || !slices.Equal(f, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("F32s = %v, %v", f, err)
	}
	for _, bad := range []*Tensor{
		{Name: "rows", DType: F32, Shape: Shape{4, 3}, Parts: []*Tensor{a, b}},
		{Name: "cols", DType: F32, Shape: Shape{3, 4}, Parts: []*Tensor{a, b}},
		{Name: "dtype", DType: F16, Shape: Shape{3, 3}, Parts: []*Tensor{a, b}},
		{Name: "data", DType: F32, Shape: Shape{3, 3}, Parts: []*Tensor{a, b}, Data: make([]byte, 36)},
		{Name: "part", DType: F32, Shape: Shape{3, 3}, Parts: []*Tensor{a, {Name: "short", DType: F32, Shape: Shape{1, 3}, Data: make([]byte, 4)}}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: validated", bad.Name)
		}
	}
	ok.Join()
	if len(ok.Parts) != 0 || ok.Validate() != nil || len(ok.Data) != 36 {
		t.Fatalf("joined: %d parts, %d bytes", len(ok.Parts), len(ok.Data))
	}
}
