package kcache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKeyDerivation(t *testing.T) {
	base := KeyInput{Source: "src", Options: []string{"-a", "-b"}, Compiler: "nvrtc 13.0", Driver: "13000", Arch: "sm_90a"}
	k := base.Key()
	if k != base.Key() {
		t.Fatal("key not deterministic")
	}
	variants := []KeyInput{
		{Source: "src ", Options: base.Options, Compiler: base.Compiler, Driver: base.Driver, Arch: base.Arch},
		{Source: base.Source, Options: []string{"-a"}, Compiler: base.Compiler, Driver: base.Driver, Arch: base.Arch},
		{Source: base.Source, Options: []string{"-a-b"}, Compiler: base.Compiler, Driver: base.Driver, Arch: base.Arch},
		{Source: base.Source, Options: []string{"-a", "-b", ""}, Compiler: base.Compiler, Driver: base.Driver, Arch: base.Arch},
		{Source: base.Source, Options: base.Options, Compiler: "nvrtc 12.8", Driver: base.Driver, Arch: base.Arch},
		{Source: base.Source, Options: base.Options, Compiler: base.Compiler, Driver: "12080", Arch: base.Arch},
		{Source: base.Source, Options: base.Options, Compiler: base.Compiler, Driver: base.Driver, Arch: "sm_90"},
		{Source: base.Source, Options: base.Options, Compiler: base.Compiler, Driver: base.Driver, Arch: base.Arch, Layout: "image+log"},
		// Field boundaries must matter: moving text between fields changes the key.
		{Source: base.Source + "nvrtc", Options: base.Options, Compiler: " 13.0", Driver: base.Driver, Arch: base.Arch},
	}
	seen := map[Key]int{k: -1}
	for i, v := range variants {
		kv := v.Key()
		if j, ok := seen[kv]; ok {
			t.Errorf("variant %d has the same key as %d", i, j)
		}
		seen[kv] = i
	}
}

func TestEncodeDecode(t *testing.T) {
	k := KeyInput{Source: "x"}.Key()
	p := []byte("payload bytes \x00\x01")
	b := Encode(k, p)
	got, err := Decode(k, b)
	if err != nil || !bytes.Equal(got, p) {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	other := KeyInput{Source: "y"}.Key()
	cases := map[string][]byte{
		"empty":     nil,
		"short":     b[:10],
		"truncated": b[:len(b)-1],
		"extended":  append(append([]byte{}, b...), 0),
		"bad magic": append([]byte("XILNKC1\n"), b[8:]...),
		"flipped":   flip(b, len(b)-1),
		"bad sum":   flip(b, 50),
		"bad len":   flip(b, 40),
	}
	for name, c := range cases {
		if _, err := Decode(k, c); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := Decode(other, b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("other key: got %v, want ErrCorrupt", err)
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte{}, b...)
	c[i] ^= 0x40
	return c
}

func TestGetOrBuild(t *testing.T) {
	dir := t.TempDir()
	k := KeyInput{Source: "kernel", Arch: "sm_90a"}.Key()
	builds := 0
	build := func() ([]byte, error) { builds++; return []byte("cubin image"), nil }

	c := New(dir)
	if p, hit, err := c.GetOrBuild(k, build); err != nil || hit || string(p) != "cubin image" {
		t.Fatalf("first: %q %v %v", p, hit, err)
	}
	if _, hit, _ := c.GetOrBuild(k, build); !hit {
		t.Fatal("second call in the same cache missed")
	}
	// A fresh cache on the same directory (a second start) builds nothing.
	c2 := New(dir)
	if p, hit, err := c2.GetOrBuild(k, build); err != nil || !hit || string(p) != "cubin image" {
		t.Fatalf("second start: %q %v %v", p, hit, err)
	}
	if builds != 1 {
		t.Fatalf("%d builds, want 1", builds)
	}
	if s := c2.Stats(); s.Compiled != 0 || s.Hits != 1 {
		t.Fatalf("second start stats %+v", s)
	}
	// No temporary files left behind.
	ents, _ := os.ReadDir(filepath.Dir(c.Path(k)))
	if len(ents) != 1 {
		t.Fatalf("%d files in the entry directory, want 1", len(ents))
	}

	// Corrupt the file: truncation, then a flipped payload byte.
	for _, corrupt := range []func([]byte) []byte{
		func(b []byte) []byte { return b[:len(b)-3] },
		func(b []byte) []byte { return flip(b, len(b)-2) },
		func(b []byte) []byte { return []byte("garbage") },
	} {
		b, err := os.ReadFile(c.Path(k))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.Path(k), corrupt(b), 0o644); err != nil {
			t.Fatal(err)
		}
		c3 := New(dir)
		before := builds
		if p, hit, err := c3.GetOrBuild(k, build); err != nil || hit || string(p) != "cubin image" {
			t.Fatalf("corrupt entry: %q %v %v", p, hit, err)
		}
		if builds != before+1 {
			t.Fatal("corrupt entry was not rebuilt")
		}
		if s := c3.Stats(); s.Corrupt != 1 || s.Compiled != 1 {
			t.Fatalf("corrupt stats %+v", s)
		}
		// The rebuilt entry is valid again.
		if _, hit, _ := New(dir).GetOrBuild(k, build); !hit {
			t.Fatal("rebuilt entry not reused")
		}
	}

	// Build errors are returned and nothing is stored.
	k2 := KeyInput{Source: "bad"}.Key()
	boom := errors.New("boom")
	if _, _, err := c.GetOrBuild(k2, func() ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("build error: %v", err)
	}
	if _, err := os.Stat(c.Path(k2)); !os.IsNotExist(err) {
		t.Fatal("failed build left an entry")
	}
}

func TestMemoryOnlyAndUnwritable(t *testing.T) {
	k := KeyInput{Source: "m"}.Key()
	c := New("")
	c.GetOrBuild(k, func() ([]byte, error) { return []byte("p"), nil })
	if _, hit, _ := c.GetOrBuild(k, nil); !hit {
		t.Fatal("memory cache missed")
	}
	// A directory that cannot be created: the build still succeeds.
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, nil, 0o644)
	c = New(filepath.Join(f, "sub"))
	if p, _, err := c.GetOrBuild(k, func() ([]byte, error) { return []byte("p"), nil }); err != nil || string(p) != "p" {
		t.Fatalf("unwritable: %q %v", p, err)
	}
	if c.Stats().WriteErr != 1 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv("KILN_CACHE_DIR", "/some/where")
	if d := DefaultDir(); d != "/some/where" {
		t.Fatal(d)
	}
	t.Setenv("KILN_CACHE_DIR", "")
	if d := DefaultDir(); filepath.Base(d) != "kernels" && filepath.Base(d) != "kiln-kernels" {
		t.Fatal(d)
	}
}

// TestBase: entries in Base (an artifact's kernels) are served before Dir
// and without a build; nothing is written there; a corrupt entry in Base is
// counted, left in place, and passed over for Dir or a build.
func TestBase(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	k1, k2 := KeyInput{Source: "in the artifact"}.Key(), KeyInput{Source: "not in it"}.Key()
	if err := New(base).Put(k1, []byte("artifact image")); err != nil {
		t.Fatal(err)
	}
	c := New(dir)
	c.Base = base
	builds := 0
	build := func() ([]byte, error) { builds++; return []byte("built image"), nil }
	if p, hit, err := c.GetOrBuild(k1, build); err != nil || !hit || string(p) != "artifact image" {
		t.Fatalf("an entry of Base: %q %v %v", p, hit, err)
	}
	if p, hit, err := c.GetOrBuild(k2, build); err != nil || hit || string(p) != "built image" {
		t.Fatalf("an entry missing from Base: %q %v %v", p, hit, err)
	}
	if s := c.Stats(); s.Compiled != 1 || s.BuildTime <= 0 {
		t.Errorf("one build: stats %+v", s)
	}
	if _, err := os.Stat(entryPath(base, k2)); !os.IsNotExist(err) {
		t.Error("the build was written into Base")
	}
	if _, err := os.Stat(c.Path(k2)); err != nil {
		t.Errorf("the build was not written into Dir: %v", err)
	}
	if _, err := os.Stat(c.Path(k1)); !os.IsNotExist(err) {
		t.Error("Base's entry was copied into Dir")
	}
	b, _ := os.ReadFile(entryPath(base, k1))
	os.WriteFile(entryPath(base, k1), flip(b, len(b)-1), 0o644)
	c2 := New(dir)
	c2.Base = base
	if p, hit, err := c2.GetOrBuild(k1, build); err != nil || hit || string(p) != "built image" {
		t.Fatalf("a corrupt entry of Base: %q %v %v", p, hit, err)
	}
	if s := c2.Stats(); s.Corrupt != 1 || s.Compiled != 1 || builds != 2 {
		t.Errorf("stats %+v, %d builds", s, builds)
	}
	if _, err := os.Stat(entryPath(base, k1)); err != nil {
		t.Errorf("the corrupt entry of Base was removed: %v", err)
	}
}
