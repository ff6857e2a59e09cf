package cuda

import (
	"path/filepath"

	"kiln/artifact"
	"kiln/backend/cuda/kcache"
	"kiln/tune"
)

// StartFrom makes b start from the ahead-of-time artifact in dir (kiln
// compile), whose manifest the caller has read and checked
// (artifact.Read, Manifest.Check): its kernel images are searched before
// the kernel cache and never written; its tuned choices are taken, and a
// choice it lacks is timed at first use and kept in memory only.
func (b *Backend) StartFrom(dir string) {
	c := kcache.New(b.Device.KernelCache().Dir)
	c.Base = filepath.Join(dir, artifact.KernelsDir)
	b.Device.SetKernelCache(c)
	b.Tune, b.TuneDir, b.tuneInMemory = tune.Cached, filepath.Join(dir, artifact.TuneDir), true
}

// JITWork is what b compiled and timed at run time since it opened:
// kernel modules compiled by NVRTC (not found in an artifact or the kernel
// cache) and first-use choices timed (not found in an artifact or the tune
// cache). Safe to call from any goroutine.
func (b *Backend) JITWork() (modules, choices int64) {
	return b.Device.KernelCache().Stats().Compiled, b.races.Load()
}
