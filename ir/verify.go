package ir

import (
	"fmt"
)

// Verify checks the graph's invariants (see the package comment) and returns
// the first violation. The compiler runs it after every pass in tests.
func (g *Graph) Verify() error {
	defined := map[*Value]bool{}
	seenNode := map[*Node]bool{}
	ids := map[int]bool{}
	for i, n := range g.Nodes {
		if n == nil {
			return fmt.Errorf("node %d is nil", i)
		}
		if seenNode[n] {
			return fmt.Errorf("n%d (%v) appears twice", n.ID, n.Op)
		}
		seenNode[n] = true
		if ids[n.ID] {
			return fmt.Errorf("id %d used twice", n.ID)
		}
		ids[n.ID] = true
		for j, in := range n.Inputs {
			if in == nil {
				return fmt.Errorf("n%d (%v) input %d is nil", n.ID, n.Op, j)
			}
			if !defined[in] {
				return fmt.Errorf("n%d (%v) reads %v before it is produced", n.ID, n.Op, in)
			}
		}
		shapes, dtypes, err := infer(n)
		if err != nil {
			return fmt.Errorf("n%d: %v: %w", n.ID, n.Op, err)
		}
		if len(shapes) != len(n.Outputs) {
			return fmt.Errorf("n%d (%v) has %d outputs, want %d", n.ID, n.Op, len(n.Outputs), len(shapes))
		}
		for j, out := range n.Outputs {
			if out == nil {
				return fmt.Errorf("n%d (%v) output %d is nil", n.ID, n.Op, j)
			}
			if out.Def != n || out.Index != j {
				return fmt.Errorf("n%d (%v) output %d claims producer n%d output %d", n.ID, n.Op, j, idOf(out.Def), out.Index)
			}
			if !out.Shape.Equal(shapes[j]) || out.DType != dtypes[j] {
				return fmt.Errorf("n%d (%v) output %d is %v%v, op gives %v%v", n.ID, n.Op, j, out.DType, out.Shape, dtypes[j], shapes[j])
			}
			if ids[out.ID] {
				return fmt.Errorf("id %d used twice", out.ID)
			}
			ids[out.ID] = true
			defined[out] = true
		}
	}
	if len(g.Outputs) == 0 {
		return fmt.Errorf("graph has no outputs")
	}
	for _, o := range g.Outputs {
		if !defined[o] {
			return fmt.Errorf("output %v is not produced by the graph", o)
		}
	}
	return nil
}

func idOf(n *Node) int {
	if n == nil {
		return -1
	}
	return n.ID
}
