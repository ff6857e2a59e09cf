// Format detection and the checks shared by every loader: Load looks at what
// a path is (a Hugging Face directory, a GGUF file, a llama2.c checkpoint)
// and hands it to the matching loader; checkTensors verifies that a model has
// every tensor its Config implies, with the right shape.

package model

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"kiln/tensor"
)

// Load reads the model at path: a directory is read as a Hugging Face
// checkpoint (config.json and safetensors), as is a path naming its
// config.json, index or a .safetensors file; a file starting with "GGUF" is
// read as GGUF, and any other file as a llama2.c checkpoint (version 1
// "ak42", or the legacy format, which has no magic).
func Load(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	if st.IsDir() {
		return LoadHF(path)
	}
	// A file of a Hugging Face checkpoint stands for its directory.
	switch base := filepath.Base(path); {
	case base == "config.json" || base == "model.safetensors.index.json" || strings.HasSuffix(base, ".safetensors"):
		return LoadHF(filepath.Dir(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	var head [4]byte
	n, err := io.ReadFull(f, head[:])
	f.Close()
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	switch {
	case n == 4 && bytes.Equal(head[:], []byte(ggufMagic)):
		return LoadGGUF(path)
	case n == 4 && binary.LittleEndian.Uint32(head[:]) == llama2cMagic:
		return LoadLlama2C(path)
	}
	return LoadLlama2C(path)
}

// loadMapped maps path and runs parse over its bytes; on success the model
// owns the mapping, on failure it is released.
func loadMapped(path string, parse func([]byte) (*Model, error)) (*Model, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	m, err := parse(data)
	if err != nil {
		unmap()
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	m.Path = path
	m.closers = append(m.closers, markMapped(m.Tensors, data, unmap))
	return m, nil
}

// markMapped sets Release on the tensors whose data lies in mapping, a
// file mapping of mapFile's that unmap releases (tensors rewritten into
// memory of their own, e.g. GGUF's permuted Q/K rows, are left alone). It
// returns the unmapping to run when the model closes: after it, Release
// does nothing (the addresses may belong to something else by then).
func markMapped(ts map[string]*tensor.Tensor, mapping []byte, unmap func() error) func() error {
	var mu sync.RWMutex
	unmapped := false
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mapping)))
	hi := lo + uintptr(len(mapping))
	for _, t := range ts {
		if len(t.Data) == 0 || len(mapping) == 0 {
			continue
		}
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(t.Data))); p >= lo && p+uintptr(len(t.Data)) <= hi {
			d := t.Data
			t.Release = func() {
				mu.RLock()
				defer mu.RUnlock()
				if !unmapped {
					dropPages(d)
				}
			}
		}
	}
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		unmapped = true
		return unmap()
	}
}

// MoERouter is the router of layer l's mixture of experts; MoEExpert
// expert e's gate, up and down projections: Mixtral's names
// (block_sparse_moe, w1, w3, w2), or Qwen3-MoE's (mlp.gate,
// mlp.experts.E.gate_proj, up_proj, down_proj).
func (c *Config) MoERouter(l int) string {
	if c.Arch == "mixtral" {
		return LayerName(l, "block_sparse_moe.gate.weight")
	}
	return LayerName(l, "mlp.gate.weight")
}

// MoEExpert: see MoERouter.
func (c *Config) MoEExpert(l, e int) (gate, up, down string) {
	if c.Arch == "mixtral" {
		p := func(w string) string { return LayerName(l, fmt.Sprintf("block_sparse_moe.experts.%d.%s.weight", e, w)) }
		return p("w1"), p("w3"), p("w2")
	}
	p := func(w string) string { return LayerName(l, fmt.Sprintf("mlp.experts.%d.%s.weight", e, w)) }
	return p("gate_proj"), p("up_proj"), p("down_proj")
}

// MoEShared names layer l's shared expert's matrices (SharedExpertSize).
func (c *Config) MoEShared(l int) (gate, up, down string) {
	p := func(w string) string { return LayerName(l, "mlp.shared_expert."+w+".weight") }
	return p("gate_proj"), p("up_proj"), p("down_proj")
}

// MoESharedGate names layer l's shared expert's gate (SharedExpertGate).
func (c *Config) MoESharedGate(l int) string { return LayerName(l, "mlp.shared_expert_gate.weight") }

// TensorSpec names a tensor a config implies, with its shape.
type TensorSpec struct {
	Name  string
	Shape tensor.Shape
}

// ExpectedTensors lists, in a fixed order, every tensor the config implies
// and its shape. lm_head is included only when the embeddings are not tied.
func ExpectedTensors(c *Config) []TensorSpec {
	h, inter, v := c.HiddenSize, c.IntermediateSize, c.VocabSize
	q, kv := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	out := []TensorSpec{{EmbedName, tensor.Shape{v, h}}}
	for l := 0; l < c.NumLayers; l++ {
		out = append(out,
			TensorSpec{LayerName(l, "input_layernorm.weight"), tensor.Shape{h}},
			TensorSpec{LayerName(l, "self_attn.q_proj.weight"), tensor.Shape{q, h}},
			TensorSpec{LayerName(l, "self_attn.k_proj.weight"), tensor.Shape{kv, h}},
			TensorSpec{LayerName(l, "self_attn.v_proj.weight"), tensor.Shape{kv, h}},
		)
		if c.QKVBias {
			out = append(out,
				TensorSpec{LayerName(l, "self_attn.q_proj.bias"), tensor.Shape{q}},
				TensorSpec{LayerName(l, "self_attn.k_proj.bias"), tensor.Shape{kv}},
				TensorSpec{LayerName(l, "self_attn.v_proj.bias"), tensor.Shape{kv}},
			)
		}
		if c.QKNorm {
			out = append(out,
				TensorSpec{LayerName(l, "self_attn.q_norm.weight"), tensor.Shape{c.HeadDim}},
				TensorSpec{LayerName(l, "self_attn.k_norm.weight"), tensor.Shape{c.HeadDim}},
			)
		}
		if c.QKNormWhole {
			out = append(out,
				TensorSpec{LayerName(l, "self_attn.q_norm.weight"), tensor.Shape{q}},
				TensorSpec{LayerName(l, "self_attn.k_norm.weight"), tensor.Shape{kv}},
			)
		}
		out = append(out,
			TensorSpec{LayerName(l, "self_attn.o_proj.weight"), tensor.Shape{h, q}},
			TensorSpec{LayerName(l, "post_attention_layernorm.weight"), tensor.Shape{h}},
		)
		if c.PostNorms {
			out = append(out,
				TensorSpec{LayerName(l, "pre_feedforward_layernorm.weight"), tensor.Shape{h}},
				TensorSpec{LayerName(l, "post_feedforward_layernorm.weight"), tensor.Shape{h}},
			)
		}
		if c.NumExperts > 0 {
			out = append(out, TensorSpec{c.MoERouter(l), tensor.Shape{c.NumExperts, h}})
			for e := 0; e < c.NumExperts; e++ {
				gate, up, down := c.MoEExpert(l, e)
				out = append(out,
					TensorSpec{gate, tensor.Shape{inter, h}},
					TensorSpec{up, tensor.Shape{inter, h}},
					TensorSpec{down, tensor.Shape{h, inter}},
				)
			}
			if s := c.SharedExpertSize; s > 0 {
				gate, up, down := c.MoEShared(l)
				out = append(out, TensorSpec{gate, tensor.Shape{s, h}}, TensorSpec{up, tensor.Shape{s, h}}, TensorSpec{down, tensor.Shape{h, s}})
				if c.SharedExpertGate {
					out = append(out, TensorSpec{c.MoESharedGate(l), tensor.Shape{1, h}})
				}
			}
			continue
		}
		out = append(out,
			TensorSpec{LayerName(l, "mlp.gate_proj.weight"), tensor.Shape{inter, h}},
			TensorSpec{LayerName(l, "mlp.up_proj.weight"), tensor.Shape{inter, h}},
			TensorSpec{LayerName(l, "mlp.down_proj.weight"), tensor.Shape{h, inter}},
		)
	}
	out = append(out, TensorSpec{NormName, tensor.Shape{h}})
	if !c.TiedEmbeddings {
		out = append(out, TensorSpec{HeadName, tensor.Shape{v, h}})
	}
	return out
}

// checkTensors validates the config, then checks that every tensor the config
// implies is present with the right shape and a valid byte size, reporting
// the first one that is not.
func checkTensors(c *Config, ts map[string]*tensor.Tensor) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.NumLayers > len(ts) {
		return fmt.Errorf("config has %d layers but the file holds only %d tensors", c.NumLayers, len(ts))
	}
	for _, e := range ExpectedTensors(c) {
		t, ok := ts[e.Name]
		if !ok {
			return fmt.Errorf("missing tensor %s", e.Name)
		}
		if !t.Shape.Equal(e.Shape) {
			return fmt.Errorf("tensor %s has shape %v, want %v", e.Name, t.Shape, e.Shape)
		}
		if err := t.Validate(); err != nil {
			return err
		}
	}
	if t, ok := ts[HeadName]; ok && c.TiedEmbeddings {
		// Some checkpoints store the tied head anyway; it must still fit.
		if !t.Shape.Equal(tensor.Shape{c.VocabSize, c.HiddenSize}) {
			return fmt.Errorf("tensor %s has shape %v, want %v", HeadName, t.Shape, tensor.Shape{c.VocabSize, c.HiddenSize})
		}
	}
	return nil
}

// mulCap multiplies non-negative a and b, failing when the product exceeds
// limit (which also rules out overflow).
func mulCap(a, b, limit int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > limit/b {
		return 0, false
	}
	return a * b, true
}

// elementsCap returns the element count of shape, failing when a dimension is
// negative or the count exceeds limit.
func elementsCap(shape []int64, limit int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		var ok bool
		if n, ok = mulCap(n, d, limit); !ok {
			return 0, false
		}
	}
	return n, true
}

// sortSpans sorts byte ranges by start, then end.
func sortSpans[S any](s []S, key func(S) (uint64, uint64)) {
	sort.Slice(s, func(i, j int) bool {
		bi, ei := key(s[i])
		bj, ej := key(s[j])
		if bi != bj {
			return bi < bj
		}
		return ei < ej
	})
}
