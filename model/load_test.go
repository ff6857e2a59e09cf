package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/tensor"
)

func TestLoadDispatch(t *testing.T) {
	c := tinyConfig("llama")
	ts := randTensors(&c, tensor.F32, 1)
	dir := writeHFDir(t, hfConfigJSON(&c, nil), ts, 1)
	gg, _ := ggufFixture(t, &c, tensor.F32, nil)
	lc, lts := tinyLlama2C(true)
	tmp := t.TempDir()
	ggPath := filepath.Join(tmp, "m.gguf")
	writeFile(t, ggPath, gg)
	lPath := filepath.Join(tmp, "m.bin")
	writeFile(t, lPath, llama2cBytes(&lc, byName(lts), true))
	for _, tc := range []struct{ path, format string }{
		{dir, "safetensors"},
		{filepath.Join(dir, "model.safetensors"), "safetensors"},
		{filepath.Join(dir, "config.json"), "safetensors"},
		{ggPath, "gguf"},
		{lPath, "llama2c"},
	} {
		m, err := Load(tc.path)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if m.Format != tc.format {
			t.Errorf("%s: format %q, want %q", tc.path, m.Format, tc.format)
		}
		if m.ParamCount() == 0 || m.ParamBytes() == 0 {
			t.Errorf("%s: empty model", tc.path)
		}
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if err := m.Close(); err != nil { // idempotent
			t.Error(err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	tmp := t.TempDir()
	empty := filepath.Join(tmp, "empty.bin")
	writeFile(t, empty, nil)
	text := filepath.Join(tmp, "text.bin")
	writeFile(t, text, []byte("this is not a model file at all, just some text"))
	noCfg := filepath.Join(tmp, "nocfg")
	os.Mkdir(noCfg, 0o755)
	noWeights := filepath.Join(tmp, "noweights")
	os.Mkdir(noWeights, 0o755)
	c := tinyConfig("llama")
	writeFile(t, filepath.Join(noWeights, "config.json"), hfConfigJSON(&c, nil))
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(tmp, "absent"), "no such file"},
		{empty, "shorter than"},
		{text, "not a GGUF file or llama2.c checkpoint: llama2.c: dim"},
		{noCfg, "config.json"},
		{noWeights, "model.safetensors"},
	} {
		_, err := Load(tc.path)
		if err == nil {
			t.Fatalf("%s: no error", tc.path)
		}
		if !strings.HasPrefix(err.Error(), "load "+tc.path+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q, want prefix and %q", tc.path, err, tc.want)
		}
	}
}
