// Package artifact is the on-disk form of a model compiled ahead of time
// for one kind of GPU (kiln compile MODEL --device cuda -o DIR): the
// device's compiled kernel images (a kernel cache, kernels/), the tuned
// choices of its products and attention (a tune cache, tune/), and a
// manifest saying what it was built for (the model, the device, the kiln
// build, the step sizes its plans and choices cover) with the SHA-256 of
// every file. kiln serve --artifact DIR starts from it without compiling
// or timing what it holds; what it lacks is compiled or timed at run time
// and counted (kiln:jit_fallback_total).
//
// A manifest that does not match (another device, kiln build or model), a
// file missing or changed, or an unknown format is refused with an error
// that says which, never used in part.
package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"kiln/model"
	"kiln/tune"
)

// Format names the manifest's layout; a reader refuses any other.
const Format = "kiln-artifact-v1"

// ManifestFile is the manifest's name in an artifact's directory;
// KernelsDir and TuneDir name the kernel and tune caches in it.
const (
	ManifestFile = "manifest.json"
	KernelsDir   = "kernels"
	TuneDir      = "tune"
)

// Manifest says what an artifact holds and what it was built for.
type Manifest struct {
	Format string `json:"format"`
	// Kiln is the kiln build that wrote it (tune.KilnVersion): the kernels'
	// sources and the choices' names are that build's.
	Kiln string `json:"kiln"`
	// Device is the GPU it was built on, as its tune cache names it (name,
	// compute capability, driver, NVRTC and cuBLASLt versions).
	Device tune.Device `json:"device"`
	// Model identifies the model (Fingerprint) and where it was read from.
	Model ModelID `json:"model"`
	// DType is the compute dtype, KVCache the KV cache's element type.
	DType   string `json:"dtype"`
	KVCache string `json:"kv_cache"`
	// Plan is the step sizes the plans are built for and the choices were
	// tuned at.
	Plan Plan `json:"plan"`
	// Files lists every file of the artifact but the manifest, with its
	// size and SHA-256.
	Files   []File    `json:"files"`
	Created time.Time `json:"created"`
}

// ModelID identifies a model: Fingerprint hashes its architecture and its
// tensors' names, dtypes and shapes (Fingerprint).
type ModelID struct {
	Path        string `json:"path"`
	Fingerprint string `json:"fingerprint"`
}

// Plan is the shape buckets an artifact covers: the prefill chunks the
// compiled plans are built for (Buckets), and the prompt, context and
// decode batches its choices were tuned at.
type Plan struct {
	Buckets []int `json:"buckets"`
	Prefill int   `json:"prefill"`
	Depth   int   `json:"depth"`
	Batches []int `json:"batches"`
}

// File is one file of an artifact, by its path relative to the artifact's
// directory (slash-separated).
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Fingerprint hashes what the compiled plans and kernels of m depend on:
// its configuration and every tensor's name, dtype and shape (not the
// weights' values: an artifact serves any checkpoint of one architecture
// and shape).
func Fingerprint(m *model.Model) string {
	h := sha256.New()
	cfg, _ := json.Marshal(m.Config)
	fmt.Fprintf(h, "kiln-model-v1\nformat %s\nconfig %s\n", m.Format, cfg)
	for _, name := range m.Names() {
		t := m.Tensors[name]
		fmt.Fprintf(h, "%s %s %v\n", name, t.DType, t.Shape)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Write lists the files under dir (all but the manifest) in m.Files with
// their checksums and writes the manifest, atomically; it returns the
// manifest written.
func Write(dir string, m Manifest) (Manifest, error) {
	m.Format = Format
	files, err := listFiles(dir)
	if err != nil {
		return m, err
	}
	m.Files = files
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	tmp := filepath.Join(dir, ".manifest.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return m, fmt.Errorf("artifact: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		os.Remove(tmp)
		return m, fmt.Errorf("artifact: %w", err)
	}
	return m, nil
}

// Read reads dir's manifest and checks every file it lists against its
// size and checksum, and that no other file is there: an artifact changed
// in any way is refused.
func Read(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("artifact %s: no %s (make one with kiln compile MODEL --device cuda -o DIR)", dir, ManifestFile)
	}
	if err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("artifact %s: manifest: %w", dir, err)
	}
	if m.Format != Format {
		return nil, fmt.Errorf("artifact %s: format %q, this kiln reads %q", dir, m.Format, Format)
	}
	have, err := listFiles(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		i := slices.IndexFunc(have, func(h File) bool { return h.Path == f.Path })
		switch {
		case i < 0:
			return nil, fmt.Errorf("artifact %s: %s is missing", dir, f.Path)
		case have[i] != f:
			return nil, fmt.Errorf("artifact %s: %s has changed (%d bytes, SHA-256 %.12s…; the manifest says %d bytes, %.12s…)", dir, f.Path, have[i].Size, have[i].SHA256, f.Size, f.SHA256)
		}
	}
	for _, h := range have {
		if !slices.ContainsFunc(m.Files, func(f File) bool { return f.Path == h.Path }) {
			return nil, fmt.Errorf("artifact %s: %s is not in the manifest", dir, h.Path)
		}
	}
	return &m, nil
}

// Check refuses m for another device, kiln build or model, saying which
// differs.
func (m *Manifest) Check(dev tune.Device, kiln, fingerprint string) error {
	switch {
	case m.Kiln != kiln:
		return fmt.Errorf("artifact built by kiln %s, this is kiln %s: compile it again with this kiln", m.Kiln, kiln)
	case m.Device != dev:
		return fmt.Errorf("artifact built for %v, this device is %v: compile it on this kind of device", m.Device, dev)
	case m.Model.Fingerprint != fingerprint:
		return fmt.Errorf("artifact built for another model (%s, fingerprint %.12s…; this model's is %.12s…)", m.Model.Path, m.Model.Fingerprint, fingerprint)
	}
	return nil
}

// listFiles lists the regular files under dir but the manifest (and its
// temporary), with sizes and checksums, ordered by path. Anything else (a
// link, a device) is an error: an artifact holds plain files.
func listFiles(dir string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case rel == ManifestFile || rel == ".manifest.tmp" || isLockFile(rel):
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file", rel)
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		files = append(files, File{Path: rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("artifact %s: %w", dir, err)
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}

// isLockFile reports whether rel is the tune cache's lock file, which
// holds nothing (tune.Cache takes it to merge its writes).
func isLockFile(rel string) bool {
	return strings.HasPrefix(rel, TuneDir+"/") && strings.HasSuffix(rel, ".lock")
}
