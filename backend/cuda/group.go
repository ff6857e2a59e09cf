package cuda

import (
	"errors"
	"fmt"

	"kiln/backend"
	"kiln/backend/cuda/cu"
)

// OpenGroup opens devices 0…n-1 as a tensor-parallel group of compute dtype
// dtype: one backend a device, each with its rank's NCCL communicator (one
// process; each device's work runs on its own locked OS thread, the
// device's worker). Abort ends every communicator.
func OpenGroup(n int, dtype string) (*backend.Group, error) {
	count, err := cu.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n < 2 || n > count {
		return nil, fmt.Errorf("cuda: a tensor-parallel group of %d on %d devices", n, count)
	}
	if err := cu.NCCLAvailable(); err != nil {
		return nil, err
	}
	var bs []*Backend
	fail := func(err error) (*backend.Group, error) {
		for _, b := range bs {
			b.Close()
		}
		return nil, err
	}
	devs := make([]*cu.Device, n)
	for i := range n {
		b, err := Open(i, dtype)
		if err != nil {
			return fail(err)
		}
		bs = append(bs, b)
		devs[i] = b.Device
	}
	comms, err := cu.NewComms(devs)
	if err != nil {
		return fail(err)
	}
	g := &backend.Group{Abort: func(error) {
		for _, c := range comms {
			c.Abort()
		}
	}}
	for i, b := range bs {
		b.Comm = comms[i]
		g.Ranks = append(g.Ranks, b)
	}
	return g, nil
}

// GroupRanks is the CUDA backend of each rank of g, or nil when g is not a
// CUDA group.
func GroupRanks(g *backend.Group) []*Backend {
	var bs []*Backend
	for _, r := range g.Ranks {
		b, ok := r.(*Backend)
		if !ok {
			return nil
		}
		bs = append(bs, b)
	}
	return bs
}

// CloseGroup ends the communicators and closes the devices of a group
// OpenGroup opened; everything loaded on it must be closed first.
func CloseGroup(g *backend.Group) error {
	var errs []error
	bs := GroupRanks(g)
	var comms []*cu.Comm
	for _, b := range bs {
		if b.Comm != nil {
			comms = append(comms, b.Comm)
		}
	}
	if err := cu.CloseComms(comms); err != nil {
		if errors.Is(err, cu.ErrCommStuck) {
			return err // the workers may be inside NCCL: closing the devices would wait on them
		}
		errs = append(errs, err)
	}
	for _, b := range bs {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}
