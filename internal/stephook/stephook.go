// Package stephook wraps a backend so that a test sees each step's batch
// before it runs, and may fail the step (a stand-in for a device error) or
// hold it (a stall).
package stephook

import (
	"sync"

	"kiln/backend"
	"kiln/compile"
)

// Backend wraps the embedded backend: Before, when set, is called with each
// step's batch before the step runs, one call at a time, and an error it
// returns is the step's.
type Backend struct {
	backend.Backend
	Before func(*backend.Batch) error
	mu     sync.Mutex
}

// Load implements backend.Backend.
func (h *Backend) Load(c *compile.Compiled) (backend.Loaded, error) {
	l, err := h.Backend.Load(c)
	if err != nil {
		return nil, err
	}
	return loaded{l, h}, nil
}

type loaded struct {
	backend.Loaded
	h *Backend
}

func (l loaded) Executable(p *compile.Plan) (backend.Executable, error) {
	x, err := l.Loaded.Executable(p)
	if err != nil {
		return nil, err
	}
	return executable{x, l.h}, nil
}

type executable struct {
	backend.Executable
	h *Backend
}

// Run implements backend.Executable.
func (x executable) Run(b *backend.Batch, kv backend.KVCache, logits []float32) error {
	if x.h.Before != nil {
		x.h.mu.Lock()
		err := x.h.Before(b)
		x.h.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return x.Executable.Run(b, kv, logits)
}
