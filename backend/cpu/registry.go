package cpu

// Kernels are registered per op with a priority, in the manner of GoMLX's
// registry: an executable takes, for each node, the registered kernel of
// highest priority whose availability check passes (reference kernels have
// priority 0 and are always available). Backend.Reference restricts the
// choice to priority 0.

import (
	"sort"

	"kiln/ir"
)

type kernelFunc func(x *execState, s *step)

type kernel struct {
	name      string
	priority  int
	available func() bool
	run       kernelFunc
	// prepare, when set, runs once when the executable is built (to allocate
	// the scratch a kernel needs so that running it allocates nothing).
	prepare func(l *loaded, s *step)
}

var registry = map[ir.Op][]kernel{}

func register(op ir.Op, k kernel) {
	if k.available == nil {
		k.available = func() bool { return true }
	}
	registry[op] = append(registry[op], k)
	sort.SliceStable(registry[op], func(i, j int) bool { return registry[op][i].priority > registry[op][j].priority })
}

// choose returns the kernel to run op with.
func choose(op ir.Op, referenceOnly bool) (kernel, bool) {
	for _, k := range registry[op] {
		if referenceOnly && k.priority != 0 {
			continue
		}
		if k.available() {
			return k, true
		}
	}
	return kernel{}, false
}

// referenceKernel returns op's priority-0 kernel, for tests.
func referenceKernel(op ir.Op) (kernel, bool) { return choose(op, true) }
