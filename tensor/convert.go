package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BF16ToF32 widens a bfloat16 bit pattern.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds to nearest even, keeping NaN a NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32 widens an IEEE half-precision bit pattern.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		man &= 0x3ff
		return math.Float32frombits(sign | e<<23 | man<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToF16 rounds to nearest even half precision.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	man := b & 0x7fffff
	if b&0x7fffffff >= 0x7f800000 { // inf or nan
		if b&0x7fffffff > 0x7f800000 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	if exp >= 0x1f {
		return sign | 0x7c00
	}
	if exp <= 0 {
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - exp)
		half := uint32(1) << (shift - 1)
		r := man >> shift
		rem := man & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++
	}
	return sign | uint16(r)
}

// ToF32 decodes n elements of any supported dtype into float32, dequantizing
// block-quantized types.
func ToF32(d DType, data []byte, dst []float32) error {
	n := int64(len(dst))
	need, err := d.Bytes(n)
	if err != nil {
		return err
	}
	if int64(len(data)) < need {
		return fmt.Errorf("decode %v: %d bytes for %d elements, need %d", d, len(data), n, need)
	}
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		}
	case I32:
		for i := range dst {
			dst[i] = float32(int32(binary.LittleEndian.Uint32(data[4*i:])))
		}
	case F8_E4M3:
		for i := range dst {
			dst[i] = E4M3ToF32(data[i])
		}
	default:
		g, ok := ggmlBlocks[d]
		if !ok {
			return fmt.Errorf("decode: unsupported dtype %v", d)
		}
		for b := range len(dst) / g.size {
			g.decode(data[b*g.bytes:(b+1)*g.bytes], dst[b*g.size:(b+1)*g.size])
		}
	}
	return nil
}

// F32s decodes a whole tensor to float32.
func (t *Tensor) F32s() ([]float32, error) {
	out := make([]float32, t.Shape.Elements())
	if len(t.Parts) > 0 {
		off := 0
		for _, p := range t.Parts {
			f, err := p.F32s()
			if err != nil {
				return nil, fmt.Errorf("tensor %s: part %s: %w", t.Name, p.Name, err)
			}
			if off+len(f) > len(out) {
				return nil, fmt.Errorf("tensor %s: its parts hold more than %v", t.Name, t.Shape)
			}
			off += copy(out[off:], f)
		}
		return out, nil
	}
	if err := ToF32(t.DType, t.Data, out); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	if len(t.Scales) > 0 && len(t.Shape) == 2 {
		k := t.Shape[1]
		for r := 0; r < t.Shape[0]; r++ {
			s := t.RowScale(r)
			for i := r * k; i < (r+1)*k; i++ {
				out[i] *= s
			}
		}
	}
	return out, nil
}

// EncodeF32 encodes vals as dtype d (F32, F16, BF16 or F8_E4M3, each
// value rounded to nearest even) into len(vals) elements of bytes.
func EncodeF32(d DType, vals []float32) ([]byte, error) {
	var b []byte
	switch d {
	case F32:
		b = make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case F16, BF16:
		put := F32ToF16
		if d == BF16 {
			put = F32ToBF16
		}
		b = make([]byte, 2*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint16(b[2*i:], put(v))
		}
	case F8_E4M3:
		b = make([]byte, len(vals))
		for i, v := range vals {
			b[i] = F32ToE4M3(v)
		}
	default:
		return nil, fmt.Errorf("encode: unsupported dtype %v", d)
	}
	return b, nil
}

// FromF32 builds an F32 tensor holding a copy of vals.
func FromF32(name string, shape Shape, vals []float32) *Tensor {
	data := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return &Tensor{Name: name, DType: F32, Shape: shape, Data: data}
}
