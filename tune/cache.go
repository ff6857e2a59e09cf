// Package tune keeps what tuning found: the persistent cache of tuned
// choices (which kernel, algorithm or split a product, attention or norm of
// a given shape runs with on a given device), so that a choice timed once
// is not timed again at every start, and a fleet of identical machines can
// share one tuning (Export, Import).
//
// Invariants:
//   - a choice holds only for the device it was measured on: entries are
//     filed under a Device (name, architecture, driver, runtime, kiln
//     version), and entries of another device are never returned, and are
//     refused by Import with a message saying whose they are;
//   - nothing read from disk is trusted unchecked: each entry carries the
//     SHA-256 of its contents, and a corrupt entry or file is skipped with
//     a warning (Cache.Warnings), never used;
//   - files are written atomically (a temporary file, then a rename), so a
//     crash mid-write leaves the previous file.
package tune

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"
	"time"
)

// Device identifies the machine a tuned choice was measured on. Two
// devices are the same only if every field is.
type Device struct {
	Name    string `json:"name"`    // e.g. "NVIDIA H200", or the CPU's model name
	Arch    string `json:"arch"`    // e.g. compute capability "9.0", or "amd64 avx2 avx512"
	Driver  string `json:"driver"`  // e.g. the CUDA driver API's version "13000" ("" on the CPU)
	Runtime string `json:"runtime"` // e.g. "CUDA 13.0", or the Go version
	Kiln    string `json:"kiln"`    // the kiln build (KilnVersion)
}

func (d Device) String() string {
	return fmt.Sprintf("%s (arch %s, driver %q, runtime %s, kiln %s)", d.Name, d.Arch, d.Driver, d.Runtime, d.Kiln)
}

// Key identifies one tuned decision on a device.
type Key struct {
	Family string `json:"family"` // the kernel family, e.g. "decode product"
	DType  string `json:"dtype"`  // the activation or weight dtype it was tuned for
	Shape  string `json:"shape"`  // the shape bucket, e.g. "T≤64 K=4096 N=28672"
}

func (k Key) String() string { return fmt.Sprintf("%s %s %s", k.Family, k.DType, k.Shape) }

// less orders keys by family, then dtype, then shape.
func (k Key) less(o Key) bool {
	if k.Family != o.Family {
		return k.Family < o.Family
	}
	if k.DType != o.DType {
		return k.DType < o.DType
	}
	return k.Shape < o.Shape
}

// Entry is one tuned decision: the candidate kept and the timings that
// chose it. A choice other than the default beat it in every timing but
// its own slowest (Race's rule); NoiseUs is the spread of the default's timings; Rejected
// lists the candidates that failed verification or crashed, with why.
type Entry struct {
	Key
	Choice    string    `json:"choice"`
	Default   string    `json:"default"`
	ChoiceUs  float64   `json:"choice_us"`  // median time of the choice, µs
	DefaultUs float64   `json:"default_us"` // median time of the default, µs
	NoiseUs   float64   `json:"noise_us"`   // the timings' spread, µs
	Rejected  []string  `json:"rejected,omitempty"`
	Tuned     time.Time `json:"tuned"`
}

// sealed is an entry as stored: its contents and their SHA-256.
type sealed struct {
	Entry json.RawMessage `json:"entry"`
	Sum   string          `json:"sha256"`
}

// file is the stored form of one device's entries (and of an export).
type file struct {
	Format  string   `json:"format"`
	Device  Device   `json:"device"`
	Entries []sealed `json:"entries"`
}

const format = "kiln-tune-v1"

// Cache is one device's tuned choices, kept in a directory. Its methods
// may be called from several goroutines.
type Cache struct {
	dir    string
	device Device

	mu      sync.Mutex
	entries map[Key]Entry
	memOnly bool // KeepInMemory
	// Warnings says what was skipped while reading (corrupt entries or
	// files, entries filed under another device), for the caller to log.
	Warnings []string
}

// Open reads the cache of device in dir (created when missing). A missing
// file is an empty cache; what cannot be trusted is skipped and noted in
// Warnings. Only I/O errors other than a missing file are returned.
func Open(dir string, device Device) (*Cache, error) {
	c := &Cache{dir: dir, device: device, entries: map[Key]Entry{}}
	b, err := os.ReadFile(c.path())
	switch {
	case errors.Is(err, os.ErrNotExist):
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("tune: read %s: %w", c.path(), err)
	}
	f, err := decode(b)
	if err != nil {
		c.Warnings = append(c.Warnings, fmt.Sprintf("tune: %s ignored: %v", c.path(), err))
		return c, nil
	}
	if f.Device != device {
		c.Warnings = append(c.Warnings, fmt.Sprintf("tune: %s ignored: it holds entries of %v", c.path(), f.Device))
		return c, nil
	}
	_, skipped := c.merge(f)
	c.Warnings = append(c.Warnings, skipped...)
	return c, nil
}

// path is the device's file: named by a hash of its identity, so that
// devices never share a file.
func (c *Cache) path() string {
	b, _ := json.Marshal(c.device)
	h := sha256.Sum256(b)
	return filepath.Join(c.dir, "tune-"+hex.EncodeToString(h[:8])+".json")
}

// Device is the device the cache holds choices for.
func (c *Cache) Device() Device { return c.device }

// Get returns the tuned decision for k, if there is one.
func (c *Cache) Get(k Key) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	return e, ok
}

// Len is the number of entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Entries lists the entries, ordered by family, dtype and shape.
func (c *Cache) Entries() []Entry {
	c.mu.Lock()
	es := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		es = append(es, e)
	}
	c.mu.Unlock()
	sort.Slice(es, func(i, j int) bool { return es[i].Key.less(es[j].Key) })
	return es
}

// Put records e (replacing any entry of its key) and writes the cache.
func (c *Cache) Put(e Entry) error {
	if e.Family == "" || e.Choice == "" {
		return fmt.Errorf("tune: entry %v without a family or a choice", e.Key)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[e.Key] = e
	if c.memOnly {
		return nil
	}
	return c.save()
}

// KeepInMemory makes Put keep its entries in memory, never writing the
// directory (a cache read from an ahead-of-time artifact, which is not
// changed by the runs that start from it).
func (c *Cache) KeepInMemory() {
	c.mu.Lock()
	c.memOnly = true
	c.mu.Unlock()
}

// Export writes every entry, with the device they hold for, to w: the file
// Import reads on another machine of the same kind.
func (c *Cache) Export(w io.Writer) error {
	c.mu.Lock()
	b, err := c.encode()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Import adds the entries of an exported file (replacing those of the same
// keys) and writes the cache. A file of another device is refused whole,
// with a message naming both; a corrupt entry is skipped and reported in
// the returned warnings. It returns the number of entries added.
func (c *Cache) Import(r io.Reader) (int, []string, error) {
	b, err := io.ReadAll(io.LimitReader(r, 256<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("tune: import: %w", err)
	}
	f, err := decode(b)
	if err != nil {
		return 0, nil, fmt.Errorf("tune: import: %w", err)
	}
	if f.Device != c.device {
		return 0, nil, fmt.Errorf("tune: import: the entries were tuned on %v, not this device, %v", f.Device, c.device)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, warnings := c.merge(f)
	return n, warnings, c.save()
}

// merge adds f's trustworthy entries, returning how many and what it
// skipped.
func (c *Cache) merge(f *file) (int, []string) {
	n, warnings := 0, []string(nil)
	for i, s := range f.Entries {
		e, err := unseal(s)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("tune: entry %d skipped: %v", i, err))
			continue
		}
		c.entries[e.Key] = e
		n++
	}
	return n, warnings
}

// save writes the cache's file atomically (c.mu held). Under a lock of
// the directory it first takes in the entries another process filed since
// this one read the file (the newer of two entries of one key wins), so
// that processes sharing a cache do not drop each other's choices.
func (c *Cache) save() error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	unlock, err := lockDir(c.dir)
	if err != nil {
		return fmt.Errorf("tune: lock %s: %w", c.dir, err)
	}
	defer unlock()
	if b, err := os.ReadFile(c.path()); err == nil {
		if f, err := decode(b); err == nil && f.Device == c.device {
			for _, sl := range f.Entries {
				if e, err := unseal(sl); err == nil {
					if mine, ok := c.entries[e.Key]; !ok || e.Tuned.After(mine.Tuned) {
						c.entries[e.Key] = e
					}
				}
			}
		}
	}
	b, err := c.encode()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".tune-*")
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("tune: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tune: write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), c.path()); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tune: %w", err)
	}
	return nil
}

// encode is the cache's file: its entries sealed, in key order (c.mu held).
func (c *Cache) encode() ([]byte, error) {
	keys := make([]Key, 0, len(c.entries))
	for k := range c.entries {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	f := file{Format: format, Device: c.device, Entries: make([]sealed, 0, len(keys))}
	for _, k := range keys {
		s, err := seal(c.entries[k])
		if err != nil {
			return nil, err
		}
		f.Entries = append(f.Entries, s)
	}
	return json.MarshalIndent(f, "", " ")
}

func seal(e Entry) (sealed, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return sealed{}, fmt.Errorf("tune: entry %v: %w", e.Key, err)
	}
	h := sha256.Sum256(b)
	return sealed{Entry: b, Sum: hex.EncodeToString(h[:])}, nil
}

// unseal checks an entry's checksum (over its bytes as stored, compacted)
// and decodes it.
func unseal(s sealed) (Entry, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, s.Entry); err != nil {
		return Entry{}, fmt.Errorf("not JSON: %w", err)
	}
	h := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(h[:]) != s.Sum {
		return Entry{}, errors.New("its checksum does not match its contents")
	}
	var e Entry
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return Entry{}, fmt.Errorf("not an entry: %w", err)
	}
	if e.Family == "" || e.Choice == "" {
		return Entry{}, errors.New("no family or choice")
	}
	return e, nil
}

// decode parses a cache or export file (not its entries' checksums).
func decode(b []byte) (*file, error) {
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("not a tune file: %w", err)
	}
	if f.Format != format {
		return nil, fmt.Errorf("format %q, want %q", f.Format, format)
	}
	return &f, nil
}

// KilnVersion names this kiln build for Device.Kiln: the module version, or
// the VCS revision it was built from ("+dirty" when modified), or "devel".
func KilnVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev != "" && dirty:
		return rev + "+dirty"
	case rev != "":
		return rev
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		return bi.Main.Version
	}
	return "devel"
}

// DefaultDir is where kiln keeps tuned choices: $KILN_TUNE_DIR, else
// os.UserCacheDir()/kiln/tune, else a directory under the system's
// temporary directory.
func DefaultDir() string {
	if d := os.Getenv("KILN_TUNE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kiln", "tune")
	}
	return filepath.Join(os.TempDir(), "kiln-tune")
}

// The ways a run treats the cache (kiln's --tune).
const (
	// Cached takes the choices the cache holds and tunes (and keeps) the
	// others: the default.
	Cached = "cached"
	// Off neither reads nor writes the cache: choices are made afresh and
	// forgotten at exit.
	Off = "off"
	// Full tunes every choice again and keeps what it finds.
	Full = "full"
	// Defaults takes the built-in defaults: nothing is timed, read or
	// kept (the untuned baseline a tuned run is measured against).
	Defaults = "defaults"
)

// ParseMode checks a --tune value ("" is Cached).
func ParseMode(s string) (string, error) {
	switch s {
	case "", Cached:
		return Cached, nil
	case Off, Full, Defaults:
		return s, nil
	}
	return "", fmt.Errorf("tune mode %q: want %s, %s, %s or %s", s, Off, Cached, Full, Defaults)
}

// OpenMode opens the cache of device in dir (DefaultDir when "") for a run
// in mode (ParseMode's values): nil under Off, Defaults or a mode
// ParseMode refuses,
// or when the cache cannot be opened (the runs then tune as without one).
// The notes say why it was not opened and what Open skipped, for the
// caller to log.
func OpenMode(mode, dir string, device Device) (*Cache, []string) {
	if m, err := ParseMode(mode); err != nil || m == Off || m == Defaults {
		return nil, nil
	}
	if dir == "" {
		dir = DefaultDir()
	}
	c, err := Open(dir, device)
	if err != nil {
		return nil, []string{fmt.Sprintf("tune cache not used: %v", err)}
	}
	return c, c.Warnings
}
