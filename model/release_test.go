package model

import (
	"bytes"
	"os"
	"testing"

	"kiln/internal/testshared"
)

// checkRelease: some tensors of m (loaded from a file mapping) can give
// their pages back (tensor.Tensor.Release), twice harmlessly, and their data
// reads the same afterwards (the pages come back from the file).
func checkRelease(t *testing.T, m *Model) {
	t.Helper()
	released := 0
	for name, ts := range m.Tensors {
		if ts.Release == nil {
			continue
		}
		before := bytes.Clone(ts.Data)
		ts.Release()
		ts.Release()
		if !bytes.Equal(ts.Data, before) {
			t.Fatalf("%s: data changed after Release", name)
		}
		released++
	}
	if released == 0 {
		t.Fatalf("%s: no tensor of a mapped file has Release", m.Path)
	}
}

// TestReleaseMapped: checkRelease on a llama2.c file, and Release does
// nothing once the model is closed (the mapping is gone).
func TestReleaseMapped(t *testing.T) {
	m, err := Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	checkRelease(t, m)
	m.Close()
	for _, ts := range m.Tensors {
		if ts.Release != nil {
			ts.Release()
		}
	}
}

// TestReleaseHF: checkRelease on a Hugging Face directory; the same
// directory read through an fs.FS (into memory, not a mapping) has no
// Release.
func TestReleaseHF(t *testing.T) {
	dir := "../demo/files"
	m, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkRelease(t, m)
	inMemory, err := LoadHFFS(os.DirFS(dir), "demo")
	if err != nil {
		t.Fatal(err)
	}
	defer inMemory.Close()
	for name, ts := range inMemory.Tensors {
		if ts.Release != nil {
			t.Errorf("%s read into memory has Release", name)
		}
	}
}
