package cu

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"
)

// NCCL, loaded at run time like the other libraries: one process drives
// every GPU of a tensor-parallel group, each from its device's worker
// thread, with one communicator a device (ncclCommInitAll).

var libNCCL = Library{Name: "nccl", Sonames: []string{"libnccl.so.2", "libnccl.so"}, Glob: "libnccl.so.*", WheelDir: "nccl"}

var (
	ncclOnce    sync.Once
	ncclLoadErr error
	ncclPath    string
	ncclVer     int
)

// NCCLAvailable loads NCCL (once) and reports why it cannot be used.
func NCCLAvailable() error {
	if err := Available(); err != nil {
		return err
	}
	ncclOnce.Do(func() {
		// NVLink multicast (NVLS) stays off unless the user chose: on the
		// shared machines kiln is developed on it can put the host's GPUs
		// out of service.
		if _, set := os.LookupEnv("NCCL_NVLS_ENABLE"); !set {
			os.Setenv("NCCL_NVLS_ENABLE", "0")
		}
		path, err := loadLib(3, libNCCL)
		if err != nil {
			ncclLoadErr = fmt.Errorf("nccl unavailable: %w", err)
			return
		}
		ncclPath = path
		if ncclVer, err = ncclVersion(); err != nil {
			ncclLoadErr = fmt.Errorf("nccl unavailable: %w", err)
		}
	})
	return ncclLoadErr
}

// NCCLLibrary is the path and version (e.g. 22703 for 2.27.3) of the NCCL
// loaded.
func NCCLLibrary() (string, int) { return ncclPath, ncclVer }

// Comm is one rank's NCCL communicator, on its device.
type Comm struct {
	d           *Device
	h           unsafe.Pointer
	Rank, Ranks int
	mu          sync.Mutex
	aborted     bool
}

// NewComms makes a group of one rank a device, rank i on devs[i].
func NewComms(devs []*Device) ([]*Comm, error) {
	if err := NCCLAvailable(); err != nil {
		return nil, err
	}
	ords := make([]int, len(devs))
	for i, d := range devs {
		ords[i] = d.Ordinal
	}
	hs, err := ncclInitAll(ords)
	if err != nil {
		return nil, err
	}
	cs := make([]*Comm, len(devs))
	for i, h := range hs {
		cs[i] = &Comm{d: devs[i], h: h, Rank: i, Ranks: len(devs)}
	}
	return cs, nil
}

// ncclType is dt's ncclDataType_t.
func ncclType(dt DType) (int, error) {
	switch dt {
	case F32:
		return 7, nil
	case F16:
		return 6, nil
	case BF16:
		return 9, nil
	}
	return 0, fmt.Errorf("nccl: no collective of %v", dt)
}

// AllReduce queues on s the sum over the ranks of n elements of src into
// dst (which may be src).
func (c *Comm) AllReduce(dst, src Ptr, n int, dt DType, s *Stream) error {
	t, err := ncclType(dt)
	if err != nil {
		return err
	}
	return c.d.Do(func() error {
		if err := c.usable(); err != nil {
			return err
		}
		return c.check(ncclAllReduce(src, dst, n, t, c.h, s.handle()))
	})
}

// AllGather queues on s the gathering of every rank's n elements of src
// into dst, rank 0's first (dst holds Ranks·n).
func (c *Comm) AllGather(dst, src Ptr, n int, dt DType, s *Stream) error {
	t, err := ncclType(dt)
	if err != nil {
		return err
	}
	return c.d.Do(func() error {
		if err := c.usable(); err != nil {
			return err
		}
		return c.check(ncclAllGather(src, dst, n, t, c.h, s.handle()))
	})
}

// usable refuses a collective on an aborted or closed communicator (whose
// handle NCCL has freed).
func (c *Comm) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted || c.h == nil {
		return fmt.Errorf("nccl: rank %d's communicator was aborted or closed", c.Rank)
	}
	return nil
}

// check adds the communicator's asynchronous error (a peer lost) to a
// call's.
func (c *Comm) check(err error) error {
	if err != nil {
		return err
	}
	c.mu.Lock()
	aborted := c.aborted
	c.mu.Unlock()
	if aborted {
		return fmt.Errorf("nccl: rank %d's communicator was aborted", c.Rank)
	}
	return nil
}

// Abort ends the communicator at once, failing what waits on it (a peer's
// step failed); the group is unusable after.
func (c *Comm) Abort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted || c.h == nil {
		return nil
	}
	c.aborted = true
	return ncclAbort(c.h)
}

// CloseComms destroys a group's communicators, every rank's at once: NCCL's
// destroy waits for the group's other ranks (one at a time never returns).
// A destroy that has not returned after CommCloseTimeout is left to the
// process's exit (ErrCommStuck): a server or a benchmark must not hang as
// it ends.
func CloseComms(cs []*Comm) error {
	errs := make([]error, len(cs))
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() { errs[i] = c.close() })
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return errors.Join(errs...)
	case <-time.After(CommCloseTimeout):
		return ErrCommStuck
	}
}

// CommCloseTimeout bounds CloseComms.
var CommCloseTimeout = 10 * time.Second

// ErrCommStuck: CloseComms gave up waiting for NCCL; the devices' workers
// may still be inside it, so the devices are not closed either.
var ErrCommStuck = errors.New("nccl: ncclCommDestroy did not return; left to the process's exit")

// close destroys the communicator; CloseComms calls it on every rank at
// once.
func (c *Comm) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil || c.aborted {
		c.h = nil
		return nil
	}
	h := c.h
	c.h = nil
	return c.d.Do(func() error { return ncclDestroy(h) })
}

// AsyncError reports a failure NCCL found after a call returned.
func (c *Comm) AsyncError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil || c.aborted {
		return nil
	}
	return ncclAsyncError(c.h)
}
