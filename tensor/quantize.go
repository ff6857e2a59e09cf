package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Quantize encodes float32 values as a block-quantized dtype, following
// ggml's reference quantizers: Q8_0 stores round(x/d) with d = max|x|/127;
// Q4_0 stores x/d + 8 in 4 bits with d = -m/8, m the value of largest
// magnitude, low nibbles holding the block's first 16 values; Q4_K, Q5_K
// and Q6_K as kquant.go says. Blocks are independent: a large x is
// quantized in parallel, in runs of whole blocks, with the same bytes.
func Quantize(d DType, x []float32) ([]byte, error) {
	total, err := d.Bytes(int64(len(x)))
	if err != nil {
		return nil, err
	}
	bs := d.BlockSize()
	parts := min(runtime.NumCPU(), len(x)/quantizeRun)
	if parts < 2 || bs <= 1 {
		return quantizeBlocks(d, x)
	}
	step := (len(x)/bs + parts - 1) / parts * bs
	out := make([]byte, 0, total)
	runs := make([][]byte, parts)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := min(p*step, len(x)), min((p+1)*step, len(x))
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[p], errs[p] = quantizeBlocks(d, x[lo:hi])
		}()
	}
	wg.Wait()
	for p := range parts {
		if errs[p] != nil {
			return nil, errs[p]
		}
		out = append(out, runs[p]...)
	}
	return out, nil
}

// quantizeRun is the fewest values a goroutine of Quantize takes.
const quantizeRun = 1 << 18

// quantizeBlocks is Quantize on one goroutine.
func quantizeBlocks(d DType, x []float32) ([]byte, error) {
	if _, err := d.Bytes(int64(len(x))); err != nil {
		return nil, err
	}
	var out []byte
	switch d {
	case Q8_0:
		for b := 0; b < len(x)/32; b++ {
			blk := x[b*32 : b*32+32]
			var amax float32
			for _, v := range blk {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			scale := amax / 127
			inv := float32(0)
			if scale != 0 {
				inv = 1 / scale
			}
			out = binary.LittleEndian.AppendUint16(out, F32ToF16(scale))
			for _, v := range blk {
				out = append(out, byte(int8(math.Round(float64(v*inv)))))
			}
		}
	case Q4_0:
		for b := 0; b < len(x)/32; b++ {
			blk := x[b*32 : b*32+32]
			var amax, mx float32
			for _, v := range blk {
				if a := float32(math.Abs(float64(v))); a > amax {
					amax, mx = a, v
				}
			}
			scale := mx / -8
			inv := float32(0)
			if scale != 0 {
				inv = 1 / scale
			}
			out = binary.LittleEndian.AppendUint16(out, F32ToF16(scale))
			for j := 0; j < 16; j++ {
				q0 := min(15, int8(blk[j]*inv+8.5))
				q1 := min(15, int8(blk[j+16]*inv+8.5))
				out = append(out, byte(q0)|byte(q1)<<4)
			}
		}
	case Q4_K:
		out = quantizeQ4_K(out, x)
	case Q5_K:
		out = quantizeQ5_K(out, x)
	case Q6_K:
		out = quantizeQ6_K(out, x)
	default:
		return nil, fmt.Errorf("quantize: no quantizer for %v", d)
	}
	return out, nil
}

// Encode stores vals as a tensor of dtype d (F32, F16, BF16, Q8_0 or Q4_0),
// rounding to nearest even or quantizing.
func Encode(name string, shape Shape, d DType, vals []float32) (*Tensor, error) {
	if int64(len(vals)) != shape.Elements() {
		return nil, fmt.Errorf("encode %s: %d values for shape %v", name, len(vals), shape)
	}
	var data []byte
	switch d {
	case F32:
		return FromF32(name, shape, vals), nil
	case F16, BF16:
		data = make([]byte, 2*len(vals))
		conv := F32ToF16
		if d == BF16 {
			conv = F32ToBF16
		}
		for i, v := range vals {
			binary.LittleEndian.PutUint16(data[2*i:], conv(v))
		}
	default:
		var err error
		if data, err = Quantize(d, vals); err != nil {
			return nil, fmt.Errorf("encode %s: %w", name, err)
		}
	}
	return &Tensor{Name: name, DType: d, Shape: shape, Data: data}, nil
}
