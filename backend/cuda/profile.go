package cuda

import (
	"fmt"
	"strings"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/ir"
)

// ProfileEntry is one kernel's share of the steps run with Backend.Profile.
type ProfileEntry struct {
	// Name is the node's kernel; a product's is its shape and the kernel
	// that ran it, with the op its epilogue computed.
	Name  string
	Calls int
	Time  time.Duration
}

// profileHold is how long a profiled step holds its stream before its
// kernels start: the host queues the whole step (a few hundred launches and
// events) meanwhile, so that the events between the kernels time the
// kernels, not the host's launches.
const profileHold = 20 * time.Millisecond

// ResetProfile forgets the profile gathered so far (Stats.Profile).
func (b *Backend) ResetProfile() {
	b.stats.Profile, b.stats.ProfileSteps, b.profIndex = nil, 0, nil
}

// profileEvents returns n timing events, made on first use.
func (l *loaded) profileEvents(n int) ([]*cu.Event, error) {
	for len(l.profEvents) < n {
		ev, err := l.dev.NewEvent(true)
		if err != nil {
			return nil, err
		}
		l.profEvents = append(l.profEvents, ev)
	}
	return l.profEvents[:n], nil
}

// profiled queues a step for Backend.Profile: node by node behind a
// hold of the stream, an event after each kernel; copyBytes of logits are
// copied to the host when not zero. x.prof names what each event ends.
// Without graphs and with an event between kernels, programmatic dependent
// launches do not overlap the kernels' tails, so the profile's total is a
// little above a replayed step's.
func (e *executable) profiled(x *stepState, copyBytes int) error {
	evs, err := e.l.profileEvents(len(e.nodes) + 3)
	if err != nil {
		return err
	}
	s := e.l.stream
	if err := e.l.k.Spin(s, profileHold); err != nil {
		return err
	}
	if err := evs[0].Record(s); err != nil {
		return err
	}
	x.prof = x.prof[:0]
	mark := func(name string) error {
		x.prof = append(x.prof, name)
		return evs[len(x.prof)].Record(s)
	}
	for i := range e.nodes {
		nd := &e.nodes[i]
		if nd == x.done {
			continue
		}
		x.ran = ""
		if err := nd.launch(x, nd); err != nil {
			return fmt.Errorf("cuda: node %d (%v, %s): %w", nd.n.ID, nd.n.Op, nd.kernel, err)
		}
		if err := mark(nd.profileName(x)); err != nil {
			return err
		}
	}
	if copyBytes == 0 {
		return nil
	}
	if err := e.l.dev.CopyDtoHAsync(e.outHost, 0, e.output.p, copyBytes, s); err != nil {
		return err
	}
	return mark("logits to the host")
}

// profileName is what a profiled step calls the kernel that node nd just
// ran: a product by its shape and kernel (with the op its epilogue
// computed), decode attention with its plan, prefill attention.
func (nd *node) profileName(x *stepState) string {
	switch {
	case x.ran != "" && nd.epilogue != nil && x.done == nd.epilogue:
		return x.ran + " + " + strings.TrimSuffix(nd.epilogue.kernel, unlessFused)
	case x.ran != "" && nd.scaledReader != nil && x.done == nd.scaledReader:
		return x.ran + " + " + strings.TrimSuffix(nd.scaledReader.kernel, unlessFused)
	case x.ran != "":
		return x.ran
	case nd.n.Op == ir.Attention && x.mixed:
		return fmt.Sprintf("decode attention (%v) and prefill attention, %d/%d heads ×%d", nd.plan, nd.n.Attrs.Heads, nd.n.Attrs.KVHeads, nd.n.Attrs.HeadDim)
	case nd.n.Op == ir.Attention && x.decode:
		return fmt.Sprintf("decode attention, %d/%d heads ×%d (%v)", nd.n.Attrs.Heads, nd.n.Attrs.KVHeads, nd.n.Attrs.HeadDim, nd.plan)
	case nd.n.Op == ir.Attention:
		return fmt.Sprintf("prefill attention, %d/%d heads ×%d", nd.n.Attrs.Heads, nd.n.Attrs.KVHeads, nd.n.Attrs.HeadDim)
	case nd.fold != nil && nd.fold.on && nd == nd.fold.n:
		return "norm folded into the products around it (no kernel)"
	case nd.fold != nil && nd.fold.on && nd == nd.fold.e:
		return strings.TrimSuffix(nd.kernel, unlessFused) + " ÷ rms of a folded norm's rows"
	}
	return strings.TrimSuffix(nd.kernel, unlessFused)
}

// addProfile adds a finished profiled step's event times to Stats.Profile.
func (l *loaded) addProfile(names []string) error {
	b := l.b
	if b.profIndex == nil {
		b.profIndex = map[string]int{}
	}
	for i, name := range names {
		ms, err := cu.Elapsed(l.profEvents[i], l.profEvents[i+1])
		if err != nil {
			return err
		}
		j, ok := b.profIndex[name]
		if !ok {
			j = len(b.stats.Profile)
			b.profIndex[name] = j
			b.stats.Profile = append(b.stats.Profile, ProfileEntry{Name: name})
		}
		p := &b.stats.Profile[j]
		p.Calls++
		p.Time += time.Duration(float64(ms) * 1e6)
	}
	b.stats.ProfileSteps++
	return nil
}
