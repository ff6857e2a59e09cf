package compile

// Fusion passes are rewrite rules: each matches a small pattern of nodes
// around one anchor node and replaces it with a fused op that the target
// implements. A rule that fires replaces the uses of the matched outputs with
// the fused node's outputs and leaves the matched nodes for deadcode.

import (
	"kiln/ir"
)

// rule tries to rewrite the pattern anchored at n; it reports whether it did.
type rule func(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node) (bool, error)

// applyRule runs r on every node, if the target implements fused.
func applyRule(g *ir.Graph, t Target, fused ir.Op, r rule) error {
	if !t.Supports(fused) {
		return nil
	}
	uses := g.Uses()
	nodes := append([]*ir.Node(nil), g.Nodes...)
	for _, n := range nodes {
		fired, err := r(g, n, uses)
		if err != nil {
			return err
		}
		if fired {
			uses = g.Uses()
		}
	}
	return nil
}

// soleUse reports whether v is read by exactly one node and is not a graph
// output, so a fusion may consume it.
func soleUse(g *ir.Graph, v *ir.Value, uses map[*ir.Value][]*ir.Node) bool {
	for _, o := range g.Outputs {
		if o == v {
			return false
		}
	}
	return len(uses[v]) == 1
}

// producer returns the node that produced v if it has op op, else nil.
func producer(v *ir.Value, op ir.Op) *ir.Node {
	if v.Def != nil && v.Def.Op == op {
		return v.Def
	}
	return nil
}

// replaceWith inserts fused before at and redirects the listed values.
func replaceWith(g *ir.Graph, at, fused *ir.Node, olds ...*ir.Value) {
	g.InsertBefore(at, fused)
	for i, old := range olds {
		if old != nil {
			g.ReplaceUses(old, fused.Outputs[i])
		}
	}
}
