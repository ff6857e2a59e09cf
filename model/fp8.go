package model

import (
	"encoding/binary"
	"fmt"
	"strings"

	"kiln/tensor"
)

// FP8 checkpoints (compressed-tensors' "float-quantized" format, as
// llm-compressor writes it and vLLM reads it, and `kiln quantize --to fp8`):
// a matrix X.weight stored as F8_E4M3 [N,K] comes with X.weight_scale, one
// float per tensor ([] or [1]) or per output channel ([N] or [N,1]); its
// value is fp8·scale. X.input_scale (static activation scales) may follow
// and is not used: kiln does not quantize activations to FP8.
//
// widenFP8 replaces each such pair by the matrix in BF16 (fp8·scale rounded
// to bfloat16: a relative error at most 2⁻⁹, against FP8's own 2⁻⁴), so
// every backend runs the checkpoint; kernels that multiply the FP8 values
// directly are issue 16's GPU work. A lone scale or an FP8 tensor without
// one is an error naming it.
func widenFP8(ts map[string]*tensor.Tensor) error {
	widened := map[string]bool{}
	for name, t := range ts {
		if t.DType != tensor.F8_E4M3 {
			continue
		}
		sc, ok := ts[name+"_scale"]
		if !ok || !strings.HasSuffix(name, ".weight") || len(t.Shape) != 2 {
			return fmt.Errorf("tensor %s: F8_E4M3 is read only for matrices X.weight with a scale X.weight_scale", name)
		}
		scale, err := sc.F32s()
		if err != nil {
			return err
		}
		n, k := t.Shape[0], t.Shape[1]
		perRow := len(scale) == n && (len(sc.Shape) == 1 || len(sc.Shape) == 2 && sc.Shape[1] == 1)
		if !perRow && len(scale) != 1 {
			return fmt.Errorf("tensor %s: scale of shape %v for a matrix of %v (want one a tensor or one a row)", sc.Name, sc.Shape, t.Shape)
		}
		data := make([]byte, 2*n*k)
		for r := 0; r < n; r++ {
			s := scale[0]
			if perRow {
				s = scale[r]
			}
			for c := 0; c < k; c++ {
				v := tensor.E4M3ToF32(t.Data[r*k+c]) * s
				binary.LittleEndian.PutUint16(data[2*(r*k+c):], tensor.F32ToBF16(v))
			}
		}
		ts[name] = &tensor.Tensor{Name: name, DType: tensor.BF16, Shape: t.Shape, Data: data}
		widened[name] = true
	}
	for name := range ts {
		base, isScale := strings.CutSuffix(name, ".weight_scale")
		if !isScale {
			base, isScale = strings.CutSuffix(name, ".input_scale")
		}
		if !isScale {
			continue
		}
		if !widened[base+".weight"] {
			return fmt.Errorf("tensor %s scales no FP8 matrix", name)
		}
		delete(ts, name)
	}
	return nil
}
