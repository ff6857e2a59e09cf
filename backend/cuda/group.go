package cuda

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"kiln/backend"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
)

// OpenGroup opens devices 0…n-1 as a tensor-parallel group of compute dtype
// dtype: one backend a device, each with its rank's NCCL communicator (one
// process; each device's work runs on its own locked OS thread, the
// device's worker). Where every device reaches the others' memory, the
// all-reduces of decode steps run as one kernel over peer memory instead
// of NCCL's (NewPeers), in the Lamport form (kernels.PeerGroup), the
// residual add and RMSNorm after each in its kernel. For comparisons,
// KILN_PEER_ALLREDUCE=0 keeps NCCL's, =flags takes the flag form, =apart
// the add and norm apart (PeerForm). Abort ends every communicator.
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
	mode, err := PeerForm(os.Getenv("KILN_PEER_ALLREDUCE"))
	if err != nil {
		CloseGroup(g)
		return nil, err
	}
	if mode.Peers {
		peers, err := NewPeers(devs)
		if err != nil {
			CloseGroup(g)
			return nil, err
		}
		blocks, err := PeerBlocks(os.Getenv("KILN_PEER_BLOCKS"), devs[0].SMs)
		if err != nil {
			CloseGroup(g)
			return nil, err
		}
		for i, p := range peers {
			p.Flags, p.Apart = mode.Flags, mode.Apart
			p.Blocks = blocks
			bs[i].Peers = p
		}
	}
	return g, nil
}

// PeerMode is how a group's all-reduces run (KILN_PEER_ALLREDUCE).
type PeerMode struct {
	// Peers: over peer memory where they can (else NCCL's alone).
	Peers bool
	// Flags: in the flag form rather than the Lamport form.
	Flags bool
	// Apart: the residual add and RMSNorm after an all-reduce in a kernel
	// of their own (kernels.PeerGroup.Apart), not in the all-reduce's.
	Apart bool
}

// PeerForm reads a value of KILN_PEER_ALLREDUCE: unset, over peer memory
// in the Lamport form, the add and norm after each all-reduce in its
// kernel; "apart" the same with the add and norm apart; "flags" the flag
// form (the add and norm apart); "0" NCCL's alone.
func PeerForm(mode string) (PeerMode, error) {
	switch mode {
	case "":
		return PeerMode{Peers: true}, nil
	case "apart":
		return PeerMode{Peers: true, Apart: true}, nil
	case "flags":
		return PeerMode{Peers: true, Flags: true}, nil
	case "0":
		return PeerMode{}, nil
	}
	return PeerMode{}, fmt.Errorf("cuda: KILN_PEER_ALLREDUCE=%q: want 0 (NCCL's), flags (the flag form) or apart (the add and norm after an all-reduce apart); unset, the Lamport form with them", mode)
}

// PeerBlocks reads a value of KILN_PEER_BLOCKS, the most blocks a call of
// the Lamport forms takes (kernels.PeerGroup.Blocks) on devices of sms
// multiprocessors: unset or "2sm", two a multiprocessor; "sm" one, or a
// number from 1 to 4 a multiprocessor (the kernels keep 4 resident, and
// every rank's blocks must be at once). Two a multiprocessor moved a
// 4 MiB sum over four H200 in 30.7 µs where kernels.PeerSlots (64) took
// 39.3, and TP=4 decoded 7.7% more at 512 sequences (docs/PERF.md,
// "Tensor parallelism", session 34).
func PeerBlocks(v string, sms int) (int, error) {
	switch v {
	case "sm":
		return sms, nil
	case "", "2sm":
		return 2 * sms, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 4*sms {
		return 0, fmt.Errorf("cuda: KILN_PEER_BLOCKS=%q: want sm, 2sm or 1 to %d blocks", v, 4*sms)
	}
	return n, nil
}

// PeerCapBytes is the most bytes of partial sums a rank's all-reduce may
// move through peer memory (kernels.PeerAllReduce) in a group of any size;
// larger ones (prefill's) go through NCCL. 4 MiB: 512 rows of 4,096 bf16
// activations (the 8B shape's decode at 128 sequences a GPU over four),
// 256 of 8,192. Over more than two ranks, sums past
// kernels.PeerOneShotBytes go in two shots, which push as many bytes as
// NCCL's ring; in one shot, NCCL's ring was already faster at 2 MiB over
// four ranks (docs/PERF.md, "Tensor parallelism", session 24).
const PeerCapBytes = 4 << 20

// PeerStagingBytes is the staging each rank's region holds for the
// logits' exchange by rows (kernels.PeerScatterRows): a rank's share of a
// sampled step's rows, whole, in f32: 128 rows of Llama 3's 128,256-token
// vocabulary (a decode of 512 sequences over four GPUs, 256 over two).
// Steps with more go through NCCL's all-gather.
const PeerStagingBytes = 64 << 20

// NewPeers readies the peer all-reduce (kernels.PeerAllReduce) and the
// logits' exchange by rows (kernels.PeerScatterRows) of a group on devs,
// rank i on devs[i], for Backend.Peers: peer access enabled both ways
// between every pair, and each rank's region (kernels.PeerRegionBytes,
// kernels.ClearPeerRegion, and PeerStagingBytes of staging) on its device. It
// returns nil, and allocates nothing, when some pair cannot reach the
// other's memory (no NVLink or PCIe peer path) or the group is larger than
// the kernels take: such a group keeps NCCL's all-reduce.
func NewPeers(devs []*cu.Device) ([]*kernels.PeerGroup, error) {
	if len(devs) < 2 || len(devs) > kernels.PeerMaxRanks {
		return nil, nil
	}
	for _, a := range devs {
		for _, b := range devs {
			if a == b {
				continue
			}
			ok, err := a.EnablePeerAccess(b)
			if err != nil {
				return nil, fmt.Errorf("cuda: peer access from device %d to %d: %w", a.Ordinal, b.Ordinal, err)
			}
			if !ok {
				return nil, nil
			}
		}
	}
	regions := make([]cu.Ptr, len(devs))
	n := kernels.PeerRegionBytes(len(devs), PeerCapBytes) + PeerStagingBytes
	for i, d := range devs {
		p, err := d.Alloc(n)
		if err == nil {
			regions[i] = p
			err = kernels.ClearPeerRegion(d, p, len(devs), PeerCapBytes, nil)
		}
		if err == nil {
			err = d.Sync()
		}
		if err != nil {
			for j, p := range regions[:i+1] {
				if p != 0 {
					devs[j].Free(p)
				}
			}
			return nil, fmt.Errorf("cuda: the peer all-reduce's region on device %d: %w", d.Ordinal, err)
		}
	}
	gs := make([]*kernels.PeerGroup, len(devs))
	for i := range devs {
		gs[i] = &kernels.PeerGroup{Rank: i, Regions: regions, CapBytes: PeerCapBytes, StagingBytes: PeerStagingBytes}
	}
	return gs, nil
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
