package cu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unsafe"

	"kiln/backend/cuda/kcache"
)

// Module is loaded device code.
type Module struct {
	d     *Device
	name  string
	h     unsafe.Pointer
	fns   map[string]*Function
	Cubin bool // the image was a CUBIN (else PTX, compiled by the driver)
	Hit   bool // the image came from the kernel cache
	// BuildTime is how long NVRTC took to compile the image (0 when it
	// came from the kernel cache).
	BuildTime time.Duration
	// Log is NVRTC's log of the compile that made the image (kept in the
	// kernel cache with it): ptxas's warnings, e.g. wgmma serialized;
	// empty when NVRTC said nothing.
	Log string
}

// Name is the module's name (Device.Compile's).
func (m *Module) Name() string { return m.name }

// Function is a kernel of a module.
type Function struct {
	m    *Module
	Name string
	h    unsafe.Pointer
	// nonPortable: clusters of more than maxPortableCluster blocks are
	// allowed (set on the device's worker at the first such launch).
	nonPortable bool
}

// Image kinds, the first byte of a cached payload: P and C the image alone
// after it, p and c the compile log first (its length, 4 bytes little
// endian, then the log) and the image after it.
const (
	imgPTX      = 'P'
	imgCubin    = 'C'
	imgPTXLog   = 'p'
	imgCubinLog = 'c'
)

// encodePayload is a cache entry's payload: the image's kind, the log, the
// image.
func encodePayload(img []byte, cubin bool, log string) []byte {
	kind := byte(imgPTXLog)
	if cubin {
		kind = imgCubinLog
	}
	b := make([]byte, 0, 5+len(log)+len(img))
	b = append(b, kind)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(log)))
	b = append(b, log...)
	return append(b, img...)
}

// decodePayload splits a cache entry's payload (either layout).
func decodePayload(p []byte) (img []byte, cubin bool, log string, err error) {
	if len(p) < 2 {
		return nil, false, "", errors.New("no image")
	}
	switch p[0] {
	case imgPTX, imgCubin:
		return p[1:], p[0] == imgCubin, "", nil
	case imgPTXLog, imgCubinLog:
		if len(p) < 5 {
			return nil, false, "", errors.New("truncated log length")
		}
		n := binary.LittleEndian.Uint32(p[1:])
		if uint64(n) > uint64(len(p)-5) || len(p)-5-int(n) < 1 {
			return nil, false, "", errors.New("log longer than the entry")
		}
		return p[5+n:], p[0] == imgCubinLog, string(p[5 : 5+n]), nil
	}
	return nil, false, "", fmt.Errorf("unknown image kind %q", p[0])
}

// target picks NVRTC's target for the device: the exact sm_XY (sm_90a on
// Hopper), giving a CUBIN, when this NVRTC supports the device; otherwise
// PTX for the newest virtual architecture it supports that the device can
// run, which the driver compiles at load time.
func (d *Device) target() (opt string, cubin bool, err error) {
	archs, err := nvrtcArchs()
	if err != nil {
		return "", false, err
	}
	cc := d.Major*10 + d.Minor
	if slices.Contains(archs, cc) && !d.forcePTX {
		return "--gpu-architecture=" + d.Arch(), true, nil
	}
	best := 0
	for _, a := range archs {
		if a <= cc && a > best {
			best = a
		}
	}
	if best == 0 {
		return "", false, fmt.Errorf("nvrtc %d.%d supports none of the architectures up to the device's %d.%d (%v)",
			libs.NVRTCVersion[0], libs.NVRTCVersion[1], d.Major, d.Minor, archs)
	}
	return fmt.Sprintf("--gpu-architecture=compute_%d", best), false, nil
}

// splitCompile asks NVRTC to use every host thread for one program;
// nvrtcInvalidOption is NVRTC_ERROR_INVALID_OPTION.
const (
	splitCompile       = "--split-compile=0"
	nvrtcInvalidOption = 5
)

// Compile compiles CUDA C source with NVRTC for this device (opts are added
// to the architecture option) and loads it. The image is cached on disk,
// keyed by source, options, NVRTC and driver versions and architecture, so a
// second start compiles nothing. A compile error carries NVRTC's log.
func (d *Device) Compile(name, src string, opts ...string) (*Module, error) {
	if err := NVRTCAvailable(); err != nil {
		return nil, err
	}
	archOpt, wantCubin, err := d.target()
	if err != nil {
		return nil, err
	}
	all := append([]string{archOpt}, opts...)
	// NVRTC 12.1 and later run the optimizer's passes on all the host's
	// threads with --split-compile=0 (a cold start's compile a third
	// shorter on an H200: docs/PERF.md, Tuning, session 18). An NVRTC that
	// refuses the option compiles without it.
	split := libs.NVRTCVersion[0] > 12 || libs.NVRTCVersion[0] == 12 && libs.NVRTCVersion[1] >= 1
	if split {
		all = append(all, splitCompile)
	}
	// KILN_NVRTC_OPTIONS adds options to every compile (for experiments;
	// they are part of the cache key).
	all = append(all, strings.Fields(os.Getenv("KILN_NVRTC_OPTIONS"))...)
	key := kcache.KeyInput{
		Source:   src,
		Options:  all,
		Compiler: fmt.Sprintf("nvrtc %d.%d", libs.NVRTCVersion[0], libs.NVRTCVersion[1]),
		Driver:   fmt.Sprintf("cuda driver %d", libs.DriverVersion),
		Arch:     d.Arch(),
		// Entries with the compile log (encodePayload): a kiln before it
		// (session 47) read such an entry as holding no image and failed.
		Layout: "kind, log, image",
	}.Key()
	var took time.Duration
	payload, hit, err := d.cache.GetOrBuild(key, func() ([]byte, error) {
		began := time.Now()
		defer func() { took = time.Since(began) }()
		img, cubin, log, err := nvrtcCompile(name, src, all, wantCubin)
		var ce *Error
		if split && errors.As(err, &ce) && ce.Code == nvrtcInvalidOption {
			img, cubin, log, err = nvrtcCompile(name, src, slices.DeleteFunc(slices.Clone(all), func(o string) bool { return o == splitCompile }), wantCubin)
		}
		if err != nil {
			if errors.As(err, &ce) {
				ce.Log = log
			}
			return nil, err
		}
		return encodePayload(img, cubin, log), nil
	})
	if err != nil {
		return nil, err
	}
	img, cubin, log, err := decodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("cuda: kernel cache entry for %s: %v", name, err)
	}
	m, err := d.LoadModule(name, img)
	if err != nil {
		return nil, err
	}
	m.Cubin, m.Hit, m.BuildTime, m.Log = cubin, hit, took, log
	return m, nil
}

// LoadModule loads a CUBIN, fatbin or PTX image.
func (d *Device) LoadModule(name string, image []byte) (*Module, error) {
	m := &Module{d: d, name: name, fns: map[string]*Function{}}
	err := d.Do(func() error {
		var e error
		m.h, e = drvModuleLoad(image)
		if e != nil {
			e.(*Error).Call += "(" + name + ")"
		}
		return e
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Close unloads the module.
func (m *Module) Close() error {
	if m.h == nil {
		return nil
	}
	err := m.d.Do(func() error { return drvModuleUnload(m.h) })
	m.h = nil
	return err
}

// Function looks up a kernel by name (cached).
func (m *Module) Function(name string) (*Function, error) {
	var f *Function
	err := m.d.Do(func() error {
		if f = m.fns[name]; f != nil {
			return nil
		}
		h, err := drvModuleFunction(m.h, name)
		if err != nil {
			return err
		}
		f = &Function{m: m, Name: name, h: h}
		m.fns[name] = f
		return nil
	})
	return f, err
}

// Global returns the address and size of a __device__ variable.
func (m *Module) Global(name string) (p Ptr, size int, err error) {
	err = m.d.Do(func() error {
		var e error
		p, size, e = drvModuleGlobal(m.h, name)
		return e
	})
	return
}

// SetMaxDynamicShared lets the kernel use more than 48 KiB of dynamic shared
// memory (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
func (f *Function) SetMaxDynamicShared(bytes int) error {
	return f.m.d.Do(func() error { return drvFuncSetAttr(f.h, f.Name, 8, bytes) })
}

// Occupancy is how many blocks of threads threads and shared bytes of
// dynamic shared memory the kernel keeps resident on one multiprocessor
// (cuOccupancyMaxActiveBlocksPerMultiprocessor).
func (f *Function) Occupancy(threads, shared int) (int, error) {
	var n int
	err := f.m.d.Do(func() error {
		var err error
		n, err = drvOccupancy(f.h, f.Name, threads, shared)
		return err
	})
	return n, err
}

// Launch looks up kernel name and launches it (see Function.Launch).
func (m *Module) Launch(name string, grid, block Dim3, shared int, s *Stream, args ...any) error {
	f, err := m.Function(name)
	if err != nil {
		return err
	}
	return f.Launch(grid, block, shared, s, args...)
}

// LaunchInClusters looks up kernel name and launches it with
// Function.LaunchInClusters.
func (m *Module) LaunchInClusters(name string, cluster int, dependent bool, grid, block Dim3, shared int, s *Stream, args ...any) error {
	f, err := m.Function(name)
	if err != nil {
		return err
	}
	return f.LaunchInClusters(cluster, dependent, grid, block, shared, s, args...)
}

// LaunchDependent looks up the kernel by name and launches it with
// Function.LaunchDependent.
func (m *Module) LaunchDependent(name string, grid, block Dim3, shared int, s *Stream, args ...any) error {
	f, err := m.Function(name)
	if err != nil {
		return err
	}
	return f.LaunchDependent(grid, block, shared, s, args...)
}

// Launch queues the kernel on stream s (nil: the default stream). Arguments
// are int32, uint32, int64, uint64, float32, float64, Ptr or TensorMap (at
// most maxMaps, each a `const __grid_constant__ CUtensorMap` parameter),
// matching the kernel's parameters in order; plain int is refused (its size
// is ambiguous). They are packed into C memory owned by the device's worker.
func (f *Function) Launch(grid, block Dim3, shared int, s *Stream, args ...any) error {
	return f.launch(false, 0, grid, block, shared, s, args...)
}

// LaunchDependent is Launch as a programmatic dependent launch (Hopper and
// later; CUDA graphs capture it as a programmatic edge): the kernel may
// start while the previous kernel in the stream is still running, and must
// itself wait for it (PTX griddepcontrol.wait) before reading or writing
// memory that kernel uses; it may prefetch what that kernel does not write.
// Without cuLaunchKernelEx, or on devices before compute capability 9.0, it
// is a plain launch.
func (f *Function) LaunchDependent(grid, block Dim3, shared int, s *Stream, args ...any) error {
	return f.launch(f.m.d.dependent, 0, grid, block, shared, s, args...)
}

// MaxCluster is the most blocks LaunchInClusters puts in a thread-block
// cluster: Hopper's non-portable limit. Clusters of up to
// maxPortableCluster blocks run on every device that has clusters; larger
// ones need the function's CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
// (set at the first such launch) and may not fit a device, which the launch
// then reports.
const (
	MaxCluster         = 16
	maxPortableCluster = 8
)

// LaunchInClusters is Launch with the grid's blocks grouped in thread-block
// clusters of cluster consecutive blocks along x (1 to MaxCluster, dividing
// grid.X), which run at once and may read each other's shared memory; as a
// programmatic dependent launch (see LaunchDependent) when dependent is set.
// It needs Device.Clusters, which implies programmatic dependent launches.
func (f *Function) LaunchInClusters(cluster int, dependent bool, grid, block Dim3, shared int, s *Stream, args ...any) error {
	if !f.m.d.Clusters() {
		return fmt.Errorf("cuda: launch %s: thread-block clusters need compute capability 9.0 and cuLaunchKernelEx", f.Name)
	}
	if cluster < 1 || cluster > MaxCluster || grid.X%cluster != 0 {
		return fmt.Errorf("cuda: launch %s: cluster of %d blocks for grid %v", f.Name, cluster, grid)
	}
	return f.launch(dependent, cluster, grid, block, shared, s, args...)
}

func (f *Function) launch(dependent bool, cluster int, grid, block Dim3, shared int, s *Stream, args ...any) error {
	if len(args) > maxArgs {
		return fmt.Errorf("cuda: launch %s: %d arguments, at most %d", f.Name, len(args), maxArgs)
	}
	for _, g := range []Dim3{grid, block} {
		if g.X <= 0 || g.Y <= 0 || g.Z <= 0 || g.X > math.MaxUint32 || g.Y > math.MaxUint32 || g.Z > math.MaxUint32 {
			return fmt.Errorf("cuda: launch %s: bad shape grid %v block %v", f.Name, grid, block)
		}
	}
	d := f.m.d
	return d.Do(func() error {
		slots := unsafe.Slice((*[argSlot]byte)(d.args), maxArgs)
		params := unsafe.Slice((*unsafe.Pointer)(d.params), maxArgs)
		// The tensor maps' slots: 128 bytes each, from the first 64-byte
		// boundary of d.maps.
		maps := unsafe.Slice((*[128]byte)(unsafe.Add(d.maps, (64-uintptr(d.maps)%64)%64)), maxMaps)
		nmaps := 0
		for i, a := range args {
			if v, ok := a.(TensorMap); ok {
				if nmaps == maxMaps {
					return fmt.Errorf("cuda: launch %s: more than %d tensor maps", f.Name, maxMaps)
				}
				maps[nmaps] = v.b
				params[i] = unsafe.Pointer(&maps[nmaps])
				nmaps++
				continue
			}
			slot := &slots[i]
			var u uint64
			size := 8
			switch v := a.(type) {
			case int32:
				u, size = uint64(uint32(v)), 4
			case uint32:
				u, size = uint64(v), 4
			case int64:
				u = uint64(v)
			case uint64:
				u = v
			case float32:
				u, size = uint64(math.Float32bits(v)), 4
			case float64:
				u = math.Float64bits(v)
			case Ptr:
				u = uint64(v)
			default:
				return fmt.Errorf("cuda: launch %s: argument %d has type %T (want int32, uint32, int64, uint64, float32, float64, cu.Ptr or cu.TensorMap)", f.Name, i, a)
			}
			for b := 0; b < size; b++ {
				slot[b] = byte(u >> (8 * b))
			}
			params[i] = unsafe.Pointer(slot)
		}
		if cluster > maxPortableCluster && !f.nonPortable {
			// CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
			if err := drvFuncSetAttr(f.h, f.Name, 14, 1); err != nil {
				return err
			}
			f.nonPortable = true
		}
		if dependent || cluster > 0 {
			return drvLaunchEx(f.h, f.Name, grid, block, shared, s.handle(), d.params, dependent, cluster)
		}
		return drvLaunch(f.h, f.Name, grid, block, shared, s.handle(), d.params)
	})
}
