package artifact

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/model"
	"kiln/tensor"
	"kiln/tune"
)

// newArtifact writes a small artifact (two kernel files, a tune file) and
// its manifest into a fresh directory.
func newArtifact(t *testing.T) (string, Manifest) {
	t.Helper()
	dir := t.TempDir()
	for path, body := range map[string]string{
		"kernels/ab/ab12.kc":    "image one",
		"kernels/cd/cd34.kc":    "image two",
		"tune/tune-0123.json":   `{"format":"kiln-tune-v1"}`,
		"tune/.lock":            "",
		"kernels/ab/.tmp-12345": "a write in progress",
	} {
		p := filepath.Join(dir, filepath.FromSlash(path))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(dir, "kernels/ab/.tmp-12345")) // written and gone, as kcache's temporaries are
	m := Manifest{Kiln: "v1", Device: tune.Device{Name: "GPU", Arch: "9.0", Driver: "13000", Runtime: "nvrtc 13.0", Kiln: "v1"},
		Model: ModelID{Path: "/m", Fingerprint: "f00d"}, DType: "bf16", KVCache: "auto",
		Plan: Plan{Buckets: []int{1, 2048}, Prefill: 2048, Depth: 512, Batches: []int{1, 64}}, Created: time.Now().UTC()}
	m, err := Write(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func TestWriteRead(t *testing.T) {
	dir, want := newArtifact(t)
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Format != Format || got.Kiln != want.Kiln || got.Device != want.Device || got.Model != want.Model || got.Plan.Prefill != 2048 {
		t.Errorf("read %+v, wrote %+v", got, want)
	}
	var paths []string
	for _, f := range got.Files {
		paths = append(paths, f.Path)
		if len(f.SHA256) != 64 || f.Size == 0 {
			t.Errorf("file %+v", f)
		}
	}
	if strings.Join(paths, " ") != "kernels/ab/ab12.kc kernels/cd/cd34.kc tune/tune-0123.json" {
		t.Errorf("files %q (the lock file and the manifest are not listed)", paths)
	}
	if err := got.Check(want.Device, "v1", "f00d"); err != nil {
		t.Errorf("Check of its own device, build and model: %v", err)
	}
}

// TestReadRefuses: an artifact changed in any way, or of another format,
// is refused with an error naming what is wrong.
func TestReadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		change     func(dir string)
	}{
		{"changed", "kernels/ab/ab12.kc has changed", func(dir string) {
			os.WriteFile(filepath.Join(dir, "kernels/ab/ab12.kc"), []byte("image 1"), 0o644) // same size
		}},
		{"missing", "kernels/cd/cd34.kc is missing", func(dir string) { os.Remove(filepath.Join(dir, "kernels/cd/cd34.kc")) }},
		{"added", "kernels/ef/ef.kc is not in the manifest", func(dir string) {
			os.MkdirAll(filepath.Join(dir, "kernels/ef"), 0o755)
			os.WriteFile(filepath.Join(dir, "kernels/ef/ef.kc"), []byte("x"), 0o644)
		}},
		{"format", `format "kiln-artifact-v0"`, func(dir string) {
			p := filepath.Join(dir, ManifestFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), Format, "kiln-artifact-v0", 1)), 0o644)
		}},
		{"garbage", "manifest", func(dir string) { os.WriteFile(filepath.Join(dir, ManifestFile), []byte("{"), 0o644) }},
		{"no manifest", "kiln compile", func(dir string) { os.Remove(filepath.Join(dir, ManifestFile)) }},
		{"link", "not a regular file", func(dir string) {
			os.Symlink("/etc/passwd", filepath.Join(dir, "kernels/ab/link.kc"))
		}},
	} {
		dir, _ := newArtifact(t)
		tc.change(dir)
		_, err := Read(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Read gave %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckRefuses(t *testing.T) {
	_, m := newArtifact(t)
	other := m.Device
	other.Name = "Another GPU"
	for _, tc := range []struct {
		dev              tune.Device
		kiln, fp, wanted string
	}{
		{other, "v1", "f00d", "this device is Another GPU"},
		{m.Device, "v2", "f00d", "this is kiln v2"},
		{m.Device, "v1", "beef", "another model"},
	} {
		err := m.Check(tc.dev, tc.kiln, tc.fp)
		if err == nil || !strings.Contains(err.Error(), tc.wanted) {
			t.Errorf("Check(%v, %s, %s) = %v, want %q", tc.dev.Name, tc.kiln, tc.fp, err, tc.wanted)
		}
	}
}

// TestFingerprint: a model's fingerprint follows its architecture and its
// tensors' shapes, not its weights' values.
func TestFingerprint(t *testing.T) {
	mk := func(rows int, fill byte) *model.Model {
		data := make([]byte, rows*4*4)
		for i := range data {
			data[i] = fill
		}
		m := &model.Model{Format: "safetensors", Tensors: map[string]*tensor.Tensor{
			"w": {Name: "w", DType: tensor.F32, Shape: tensor.Shape{rows, 4}, Data: data}}}
		m.Config.HiddenSize = 4
		return m
	}
	a, b, c := Fingerprint(mk(2, 1)), Fingerprint(mk(2, 7)), Fingerprint(mk(3, 1))
	if a != b {
		t.Errorf("other weights, same shapes: fingerprints %s and %s differ", a, b)
	}
	if a == c {
		t.Errorf("another shape, the same fingerprint %s", a)
	}
	d := mk(2, 1)
	d.Config.HiddenSize = 8
	if Fingerprint(d) == a {
		t.Error("another configuration, the same fingerprint")
	}
}
