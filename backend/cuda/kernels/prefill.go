package kernels

import (
	"fmt"

	"kiln/backend/cuda/cu"
)

// PrefillAttention runs causal (optionally windowed) attention for every
// token of the batch, tiled over its prefill tiles: FlashAttention-style,
// keys in shared-memory tiles, online softmax. f16 and bf16 run on the
// tensor cores (mma.sync), f32 on the CUDA cores.
func (k *Kernels) PrefillAttention(s *cu.Stream, a Attn, m DevMeta) error {
	v := "mma"
	if k.Act == cu.F32 || a.HeadDim%16 != 0 {
		v = "attn"
	}
	return k.prefill(s, a, m, v)
}

// prefill runs one variant of the prefill kernel: "attn" (CUDA cores, any
// dtype), "mma" (tensor cores, f16/bf16) or "ldm" (tensor cores, fragments
// through ldmatrix).
func (k *Kernels) prefill(s *cu.Stream, a Attn, m DevMeta, variant string) error {
	if err := k.checkAttn(&a, m); err != nil {
		return err
	}
	if variant != "attn" && k.Act == cu.F32 {
		return fmt.Errorf("kernels: no tensor-core prefill for f32")
	}
	name := fmt.Sprintf("prefill_%s_%d", variant, a.HeadDim)
	if variant == "ldm" {
		m2, err := k.expModule()
		if err != nil {
			return err
		}
		return launchOn(m2, name, cu.Dim3{X: m.Tiles, Y: a.Heads, Z: 1}, cu.D1(128), 0, s,
			a.Q, a.KCache, a.VCache, a.Out, m.At(m.TileTok0), m.At(m.TileCount), m.At(m.Positions), m.At(m.SeqIndex),
			m.At(m.SeqBlockOff), m.At(m.BlockTable), int32(a.Heads), int32(a.KVHeads), int32(m.BlockSize), int32(a.Window), a.Scale)
	}
	return k.launch(name, cu.Dim3{X: m.Tiles, Y: a.Heads, Z: 1}, cu.D1(128), 0, s,
		a.Q, a.KCache, a.VCache, a.Out, m.At(m.TileTok0), m.At(m.TileCount), m.At(m.Positions), m.At(m.SeqIndex),
		m.At(m.SeqBlockOff), m.At(m.BlockTable), int32(a.Heads), int32(a.KVHeads), int32(m.BlockSize), int32(a.Window), a.Scale)
}
