package ir

import (
	"fmt"
	"strings"
)

// String prints the graph one node a line, in the form
//
//	v7 = rmsnorm v5, v6 {eps=1e-05} : f32[T,64]
//
// Weights print their tensor's name and constants their description.
func (g *Graph) String() string {
	var b strings.Builder
	for _, n := range g.Nodes {
		b.WriteString(n.String())
		b.WriteByte('\n')
	}
	outs := make([]string, len(g.Outputs))
	for i, o := range g.Outputs {
		outs[i] = o.String()
	}
	fmt.Fprintf(&b, "return %s\n", strings.Join(outs, ", "))
	return b.String()
}

func (n *Node) String() string {
	outs := make([]string, len(n.Outputs))
	types := make([]string, len(n.Outputs))
	for i, o := range n.Outputs {
		outs[i] = o.String()
		if IsState(o) {
			types[i] = "state"
		} else {
			types[i] = o.DType.String() + o.Shape.String()
		}
	}
	ins := make([]string, len(n.Inputs))
	for i, in := range n.Inputs {
		ins[i] = in.String()
	}
	s := strings.Join(outs, ", ") + " = " + n.Op.String()
	if len(ins) > 0 {
		s += " " + strings.Join(ins, ", ")
	}
	if a := n.attrString(); a != "" {
		s += " {" + a + "}"
	}
	return s + " : " + strings.Join(types, ", ")
}

func (n *Node) attrString() string {
	a := n.Attrs
	var parts []string
	add := func(format string, args ...any) { parts = append(parts, fmt.Sprintf(format, args...)) }
	switch n.Op {
	case Weight, Const:
		add("%s", a.Name)
	case RMSNorm, AddRMSNorm:
		add("eps=%g", a.Eps)
		if a.HeadDim > 0 {
			add("head_dim=%d", a.HeadDim)
		}
	case RoPE:
		add("heads=%d head_dim=%d interleaved=%v", a.Heads, a.HeadDim, a.Interleaved)
	case SoftCap:
		add("cap=%g", a.Cap)
	case Embed:
		if a.Scale != 0 {
			add("scale=%g", a.Scale)
		}
		if a.Ranks > 1 {
			add("vocab_start=%d ranks=%d", a.VocabStart, a.Ranks)
		}
	case AllReduce, AllGather:
		add("ranks=%d", a.Ranks)
	case MoE:
		add("experts=%d top_k=%d norm_top_k=%v", a.Experts, a.TopK, a.NormTopK)
		if a.Shared {
			add("shared=true shared_gate=%v", a.SharedGate)
		}
	case KVWrite:
		add("layer=%d kv_heads=%d head_dim=%d", a.Layer, a.KVHeads, a.HeadDim)
	case RoPEKVWrite:
		add("layer=%d kv_heads=%d head_dim=%d interleaved=%v", a.Layer, a.KVHeads, a.HeadDim, a.Interleaved)
	case RoPEQKVWrite:
		add("layer=%d heads=%d kv_heads=%d head_dim=%d interleaved=%v", a.Layer, a.Heads, a.KVHeads, a.HeadDim, a.Interleaved)
	case Attention:
		add("layer=%d heads=%d kv_heads=%d head_dim=%d scale=%g", a.Layer, a.Heads, a.KVHeads, a.HeadDim, a.Scale)
		if a.Window > 0 {
			add("window=%d", a.Window)
		}
		if a.Cap > 0 {
			add("cap=%g", a.Cap)
		}
	case RopeTable:
		r := a.Rope
		add("theta=%g max_pos=%d head_dim=%d", r.Theta, r.MaxPositions, r.HeadDim)
		if r.Scaling != "" {
			add("scaling=%s factor=%g", r.Scaling, r.Factor)
		}
		if r.FreqFactors != nil {
			add("freq_factors=%d", len(r.FreqFactors))
		}
	case Split:
		add("sizes=%v", a.Sizes)
	}
	return strings.Join(parts, " ")
}
