// Safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the end of the header) plus an optional
// "__metadata__" map of strings, then the raw little-endian tensor data.
//
// parseSafetensors works on the file's bytes (a memory mapping in practice)
// and returns tensors whose Data slices those bytes.

package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"

	"kiln/tensor"
)

// maxSafetensorsHeader bounds the JSON header (the reference implementation
// uses 100 MB).
const maxSafetensorsHeader = 100 << 20

var safetensorsDTypes = map[string]tensor.DType{
	"F32":     tensor.F32,
	"F16":     tensor.F16,
	"BF16":    tensor.BF16,
	"F8_E4M3": tensor.F8_E4M3,
}

var dtypeToSafetensors = map[tensor.DType]string{
	tensor.F32:     "F32",
	tensor.F16:     "F16",
	tensor.BF16:    "BF16",
	tensor.F8_E4M3: "F8_E4M3",
}

type safetensorsEntry struct {
	DType       string            `json:"dtype"`
	Shape       []int64           `json:"shape"`
	DataOffsets []json.RawMessage `json:"data_offsets"`
}

// parseSafetensors parses a whole safetensors file held in data. The tensors
// slice data without copying; metadata is the "__metadata__" map (may be nil).
func parseSafetensors(data []byte) (map[string]*tensor.Tensor, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, fmt.Errorf("safetensors: file of %d bytes is shorter than the 8-byte header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > maxSafetensorsHeader || n > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d exceeds the file (%d bytes) or the %d-byte limit", n, len(data), maxSafetensorsHeader)
	}
	header := data[8 : 8+n]
	body := data[8+n:]
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	if err := dec.Decode(&raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors: header: %w", err)
	}
	if raw == nil {
		return nil, nil, errors.New("safetensors: header is not a JSON object")
	}
	// Only spaces (padding) may follow the object.
	if len(bytes.TrimSpace(header[dec.InputOffset():])) != 0 {
		return nil, nil, errors.New("safetensors: header has data after the JSON object")
	}
	var meta map[string]string
	if m, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, nil, fmt.Errorf("safetensors: __metadata__: %w", err)
		}
		delete(raw, "__metadata__")
	}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(raw))
	ts := make(map[string]*tensor.Tensor, len(raw))
	for name, msg := range raw {
		var e safetensorsEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: %w", name, err)
		}
		dt, ok := safetensorsDTypes[e.DType]
		if !ok {
			return nil, nil, fmt.Errorf("unsupported dtype %s for tensor %s", e.DType, name)
		}
		if e.Shape == nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %s has no shape", name)
		}
		if len(e.DataOffsets) != 2 {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: data_offsets must hold 2 numbers, has %d", name, len(e.DataOffsets))
		}
		var off [2]int64
		for i, r := range e.DataOffsets {
			if err := json.Unmarshal(r, &off[i]); err != nil {
				return nil, nil, fmt.Errorf("safetensors: tensor %s: data_offsets: %w", name, err)
			}
		}
		begin, end := off[0], off[1]
		if begin < 0 || end < begin || end > int64(len(body)) {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: data_offsets [%d, %d] outside the %d data bytes", name, begin, end, len(body))
		}
		shape := make(tensor.Shape, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, nil, fmt.Errorf("safetensors: tensor %s: bad dimension %d in shape %v", name, d, e.Shape)
			}
			shape[i] = int(d)
		}
		elems, ok := elementsCap(e.Shape, int64(len(body)))
		if !ok {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: shape %v is larger than the file", name, e.Shape)
		}
		want, err := dt.Bytes(elems)
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: %w", name, err)
		}
		if end-begin != want {
			return nil, nil, fmt.Errorf("safetensors: tensor %s: %s %v needs %d bytes, data_offsets give %d", name, e.DType, shape, want, end-begin)
		}
		ts[name] = &tensor.Tensor{Name: name, DType: dt, Shape: shape, Data: body[begin:end:end]}
		spans = append(spans, span{name, begin, end})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, nil, fmt.Errorf("safetensors: tensors %s and %s overlap", spans[i-1].name, spans[i].name)
		}
	}
	return ts, meta, nil
}

// WriteSafetensors writes tensors (F32, F16 or BF16) as a safetensors file,
// in the order given, with optional string metadata. Tests use it to build
// fixtures.
func WriteSafetensors(w io.Writer, tensors []*tensor.Tensor, metadata map[string]string) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if err := t.Validate(); err != nil {
			return err
		}
		name, ok := dtypeToSafetensors[t.DType]
		if !ok {
			return fmt.Errorf("write safetensors: unsupported dtype %v for tensor %s", t.DType, t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("write safetensors: duplicate tensor %s", t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = tensor.Shape{}
		}
		header[t.Name] = map[string]any{
			"dtype":        name,
			"shape":        shape,
			"data_offsets": [2]int64{off, off + int64(len(t.Data))},
		}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}
