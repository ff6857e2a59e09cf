package tensor

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestSliceRowsCols(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]float32, 6*8)
	for i := range vals {
		vals[i] = rng.Float32()
	}
	for _, d := range []DType{F32, F16, BF16} {
		m, err := Encode("m", Shape{6, 8}, d, vals)
		if err != nil {
			t.Fatal(err)
		}
		full, _ := m.F32s()
		r, err := m.SliceRows(2, 5)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := r.F32s()
		for i := range got {
			if got[i] != full[2*8+i] {
				t.Fatalf("%v rows: element %d is %g, want %g", d, i, got[i], full[2*8+i])
			}
		}
		c, err := m.SliceCols(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = c.F32s()
		for i := range got {
			if want := full[(i/4)*8+4+i%4]; got[i] != want {
				t.Fatalf("%v cols: element %d is %g, want %g", d, i, got[i], want)
			}
		}
	}
	// Blocks: columns cut at whole blocks only, and the cut decodes to the
	// same values as the whole.
	big := make([]float32, 2*64)
	for i := range big {
		big[i] = rng.Float32() - 0.5
	}
	q, err := Encode("q", Shape{2, 64}, Q8_0, big)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := q.F32s()
	c, err := q.SliceCols(32, 64)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := c.F32s()
	for i := range got {
		if want := full[(i/32)*64+32+i%32]; got[i] != want {
			t.Fatalf("q8_0 cols: element %d is %g, want %g", i, got[i], want)
		}
	}
	if _, err := q.SliceCols(16, 48); err == nil || !strings.Contains(err.Error(), "blocks of 32") {
		t.Fatalf("a cut inside a block: %v", err)
	}
	if _, err := q.SliceRows(1, 3); err == nil {
		t.Fatal("rows past the end accepted")
	}
	v := FromF32("v", Shape{4}, []float32{1, 2, 3, 4})
	s, err := v.SliceRows(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.F32s(); len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("vector slice %v", got)
	}
}
