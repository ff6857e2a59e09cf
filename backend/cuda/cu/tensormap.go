package cu

import "fmt"

// TensorMap is a tensor map of Hopper's tensor memory accelerator (TMA): a
// CUtensorMap, 128 bytes that the driver encodes (Device.EncodeTiled) and a
// kernel takes by value, as a `const __grid_constant__` parameter of 128
// bytes aligned to 64, whose address the bulk tensor copies
// (cp.async.bulk.tensor) name. Function.Launch passes it as such.
type TensorMap struct{ b [128]byte }

// TiledMap describes a tiled tensor map over global memory: a tensor of up
// to 5 dimensions, innermost first, of which a copy moves one box into
// shared memory (rows of Box[0] elements, one after the other), swizzled.
type TiledMap struct {
	// Elem is the element size in bytes: 1, 2 or 4 (copied as unsigned
	// integers of that size: a copy needs no floating-point type, and
	// elements out of bounds read as zeros).
	Elem int
	// Base is the tensor's first element, 16-byte aligned.
	Base Ptr
	// Dims are the elements of each dimension (1 to 2³²), innermost first.
	Dims []uint64
	// Strides are the bytes between consecutive indices of dimensions 1 to
	// len(Dims)−1: multiples of 16, below 2⁴⁰, each at least the extent of
	// the dimension inside it.
	Strides []uint64
	// Box is the elements a copy moves in each dimension (1 to 256);
	// Box[0]·Elem is a multiple of 16 bytes.
	Box []uint32
	// Swizzle is 0 (none) or 32, 64 or 128: rows of shared memory swizzled
	// in 16-byte chunks within atoms of 8 rows of that many bytes (128:
	// chunk c of row r at (c ^ r%8)·16 from a 1024-byte aligned base, as
	// wgmma's 128-byte swizzled operands lie); Box[0]·Elem at most that.
	Swizzle int
}

// Check reports what the driver would refuse in m, naming it.
func (m TiledMap) Check() error {
	rank := len(m.Dims)
	switch {
	case m.Elem != 1 && m.Elem != 2 && m.Elem != 4:
		return fmt.Errorf("cuda: tensor map: element of %d bytes (want 1, 2 or 4)", m.Elem)
	case rank < 1 || rank > 5:
		return fmt.Errorf("cuda: tensor map: %d dimensions (want 1 to 5)", rank)
	case len(m.Strides) != rank-1 || len(m.Box) != rank:
		return fmt.Errorf("cuda: tensor map: %d dimensions, %d strides, %d box sizes (want %d, %d, %d)", rank, len(m.Strides), len(m.Box), rank, rank-1, rank)
	case m.Base == 0 || m.Base%16 != 0:
		return fmt.Errorf("cuda: tensor map: base %#x is not 16-byte aligned", uint64(m.Base))
	}
	extent := uint64(m.Elem) // bytes of the dimensions inside dimension i
	for i, d := range m.Dims {
		if d == 0 || d > 1<<32 {
			return fmt.Errorf("cuda: tensor map: dimension %d of %d elements (want 1 to 2³²)", i, d)
		}
		if b := m.Box[i]; b == 0 || b > 256 || uint64(b) > d {
			return fmt.Errorf("cuda: tensor map: box of %d elements in dimension %d of %d (want 1 to 256, within the dimension)", b, i, d)
		}
		if i > 0 {
			s := m.Strides[i-1]
			if s%16 != 0 || s >= 1<<40 || s < extent {
				return fmt.Errorf("cuda: tensor map: stride of %d bytes for dimension %d (want a multiple of 16 below 2⁴⁰, at least the %d bytes inside it)", s, i, extent)
			}
			extent = s
		}
		extent *= d
	}
	row := int(m.Box[0]) * m.Elem
	switch {
	case row%16 != 0:
		return fmt.Errorf("cuda: tensor map: a box row of %d bytes (want a multiple of 16)", row)
	case m.Swizzle != 0 && m.Swizzle != 32 && m.Swizzle != 64 && m.Swizzle != 128:
		return fmt.Errorf("cuda: tensor map: swizzle of %d bytes (want 0, 32, 64 or 128)", m.Swizzle)
	case m.Swizzle != 0 && row > m.Swizzle:
		return fmt.Errorf("cuda: tensor map: a box row of %d bytes in a %d-byte swizzle", row, m.Swizzle)
	}
	return nil
}

// EncodeTiled encodes the tiled tensor map m (cuTensorMapEncodeTiled;
// compute capability 9.0 and a CUDA 12 driver). It needs no device memory
// and may be called from any goroutine.
func (d *Device) EncodeTiled(m TiledMap) (TensorMap, error) {
	var out TensorMap
	if err := m.Check(); err != nil {
		return out, err
	}
	if d.Major < 9 {
		return out, fmt.Errorf("cuda: tensor maps need compute capability 9.0 (%s is %d.%d)", d.Name, d.Major, d.Minor)
	}
	// CUtensorMapDataType: UINT8 0, UINT16 1, UINT32 2; CUtensorMapSwizzle:
	// NONE 0, 32B 1, 64B 2, 128B 3.
	dtype := map[int]int{1: 0, 2: 1, 4: 2}[m.Elem]
	swizzle := map[int]int{0: 0, 32: 1, 64: 2, 128: 3}[m.Swizzle]
	ones := make([]uint32, len(m.Dims))
	for i := range ones {
		ones[i] = 1
	}
	// The driver checks the address against the current context: the call
	// runs on the device's thread, as every other driver call does.
	err := d.Do(func() error { return drvTensorMapEncodeTiled(&out, dtype, m, ones, swizzle) })
	return out, err
}
