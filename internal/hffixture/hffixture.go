// Package hffixture loads the Hugging Face transformers fixtures of
// testdata/hf (recorded by tools/hf-fixtures): random-weight models with
// transformers' logits at every prompt position and its greedy continuation,
// for the tests of every backend.
package hffixture

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kiln/engine"
)

// Fixture is one recorded model.
type Fixture struct {
	Variant     string `json:"variant"`
	InputIDs    []int  `json:"input_ids"`
	GreedyIDs   []int  `json:"greedy_ids"`
	LogitsShape [2]int `json:"logits_shape"`
	// Logits holds transformers' logits, LogitsShape[0] rows of
	// LogitsShape[1].
	Logits []float32 `json:"-"`
}

// Load reads every fixture under root (the repository's testdata/hf), keyed
// by its directory.
func Load(t testing.TB, root string) map[string]*Fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "*", "expected.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures under %s: %v", root, err)
	}
	out := map[string]*Fixture{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f := &Fixture{}
		if err := json.Unmarshal(data, f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		raw, err := os.ReadFile(filepath.Join(filepath.Dir(p), "logits.bin"))
		if err != nil {
			t.Fatal(err)
		}
		n := f.LogitsShape[0] * f.LogitsShape[1]
		if len(raw) != 4*n || f.LogitsShape[0] != len(f.InputIDs) {
			t.Fatalf("%s: logits.bin has %d bytes for shape %v and %d ids", p, len(raw), f.LogitsShape, len(f.InputIDs))
		}
		f.Logits = make([]float32, n)
		for i := range f.Logits {
			f.Logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		out[filepath.Dir(p)] = f
	}
	return out
}

// Prefill runs the fixture's prompt through e as one new sequence and
// returns the logits of every position (freeing the sequence).
func (f *Fixture) Prefill(t testing.TB, e *engine.Engine) []float32 {
	t.Helper()
	seq := e.NewSequence()
	defer e.Free(seq)
	logits, err := e.Prefill(seq, f.InputIDs, true)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// CheckGreedy generates the fixture's greedy continuation on e and requires
// transformers' ids.
func (f *Fixture) CheckGreedy(t testing.TB, e *engine.Engine) {
	t.Helper()
	var ids []int
	if _, err := e.Generate(f.InputIDs, engine.SamplingParams{MaxTokens: len(f.GreedyIDs)}, func(id int) bool {
		ids = append(ids, id)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, f.GreedyIDs) {
		t.Errorf("greedy ids\n got %v\nwant %v", ids, f.GreedyIDs)
	}
}
