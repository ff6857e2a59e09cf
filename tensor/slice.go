package tensor

import "fmt"

// SliceRows is rows [lo, hi) of t (the elements [lo, hi) of a vector): a
// view of t's Data, with the rows' scales. Tensor parallelism takes a rank's
// rows of a column-parallel matrix this way.
func (t *Tensor) SliceRows(lo, hi int) (*Tensor, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if len(t.Parts) > 0 || len(t.Shape) == 0 || len(t.Shape) > 2 || lo < 0 || hi > t.Shape[0] || lo >= hi {
		return nil, fmt.Errorf("tensor %s %v: no rows [%d,%d)", t.Name, t.Shape, lo, hi)
	}
	row := int64(len(t.Data)) / int64(t.Shape[0])
	if len(t.Shape) == 1 && t.DType.BlockSize() != 1 {
		return nil, fmt.Errorf("tensor %s: a %v vector has no elements apart", t.Name, t.DType)
	}
	s := &Tensor{Name: fmt.Sprintf("%s[%d:%d]", t.Name, lo, hi), DType: t.DType, Shape: append(Shape{hi - lo}, t.Shape[1:]...),
		Data: t.Data[int64(lo)*row : int64(hi)*row], Release: t.Release}
	switch len(t.Scales) {
	case 0:
	case 1:
		s.Scales = t.Scales
	default:
		s.Scales = t.Scales[lo:hi]
	}
	return s, nil
}

// SliceCols is columns [lo, hi) of matrix t, copied (a row-parallel
// matrix's rank's columns). A block-quantized matrix is cut at whole blocks.
func (t *Tensor) SliceCols(lo, hi int) (*Tensor, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if len(t.Parts) > 0 || len(t.Shape) != 2 || lo < 0 || hi > t.Shape[1] || lo >= hi {
		return nil, fmt.Errorf("tensor %s %v: no columns [%d,%d)", t.Name, t.Shape, lo, hi)
	}
	bs := t.DType.BlockSize()
	if lo%bs != 0 || hi%bs != 0 {
		return nil, fmt.Errorf("tensor %s: columns [%d,%d) cut %v blocks of %d", t.Name, lo, hi, t.DType, bs)
	}
	rows, bb := t.Shape[0], t.DType.BlockBytes()
	row := len(t.Data) / rows
	a, b := lo/bs*bb, hi/bs*bb
	data := make([]byte, 0, rows*(b-a))
	for r := 0; r < rows; r++ {
		data = append(data, t.Data[r*row+a:r*row+b]...)
	}
	return &Tensor{Name: fmt.Sprintf("%s[:,%d:%d]", t.Name, lo, hi), DType: t.DType, Shape: Shape{rows, hi - lo}, Data: data,
		Scales: t.Scales}, nil
}
