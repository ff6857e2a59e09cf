// Package kcache is the on-disk cache of compiled GPU kernels (CUBIN or PTX
// images). It knows nothing about CUDA: an entry is an opaque payload stored
// under a key derived from everything that determines the compiler's output
// (source, options, compiler version, driver version, device architecture).
//
// Entries are written atomically (temporary file, then rename) and carry a
// header with the key, the payload's length and its SHA-256, so a truncated,
// corrupt or misplaced file is detected, counted, and rebuilt, never trusted.
package kcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// KeyInput is everything that determines a compiled kernel image.
type KeyInput struct {
	Source   string
	Options  []string
	Compiler string // e.g. "nvrtc 13.0"
	Driver   string // e.g. "cuda driver 13000"
	Arch     string // e.g. "sm_90a"
	// Layout names the payload's layout, so that programs that lay their
	// payloads out differently never read each other's entries (an older
	// kiln sharing the directory refuses a payload it cannot parse).
	Layout string
}

// Key is the SHA-256 of a KeyInput's fields, each length-prefixed so that no
// two different inputs share an encoding.
type Key [32]byte

// String is the key in hex; it names the entry's file.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Key derives the cache key.
func (in KeyInput) Key() Key {
	h := sha256.New()
	put := func(tag string, s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write([]byte(tag))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	put("kiln-kernel-v1", "")
	put("src", in.Source)
	put("nopt", fmt.Sprint(len(in.Options)))
	for _, o := range in.Options {
		put("opt", o)
	}
	put("compiler", in.Compiler)
	put("driver", in.Driver)
	put("arch", in.Arch)
	put("layout", in.Layout)
	var k Key
	copy(k[:], h.Sum(nil))
	return k
}

// File layout: magic (8) | key (32) | payload length (8, little endian) |
// payload SHA-256 (32) | payload.
const (
	magic      = "KILNKC1\n"
	headerSize = 8 + 32 + 8 + 32
)

// ErrCorrupt marks an entry that failed validation.
var ErrCorrupt = errors.New("kcache: corrupt entry")

// Encode builds an entry file's contents.
func Encode(k Key, payload []byte) []byte {
	b := make([]byte, headerSize+len(payload))
	copy(b, magic)
	copy(b[8:], k[:])
	binary.LittleEndian.PutUint64(b[40:], uint64(len(payload)))
	sum := sha256.Sum256(payload)
	copy(b[48:], sum[:])
	copy(b[headerSize:], payload)
	return b
}

// Decode validates an entry file's contents for key k and returns its payload.
func Decode(k Key, b []byte) ([]byte, error) {
	if len(b) < headerSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorrupt, len(b))
	}
	if string(b[:8]) != magic {
		return nil, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	if !bytes.Equal(b[8:40], k[:]) {
		return nil, fmt.Errorf("%w: entry holds another key", ErrCorrupt)
	}
	n := binary.LittleEndian.Uint64(b[40:])
	if n != uint64(len(b)-headerSize) {
		return nil, fmt.Errorf("%w: payload of %d bytes, header says %d", ErrCorrupt, len(b)-headerSize, n)
	}
	p := b[headerSize:]
	sum := sha256.Sum256(p)
	if !bytes.Equal(sum[:], b[48:80]) {
		return nil, fmt.Errorf("%w: payload checksum mismatch", ErrCorrupt)
	}
	return p, nil
}

// Stats counts what a Cache did.
type Stats struct {
	Compiled int64 // builds run (misses and rebuilt corrupt entries)
	Hits     int64 // entries served from memory or disk
	Corrupt  int64 // entries on disk rejected
	WriteErr int64 // entries that could not be written (the build still succeeded)
	// BuildTime is the time the builds took, summed.
	BuildTime time.Duration
}

// Cache is a kernel cache rooted at a directory. An empty Dir keeps entries
// in memory only. Safe for concurrent use.
type Cache struct {
	Dir string
	// Base, when set, is a directory of entries searched before Dir and
	// never written (an ahead-of-time artifact's kernels): a corrupt entry
	// there is counted and passed over, not removed.
	Base string

	mu  sync.Mutex
	mem map[Key][]byte

	compiled, hits, corrupt, writeErr, buildNs atomic.Int64
}

// New returns a cache rooted at dir ("" for memory only).
func New(dir string) *Cache { return &Cache{Dir: dir} }

// DefaultDir is $KILN_CACHE_DIR, else os.UserCacheDir()/kiln/kernels, else
// os.TempDir()/kiln-kernels.
func DefaultDir() string {
	if d := os.Getenv("KILN_CACHE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kiln", "kernels")
	}
	return filepath.Join(os.TempDir(), "kiln-kernels")
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	return Stats{Compiled: c.compiled.Load(), Hits: c.hits.Load(), Corrupt: c.corrupt.Load(), WriteErr: c.writeErr.Load(),
		BuildTime: time.Duration(c.buildNs.Load())}
}

// Path is the file an entry lives in.
func (c *Cache) Path(k Key) string { return entryPath(c.Dir, k) }

func entryPath(dir string, k Key) string {
	return filepath.Join(dir, k.String()[:2], k.String()+".kc")
}

// Get returns the payload for k if a valid entry exists (in memory, or on
// disk). A corrupt file on disk is removed and counted. Get does not count hits.
func (c *Cache) Get(k Key) ([]byte, bool) {
	c.mu.Lock()
	p, ok := c.mem[k]
	c.mu.Unlock()
	if ok {
		return p, true
	}
	if c.Base != "" {
		if b, err := os.ReadFile(entryPath(c.Base, k)); err == nil {
			if p, err := Decode(k, b); err == nil {
				c.remember(k, p)
				return p, true
			}
			c.corrupt.Add(1)
		}
	}
	if c.Dir == "" {
		return nil, false
	}
	b, err := os.ReadFile(c.Path(k))
	if err != nil {
		return nil, false
	}
	p, err = Decode(k, b)
	if err != nil {
		c.corrupt.Add(1)
		os.Remove(c.Path(k))
		return nil, false
	}
	c.remember(k, p)
	return p, true
}

func (c *Cache) remember(k Key, p []byte) {
	c.mu.Lock()
	if c.mem == nil {
		c.mem = map[Key][]byte{}
	}
	c.mem[k] = p
	c.mu.Unlock()
}

// Forget drops the in-memory copy of k (the disk entry stays), so that the
// next Get reads the disk: for tests, and a fresh process behaves the same.
func (c *Cache) Forget(k Key) {
	c.mu.Lock()
	delete(c.mem, k)
	c.mu.Unlock()
}

// Put stores a payload atomically: a temporary file in the entry's directory,
// synced, then renamed over the entry.
func (c *Cache) Put(k Key, p []byte) error {
	c.remember(k, p)
	if c.Dir == "" {
		return nil
	}
	path := c.Path(k)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("kcache: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("kcache: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(Encode(k, p))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kcache: writing %s: %w", path, err)
	}
	return nil
}

// GetOrBuild returns the cached payload for k, or runs build, stores its
// result and returns it. hit reports whether build was skipped. A failure to
// write the entry is counted but not returned: the kernel still works.
func (c *Cache) GetOrBuild(k Key, build func() ([]byte, error)) (p []byte, hit bool, err error) {
	if p, ok := c.Get(k); ok {
		c.hits.Add(1)
		return p, true, nil
	}
	began := time.Now()
	p, err = build()
	if err != nil {
		return nil, false, err
	}
	c.buildNs.Add(int64(time.Since(began)))
	c.compiled.Add(1)
	if err := c.Put(k, p); err != nil {
		c.writeErr.Add(1)
	}
	return p, false, nil
}
