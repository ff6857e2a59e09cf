package model

import (
	"bytes"
	"os"
	"testing"

	"kiln/internal/testshared"
)

// TestReleaseMapped: the tensors of a mapped file can give their pages back
// (tensor.Tensor.Release), and their data reads the same afterwards (the
// pages come back from the file), for a llama2.c file and a Hugging Face
// directory; the same directory read through an fs.FS (into memory, not a
// mapping) has no Release.
func TestReleaseMapped(t *testing.T) {
	m, err := Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	released := 0
	for name, ts := range m.Tensors {
		if ts.Release == nil {
			continue
		}
		before := bytes.Clone(ts.Data)
		ts.Release()
		ts.Release() // twice is harmless
		if !bytes.Equal(ts.Data, before) {
			t.Fatalf("%s: data changed after Release", name)
		}
		released++
	}
	if released == 0 {
		t.Fatal("no tensor of a mapped file has Release")
	}
	// After Close the mapping is gone: Release must not touch it.
	m.Close()
	for _, ts := range m.Tensors {
		if ts.Release != nil {
			ts.Release()
		}
	}
}

func TestReleaseHF(t *testing.T) {
	dir := "../demo/files"
	m, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	n := 0
	for name, ts := range m.Tensors {
		if ts.Release == nil {
			continue
		}
		before := bytes.Clone(ts.Data)
		ts.Release()
		if !bytes.Equal(ts.Data, before) {
			t.Fatalf("%s: data changed after Release", name)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no tensor of a mapped checkpoint has Release")
	}
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
