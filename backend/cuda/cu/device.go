package cu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"kiln/backend/cuda/kcache"
)

// Device attribute numbers (CUdevice_attribute in cuda.h).
const (
	attrMultiprocessorCount = 16
	attrSharedPerBlockOptin = 97
	attrComputeMajor        = 75
	attrComputeMinor        = 76
)

// Device is one GPU and the worker goroutine that owns its primary context.
type Device struct {
	Ordinal int
	Name    string
	Major   int // compute capability
	Minor   int
	SMs     int
	// SharedPerBlock is the most dynamic shared memory a block can opt in
	// to (Function.SetMaxDynamicShared), in bytes.
	SharedPerBlock int
	TotalMem       uint64

	dev  int
	ctx  unsafe.Pointer
	work chan func()
	tid  int // the worker's OS thread
	// dependent: programmatic dependent launches and thread-block clusters
	// are available (compute capability 9.0+ and cuLaunchKernelEx).
	dependent bool

	mu     sync.Mutex
	closed bool

	// Used on the worker only.
	staging     unsafe.Pointer // pinned bounce buffer for Upload/Download
	stagingSize int
	args        unsafe.Pointer // packed kernel arguments (C memory)
	params      unsafe.Pointer // void*[maxArgs] pointing into args
	maps        unsafe.Pointer // C memory of the tensor maps passed by value (maxMaps, 64-byte aligned in it)

	capturing []*Stream // streams between BeginCapture and EndCapture

	cache    *kcache.Cache
	forcePTX bool // tests: take the PTX path of Compile
}

const (
	maxArgs      = 64
	argSlot      = 16
	maxMaps      = 4 // tensor maps a launch passes (TensorMap arguments)
	stagingChunk = 64 << 20
)

// ErrClosed is returned by a closed device.
var ErrClosed = errors.New("cuda: device closed")

// Open starts the worker of device ordinal, retains its primary context and
// makes it current on the worker's thread.
func Open(ordinal int) (*Device, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= devCount {
		return nil, fmt.Errorf("cuda: device %d of %d", ordinal, devCount)
	}
	d := &Device{Ordinal: ordinal, work: make(chan func(), 1), cache: kcache.New(kcache.DefaultDir())}
	ready := make(chan error)
	go d.worker(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) worker(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the worker
	d.tid = gettid()
	err := d.setup()
	ready <- err
	if err != nil {
		return
	}
	for {
		f, ok := receive(d.work, workerSpin)
		if !ok {
			return
		}
		f()
	}
}

// Hand-offs between the worker and its callers poll their channel for a
// while before blocking on it: waking a parked thread took 50–100 µs a
// round trip on a 2-core machine here (a goroutine locked to its thread,
// 2026-11-23), the order of a whole decode step's time outside the device
// on an H200 (docs/PERF.md). The worker polls for the next call for up to
// workerSpin after each one (a decode loop calls again within
// microseconds); Do polls for its result for up to callerSpin, longer than
// a decode step, while the worker waits for the device.
const (
	workerSpin = time.Millisecond
	callerSpin = 20 * time.Millisecond
)

// receive is a receive from ch that polls it for up to spin before
// blocking.
func receive[T any](ch <-chan T, spin time.Duration) (T, bool) {
	var start time.Time
	for i := 0; ; i++ {
		select {
		case v, ok := <-ch:
			return v, ok
		default:
		}
		if i%64 == 0 {
			if i == 0 {
				start = time.Now()
			} else if time.Since(start) > spin {
				break
			}
		}
	}
	v, ok := <-ch
	return v, ok
}

func (d *Device) setup() (err error) {
	if d.dev, err = drvDeviceGet(d.Ordinal); err != nil {
		return err
	}
	if d.Name, err = drvDeviceName(d.dev); err != nil {
		return err
	}
	if d.Major, err = drvDeviceAttr(d.dev, attrComputeMajor); err != nil {
		return err
	}
	if d.Minor, err = drvDeviceAttr(d.dev, attrComputeMinor); err != nil {
		return err
	}
	d.dependent = d.Major >= 9 && drvHasLaunchEx()
	if d.SMs, err = drvDeviceAttr(d.dev, attrMultiprocessorCount); err != nil {
		return err
	}
	if d.SharedPerBlock, err = drvDeviceAttr(d.dev, attrSharedPerBlockOptin); err != nil {
		return err
	}
	if d.TotalMem, err = drvTotalMem(d.dev); err != nil {
		return err
	}
	if d.ctx, err = drvPrimaryCtxRetain(d.dev); err != nil {
		return err
	}
	if err = drvCtxSetCurrent(d.ctx); err != nil {
		drvPrimaryCtxRelease(d.dev)
		return err
	}
	d.args = cMalloc(maxArgs * argSlot)
	d.params = cMalloc(maxArgs * int(unsafe.Sizeof(uintptr(0))))
	d.maps = cMalloc(maxMaps*128 + 64)
	return nil
}

// Clusters reports whether kernels can be launched in thread-block clusters
// (Function.LaunchInClusters): compute capability 9.0+ and cuLaunchKernelEx.
func (d *Device) Clusters() bool { return d.dependent }

// FP8 reports whether the device converts FP8 E4M3 in hardware (compute
// capability 8.9+: the cvt instructions the FP8 kernels use, and cuBLASLt's
// FP8 products).
func (d *Device) FP8() bool { return d.Major*10+d.Minor >= 89 }

// onWorker reports whether the caller runs on the device's worker thread. A
// goroutine locked to a thread is the only one that runs on it, so the
// thread id identifies the worker.
func (d *Device) onWorker() bool { return gettid() == d.tid }

// Do runs f on the device's worker, with the device's context current, and
// returns its error. Calls from inside f run inline. A panic in f is returned
// as an error.
func (d *Device) Do(f func() error) error {
	wait, err := d.Go(f)
	if err != nil {
		return err
	}
	return wait()
}

// Go hands f to the device's worker, as Do does, and returns at once (an
// error only when the device is closed); wait returns f's error once f has
// run, polling for it before it blocks as Do does. Callers that drive
// several devices hand each its work with Go and then wait for all, so
// that every device starts at once. Called on the worker, f runs inline
// before Go returns.
func (d *Device) Go(f func() error) (wait func() error, err error) {
	if d.onWorker() {
		err := d.noteCapture(f())
		return func() error { return err }, nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrClosed
	}
	done := make(chan error, 1)
	d.work <- func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("cuda: panic on device %d worker: %v", d.Ordinal, r)
			}
		}()
		done <- d.noteCapture(f())
	}
	d.mu.Unlock()
	return func() error {
		err, _ := receive(done, callerSpin)
		return err
	}, nil
}

// Close synchronises the device, frees the package's buffers, releases the
// primary context and ends the worker. Resources the caller still holds
// (allocations, modules, streams) should be freed first.
func (d *Device) Close() error {
	err := d.Do(func() error {
		err := drvCtxSync()
		if d.staging != nil {
			drvHostFree(d.staging)
			d.staging = nil
		}
		cFree(d.args)
		cFree(d.params)
		cFree(d.maps)
		if e := drvPrimaryCtxRelease(d.dev); err == nil {
			err = e
		}
		return err
	})
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.work)
	}
	d.mu.Unlock()
	return err
}

// Arch is the NVRTC target name for the device: sm_XY, with the "a" suffix
// on compute capability 9.0 (Hopper's wgmma and setmaxnreg need sm_90a).
func (d *Device) Arch() string {
	s := fmt.Sprintf("sm_%d%d", d.Major, d.Minor)
	if d.Major == 9 && d.Minor == 0 {
		s += "a"
	}
	return s
}

// KernelCache is the device's compiled-kernel cache (KILN_CACHE_DIR, default
// os.UserCacheDir()/kiln/kernels).
func (d *Device) KernelCache() *kcache.Cache { return d.cache }

// SetKernelCache replaces the kernel cache (tests use a fresh directory).
func (d *Device) SetKernelCache(c *kcache.Cache) { d.cache = c }

// Sync waits for all work on the device.
func (d *Device) Sync() error { return d.Do(drvCtxSync) }

// MemInfo returns the free and total device memory.
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.Do(func() error {
		var e error
		free, total, e = drvMemInfo()
		return e
	})
	return
}

// Alloc allocates n bytes of device memory (256-byte aligned).
func (d *Device) Alloc(n int) (p Ptr, err error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda: Alloc(%d)", n)
	}
	err = d.Do(func() error {
		var e error
		p, e = drvMemAlloc(n)
		return e
	})
	return
}

// Free releases device memory from Alloc.
func (d *Device) Free(p Ptr) error {
	if p == 0 {
		return nil
	}
	return d.Do(func() error { return drvMemFree(p) })
}

// Memset8 sets n bytes at p to v on stream s (nil: the default stream).
func (d *Device) Memset8(p Ptr, v byte, n int, s *Stream) error {
	return d.Do(func() error { return drvMemset8(p, v, n, s.handle()) })
}

// Memset32 sets n 32-bit words at p to v on stream s.
func (d *Device) Memset32(p Ptr, v uint32, n int, s *Stream) error {
	return d.Do(func() error { return drvMemset32(p, v, n, s.handle()) })
}

// growStaging makes the pinned bounce buffer at least n bytes (worker only).
func (d *Device) growStaging(n int) error {
	if n <= d.stagingSize {
		return nil
	}
	if d.staging != nil {
		if err := drvHostFree(d.staging); err != nil {
			return err
		}
		d.staging, d.stagingSize = nil, 0
	}
	p, err := drvHostAlloc(n)
	if err != nil {
		return err
	}
	d.staging, d.stagingSize = p, n
	return nil
}

// Upload copies src to device address dst and waits for the copy. The bytes
// go through a pinned buffer in chunks of at most 64 MiB.
func (d *Device) Upload(dst Ptr, src []byte) error {
	return d.Do(func() error {
		if err := d.growStaging(min(len(src), stagingChunk)); err != nil {
			return err
		}
		for off := 0; off < len(src); off += stagingChunk {
			n := min(stagingChunk, len(src)-off)
			copy(unsafe.Slice((*byte)(d.staging), n), src[off:off+n])
			if err := drvHtoD(dst.Add(off), d.staging, n, nil); err != nil {
				return err
			}
			if err := drvStreamSync(nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// Download copies len(dst) bytes from device address src into dst, after
// the work queued before it on the default stream; streams created with
// NewStream do not synchronise with it, so sync them first.
func (d *Device) Download(dst []byte, src Ptr) error {
	return d.Do(func() error {
		if err := d.growStaging(min(len(dst), stagingChunk)); err != nil {
			return err
		}
		for off := 0; off < len(dst); off += stagingChunk {
			n := min(stagingChunk, len(dst)-off)
			if err := drvDtoH(d.staging, src.Add(off), n, nil); err != nil {
				return err
			}
			if err := drvStreamSync(nil); err != nil {
				return err
			}
			copy(dst[off:off+n], unsafe.Slice((*byte)(d.staging), n))
		}
		return nil
	})
}

// CopyDtoD copies n bytes between device addresses on stream s.
func (d *Device) CopyDtoD(dst, src Ptr, n int, s *Stream) error {
	return d.Do(func() error { return drvDtoD(dst, src, n, s.handle()) })
}

// HostBuf is pinned host memory, for asynchronous transfers.
type HostBuf struct {
	d *Device
	p unsafe.Pointer
	n int
}

// AllocHost allocates n bytes of pinned host memory.
func (d *Device) AllocHost(n int) (*HostBuf, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocHost(%d)", n)
	}
	h := &HostBuf{d: d, n: n}
	err := d.Do(func() error {
		var e error
		h.p, e = drvHostAlloc(n)
		return e
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Bytes is the buffer's memory; valid until Free.
func (h *HostBuf) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// Free releases the buffer.
func (h *HostBuf) Free() error {
	if h.p == nil {
		return nil
	}
	err := h.d.Do(func() error { return drvHostFree(h.p) })
	h.p = nil
	return err
}

func (h *HostBuf) check(off, n int) error {
	if h.p == nil || off < 0 || n < 0 || off+n > h.n {
		return fmt.Errorf("cuda: host buffer range [%d,%d) of %d bytes", off, off+n, h.n)
	}
	return nil
}

// CopyHtoDAsync queues a copy of n bytes from h[off:] to dst on stream s.
func (d *Device) CopyHtoDAsync(dst Ptr, h *HostBuf, off, n int, s *Stream) error {
	if err := h.check(off, n); err != nil {
		return err
	}
	return d.Do(func() error { return drvHtoD(dst, unsafe.Add(h.p, off), n, s.handle()) })
}

// CopyDtoHAsync queues a copy of n bytes from src to h[off:] on stream s.
func (d *Device) CopyDtoHAsync(h *HostBuf, off int, src Ptr, n int, s *Stream) error {
	if err := h.check(off, n); err != nil {
		return err
	}
	return d.Do(func() error { return drvDtoH(unsafe.Add(h.p, off), src, n, s.handle()) })
}

// Stream is a CUDA stream. A nil *Stream is the legacy default stream.
type Stream struct {
	d *Device
	h unsafe.Pointer

	// Worker only: set between BeginCapture and EndCapture, with the first
	// failed CUDA or cuBLASLt call made on the device meanwhile.
	capturing bool
	capErr    *Error
}

func (s *Stream) handle() unsafe.Pointer {
	if s == nil {
		return nil
	}
	return s.h
}

// NewStream creates a non-blocking stream.
func (d *Device) NewStream() (*Stream, error) {
	s := &Stream{d: d}
	err := d.Do(func() error {
		var e error
		s.h, e = drvStreamCreate()
		return e
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Sync waits for the stream's work.
func (s *Stream) Sync() error {
	return s.d.Do(func() error { return drvStreamSync(s.h) })
}

// Wait makes future work on s wait for e.
func (s *Stream) Wait(e *Event) error {
	return s.d.Do(func() error { return drvStreamWaitEvent(s.h, e.h) })
}

// Close destroys the stream; a capture still open on it is ended and its
// graph dropped.
func (s *Stream) Close() error {
	if s == nil || s.h == nil {
		return nil
	}
	err := s.d.Do(func() error {
		var err error
		if s.capturing {
			err = s.abortCapture()
		}
		if e := drvStreamDestroy(s.h); err == nil {
			err = e
		}
		return err
	})
	s.h = nil
	return err
}

// Event is a CUDA event.
type Event struct {
	d *Device
	h unsafe.Pointer
}

// NewEvent creates an event; timing events can be used with Elapsed.
func (d *Device) NewEvent(timing bool) (*Event, error) {
	e := &Event{d: d}
	err := d.Do(func() error {
		var err error
		e.h, err = drvEventCreate(timing)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Record records the event on stream s (nil: the default stream).
func (e *Event) Record(s *Stream) error {
	return e.d.Do(func() error { return drvEventRecord(e.h, s.handle()) })
}

// Sync waits for the event.
func (e *Event) Sync() error { return e.d.Do(func() error { return drvEventSync(e.h) }) }

// Elapsed is the time in milliseconds from start to end (both recorded and
// complete).
func Elapsed(start, end *Event) (ms float32, err error) {
	err = start.d.Do(func() error {
		var e error
		ms, e = drvEventElapsed(start.h, end.h)
		return e
	})
	return
}

// Close destroys the event.
func (e *Event) Close() error {
	if e == nil || e.h == nil {
		return nil
	}
	err := e.d.Do(func() error { return drvEventDestroy(e.h) })
	e.h = nil
	return err
}

// AsBytes views a slice of plain numbers as bytes (no copy).
func AsBytes[T ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
