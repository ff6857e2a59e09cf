// Package tensor defines the element types and the named, shaped byte
// buffers that flow from model files into the compiler and the backends.
//
// Invariant: a Tensor's Data holds exactly DType.Bytes(Shape) bytes in
// little-endian, row-major order (last dimension fastest). Data may be a view
// into a memory-mapped file, so it must be treated as read-only.
package tensor

import (
	"fmt"
	"strings"
)

// DType is an element type.
type DType uint8

const (
	Invalid DType = iota
	F32
	F16
	BF16
	I32
	Q8_0 // GGML Q8_0: blocks of 32 int8 with one f16 scale (34 bytes)
	Q4_0 // GGML Q4_0: blocks of 32 4-bit values with one f16 scale (18 bytes)
	// The other GGML block types (ggml.go): blocks of 32 for Q4_1, Q5_0,
	// Q5_1 and IQ4_NL, super-blocks of 256 for the k-quants.
	Q4_1
	Q5_0
	Q5_1
	Q2_K
	Q3_K
	Q4_K
	Q5_K
	Q6_K
	IQ4_NL
	// F8_E4M3: 8-bit floats (OCP FP8 E4M3, PyTorch's float8_e4m3fn), one
	// byte each; the scales that make them a weight live in other tensors
	// (fp8.go).
	F8_E4M3
)

var dtypeNames = [...]string{Invalid: "invalid", F32: "f32", F16: "f16", BF16: "bf16", I32: "i32", Q8_0: "q8_0", Q4_0: "q4_0",
	Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", Q2_K: "q2_k", Q3_K: "q3_k", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k", IQ4_NL: "iq4_nl", F8_E4M3: "f8_e4m3"}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", d)
}

// BlockSize is the number of elements that share one storage block (1 for
// plain types, 32 or 256 for the GGML block-quantized types).
func (d DType) BlockSize() int {
	if g, ok := ggmlBlocks[d]; ok {
		return g.size
	}
	return 1
}

// Quantized reports whether d is a GGML block-quantized type.
func (d DType) Quantized() bool {
	_, ok := ggmlBlocks[d]
	return ok
}

// BlockBytes is the number of bytes of one storage block.
func (d DType) BlockBytes() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case F8_E4M3:
		return 1
	}
	if g, ok := ggmlBlocks[d]; ok {
		return g.bytes
	}
	return 0
}

// Bytes returns the storage size of n elements, or an error when n is not a
// whole number of blocks or the type is unknown.
func (d DType) Bytes(n int64) (int64, error) {
	bs := int64(d.BlockSize())
	if d.BlockBytes() == 0 {
		return 0, fmt.Errorf("unsupported dtype %v", d)
	}
	if n < 0 || n%bs != 0 {
		return 0, fmt.Errorf("%d elements is not a whole number of %v blocks of %d", n, d, bs)
	}
	return n / bs * int64(d.BlockBytes()), nil
}

// Shape is a list of dimension sizes, outermost first.
type Shape []int

// Elements returns the product of the dimensions (1 for a scalar).
func (s Shape) Elements() int64 {
	n := int64(1)
	for _, d := range s {
		n *= int64(d)
	}
	return n
}

func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Equal reports whether two shapes are identical.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Tensor is a named, typed, shaped buffer.
type Tensor struct {
	Name  string
	DType DType
	Shape Shape
	Data  []byte
	// Scales scale an F8_E4M3 matrix's codes: value = code·Scales[row], or
	// ·Scales[0] for every row (FP8 checkpoints' weight_scale); nil for
	// other dtypes. F32s applies them; ToF32 on Data does not.
	Scales []float32
	// Release, when set, gives back to the system the memory behind Data,
	// which stays valid: the loader sets it on tensors that slice a file
	// mapping, whose pages are read from the file again if touched. A
	// backend that keeps its own copy of a tensor calls it.
	Release func()
	// Parts, when set, make the tensor the concatenation of their rows
	// (each of its dtype and row shape, their rows summing to Shape[0]),
	// with no Data of its own: the graph compiler stacks matrices so for a
	// backend that copies each part where it goes (compile.LazyStacker:
	// the GPU's upload) instead of into one host buffer first. F32s and
	// Validate take them; a reader of Data calls Join first.
	Parts []*Tensor
}

// Join gives a tensor of Parts its Data: the parts' bytes one after
// another (nothing for any other tensor).
func (t *Tensor) Join() {
	if len(t.Parts) == 0 {
		return
	}
	n := 0
	for _, p := range t.Parts {
		p.Join()
		n += len(p.Data)
	}
	data := make([]byte, 0, n)
	for _, p := range t.Parts {
		data = append(data, p.Data...)
	}
	t.Data, t.Parts = data, nil
}

// Validate checks that Data has the size Shape and DType require.
func (t *Tensor) Validate() error {
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %s: negative dimension in %v", t.Name, t.Shape)
		}
	}
	want, err := t.DType.Bytes(t.Shape.Elements())
	if err != nil {
		return fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	if len(t.Parts) > 0 {
		return t.validateParts()
	}
	if int64(len(t.Data)) != want {
		return fmt.Errorf("tensor %s: %v %v needs %d bytes, has %d", t.Name, t.DType, t.Shape, want, len(t.Data))
	}
	if len(t.Scales) > 0 && (t.DType != F8_E4M3 || len(t.Shape) != 2 || len(t.Scales) != 1 && len(t.Scales) != t.Shape[0]) {
		return fmt.Errorf("tensor %s: %d scales for %v %v (F8_E4M3 matrices only, one or one a row)", t.Name, len(t.Scales), t.DType, t.Shape)
	}
	return nil
}

// validateParts checks a tensor of Parts: no Data, and parts of its dtype
// and row shape, each valid, whose rows sum to its own.
func (t *Tensor) validateParts() error {
	if len(t.Data) != 0 || len(t.Shape) == 0 {
		return fmt.Errorf("tensor %s: parts with data of its own, or of no rows", t.Name)
	}
	rows := 0
	for _, p := range t.Parts {
		if p.DType != t.DType || len(p.Shape) != len(t.Shape) || !p.Shape[1:].Equal(t.Shape[1:]) {
			return fmt.Errorf("tensor %s: part %s is %v %v, not rows of %v %v", t.Name, p.Name, p.DType, p.Shape, t.DType, t.Shape)
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		rows += p.Shape[0]
	}
	if rows != t.Shape[0] {
		return fmt.Errorf("tensor %s: parts of %d rows for %v", t.Name, rows, t.Shape)
	}
	if len(t.Scales) > 0 && (t.DType != F8_E4M3 || len(t.Shape) != 2 || len(t.Scales) != 1 && len(t.Scales) != t.Shape[0]) {
		return fmt.Errorf("tensor %s: %d scales for %v %v (F8_E4M3 matrices only, one or one a row)", t.Name, len(t.Scales), t.DType, t.Shape)
	}
	return nil
}

// RowScale is the scale of row r of an F8_E4M3 matrix with Scales (1
// without).
func (t *Tensor) RowScale(r int) float32 {
	switch len(t.Scales) {
	case 0:
		return 1
	case 1:
		return t.Scales[0]
	}
	return t.Scales[r]
}
