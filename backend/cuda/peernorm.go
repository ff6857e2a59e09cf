package cuda

import (
	"kiln/compile"
	"kiln/ir"
)

// The residual add and RMSNorm after a tensor-parallel all-reduce, run by
// the all-reduce's kernel over peer memory (kernels.PeerAllReduceNorm):
// the norm needs the whole sum, which each rank holds (one shot) or
// receives (two shots, where the owner of each row sums and normalizes it
// before sending it back) inside the all-reduce anyway. TP=1 runs the
// same norms folded into the products around them (normfold.go), which
// the all-reduce between them prevents here.

// markPeerNorms marks each all-reduce whose output only the AddRMSNorm
// right after it reads (as one of its two inputs; its normed output not
// written in FP8 form), on a group with peer memory (a norm folded into
// the products around it runs here in the steps where the all-reduce does
// not add its residual, with its unit gain):
// its launch runs the norm where the kernel takes it (runPeerNorm). The
// kernel's threads read a vector of the partials and of r and write the
// same vector of sum and normed, the rows in any order: where the norm's
// outputs in plan p lie neither apart from the partials nor exactly on
// them, the call must sync (kernels.PeerAllReduceNorm), and they must lie
// apart from r or on it (as the norm's own kernel needs).
func (l *loaded) markPeerNorms(nodes []node, p *compile.Plan) {
	if l.b.Peers == nil {
		return
	}
	apartOrOn := func(a, b *ir.Value) bool {
		x, okx := p.Buffers[a]
		y, oky := p.Buffers[b]
		return okx && oky && (x == y || x.Offset+x.Bytes <= y.Offset || y.Offset+y.Bytes <= x.Offset)
	}
	readers := readerCounts(nodes, p.Graph)
	for i := 0; i+1 < len(nodes); i++ {
		ar, nn := &nodes[i], &nodes[i+1]
		if ar.n.Op != ir.AllReduce || nn.n.Op != ir.AddRMSNorm || nn.fp8Out || ar.in[0].dtype != l.act {
			continue
		}
		x := ar.n.Outputs[0]
		if readers[x] != 1 || nn.n.Inputs[0] != x && nn.n.Inputs[1] != x {
			continue
		}
		k := 0 // the residual's input
		if nn.n.Inputs[0] == x {
			k = 1
		}
		r := nn.n.Inputs[k]
		pn := &peerNorm{norm: nn, resid: nn.in[k]}
		apart := true
		for _, out := range nn.n.Outputs {
			apart = apart && apartOrOn(out, r)
			pn.sync = pn.sync || !apartOrOn(out, ar.n.Inputs[0])
		}
		if !apart {
			continue
		}
		ar.peerNorm = pn
		ar.kernel += " (+ the add_rmsnorm after it where it fits)"
		nn.kernel += " (in the peer all-reduce's kernel where it fits)"
	}
}

// peerNorm is the AddRMSNorm after an all-reduce that the all-reduce's
// kernel runs (markPeerNorms): its node, its residual input (the one that
// is not the all-reduce's output), and whether the call must sync
// (kernels.PeerAllReduceNorm).
type peerNorm struct {
	norm  *node
	resid operand
	sync  bool
}

// runPeerNorm launches all-reduce node ar and the norm after it
// (node.peerNorm) as one kernel when it takes the step's rows, and reports
// whether it did: the norm's node is then done (stepState.done).
func (l *loaded) runPeerNorm(x *stepState, ar *node) (bool, error) {
	pn, p := ar.peerNorm, l.b.Peers
	if pn == nil || p == nil {
		return false, nil
	}
	rows, dim := ar.in[0].rows(x), ar.in[0].cols
	nn, r := pn.norm, pn.resid
	sum, normed, w := nn.out[0], nn.out[1], nn.in[2]
	if !l.k.PeerAllReduceNormFits(*p, rows, dim, sum.p, normed.p, ar.in[0].p, r.p) {
		return false, nil
	}
	x.done = nn
	x.ran = "peer all-reduce + add_rmsnorm (one kernel)"
	l.b.stats.PeerNorms++
	return true, l.k.PeerAllReduceNorm(l.stream, *p, sum.p, normed.p, ar.in[0].p, r.p, w.p, w.dtype, rows, dim, nn.n.Attrs.Eps, pn.sync)
}
