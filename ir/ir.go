// Package ir is kiln's graph intermediate representation: typed operations on
// tensors with shapes, in which the token dimension of a step is symbolic.
//
// A Graph describes one model step. The step's runtime context (which tokens,
// their positions and sequences, each sequence's KV-cache block table, and
// which rows need logits) is not part of the graph: ops that need it
// (Tokens, Positions, KVWrite, Attention, SelectRows) read it from the batch
// the backend is given when it runs the step.
//
// Invariants, checked by Verify: nodes are in execution order (every input is
// produced by an earlier node), each value has exactly one producer, every
// node's inputs and outputs have the shapes and dtypes its op requires, and
// the graph's outputs are produced by its nodes.
package ir

import (
	"fmt"

	"kiln/tensor"
)

// Dim is one dimension: a size when non-negative, a symbol when negative.
type Dim int

const (
	// TokenDim is the number of tokens processed in a step.
	TokenDim Dim = -1
	// RowDim is the number of token rows whose logits the step returns.
	RowDim Dim = -2
)

func (d Dim) String() string {
	switch d {
	case TokenDim:
		return "T"
	case RowDim:
		return "R"
	}
	return fmt.Sprint(int(d))
}

// Shape is a list of dimensions, outermost first.
type Shape []Dim

func (s Shape) String() string {
	out := "["
	for i, d := range s {
		if i > 0 {
			out += ","
		}
		out += d.String()
	}
	return out + "]"
}

// Equal reports whether two shapes are identical (symbols included).
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Bindings gives the symbols their sizes for one shape bucket.
type Bindings struct{ Tokens, Rows int }

// Elements returns the number of elements of s under b.
func (s Shape) Elements(b Bindings) int {
	n := 1
	for _, d := range s {
		switch d {
		case TokenDim:
			n *= b.Tokens
		case RowDim:
			n *= b.Rows
		default:
			n *= int(d)
		}
	}
	return n
}

// Last returns the innermost dimension as a size (0 if symbolic or scalar).
func (s Shape) Last() int {
	if len(s) == 0 || s[len(s)-1] < 0 {
		return 0
	}
	return int(s[len(s)-1])
}

// Value is a tensor produced by one node output.
type Value struct {
	ID    int
	Shape Shape
	DType tensor.DType
	Def   *Node // producing node
	Index int   // which of Def's outputs
}

func (v *Value) String() string { return fmt.Sprintf("v%d", v.ID) }

// Node is one operation.
type Node struct {
	ID      int
	Op      Op
	Inputs  []*Value
	Outputs []*Value
	Attrs   Attrs
}

// Out returns the node's single output (panics for multi-output ops, which
// is a programming error).
func (n *Node) Out() *Value {
	if len(n.Outputs) != 1 {
		panic(fmt.Sprintf("ir: %v has %d outputs", n.Op, len(n.Outputs)))
	}
	return n.Outputs[0]
}

// Attrs holds every op's parameters; each op uses the fields its table entry
// documents and leaves the rest zero.
type Attrs struct {
	Name   string         // Weight: model tensor name; Const: description
	Tensor *tensor.Tensor // Weight, Const: the data
	Eps    float32        // RMSNorm, AddRMSNorm
	Layer  int            // KVWrite, Attention, RoPEKVWrite, RoPEQKVWrite: KV-cache layer
	// Heads, KVHeads, HeadDim shape attention and RoPE.
	Heads, KVHeads, HeadDim int
	Window                  int     // Attention: sliding window (0: none)
	Scale                   float32 // Attention: score scale; Embed: rows scaled by it when set
	Cap                     float32 // SoftCap; Attention: scores soft-capped when set
	Interleaved             bool    // RoPE: rotate pairs (2i,2i+1) instead of (i,i+d/2)
	Rope                    RopeParams
	Sizes                   []int // Split: column counts of each output
	Experts, TopK           int   // MoE: experts, and those each row is routed to
	// NormTopK (MoE): weight the chosen experts by the softmax of their
	// logits (Mixtral), else by their probabilities under the softmax over
	// every expert (Qwen3-MoE without norm_topk_prob, OLMoE).
	NormTopK bool
	// Shared (MoE): a shared expert, a SwiGLU MLP every row goes through,
	// added to the routed experts' sum; its gate[S,D], up[S,D] and
	// down[D,S] follow the routed experts' inputs. SharedGate: then a
	// [1,D] input too, the shared expert's output scaled by sigmoid(x·w)
	// (Qwen2-MoE's shared_expert_gate).
	Shared, SharedGate bool
	// Ranks is the size of a tensor-parallel group (AllReduce, AllGather;
	// Embed of a vocabulary shard starting at row VocabStart).
	Ranks, VocabStart int
}

// RopeParams define a RoPE frequency table.
type RopeParams struct {
	Theta        float64
	MaxPositions int
	HeadDim      int
	// Scaling: "" or "linear" (Factor) or "llama3" (Factor, LowFreqFactor,
	// HighFreqFactor, OriginalMaxPositions).
	Scaling                       string
	Factor                        float64
	LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions          int
	// FreqFactors, when set, divide each pair's frequency (GGUF rope_freqs).
	FreqFactors []float32
	// Scaling "longrope": ShortFactor divides each pair's frequency when
	// the context (MaxPositions: the context asked for, before the engine
	// fits it to memory) is within OriginalMaxPositions, LongFactor when it
	// reaches past it, and cos and sin are scaled by AttentionFactor.
	// Chosen by the context, as llama.cpp does, so that a sequence's cached
	// keys keep their rotation as it grows: transformers' results for every
	// sequence when the context is within the original one, and for every
	// sequence longer than it otherwise (transformers rotates a sequence by
	// the short factors until it passes the original context, then
	// recomputes it with the long ones); a shorter sequence in a longer
	// context differs from transformers'.
	ShortFactor, LongFactor []float32
	AttentionFactor         float64
}

// Graph is one model step.
type Graph struct {
	Nodes   []*Node
	Outputs []*Value
	nextID  int
}

// Add appends a node of op with the given inputs and attributes, infers its
// output shapes and returns it. Errors in shapes are returned, not panicked,
// so builders can report a model whose tensors do not fit together.
func (g *Graph) Add(op Op, attrs Attrs, inputs ...*Value) (*Node, error) {
	n := &Node{ID: g.newID(), Op: op, Inputs: inputs, Attrs: attrs}
	shapes, dtypes, err := infer(n)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", op, err)
	}
	for i := range shapes {
		n.Outputs = append(n.Outputs, &Value{ID: g.newID(), Shape: shapes[i], DType: dtypes[i], Def: n, Index: i})
	}
	g.Nodes = append(g.Nodes, n)
	return n, nil
}

// NewNode builds a node without appending it, for passes that place nodes
// themselves with Replace or Insert.
func (g *Graph) NewNode(op Op, attrs Attrs, inputs ...*Value) (*Node, error) {
	n, err := g.Add(op, attrs, inputs...)
	if err != nil {
		return nil, err
	}
	g.Nodes = g.Nodes[:len(g.Nodes)-1]
	return n, nil
}

func (g *Graph) newID() int {
	g.nextID++
	return g.nextID
}

// Uses returns, for each value ID, the nodes that read it (in order).
func (g *Graph) Uses() map[*Value][]*Node {
	uses := map[*Value][]*Node{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			uses[in] = append(uses[in], n)
		}
	}
	return uses
}

// ReplaceUses makes every reader of old (and the graph outputs) read new.
func (g *Graph) ReplaceUses(old, new *Value) {
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == old {
				n.Inputs[i] = new
			}
		}
	}
	for i, o := range g.Outputs {
		if o == old {
			g.Outputs[i] = new
		}
	}
}

// Reinfer recomputes every node's output shapes and dtypes in order, for
// passes that change weights or attributes (compile's shard pass).
func (g *Graph) Reinfer() error {
	for _, n := range g.Nodes {
		shapes, dtypes, err := infer(n)
		if err != nil {
			return fmt.Errorf("n%d: %v: %w", n.ID, n.Op, err)
		}
		if len(shapes) != len(n.Outputs) {
			return fmt.Errorf("n%d (%v) has %d outputs, want %d", n.ID, n.Op, len(n.Outputs), len(shapes))
		}
		for i, o := range n.Outputs {
			o.Shape, o.DType = shapes[i], dtypes[i]
		}
	}
	return nil
}

// InsertBefore places n immediately before the node at.
func (g *Graph) InsertBefore(at, n *Node) {
	for i, x := range g.Nodes {
		if x == at {
			g.Nodes = append(g.Nodes[:i], append([]*Node{n}, g.Nodes[i:]...)...)
			return
		}
	}
	panic("ir: InsertBefore: node not in graph")
}

// Weights returns the Weight and Const nodes' tensors in graph order.
func (g *Graph) Weights() []*Node {
	var ws []*Node
	for _, n := range g.Nodes {
		if n.Op == Weight || n.Op == Const {
			ws = append(ws, n)
		}
	}
	return ws
}

// Remove deletes n from the graph; its outputs must have no readers left.
func (g *Graph) Remove(n *Node) {
	for i, x := range g.Nodes {
		if x == n {
			g.Nodes = append(g.Nodes[:i], g.Nodes[i+1:]...)
			return
		}
	}
	panic("ir: Remove: node not in graph")
}
