package ir

import (
	"fmt"

	"kiln/tensor"
)

// Op is an operation code.
type Op uint8

// The operations. Shapes use T for the step's tokens, R for the rows whose
// logits are returned; "state" is a value with no data that orders a KV-cache
// write before the attention that reads it.
const (
	Invalid Op = iota

	Tokens    // () -> i32[T]: the step's token ids
	Positions // () -> i32[T]: each token's position in its sequence
	Weight    // () -> the model tensor Attrs.Tensor, named Attrs.Name
	Const     // () -> the compile-time constant Attrs.Tensor
	RopeTable // () -> f32[MaxPositions, HeadDim]: row p holds cos(p·f_i) then sin(p·f_i); always folded to a Const

	Embed      // (table[V,D], ids i32[T]) -> f32[T,D], times Attrs.Scale when set (Gemma's √D); with Ranks > 1 the table is rows [VocabStart, VocabStart+V) of a vocabulary of Ranks·V, and any other id gives a row of zeros (a vocabulary-parallel shard)
	RMSNorm    // (x[X,D], w[D]) -> f32[X,D]: x / sqrt(mean(x²)+Eps) · w; with HeadDim, w[HeadDim] and each head's HeadDim elements normalized (Qwen3's q/k norms)
	MatMul     // (x[X,K], w[N,K]) -> f32[X,N]: x·wᵀ
	Add        // (a, b) -> a+b, same shapes
	AddBias    // (x[X,N], b[N]) -> x+b broadcast over rows
	SiLU       // (x) -> x·sigmoid(x)
	GELUTanh   // (x) -> x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GELU's tanh approximation (Gemma's GeGLU)
	SoftCap    // (x) -> Cap·tanh(x/Cap) (Gemma 2's logit soft-capping)
	Mul        // (a, b) -> a·b elementwise
	RoPE       // (x[T,Heads·HeadDim], pos i32[T], table) -> rotated x
	KVWrite    // (k[T,KVHeads·HeadDim], v[T,KVHeads·HeadDim]) -> state: store into layer Attrs.Layer's cache
	Attention  // (q[T,Heads·HeadDim], state) -> f32[T,Heads·HeadDim]: causal (optionally windowed) attention over the sequence's cache; with Cap, scores soft-capped to Cap·tanh(s/Cap) (Gemma 2)
	SelectRows // (x[T,D]) -> f32[R,D]: the rows the batch wants logits for
	// MoE (x[X,D], router[E,D], then per expert gate[I,D], up[I,D],
	// down[D,I]; with Shared, the shared expert's gate[S,D], up[S,D],
	// down[D,S]; with SharedGate, its gate w[1,D]) -> f32[X,D]: a mixture
	// of SwiGLU experts, each row routed to the TopK experts of largest
	// router logit, weighted by their softmax over those TopK (NormTopK:
	// Mixtral's routing) or over every expert, plus the shared expert's
	// output (times sigmoid(x·w) with SharedGate).
	MoE
	// AllReduce (x) -> the sum of x over the Ranks ranks of a
	// tensor-parallel group (each rank holding a partial sum).
	AllReduce
	// AllGather (x[X,N]) -> [X, Ranks·N]: each rank's columns side by side,
	// rank 0's first.
	AllGather

	// Fused operations, produced only by compiler passes.
	AddRMSNorm  // (x[T,D], r[T,D], w[D]) -> (x+r, RMSNorm(x+r, w))
	SwiGLU      // (gate[X,N], up[X,N]) -> SiLU(gate)·up
	RoPEKVWrite // (k, v, pos, table) -> state: RoPE on k, then KVWrite(k, v)
	Split       // (x[X,ΣSizes]) -> one output per Attrs.Sizes, column slices
	ConcatRows  // (w₁[N₁,K], w₂[N₂,K], ...) -> [ΣN,K]: weights stacked; always folded to a Const
	// SwiGLUPacked (gu[X,2N]) -> SiLU(gu[:, :N])·gu[:, N:]: SwiGLU of the two
	// halves of a stacked gate/up product, without splitting it first.
	SwiGLUPacked
	// RoPEQKVWrite (qkv[T,(Heads+2·KVHeads)·HeadDim], pos, table) -> (q, state):
	// a stacked Q/K/V product taken apart without copies: q rotated into
	// f32[T,Heads·HeadDim], k rotated and v stored into layer Attrs.Layer's
	// cache.
	RoPEQKVWrite
	// MatMulBias (x[X,K], w[N,K], b[N]) -> f32[X,N]: x·wᵀ + b, the bias
	// added in the product's epilogue.
	MatMulBias

	numOps
)

type opInfo struct {
	name  string
	fused bool // produced by fusion passes only
	// infer returns output shapes and dtypes, or an error when the inputs do
	// not fit the op.
	infer func(n *Node) ([]Shape, []tensor.DType, error)
}

var ops [numOps]opInfo

func init() {
	ops = [numOps]opInfo{
		Invalid:   {name: "invalid", infer: func(*Node) ([]Shape, []tensor.DType, error) { return nil, nil, fmt.Errorf("invalid op") }},
		Tokens:    {name: "tokens", infer: fixed(0, Shape{TokenDim}, tensor.I32)},
		Positions: {name: "positions", infer: fixed(0, Shape{TokenDim}, tensor.I32)},
		Weight:    {name: "weight", infer: inferTensor},
		Const:     {name: "const", infer: inferTensor},
		RopeTable: {name: "rope_table", infer: inferRopeTable},
		Embed:     {name: "embed", infer: inferEmbed},
		RMSNorm:   {name: "rmsnorm", infer: inferRMSNorm},
		MatMul:    {name: "matmul", infer: inferMatMul},
		Add:       {name: "add", infer: inferSame(2)},
		AddBias:   {name: "add_bias", infer: inferAddBias},
		SiLU:      {name: "silu", infer: inferSame(1)},
		GELUTanh:  {name: "gelu_tanh", infer: inferSame(1)},
		SoftCap: {name: "softcap", infer: func(n *Node) ([]Shape, []tensor.DType, error) {
			if n.Attrs.Cap <= 0 {
				return nil, nil, fmt.Errorf("cap %g", n.Attrs.Cap)
			}
			return inferSame(1)(n)
		}},
		Mul:       {name: "mul", infer: inferSame(2)},
		RoPE:      {name: "rope", infer: inferRoPE},
		KVWrite:   {name: "kv_write", infer: inferKVWrite},
		Attention: {name: "attention", infer: inferAttention},
		SelectRows: {name: "select_rows", infer: func(n *Node) ([]Shape, []tensor.DType, error) {
			if err := arity(n, 1); err != nil {
				return nil, nil, err
			}
			x := n.Inputs[0]
			if len(x.Shape) != 2 || x.Shape[0] != TokenDim {
				return nil, nil, fmt.Errorf("input %v must be [T,D]", x.Shape)
			}
			return []Shape{{RowDim, x.Shape[1]}}, []tensor.DType{x.DType}, nil
		}},
		MoE:          {name: "moe", infer: inferMoE},
		AllReduce:    {name: "all_reduce", infer: inferAllReduce},
		AllGather:    {name: "all_gather", infer: inferAllGather},
		AddRMSNorm:   {name: "add_rmsnorm", fused: true, infer: inferAddRMSNorm},
		SwiGLU:       {name: "swiglu", fused: true, infer: inferSame(2)},
		RoPEKVWrite:  {name: "rope_kv_write", fused: true, infer: inferRoPEKVWrite},
		Split:        {name: "split", fused: true, infer: inferSplit},
		ConcatRows:   {name: "concat_rows", fused: true, infer: inferConcatRows},
		SwiGLUPacked: {name: "swiglu_packed", fused: true, infer: inferSwiGLUPacked},
		RoPEQKVWrite: {name: "rope_qkv_write", fused: true, infer: inferRoPEQKVWrite},
		MatMulBias:   {name: "matmul_bias", fused: true, infer: inferMatMulBias},
	}
}

func (o Op) String() string {
	if o < numOps && ops[o].name != "" {
		return ops[o].name
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Fused reports whether o is produced only by fusion passes.
func (o Op) Fused() bool { return o < numOps && ops[o].fused }

// AllOps lists every valid op, for backends declaring what they support.
func AllOps() []Op {
	var all []Op
	for o := Op(1); o < numOps; o++ {
		all = append(all, o)
	}
	return all
}

func infer(n *Node) ([]Shape, []tensor.DType, error) {
	if n.Op == Invalid || n.Op >= numOps {
		return nil, nil, fmt.Errorf("unknown op %d", n.Op)
	}
	for i, in := range n.Inputs {
		if in == nil {
			return nil, nil, fmt.Errorf("input %d is nil", i)
		}
	}
	return ops[n.Op].infer(n)
}

// WritesCache reports whether o stores into the KV cache: such a node is
// never dead code, whatever reads its outputs.
func (o Op) WritesCache() bool { return o == KVWrite || o == RoPEKVWrite || o == RoPEQKVWrite }

// IsState reports whether v is a KV-cache ordering token rather than data.
func IsState(v *Value) bool { return v.DType == tensor.Invalid }

func arity(n *Node, k int) error {
	if len(n.Inputs) != k {
		return fmt.Errorf("takes %d inputs, got %d", k, len(n.Inputs))
	}
	return nil
}

func fixed(k int, s Shape, d tensor.DType) func(*Node) ([]Shape, []tensor.DType, error) {
	return func(n *Node) ([]Shape, []tensor.DType, error) {
		if err := arity(n, k); err != nil {
			return nil, nil, err
		}
		return []Shape{s}, []tensor.DType{d}, nil
	}
}

func inferTensor(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 0); err != nil {
		return nil, nil, err
	}
	t := n.Attrs.Tensor
	if t == nil {
		return nil, nil, fmt.Errorf("%q has no tensor", n.Attrs.Name)
	}
	s := make(Shape, len(t.Shape))
	for i, d := range t.Shape {
		s[i] = Dim(d)
	}
	return []Shape{s}, []tensor.DType{t.DType}, nil
}

func inferRopeTable(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 0); err != nil {
		return nil, nil, err
	}
	r := n.Attrs.Rope
	if r.MaxPositions <= 0 || r.HeadDim <= 0 || r.HeadDim%2 != 0 || r.Theta <= 0 {
		return nil, nil, fmt.Errorf("bad rope params %+v", r)
	}
	if r.FreqFactors != nil && len(r.FreqFactors) != r.HeadDim/2 {
		return nil, nil, fmt.Errorf("%d rope frequency factors for head dim %d", len(r.FreqFactors), r.HeadDim)
	}
	if r.Scaling == "longrope" && (len(r.ShortFactor) != r.HeadDim/2 || len(r.LongFactor) != r.HeadDim/2 || r.AttentionFactor <= 0) {
		return nil, nil, fmt.Errorf("longrope: %d short and %d long factors for head dim %d, attention factor %g", len(r.ShortFactor), len(r.LongFactor), r.HeadDim, r.AttentionFactor)
	}
	return []Shape{{Dim(r.MaxPositions), Dim(r.HeadDim)}}, []tensor.DType{tensor.F32}, nil
}

func isFloat(d tensor.DType) bool { return d == tensor.F32 || d == tensor.F16 || d == tensor.BF16 }

// isWeightMatrix: a matrix [R, C] a product or a lookup can read, floats or
// a GGML block type whose rows are whole blocks.
func isWeightMatrix(d tensor.DType, cols Dim) bool {
	return isFloat(d) || d.Quantized() && cols >= 0 && int(cols)%d.BlockSize() == 0
}

func inferEmbed(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	tab, ids := n.Inputs[0], n.Inputs[1]
	if len(tab.Shape) != 2 || tab.Shape[0] < 0 || tab.Shape[1] < 0 || !isWeightMatrix(tab.DType, tab.Shape[1]) {
		return nil, nil, fmt.Errorf("table %v %v must be a float (or block-quantized) [V,D] matrix", tab.DType, tab.Shape)
	}
	if !ids.Shape.Equal(Shape{TokenDim}) || ids.DType != tensor.I32 {
		return nil, nil, fmt.Errorf("ids must be i32[T]")
	}
	if r := n.Attrs.Ranks; r > 1 && (n.Attrs.VocabStart < 0 || n.Attrs.VocabStart+int(tab.Shape[0]) > r*int(tab.Shape[0])) {
		return nil, nil, fmt.Errorf("shard at %d of %d rows outside a vocabulary of %d", n.Attrs.VocabStart, tab.Shape[0], r*int(tab.Shape[0]))
	}
	return []Shape{{TokenDim, tab.Shape[1]}}, []tensor.DType{tensor.F32}, nil
}

func inferAllReduce(n *Node) ([]Shape, []tensor.DType, error) {
	if n.Attrs.Ranks < 2 {
		return nil, nil, fmt.Errorf("%d ranks, want at least 2", n.Attrs.Ranks)
	}
	return inferSame(1)(n)
}

func inferAllGather(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 1); err != nil {
		return nil, nil, err
	}
	if n.Attrs.Ranks < 2 {
		return nil, nil, fmt.Errorf("%d ranks, want at least 2", n.Attrs.Ranks)
	}
	x := n.Inputs[0]
	if len(x.Shape) != 2 || x.Shape[1] <= 0 || x.DType != tensor.F32 {
		return nil, nil, fmt.Errorf("input %v %v must be f32 [X,N]", x.DType, x.Shape)
	}
	return []Shape{{x.Shape[0], x.Shape[1] * Dim(n.Attrs.Ranks)}}, []tensor.DType{tensor.F32}, nil
}

func checkRowVector(x *Value, w *Value, what string) error {
	if len(x.Shape) != 2 || x.Shape[1] < 0 {
		return fmt.Errorf("%s input %v must be [X,D]", what, x.Shape)
	}
	if len(w.Shape) != 1 || w.Shape[0] != x.Shape[1] || !isFloat(w.DType) {
		return fmt.Errorf("%s vector %v %v does not match input %v", what, w.DType, w.Shape, x.Shape)
	}
	return nil
}

func inferRMSNorm(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	if hd := n.Attrs.HeadDim; hd != 0 {
		x, w := n.Inputs[0], n.Inputs[1]
		if hd < 0 || len(x.Shape) != 2 || x.Shape[1] < 0 || x.Shape[1]%Dim(hd) != 0 || len(w.Shape) != 1 || w.Shape[0] != Dim(hd) || !isFloat(w.DType) {
			return nil, nil, fmt.Errorf("rmsnorm of heads of %d: input %v, vector %v %v", hd, x.Shape, w.DType, w.Shape)
		}
		return []Shape{x.Shape}, []tensor.DType{tensor.F32}, nil
	}
	if err := checkRowVector(n.Inputs[0], n.Inputs[1], "rmsnorm"); err != nil {
		return nil, nil, err
	}
	return []Shape{n.Inputs[0].Shape}, []tensor.DType{tensor.F32}, nil
}

func inferMoE(n *Node) ([]Shape, []tensor.DType, error) {
	e, k := n.Attrs.Experts, n.Attrs.TopK
	if e < 1 || k < 1 || k > e {
		return nil, nil, fmt.Errorf("moe of %d experts, %d a row", e, k)
	}
	if n.Attrs.SharedGate && !n.Attrs.Shared {
		return nil, nil, fmt.Errorf("moe: a shared expert's gate without a shared expert")
	}
	if err := arity(n, MoEInputs(n.Attrs)); err != nil {
		return nil, nil, err
	}
	x, r := n.Inputs[0], n.Inputs[1]
	if len(x.Shape) != 2 || x.Shape[1] < 1 {
		return nil, nil, fmt.Errorf("moe input %v must be [X,D]", x.Shape)
	}
	d := x.Shape[1]
	if !r.Shape.Equal(Shape{Dim(e), d}) {
		return nil, nil, fmt.Errorf("moe router %v, want [%d,%d]", r.Shape, e, d)
	}
	inter := Dim(0)
	for i := 0; i < e; i++ {
		g, u, dn := n.Inputs[2+3*i], n.Inputs[3+3*i], n.Inputs[4+3*i]
		if i == 0 {
			inter = g.Shape[0]
		}
		if !g.Shape.Equal(Shape{inter, d}) || !u.Shape.Equal(Shape{inter, d}) || !dn.Shape.Equal(Shape{d, inter}) {
			return nil, nil, fmt.Errorf("moe expert %d: gate %v, up %v, down %v for rows of %d", i, g.Shape, u.Shape, dn.Shape, d)
		}
	}
	if n.Attrs.Shared {
		s := 2 + 3*e
		g, u, dn := n.Inputs[s], n.Inputs[s+1], n.Inputs[s+2]
		w := g.Shape[0]
		if len(g.Shape) != 2 || !g.Shape.Equal(Shape{w, d}) || !u.Shape.Equal(Shape{w, d}) || !dn.Shape.Equal(Shape{d, w}) {
			return nil, nil, fmt.Errorf("moe shared expert: gate %v, up %v, down %v for rows of %d", g.Shape, u.Shape, dn.Shape, d)
		}
		if n.Attrs.SharedGate && !n.Inputs[s+3].Shape.Equal(Shape{1, d}) {
			return nil, nil, fmt.Errorf("moe shared expert's gate %v, want [1,%d]", n.Inputs[s+3].Shape, d)
		}
	}
	return []Shape{x.Shape}, []tensor.DType{tensor.F32}, nil
}

// MoEInputs is how many inputs an ir.MoE of attributes a takes: x, the
// router, each expert's three matrices, and the shared expert's three and
// its gate when a has them.
func MoEInputs(a Attrs) int {
	n := 2 + 3*a.Experts
	if a.Shared {
		n += 3
	}
	if a.SharedGate {
		n++
	}
	return n
}

func inferAddRMSNorm(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 3); err != nil {
		return nil, nil, err
	}
	x, r := n.Inputs[0], n.Inputs[1]
	if !x.Shape.Equal(r.Shape) || x.DType != r.DType {
		return nil, nil, fmt.Errorf("add of %v %v and %v %v", x.DType, x.Shape, r.DType, r.Shape)
	}
	if err := checkRowVector(x, n.Inputs[2], "rmsnorm"); err != nil {
		return nil, nil, err
	}
	return []Shape{x.Shape, x.Shape}, []tensor.DType{x.DType, tensor.F32}, nil
}

func inferMatMul(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	x, w := n.Inputs[0], n.Inputs[1]
	if len(x.Shape) != 2 || len(w.Shape) != 2 || w.Shape[0] < 0 || w.Shape[1] < 0 || x.Shape[1] != w.Shape[1] {
		return nil, nil, fmt.Errorf("x%v · w%vᵀ does not fit", x.Shape, w.Shape)
	}
	// FP8 (E4M3) matrices, with their scales, are products' weights only.
	if !isWeightMatrix(w.DType, w.Shape[1]) && w.DType != tensor.F8_E4M3 || x.DType != tensor.F32 {
		return nil, nil, fmt.Errorf("matmul of %v by %v %v weights", x.DType, w.DType, w.Shape)
	}
	return []Shape{{x.Shape[0], w.Shape[0]}}, []tensor.DType{tensor.F32}, nil
}

func inferSame(k int) func(*Node) ([]Shape, []tensor.DType, error) {
	return func(n *Node) ([]Shape, []tensor.DType, error) {
		if err := arity(n, k); err != nil {
			return nil, nil, err
		}
		a := n.Inputs[0]
		if a.DType != tensor.F32 {
			return nil, nil, fmt.Errorf("input is %v, want f32", a.DType)
		}
		for _, b := range n.Inputs[1:] {
			if !a.Shape.Equal(b.Shape) || a.DType != b.DType {
				return nil, nil, fmt.Errorf("inputs %v %v and %v %v differ", a.DType, a.Shape, b.DType, b.Shape)
			}
		}
		return []Shape{a.Shape}, []tensor.DType{a.DType}, nil
	}
}

func inferAddBias(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	if err := checkRowVector(n.Inputs[0], n.Inputs[1], "bias"); err != nil {
		return nil, nil, err
	}
	return []Shape{n.Inputs[0].Shape}, []tensor.DType{tensor.F32}, nil
}

// checkHeads checks that x is [T, heads·headDim] and pos is i32[T].
func checkHeads(x *Value, heads, headDim int) error {
	if heads <= 0 || headDim <= 0 || headDim%2 != 0 {
		return fmt.Errorf("heads %d, head dim %d", heads, headDim)
	}
	if !x.Shape.Equal(Shape{TokenDim, Dim(heads * headDim)}) || x.DType != tensor.F32 {
		return fmt.Errorf("input %v %v, want f32[T,%d]", x.DType, x.Shape, heads*headDim)
	}
	return nil
}

func checkTable(pos, table *Value, headDim int) error {
	if !pos.Shape.Equal(Shape{TokenDim}) || pos.DType != tensor.I32 {
		return fmt.Errorf("positions must be i32[T]")
	}
	if len(table.Shape) != 2 || table.Shape.Last() != headDim || table.DType != tensor.F32 {
		return fmt.Errorf("rope table %v does not match head dim %d", table.Shape, headDim)
	}
	return nil
}

func inferRoPE(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 3); err != nil {
		return nil, nil, err
	}
	a := n.Attrs
	if err := checkHeads(n.Inputs[0], a.Heads, a.HeadDim); err != nil {
		return nil, nil, err
	}
	if err := checkTable(n.Inputs[1], n.Inputs[2], a.HeadDim); err != nil {
		return nil, nil, err
	}
	return []Shape{n.Inputs[0].Shape}, []tensor.DType{tensor.F32}, nil
}

func checkKV(n *Node, k, v *Value) error {
	a := n.Attrs
	if a.Layer < 0 {
		return fmt.Errorf("layer %d", a.Layer)
	}
	if err := checkHeads(k, a.KVHeads, a.HeadDim); err != nil {
		return fmt.Errorf("k: %w", err)
	}
	if err := checkHeads(v, a.KVHeads, a.HeadDim); err != nil {
		return fmt.Errorf("v: %w", err)
	}
	return nil
}

var stateOut = []tensor.DType{tensor.Invalid}

func inferKVWrite(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	if err := checkKV(n, n.Inputs[0], n.Inputs[1]); err != nil {
		return nil, nil, err
	}
	return []Shape{nil}, stateOut, nil
}

func inferRoPEKVWrite(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 4); err != nil {
		return nil, nil, err
	}
	if err := checkKV(n, n.Inputs[0], n.Inputs[1]); err != nil {
		return nil, nil, err
	}
	if err := checkTable(n.Inputs[2], n.Inputs[3], n.Attrs.HeadDim); err != nil {
		return nil, nil, err
	}
	return []Shape{nil}, stateOut, nil
}

func inferMatMulBias(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 3); err != nil {
		return nil, nil, err
	}
	mm := &Node{Op: MatMul, Inputs: n.Inputs[:2]}
	shapes, dtypes, err := inferMatMul(mm)
	if err != nil {
		return nil, nil, err
	}
	out := &Value{Shape: shapes[0], DType: dtypes[0]}
	if err := checkRowVector(out, n.Inputs[2], "bias"); err != nil {
		return nil, nil, err
	}
	return shapes, dtypes, nil
}

func inferSwiGLUPacked(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 1); err != nil {
		return nil, nil, err
	}
	x := n.Inputs[0]
	if len(x.Shape) != 2 || x.Shape[1] <= 0 || x.Shape[1]%2 != 0 || !isFloat(x.DType) {
		return nil, nil, fmt.Errorf("input %v %v, want [X,2N]", x.DType, x.Shape)
	}
	return []Shape{{x.Shape[0], x.Shape[1] / 2}}, []tensor.DType{x.DType}, nil
}

func inferRoPEQKVWrite(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 3); err != nil {
		return nil, nil, err
	}
	a := n.Attrs
	if a.Layer < 0 || a.KVHeads <= 0 || a.Heads <= 0 || a.Heads%a.KVHeads != 0 {
		return nil, nil, fmt.Errorf("layer %d, %d heads over %d kv heads", a.Layer, a.Heads, a.KVHeads)
	}
	if err := checkHeads(n.Inputs[0], a.Heads+2*a.KVHeads, a.HeadDim); err != nil {
		return nil, nil, fmt.Errorf("qkv: %w", err)
	}
	if err := checkTable(n.Inputs[1], n.Inputs[2], a.HeadDim); err != nil {
		return nil, nil, err
	}
	return []Shape{{TokenDim, Dim(a.Heads * a.HeadDim)}, nil}, []tensor.DType{tensor.F32, tensor.Invalid}, nil
}

func inferAttention(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 2); err != nil {
		return nil, nil, err
	}
	a := n.Attrs
	if err := checkHeads(n.Inputs[0], a.Heads, a.HeadDim); err != nil {
		return nil, nil, err
	}
	if a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 {
		return nil, nil, fmt.Errorf("%d heads over %d kv heads", a.Heads, a.KVHeads)
	}
	if !IsState(n.Inputs[1]) {
		return nil, nil, fmt.Errorf("second input must be a kv state")
	}
	if a.Layer < 0 {
		return nil, nil, fmt.Errorf("layer %d", a.Layer)
	}
	if a.Window < 0 || a.Scale <= 0 || a.Cap < 0 {
		return nil, nil, fmt.Errorf("window %d, scale %g, cap %g", a.Window, a.Scale, a.Cap)
	}
	return []Shape{n.Inputs[0].Shape}, []tensor.DType{tensor.F32}, nil
}

func inferSplit(n *Node) ([]Shape, []tensor.DType, error) {
	if err := arity(n, 1); err != nil {
		return nil, nil, err
	}
	x := n.Inputs[0]
	if len(x.Shape) != 2 {
		return nil, nil, fmt.Errorf("split of %v into %v", x.Shape, n.Attrs.Sizes)
	}
	total := 0
	var shapes []Shape
	var dtypes []tensor.DType
	for _, s := range n.Attrs.Sizes {
		if s <= 0 {
			return nil, nil, fmt.Errorf("split size %d", s)
		}
		total += s
		shapes = append(shapes, Shape{x.Shape[0], Dim(s)})
		dtypes = append(dtypes, x.DType)
	}
	if len(x.Shape) != 2 || x.Shape.Last() != total || len(shapes) < 2 {
		return nil, nil, fmt.Errorf("split of %v into %v", x.Shape, n.Attrs.Sizes)
	}
	return shapes, dtypes, nil
}

func inferConcatRows(n *Node) ([]Shape, []tensor.DType, error) {
	if len(n.Inputs) < 2 {
		return nil, nil, fmt.Errorf("needs at least 2 inputs")
	}
	first := n.Inputs[0]
	rows := 0
	for _, w := range n.Inputs {
		if w.DType != first.DType || len(w.Shape) != len(first.Shape) || len(w.Shape) == 0 || len(w.Shape) > 2 {
			return nil, nil, fmt.Errorf("cannot stack %v %v on %v %v", w.DType, w.Shape, first.DType, first.Shape)
		}
		if len(w.Shape) == 2 && w.Shape[1] != first.Shape[1] {
			return nil, nil, fmt.Errorf("cannot stack %v on %v", w.Shape, first.Shape)
		}
		if w.Shape[0] < 0 {
			return nil, nil, fmt.Errorf("symbolic rows")
		}
		rows += int(w.Shape[0])
	}
	out := append(Shape{Dim(rows)}, first.Shape[1:]...)
	return []Shape{out}, []tensor.DType{first.DType}, nil
}
