package cu

import (
	"errors"
	"slices"
	"unsafe"
)

// CUDA graphs: a stream's work is captured once (BeginCapture ... EndCapture)
// and replayed with one launch (Graph.Launch), which saves the driver's
// per-launch cost of every kernel in it — for a decode step, hundreds of
// small kernels and cuBLASLt matmuls.
//
// While a stream captures, work queued on it is recorded, not run:
// Function.Launch, BlasLt.Matmul with Matmul.Stream set, CopyDtoD, Memset8,
// Memset32 and the asynchronous copies of pinned buffers (the graph reads
// and writes the host buffer when it is replayed), Event.Record and
// Stream.Wait. A graph bakes in what each call was given: kernel arguments
// (pointers and scalars), shapes, the functions, cuBLASLt's algorithm and
// workspace. It does not bake in data: a replay reads whatever the buffers
// hold then. So buffers, modules and the BlasLt used in a capture must
// outlive the graph, and a call that needs other pointers or scalars needs
// another capture.
//
// Calls that wait or allocate must not be made on the device while a
// capture is open: Stream.Sync, Device.Sync, Event.Sync of an event recorded
// in the capture, Alloc, Free, Upload and Download (both wait on the legacy
// stream). The driver refuses them (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
// CUDA_ERROR_CAPTURED_EVENT) and invalidates the capture, and EndCapture
// then fails naming the first failed call (TestGraphErrors).
//
// No warm-up is needed: the first launch of a freshly loaded kernel (lazy
// loading) and a Matmul whose cuBLASLt plan is made inside the capture both
// capture and replay correctly (TestGraphColdCapture, TestGraphMatmul; H100,
// driver 580, CUDA 13.0). Running a step once before capturing it is still
// the better order: a failure (a bad shape, no cuBLASLt algorithm) then
// shows up outside the capture rather than as a failed capture.

// Values from cuda.h.
const (
	captureModeThreadLocal   = 1   // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL (GLOBAL 0, RELAXED 2)
	captureStatusActive      = 1   // CU_STREAM_CAPTURE_STATUS_ACTIVE (NONE 0)
	captureStatusInvalidated = 2   // CU_STREAM_CAPTURE_STATUS_INVALIDATED
	errCaptureInvalidated    = 901 // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
)

// BeginCapture starts capturing the work queued on s into a graph, until
// EndCapture. The legacy default stream (a nil *Stream) cannot be captured.
//
// The mode is CU_STREAM_CAPTURE_MODE_THREAD_LOCAL. All CUDA calls of a
// Device run on its worker thread, which is the thread that begins the
// capture, so thread-local mode refuses every unsafe call (a synchronising
// or allocating call that cannot be captured) that this device's code makes
// during the capture, exactly as global mode would; unlike global mode it
// does not also make unsafe calls fail on other threads — the workers of
// other devices (or of a second Device on the same GPU) and any other CUDA
// user in the process — for as long as the capture is open.
func (s *Stream) BeginCapture() error {
	if s == nil {
		return errors.New("cuda: BeginCapture: the legacy default stream (a nil *Stream) cannot be captured; use a stream from Device.NewStream")
	}
	if s.h == nil {
		return errors.New("cuda: BeginCapture on a closed stream")
	}
	return s.d.Do(func() error {
		if s.capturing {
			return errors.New("cuda: BeginCapture: the stream is already capturing")
		}
		if err := drvStreamBeginCapture(s.h, captureModeThreadLocal); err != nil {
			return err
		}
		s.capturing, s.capErr = true, nil
		s.d.capturing = append(s.d.capturing, s)
		return nil
	})
}

// EndCapture ends the capture begun by BeginCapture and instantiates the
// graph. If the capture failed — a call during it failed, which may also
// have invalidated it, or the driver refuses the graph — nothing is
// returned but the error, which names the driver call that failed and the
// first call that failed during the capture; the partial graph is freed and
// the stream is left usable, no longer capturing.
func (s *Stream) EndCapture() (*Graph, error) {
	if s == nil || s.h == nil {
		return nil, errors.New("cuda: EndCapture on the legacy default stream or a closed stream")
	}
	g := &Graph{d: s.d}
	err := s.d.Do(func() error {
		if !s.capturing {
			return errors.New("cuda: EndCapture: the stream is not capturing")
		}
		first := s.stopCapture()
		graph, err := drvStreamEndCapture(s.h)
		if err != nil {
			if first != nil {
				annotate(err, " [first failed call during the capture: "+first.Error()+"]")
			}
			if graph != nil {
				addCleanup(err, drvGraphDestroy(graph))
			}
			return err
		}
		if first != nil {
			// The capture ended but missed the failed call's work.
			e := &Error{Lib: first.Lib, Call: "cuStreamEndCapture: graph dropped, a call failed during the capture: " + first.Call,
				Code: first.Code, Name: first.Name, Msg: first.Msg}
			addCleanup(e, drvGraphDestroy(graph))
			return e
		}
		exec, err := drvGraphInstantiate(graph)
		if err != nil {
			addCleanup(err, drvGraphDestroy(graph))
			return err
		}
		g.graph, g.exec = graph, exec
		return nil
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Capturing reports whether a capture is open on s, as the driver sees it:
// active, or invalidated by a failed call and waiting for EndCapture.
// The legacy default stream (nil) never captures.
func (s *Stream) Capturing() (bool, error) {
	if s == nil {
		return false, nil
	}
	if s.h == nil {
		return false, errors.New("cuda: Capturing on a closed stream")
	}
	var st int
	err := s.d.Do(func() error {
		var e error
		st, e = drvStreamIsCapturing(s.h)
		return e
	})
	return st == captureStatusActive || st == captureStatusInvalidated, err
}

// stopCapture drops s from the device's capturing streams and returns the
// first call that failed during the capture (worker only).
func (s *Stream) stopCapture() *Error {
	first := s.capErr
	s.capturing, s.capErr = false, nil
	s.d.capturing = slices.DeleteFunc(s.d.capturing, func(o *Stream) bool { return o == s })
	return first
}

// abortCapture ends an open capture and frees its graph (worker only). An
// invalidated capture is not an error here.
func (s *Stream) abortCapture() error {
	s.stopCapture()
	graph, err := drvStreamEndCapture(s.h)
	if ce, ok := err.(*Error); ok && ce.Code == errCaptureInvalidated {
		err = nil
	}
	if graph != nil {
		if e := drvGraphDestroy(graph); err == nil {
			err = e
		}
	}
	return err
}

// noteCapture records err, when it is a failed CUDA or cuBLASLt call, as the
// first failure of every stream capturing on d that has none yet (worker
// only; Do passes every result through it).
func (d *Device) noteCapture(err error) error {
	if err == nil || len(d.capturing) == 0 {
		return err
	}
	var ce *Error
	if errors.As(err, &ce) {
		for _, s := range d.capturing {
			if s.capErr == nil {
				s.capErr = ce
			}
		}
	}
	return err
}

// annotate appends to the call named by err, when it is an *Error.
func annotate(err error, s string) {
	if e, ok := err.(*Error); ok {
		e.Call += s
	}
}

func addCleanup(err, cleanup error) {
	if cleanup != nil {
		annotate(err, " [and freeing the partial graph failed: "+cleanup.Error()+"]")
	}
}

// Graph is an instantiated CUDA graph: the CUgraphExec that is launched and
// the CUgraph it was made from.
type Graph struct {
	d     *Device
	graph unsafe.Pointer // CUgraph
	exec  unsafe.Pointer // CUgraphExec
}

// Launch queues one replay of the graph on stream s (nil: the legacy default
// stream), after the work queued on s before it. s need not be the stream
// the graph was captured on.
func (g *Graph) Launch(s *Stream) error {
	if g == nil || g.exec == nil {
		return errors.New("cuda: launch of a closed graph")
	}
	return g.d.Do(func() error { return drvGraphLaunch(g.exec, s.handle()) })
}

// Close frees the graph. Replays already queued finish first (the driver
// defers the release).
func (g *Graph) Close() error {
	if g == nil || g.exec == nil {
		return nil
	}
	err := g.d.Do(func() error {
		err := drvGraphExecDestroy(g.exec)
		if e := drvGraphDestroy(g.graph); err == nil {
			err = e
		}
		return err
	})
	g.exec, g.graph = nil, nil
	return err
}
