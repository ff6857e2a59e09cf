package kernels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
)

const goodManifest = `{"family": "decode product", "entry": "ext_gemv", "dtype": "bf16", "out": "f32",
 "threads": 256, "cols_per_block": 8, "shared_bytes": 1024, "max_rows": 16, "k_multiple": 8, "n_multiple": 2}`

// TestParseExternalSpec: a manifest's fields are read and checked; each
// wrong field is an error that names the kernel and the field.
func TestParseExternalSpec(t *testing.T) {
	s, err := ParseExternalSpec("mine", []byte(goodManifest))
	if err != nil {
		t.Fatal(err)
	}
	want := ExternalSpec{Name: "mine", Family: ExternalFamily, Entry: "ext_gemv", DType: "bf16", Out: "f32", Threads: 256, ColsPerBlock: 8,
		SharedBytes: 1024, MaxRows: 16, KMultiple: 8, NMultiple: 2}
	if s != want {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
	if s, err := ParseExternalSpec("plain", []byte(`{"family": "decode product", "entry": "e", "dtype": "f16", "threads": 32, "cols_per_block": 1, "max_rows": 1}`)); err != nil || s.Out != "f16" {
		t.Fatalf("out defaults to the dtype: %+v, %v", s, err)
	}
	for _, c := range []struct{ edit, field string }{
		{`"family": "decode product"`, `"family": "prefill attention"`},
		{`"entry": "ext_gemv"`, `"entry": "ext gemv()"`},
		{`"entry": "ext_gemv"`, `"entry": ""`},
		{`"dtype": "bf16"`, `"dtype": "fp8"`},
		{`"out": "f32"`, `"out": "f16"`},
		{`"threads": 256`, `"threads": 48`},
		{`"threads": 256`, `"threads": 2048`},
		{`"cols_per_block": 8`, `"cols_per_block": 0`},
		{`"shared_bytes": 1024`, `"shared_bytes": -1`},
		{`"shared_bytes": 1024`, `"shared_bytes": 1000000`},
		{`"max_rows": 16`, `"max_rows": 65`},
		{`"max_rows": 16`, `"max_rows": 0`},
		{`"k_multiple": 8`, `"k_multiple": -8`},
		{`"n_multiple": 2`, `"n_multiple": 2, "grid": 4`},
		{`"threads": 256`, `"threads": "256"`},
	} {
		m := strings.Replace(goodManifest, c.edit, c.field, 1)
		_, err := ParseExternalSpec("mine", []byte(m))
		if err == nil || !strings.Contains(err.Error(), "external kernel mine") {
			t.Errorf("%s: error %v", c.field, err)
		}
	}
	for _, m := range []string{"", "{", "[]", goodManifest + goodManifest} {
		if _, err := ParseExternalSpec("mine", []byte(m)); err == nil {
			t.Errorf("manifest %q accepted", m)
		}
	}
}

// TestSpecTakes: a kernel takes the products of its dtypes, rows and
// multiples only.
func TestSpecTakes(t *testing.T) {
	s, err := ParseExternalSpec("mine", []byte(goodManifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		t, k, n int
		in, out cu.DType
		takes   bool
	}{
		{1, 4096, 4096, cu.BF16, cu.F32, true},
		{16, 64, 2, cu.BF16, cu.F32, true},
		{17, 4096, 4096, cu.BF16, cu.F32, false},
		{0, 4096, 4096, cu.BF16, cu.F32, false},
		{1, 4100, 4096, cu.BF16, cu.F32, false},
		{1, 4096, 4097, cu.BF16, cu.F32, false},
		{1, 4096, 4096, cu.BF16, cu.BF16, false},
		{1, 4096, 4096, cu.F16, cu.F32, false},
	} {
		if got := s.Takes(c.t, c.k, c.n, c.in, c.out); got != c.takes {
			t.Errorf("Takes(%d, %d, %d, %v, %v) = %v", c.t, c.k, c.n, c.in, c.out, got)
		}
	}
}

// TestReadExternal: a directory's kernels are read in name order with
// their sources and sums (a changed source changes the sum and the
// choice's name); the test kernels of backend/cuda read; a manifest
// without its source, an oversized source, a wrong manifest and a
// missing directory are errors naming what is wrong.
func TestReadExternal(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.json", goodManifest)
	write("b.cu", "// b")
	write("a.json", goodManifest)
	write("a.cu", "// a")
	write("notes.txt", "not a kernel")
	specs, err := ReadExternal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[0].Name != "a" || specs[1].Name != "b" || specs[0].Source != "// a" || len(specs[0].Sum) != 64 ||
		specs[0].Sum == specs[1].Sum {
		t.Fatalf("specs %+v", specs)
	}
	if !strings.HasPrefix(specs[0].ChoiceName(), "external a sha256:"+specs[0].Sum[:12]) {
		t.Errorf("choice name %q", specs[0].ChoiceName())
	}
	verify, err := ReadExternal("../testdata/external/verify")
	if err != nil || len(verify) != 4 {
		t.Fatalf("the test kernels: %d, %v", len(verify), err)
	}
	faulty, err := ReadExternal("../testdata/external/faulty")
	if err != nil || len(faulty) != 2 {
		t.Fatalf("the faulty test kernels: %d, %v", len(faulty), err)
	}
	for _, c := range []struct {
		name, content, want string
	}{
		{"c.json", goodManifest, "its source"},
		{"c.cu", strings.Repeat("x", MaxExternalSource+1), "at most"},
		{"c.json", `{"family": "decode product"}`, "c.json"},
	} {
		write(c.name, c.content)
		_, err := ReadExternal(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("after %s: error %v, want one with %q", c.name, err, c.want)
		}
	}
	if _, err := ReadExternal(filepath.Join(dir, "none")); err == nil {
		t.Error("a missing directory read")
	}
}

// FuzzParseExternalSpec: any manifest is parsed or refused with an error,
// never a panic; one that parses passes its own checks again.
func FuzzParseExternalSpec(f *testing.F) {
	f.Add([]byte(goodManifest))
	f.Add([]byte(`{"family": "decode product", "entry": "e", "dtype": "f32", "threads": 32, "cols_per_block": 1, "max_rows": 64}`))
	f.Add([]byte(`{"threads": 1e400}`))
	f.Fuzz(func(t *testing.T, m []byte) {
		s, err := ParseExternalSpec("fuzz", m)
		if err != nil {
			return
		}
		if s.Threads%32 != 0 || s.MaxRows < 1 || s.MaxRows > GEMVMaxT || s.ColsPerBlock < 1 || !cIdent.MatchString(s.Entry) {
			t.Fatalf("accepted %+v", s)
		}
	})
}
