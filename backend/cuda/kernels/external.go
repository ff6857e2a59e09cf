package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"kiln/backend/cuda/cu"
)

// External kernels are kernels written outside kiln (by hand or by a
// generator) and offered to the same gate as kiln's own candidates: each
// is compiled with NVRTC for the device, checked against the default's
// result on fresh random inputs before it may be timed, raced, and kept
// only if it beats the default as tune.Race requires (backend/cuda: raceGEMV).
// A directory holds them, a kernel as two files, NAME.cu (its CUDA C++
// source) and NAME.json (its manifest); docs/EXTERNAL_KERNELS.md
// describes the format.
//
// One family takes them: "decode product", the products of batched decode
// (at most GEMVMaxT rows), Y[T,N] = X[T,K]·W[N,K]ᵀ, row-major, the weights
// as the model stores them. The kernel's signature is
//
//	extern "C" __global__ void ENTRY(OUT* y, const IN* x, const IN* w, int t, int k, int n)
//
// launched on a grid of ceil(n / cols_per_block) blocks of threads
// threads with shared_bytes of dynamic shared memory, where IN is the
// activation dtype (16-bit values are passed as their bits: unsigned
// short) and OUT the output's.

// ExternalFamily is the family external kernels may join.
const ExternalFamily = "decode product"

// ExternalSpec is one external kernel: its manifest, its source and their
// checksum.
type ExternalSpec struct {
	Name   string `json:"-"` // the files' base name
	Family string `json:"family"`
	Entry  string `json:"entry"` // the kernel's name in its source
	DType  string `json:"dtype"` // the activations' and weights': bf16, f16 or f32
	Out    string `json:"out"`   // the output's: dtype or f32 ("": dtype)
	// The launch: threads a block (a multiple of 32, at most 1024),
	// output columns a block, dynamic shared memory.
	Threads      int `json:"threads"`
	ColsPerBlock int `json:"cols_per_block"`
	SharedBytes  int `json:"shared_bytes"`
	// What it takes: at most MaxRows rows (1 to GEMVMaxT), K and N
	// multiples of KMultiple and NMultiple (0: any).
	MaxRows   int `json:"max_rows"`
	KMultiple int `json:"k_multiple"`
	NMultiple int `json:"n_multiple"`

	Source string `json:"-"`
	// Sum is the SHA-256 of the manifest and the source (hex): the tune
	// cache files a choice of it under its name and sum, so that a
	// changed kernel is raced again.
	Sum string `json:"-"`
}

// MaxExternalSource bounds an external kernel's source.
const MaxExternalSource = 1 << 20

var cIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ParseExternalSpec reads the manifest of external kernel name (its JSON,
// fields as ExternalSpec's tags; an unknown field is an error) and checks
// it.
func ParseExternalSpec(name string, manifest []byte) (ExternalSpec, error) {
	var s ExternalSpec
	dec := json.NewDecoder(bytes.NewReader(manifest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("external kernel %s: manifest: %v", name, err)
	}
	if dec.More() {
		return s, fmt.Errorf("external kernel %s: manifest: more than one JSON value", name)
	}
	s.Name = name
	if s.Out == "" {
		s.Out = s.DType
	}
	bad := func(format string, a ...any) (ExternalSpec, error) {
		return s, fmt.Errorf("external kernel %s: %s", name, fmt.Sprintf(format, a...))
	}
	switch {
	case s.Family != ExternalFamily:
		return bad("family %q: the family external kernels join is %q", s.Family, ExternalFamily)
	case !cIdent.MatchString(s.Entry):
		return bad("entry %q is not a C identifier", s.Entry)
	case !slices.Contains([]string{"bf16", "f16", "f32"}, s.DType):
		return bad("dtype %q: want bf16, f16 or f32", s.DType)
	case s.Out != s.DType && s.Out != "f32":
		return bad("out %q: want %s (the dtype) or f32", s.Out, s.DType)
	case s.Threads < 32 || s.Threads > 1024 || s.Threads%32 != 0:
		return bad("threads %d: want a multiple of 32 from 32 to 1024", s.Threads)
	case s.ColsPerBlock < 1 || s.ColsPerBlock > 1<<16:
		return bad("cols_per_block %d: want 1 to 65536", s.ColsPerBlock)
	case s.SharedBytes < 0 || s.SharedBytes > 227<<10:
		return bad("shared_bytes %d: want 0 to %d", s.SharedBytes, 227<<10)
	case s.MaxRows < 1 || s.MaxRows > GEMVMaxT:
		return bad("max_rows %d: want 1 to %d (the decode products)", s.MaxRows, GEMVMaxT)
	case s.KMultiple < 0 || s.KMultiple > 1<<16 || s.NMultiple < 0 || s.NMultiple > 1<<16:
		return bad("k_multiple %d, n_multiple %d: want 0 to 65536", s.KMultiple, s.NMultiple)
	}
	return s, nil
}

// ReadExternal reads the external kernels in dir: each NAME.json with its
// NAME.cu, in the order of their names. Any file that is wrong (a
// manifest that does not parse or check, a missing or oversized source)
// is an error naming it: a kernel offered is either read whole or not at
// all.
func ReadExternal(dir string) ([]ExternalSpec, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("external kernels: %w", err)
	}
	manifests, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	slices.Sort(manifests)
	var specs []ExternalSpec
	for _, m := range manifests {
		name := strings.TrimSuffix(filepath.Base(m), ".json")
		manifest, err := os.ReadFile(m)
		if err != nil {
			return nil, fmt.Errorf("external kernel %s: %w", name, err)
		}
		s, err := ParseExternalSpec(name, manifest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		src := strings.TrimSuffix(m, ".json") + ".cu"
		st, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("external kernel %s: its source: %w", name, err)
		}
		if st.Size() > MaxExternalSource {
			return nil, fmt.Errorf("external kernel %s: %s has %d bytes, at most %d", name, src, st.Size(), MaxExternalSource)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("external kernel %s: %w", name, err)
		}
		s.Source = string(b)
		h := sha256.New()
		h.Write(manifest)
		h.Write([]byte{0})
		h.Write(b)
		s.Sum = hex.EncodeToString(h.Sum(nil))
		specs = append(specs, s)
	}
	return specs, nil
}

// ChoiceName names s as a choice in the tune cache: its name and the
// first 12 hex digits of its sum.
func (s ExternalSpec) ChoiceName() string {
	return fmt.Sprintf("external %s sha256:%s", s.Name, s.Sum[:min(12, len(s.Sum))])
}

// Takes reports whether s computes a product of t rows of k by n in
// dtype in, out.
func (s ExternalSpec) Takes(t, k, n int, in, out cu.DType) bool {
	return t >= 1 && t <= s.MaxRows && in.String() == s.DType && out.String() == s.Out &&
		(s.KMultiple == 0 || k%s.KMultiple == 0) && (s.NMultiple == 0 || n%s.NMultiple == 0)
}

// External is an external kernel compiled for a device.
type External struct {
	Spec ExternalSpec
	mod  *cu.Module
	fn   *cu.Function
}

// NewExternal compiles s for d (through the kernel cache, as kiln's own
// modules) and finds its entry.
func NewExternal(d *cu.Device, s ExternalSpec) (*External, error) {
	m, err := d.Compile("external_"+s.Name, s.Source)
	if err != nil {
		return nil, fmt.Errorf("external kernel %s: %w", s.Name, err)
	}
	fn, err := m.Function(s.Entry)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("external kernel %s: entry %s: %w", s.Name, s.Entry, err)
	}
	if s.SharedBytes > 48<<10 {
		if err := fn.SetMaxDynamicShared(s.SharedBytes); err != nil {
			m.Close()
			return nil, fmt.Errorf("external kernel %s: %d bytes of shared memory: %w", s.Name, s.SharedBytes, err)
		}
	}
	return &External{Spec: s, mod: m, fn: fn}, nil
}

// Run queues y[t,n] = x[t,k]·w[n,k]ᵀ on s.
func (e *External) Run(s *cu.Stream, y, x, w cu.Ptr, t, k, n int) error {
	grid := (n + e.Spec.ColsPerBlock - 1) / e.Spec.ColsPerBlock
	return e.fn.Launch(cu.D1(grid), cu.D1(e.Spec.Threads), e.Spec.SharedBytes, s, y, x, w, int32(t), int32(k), int32(n))
}

// Close unloads the kernel.
func (e *External) Close() error { return e.mod.Close() }
