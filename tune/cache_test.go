package tune

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	h200 = Device{Name: "NVIDIA H200", Arch: "9.0", Driver: "580.159.04", Runtime: "CUDA 13.0", Kiln: "abc123"}
	h100 = Device{Name: "NVIDIA H100 80GB HBM3", Arch: "9.0", Driver: "580.159.04", Runtime: "CUDA 13.0", Kiln: "abc123"}
)

func entry(shape, choice string) Entry {
	return Entry{Key: Key{Family: "decode product", DType: "bf16", Shape: shape}, Choice: choice, Default: "cublaslt",
		ChoiceUs: 12.5, DefaultUs: 15.25, NoiseUs: 0.4, Rejected: []string{"tile split 8: wrong result"},
		Tuned: time.Date(2026, 11, 26, 7, 30, 0, 0, time.UTC)}
}

func mustOpen(t *testing.T, dir string, d Device) *Cache {
	t.Helper()
	c, err := Open(dir, d)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCacheRoundTrip: entries put are read back by a later Open of the same
// device (Entries in the order of their keys), and not by another device's; the file is replaced atomically (no
// temporary file left behind).
func TestCacheRoundTrip(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, dir, h200)
	want := []Entry{entry("T≤64 K=4096 N=28672", "tile split 2"), entry("T≤64 K=4096 N=4096", "cublaslt algo 3")}
	for _, e := range want {
		if err := c.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	want[0].Choice = "tile split 4" // replaced by a later tuning
	if err := c.Put(want[0]); err != nil {
		t.Fatal(err)
	}
	again := mustOpen(t, dir, h200)
	if len(again.Warnings) != 0 || again.Len() != len(want) {
		t.Fatalf("reopened: %d entries, warnings %v", again.Len(), again.Warnings)
	}
	for _, e := range want {
		got, ok := again.Get(e.Key)
		if !ok || got.Choice != e.Choice || got.ChoiceUs != e.ChoiceUs || !got.Tuned.Equal(e.Tuned) || len(got.Rejected) != 1 {
			t.Errorf("%v: got %+v (%v), want %+v", e.Key, got, ok, e)
		}
	}
	if es := again.Entries(); len(es) != 2 || es[0].Key != want[0].Key || es[1].Key != want[1].Key {
		t.Errorf("Entries, ordered by key: %+v", es)
	}
	if other := mustOpen(t, dir, h100); other.Len() != 0 {
		t.Errorf("another device sees %d entries", other.Len())
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	names = slices.DeleteFunc(names, func(n string) bool { return filepath.Base(n) == ".lock" })
	if len(names) != 1 || strings.HasPrefix(filepath.Base(names[0]), ".tune-") {
		t.Errorf("files in the cache directory: %v", names)
	}
}

// TestCacheShared: two processes' caches of one directory, each opened
// before the other wrote, keep both's entries; of two entries of one key
// the newer wins.
func TestCacheShared(t *testing.T) {
	dir := t.TempDir()
	a, b := mustOpen(t, dir, h200), mustOpen(t, dir, h200)
	ea, eb := entry("T≤16 K=4096 N=4096", "gemv"), entry("T≤64 K=4096 N=4096", "cublaslt")
	if err := a.Put(ea); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(eb); err != nil {
		t.Fatal(err)
	}
	newer := ea
	newer.Choice, newer.Tuned = "gemv, K split 2", ea.Tuned.Add(time.Hour)
	if err := b.Put(newer); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(eb); err != nil { // a's ea is older than the file's
		t.Fatal(err)
	}
	c := mustOpen(t, dir, h200)
	if got, _ := c.Get(ea.Key); c.Len() != 2 || got.Choice != newer.Choice {
		t.Errorf("%d entries, %v: %q (want 2, %q)", c.Len(), ea.Key, got.Choice, newer.Choice)
	}
}

// TestCacheCorrupt: an entry whose contents no longer match its checksum is
// skipped with a warning while the others are kept; a file that is not a
// tune file, or that holds another device's entries, is ignored whole with
// a warning.
func TestCacheCorrupt(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, dir, h200)
	if err := c.Put(entry("a", "x")); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(entry("b", "y")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(c.path())
	if err != nil {
		t.Fatal(err)
	}
	// A bit flip in entry b's choice.
	bad := bytes.Replace(b, []byte(`\"choice\": \"y\"`), []byte(`\"choice\": \"z\"`), 1)
	bad = bytes.Replace(bad, []byte(`"choice": "y"`), []byte(`"choice": "z"`), 1)
	if bytes.Equal(bad, b) {
		t.Fatal("the test did not change the file")
	}
	if err := os.WriteFile(c.path(), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, dir, h200)
	if _, ok := r.Get(entry("b", "").Key); ok || r.Len() != 1 || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "checksum") {
		t.Errorf("after corrupting one entry: %d entries, warnings %v", r.Len(), r.Warnings)
	}
	for _, garbage := range [][]byte{[]byte("not json"), []byte(`{"format": "kiln-tune-v0"}`), b[:len(b)/2]} {
		if err := os.WriteFile(c.path(), garbage, 0o644); err != nil {
			t.Fatal(err)
		}
		r := mustOpen(t, dir, h200)
		if r.Len() != 0 || len(r.Warnings) != 1 {
			t.Errorf("%.20q: %d entries, warnings %v", garbage, r.Len(), r.Warnings)
		}
	}
	// Another device's file under this device's name.
	other := mustOpen(t, t.TempDir(), h100)
	if err := other.Put(entry("a", "x")); err != nil {
		t.Fatal(err)
	}
	ob, _ := os.ReadFile(other.path())
	if err := os.WriteFile(c.path(), ob, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := mustOpen(t, dir, h200); r.Len() != 0 || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "H100") {
		t.Errorf("another device's file: %d entries, warnings %v", r.Len(), r.Warnings)
	}
}

// TestExportImport: an export moves the entries to another machine of the
// same kind; another device's export is refused with a message naming both;
// a corrupt entry in an export is skipped and reported.
func TestExportImport(t *testing.T) {
	src := mustOpen(t, t.TempDir(), h200)
	for _, s := range []string{"a", "b", "c"} {
		if err := src.Put(entry(s, "choice "+s)); err != nil {
			t.Fatal(err)
		}
	}
	var exp bytes.Buffer
	if err := src.Export(&exp); err != nil {
		t.Fatal(err)
	}
	dstDir := t.TempDir()
	dst := mustOpen(t, dstDir, h200)
	n, warnings, err := dst.Import(bytes.NewReader(exp.Bytes()))
	if err != nil || n != 3 || len(warnings) != 0 {
		t.Fatalf("import: %d entries, warnings %v, err %v", n, warnings, err)
	}
	if e, ok := mustOpen(t, dstDir, h200).Get(entry("b", "").Key); !ok || e.Choice != "choice b" {
		t.Errorf("after import and reopen: %+v %v", e, ok)
	}

	foreign := mustOpen(t, t.TempDir(), h100)
	if n, _, err := foreign.Import(bytes.NewReader(exp.Bytes())); err == nil || n != 0 ||
		!strings.Contains(err.Error(), "H200") || !strings.Contains(err.Error(), "H100") {
		t.Errorf("import of another device's entries: %d, %v", n, err)
	}

	bad := bytes.Replace(exp.Bytes(), []byte(`"choice": "choice c"`), []byte(`"choice": "choice d"`), 1)
	bad = bytes.Replace(bad, []byte(`\"choice\":\"choice c\"`), []byte(`\"choice\":\"choice d\"`), 1)
	fresh := mustOpen(t, t.TempDir(), h200)
	n, warnings, err = fresh.Import(bytes.NewReader(bad))
	if err != nil || n != 2 || len(warnings) != 1 {
		t.Errorf("import with a corrupt entry: %d entries, warnings %v, err %v", n, warnings, err)
	}
	if _, _, err := fresh.Import(strings.NewReader("{")); err == nil {
		t.Error("import of a truncated file accepted")
	}
}

// TestPutRefuses: an entry without a family or a choice is refused.
func TestPutRefuses(t *testing.T) {
	c := mustOpen(t, t.TempDir(), h200)
	for _, e := range []Entry{{Key: Key{Family: "f"}}, {Choice: "x"}} {
		if err := c.Put(e); err == nil {
			t.Errorf("%+v accepted", e)
		}
	}
}

// FuzzImport: no input makes Import panic, and whatever it accepts is
// written and read back unchanged.
func FuzzImport(f *testing.F) {
	c, err := Open(f.TempDir(), h200)
	if err != nil {
		f.Fatal(err)
	}
	if err := c.Put(entry("a", "x")); err != nil {
		f.Fatal(err)
	}
	var exp bytes.Buffer
	if err := c.Export(&exp); err != nil {
		f.Fatal(err)
	}
	f.Add(exp.Bytes())
	f.Add([]byte(`{"format":"kiln-tune-v1","device":{},"entries":[{"entry":{},"sha256":""}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		c, err := Open(dir, h200)
		if err != nil {
			t.Fatal(err)
		}
		n, _, err := c.Import(bytes.NewReader(b))
		if err != nil {
			return
		}
		r, err := Open(dir, h200)
		if err != nil || r.Len() != c.Len() || len(r.Warnings) != 0 || n > c.Len() {
			t.Fatalf("imported %d, cache %d, reopened %d (warnings %v, err %v)", n, c.Len(), r.Len(), r.Warnings, err)
		}
	})
}

// TestKeepInMemory: a cache kept in memory (an artifact's) takes entries
// and answers for them but never writes its directory.
func TestKeepInMemory(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, dir, h200)
	if err := c.Put(entry("T≤1 K=8 N=8", "gemv")); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(c.path())
	if err != nil {
		t.Fatal(err)
	}
	c = mustOpen(t, dir, h200)
	c.KeepInMemory()
	e := entry("T≤64 K=8 N=8", "cublaslt")
	if err := c.Put(e); err != nil {
		t.Fatal(err)
	}
	if got, ok := c.Get(e.Key); !ok || got.Choice != "cublaslt" || c.Len() != 2 {
		t.Errorf("in memory: %+v %v, %d entries", got, ok, c.Len())
	}
	after, _ := os.ReadFile(c.path())
	if !bytes.Equal(before, after) {
		t.Error("a cache kept in memory wrote its file")
	}
}
