// Package cu reaches CUDA from Go without a CUDA toolkit at build time: the
// driver API (libcuda), NVRTC and cuBLASLt are loaded at run time through
// dlopen by a small cgo shim, so building kiln needs no CUDA headers,
// libraries or GPU. Where CUDA cannot be loaded, Available reports why in one
// line and the caller runs on the CPU. Builds without cgo compile too and
// report unavailable.
//
// Every device has one worker goroutine, locked to its OS thread, that holds
// the device's primary context; all CUDA calls for the device run there
// (Device.Do). No Go pointer is handed to C: values come back from the shim in
// structs, transfers go through pinned (cuMemHostAlloc) buffers, and kernel
// arguments are packed into C memory.
package cu

import (
	"errors"
	"fmt"
	"sync"
)

// Ptr is a device address.
type Ptr uint64

// Add offsets a device address by n bytes.
func (p Ptr) Add(n int) Ptr { return p + Ptr(n) }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// D1 is a one-dimensional shape.
func D1(x int) Dim3 { return Dim3{x, 1, 1} }

func (d Dim3) String() string { return fmt.Sprintf("(%d,%d,%d)", d.X, d.Y, d.Z) }

// Error is a failed CUDA, NVRTC or cuBLASLt call.
type Error struct {
	Lib  string // "cuda", "nvrtc", "cublasLt"
	Call string // the call, with the kernel or symbol where there is one
	Code int    // the library's status code
	Name string // e.g. CUDA_ERROR_OUT_OF_MEMORY
	Msg  string // the driver's description, where there is one
	Log  string // NVRTC's compile log, where there is one
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s: %s", e.Lib, e.Call, e.Name)
	if e.Msg != "" {
		s += " (" + e.Msg + ")"
	}
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// ContextLost reports whether err is one of the driver's sticky errors: a
// kernel faulted (an illegal address or instruction, a misaligned access,
// a failed launch, a trap or assertion) and the context is unusable, so
// that every later call fails too; only a new process recovers.
func ContextLost(err error) bool {
	var e *Error
	if !errors.As(err, &e) || e.Lib != "cuda" {
		return false
	}
	switch e.Code {
	case 700, // CUDA_ERROR_ILLEGAL_ADDRESS
		710, // CUDA_ERROR_ASSERT
		714, // CUDA_ERROR_HARDWARE_STACK_ERROR
		715, // CUDA_ERROR_ILLEGAL_INSTRUCTION
		716, // CUDA_ERROR_MISALIGNED_ADDRESS
		717, // CUDA_ERROR_INVALID_ADDRESS_SPACE
		718, // CUDA_ERROR_INVALID_PC
		719: // CUDA_ERROR_LAUNCH_FAILED
		return true
	}
	return false
}

// Libs records which shared libraries were loaded, and from where.
type Libs struct {
	Driver, NVRTC, BlasLt string
	DriverVersion         int // e.g. 13000
	NVRTCVersion          [2]int
	BlasLtVersion         int
}

var (
	drvOnce           sync.Once
	drvErr            error
	nvrtcOnce, ltOnce sync.Once
	nvrtcLoadErr      error
	ltLoadErr         error
	libs              Libs
	devCount          int
)

// Available reports nil if the CUDA driver loaded, initialised and sees at
// least one device; otherwise an error whose text is a one-line reason.
func Available() error {
	drvOnce.Do(func() { drvErr = initDriver() })
	return drvErr
}

func initDriver() error {
	if !cgoEnabled {
		return errors.New("cuda unavailable: kiln was built without cgo")
	}
	path, err := loadLib(0, libCUDA)
	if err != nil {
		return fmt.Errorf("cuda unavailable: %w", err)
	}
	libs.Driver = path
	if err := drvInit(); err != nil {
		return fmt.Errorf("cuda unavailable: %w", err)
	}
	if libs.DriverVersion, err = drvVersion(); err != nil {
		return fmt.Errorf("cuda unavailable: %w", err)
	}
	if devCount, err = drvDeviceCount(); err != nil {
		return fmt.Errorf("cuda unavailable: %w", err)
	}
	if devCount == 0 {
		return errors.New("cuda unavailable: the driver sees no devices")
	}
	return nil
}

// NVRTCAvailable loads NVRTC (once) and reports why it cannot be used.
func NVRTCAvailable() error {
	if err := Available(); err != nil {
		return err
	}
	nvrtcOnce.Do(func() {
		path, err := loadLib(1, libNVRTC)
		if err != nil {
			nvrtcLoadErr = fmt.Errorf("nvrtc unavailable: %w", err)
			return
		}
		libs.NVRTC = path
		maj, min, err := nvrtcVersionGet()
		if err != nil {
			nvrtcLoadErr = fmt.Errorf("nvrtc unavailable: %w", err)
			return
		}
		libs.NVRTCVersion = [2]int{maj, min}
	})
	return nvrtcLoadErr
}

// BlasLtAvailable loads cuBLASLt (once) and reports why it cannot be used.
func BlasLtAvailable() error {
	if err := Available(); err != nil {
		return err
	}
	ltOnce.Do(func() {
		path, err := loadLib(2, libLt)
		if err != nil {
			ltLoadErr = fmt.Errorf("cublasLt unavailable: %w", err)
			return
		}
		libs.BlasLt = path
		libs.BlasLtVersion = ltVersion()
	})
	return ltLoadErr
}

// Loaded returns the libraries loaded so far.
func Loaded() Libs { return libs }

// DeviceCount is the number of CUDA devices.
func DeviceCount() (int, error) {
	if err := Available(); err != nil {
		return 0, err
	}
	return devCount, nil
}
