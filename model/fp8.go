package model

import (
	"fmt"
	"strings"

	"kiln/tensor"
)

// FP8 checkpoints (compressed-tensors' "float-quantized" format, as
// llm-compressor writes it and vLLM reads it, and `kiln quantize --to fp8`):
// a matrix X.weight stored as F8_E4M3 [N,K] comes with X.weight_scale, one
// float per tensor ([] or [1]) or per output channel ([N] or [N,1]); its
// value is fp8·scale. X.input_scale (static activation scales) may follow
// and is not used: kiln does not quantize activations to FP8 statically.
//
// scaleFP8 keeps each such matrix in F8_E4M3 with its scale as the tensor's
// Scales (Tensor.F32s applies them), and drops the scale tensors: the CPU
// multiplies the codes directly (gemm's F8_E4M3 weights), the GPU widens
// them to its compute dtype as it uploads them. A lone scale or an FP8
// tensor without one is an error naming it.
func scaleFP8(ts map[string]*tensor.Tensor) error {
	scaled := map[string]bool{}
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
		n := t.Shape[0]
		perRow := len(scale) == n && (len(sc.Shape) == 1 || len(sc.Shape) == 2 && sc.Shape[1] == 1)
		if !perRow && len(scale) != 1 {
			return fmt.Errorf("tensor %s: scale of shape %v for a matrix of %v (want one a tensor or one a row)", sc.Name, sc.Shape, t.Shape)
		}
		ts[name] = &tensor.Tensor{Name: name, DType: tensor.F8_E4M3, Shape: t.Shape, Data: t.Data, Scales: scale}
		scaled[name] = true
	}
	for name := range ts {
		base, isScale := strings.CutSuffix(name, ".weight_scale")
		if !isScale {
			base, isScale = strings.CutSuffix(name, ".input_scale")
		}
		if !isScale {
			continue
		}
		if !scaled[base+".weight"] {
			return fmt.Errorf("tensor %s scales no FP8 matrix", name)
		}
		delete(ts, name)
	}
	return nil
}
