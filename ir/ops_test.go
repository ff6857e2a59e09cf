package ir_test

import (
	"strings"
	"testing"

	"kiln/ir"
	"kiln/tensor"
)

// vals are prebuilt values of various types for the Add tests.
type vals struct {
	tokens, pos        *ir.Value // i32[T]
	x8, y8, x12, x4    *ir.Value // f32[T,8], f32[T,8], f32[T,12], f32[T,4]
	r8                 *ir.Value // f32[R,8]
	emb                *ir.Value // f32[16,8]
	embI32             *ir.Value // i32[16,8]
	w8, w12, w4        *ir.Value // f32[8], f32[12], f32[4]
	m12x8, m12x6, m4x8 *ir.Value // f32 matrices [N,K]
	h12x8              *ir.Value // f16[12,8]
	q12x32, q12x8, x32 *ir.Value // q4_0[12,32], q4_0[12,8] (rows not whole blocks), f32[T,32]
	v3                 *ir.Value // f32[2,3,4]
	table4, table8     *ir.Value // rope tables [32,4], [32,8]
	state              *ir.Value
	r1x8, m8x12, m8x4  *ir.Value // f32 [1,8] (a router of one expert), [8,12], [8,4]
}

func newVals(t *testing.T) (*builder, *vals) {
	b := newBuilder(t)
	v := &vals{}
	v.tokens = b.Op(ir.Tokens, ir.Attrs{})
	v.pos = b.Op(ir.Positions, ir.Attrs{})
	v.emb = b.weight("emb", 16, 8)
	v.embI32 = b.Op(ir.Weight, ir.Attrs{Name: "embi", Tensor: &tensor.Tensor{Name: "embi", DType: tensor.I32, Shape: tensor.Shape{16, 8}, Data: make([]byte, 16*8*4)}})
	v.x8 = b.Op(ir.Embed, ir.Attrs{}, v.emb, v.tokens)
	v.y8 = b.Op(ir.Embed, ir.Attrs{}, v.emb, v.tokens)
	v.x12 = b.Op(ir.Embed, ir.Attrs{}, b.weight("emb12", 16, 12), v.tokens)
	v.x4 = b.Op(ir.Embed, ir.Attrs{}, b.weight("emb4", 16, 4), v.tokens)
	v.r8 = b.Op(ir.SelectRows, ir.Attrs{}, v.x8)
	v.w8, v.w12, v.w4 = b.weight("w8", 8), b.weight("w12", 12), b.weight("w4", 4)
	v.m12x8, v.m12x6, v.m4x8 = b.weight("m12x8", 12, 8), b.weight("m12x6", 12, 6), b.weight("m4x8", 4, 8)
	v.h12x8 = b.Op(ir.Weight, ir.Attrs{Name: "h", Tensor: &tensor.Tensor{Name: "h", DType: tensor.F16, Shape: tensor.Shape{12, 8}, Data: make([]byte, 12*8*2)}})
	v.v3 = b.weight("v3", 2, 3, 4)
	q4 := func(name string, n, k int) *ir.Value {
		return b.Op(ir.Weight, ir.Attrs{Name: name, Tensor: &tensor.Tensor{Name: name, DType: tensor.Q4_0, Shape: tensor.Shape{n, k}, Data: make([]byte, n*k/32*18)}})
	}
	v.q12x32, v.q12x8 = q4("q12x32", 12, 32), q4("q12x8", 12, 8)
	v.x32 = b.Op(ir.Embed, ir.Attrs{}, q4("emb32", 16, 32), v.tokens)
	v.table4 = b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 10000, MaxPositions: 32, HeadDim: 4}})
	v.table8 = b.Op(ir.RopeTable, ir.Attrs{Rope: ir.RopeParams{Theta: 10000, MaxPositions: 32, HeadDim: 8}})
	v.state = b.Op(ir.KVWrite, ir.Attrs{Layer: 0, KVHeads: 1, HeadDim: 4}, v.x4, v.x4)
	v.r1x8, v.m8x12, v.m8x4 = b.weight("r1x8", 1, 8), b.weight("m8x12", 8, 12), b.weight("m8x4", 8, 4)
	return b, v
}

func TestAddInfersAndRejects(t *testing.T) {
	type tc struct {
		name  string
		op    ir.Op
		attrs ir.Attrs
		in    func(v *vals) []*ir.Value
		want  string // output types joined by ", ", or "error: substring"
	}
	none := func(*vals) []*ir.Value { return nil }
	in := func(f func(v *vals) []*ir.Value) func(v *vals) []*ir.Value { return f }
	rope := func(r ir.RopeParams) ir.Attrs { return ir.Attrs{Rope: r} }
	attn := ir.Attrs{Layer: 0, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 0.5}
	kv := ir.Attrs{Layer: 1, KVHeads: 1, HeadDim: 4}
	cases := []tc{
		{"invalid", ir.Invalid, ir.Attrs{}, none, "error: unknown op"},
		{"out of range op", ir.Op(200), ir.Attrs{}, none, "error: unknown op"},

		{"tokens", ir.Tokens, ir.Attrs{}, none, "i32[T]"},
		{"tokens with input", ir.Tokens, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.pos} }), "error: takes 0 inputs, got 1"},
		{"positions", ir.Positions, ir.Attrs{}, none, "i32[T]"},
		{"positions with input", ir.Positions, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: takes 0 inputs"},

		{"weight", ir.Weight, ir.Attrs{Name: "w", Tensor: zeros("w", 3, 5)}, none, "f32[3,5]"},
		{"weight without tensor", ir.Weight, ir.Attrs{Name: "w"}, none, `error: "w" has no tensor`},
		{"weight with input", ir.Weight, ir.Attrs{Name: "w", Tensor: zeros("w", 3)}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8} }), "error: takes 0 inputs"},
		{"const", ir.Const, ir.Attrs{Name: "c", Tensor: zeros("c", 7)}, none, "f32[7]"},
		{"const without tensor", ir.Const, ir.Attrs{Name: "c"}, none, "error: has no tensor"},

		{"rope table", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, MaxPositions: 32, HeadDim: 4}), none, "f32[32,4]"},
		{"rope table freq factors", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, MaxPositions: 32, HeadDim: 4, FreqFactors: []float32{1, 2}}), none, "f32[32,4]"},
		{"rope table odd head dim", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, MaxPositions: 32, HeadDim: 5}), none, "error: bad rope params"},
		{"rope table zero theta", ir.RopeTable, rope(ir.RopeParams{MaxPositions: 32, HeadDim: 4}), none, "error: bad rope params"},
		{"rope table no positions", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, HeadDim: 4}), none, "error: bad rope params"},
		{"rope table freq factor count", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, MaxPositions: 32, HeadDim: 4, FreqFactors: []float32{1}}), none, "error: 1 rope frequency factors for head dim 4"},
		{"rope table with input", ir.RopeTable, rope(ir.RopeParams{Theta: 1e4, MaxPositions: 32, HeadDim: 4}), in(func(v *vals) []*ir.Value { return []*ir.Value{v.pos} }), "error: takes 0 inputs"},

		{"embed", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.emb, v.tokens} }), "f32[T,8]"},
		{"embed f16 table", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.h12x8, v.tokens} }), "f32[T,8]"},
		{"embed i32 table", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.embI32, v.tokens} }), "error: must be a float (or block-quantized) [V,D] matrix"},
		{"embed vector table", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8, v.tokens} }), "error: must be a float (or block-quantized) [V,D] matrix"},
		{"embed symbolic table", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.tokens} }), "error: must be a float (or block-quantized) [V,D] matrix"},
		{"embed q4_0 table", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.q12x32, v.tokens} }), "f32[T,32]"},
		{"embed q4_0 rows of 8", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.q12x8, v.tokens} }), "error: must be a float (or block-quantized) [V,D] matrix"},
		{"embed f32 ids", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.emb, v.w8} }), "error: ids must be i32[T]"},
		{"embed vocabulary shard", ir.Embed, ir.Attrs{Ranks: 2, VocabStart: 16}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.emb, v.tokens} }), "f32[T,8]"},
		{"embed shard past the vocabulary", ir.Embed, ir.Attrs{Ranks: 2, VocabStart: 17}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.emb, v.tokens} }), "error: shard at 17 of 16 rows outside a vocabulary of 32"},
		{"embed one input", ir.Embed, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.emb} }), "error: takes 2 inputs, got 1"},

		{"rmsnorm", ir.RMSNorm, ir.Attrs{Eps: 1e-5}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.w8} }), "f32[T,8]"},
		{"rmsnorm of rows", ir.RMSNorm, ir.Attrs{Eps: 1e-5}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8, v.w8} }), "f32[R,8]"},
		{"rmsnorm weight length", ir.RMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.w12} }), "error: does not match input"},
		{"rmsnorm 1-D input", ir.RMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8, v.w8} }), "error: must be [X,D]"},
		{"rmsnorm i32 weight", ir.RMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos} }), "error: does not match input"},

		{"matmul", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.m12x8} }), "f32[T,12]"},
		{"matmul f16 weights", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8, v.h12x8} }), "f32[R,12]"},
		{"matmul K mismatch", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.m12x6} }), "error: does not fit"},
		{"matmul vector weight", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.w8} }), "error: does not fit"},
		{"matmul symbolic weight", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8} }), "error: does not fit"},
		{"matmul i32 weight", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.embI32} }), "error: matmul of f32 by i32 [16,8] weights"},
		{"matmul q4_0 weights", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x32, v.q12x32} }), "f32[T,12]"},
		{"matmul q4_0 rows of 8", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.q12x8} }), "error: matmul of f32 by q4_0 [12,8] weights"},
		{"matmul f16 input", ir.MatMul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.h12x8, v.m12x8} }), "error: matmul of f16"},

		{"add", ir.Add, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8} }), "f32[T,8]"},
		{"add different shapes", ir.Add, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x12} }), "error: differ"},
		{"add tokens and rows", ir.Add, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.r8} }), "error: differ"},
		{"add i32", ir.Add, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens, v.pos} }), "error: want f32"},
		{"add one input", ir.Add, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8} }), "error: takes 2 inputs"},

		{"add bias", ir.AddBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.w12} }), "f32[T,12]"},
		{"add bias length", ir.AddBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.w8} }), "error: bias vector"},
		{"add bias 3-D", ir.AddBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.v3, v.w4} }), "error: bias input"},

		{"silu", ir.SiLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8} }), "f32[T,8]"},
		{"silu i32", ir.SiLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: want f32"},
		{"silu two inputs", ir.SiLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x8} }), "error: takes 1 inputs"},
		{"silu of state", ir.SiLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.state} }), "error: want f32"},

		{"gelu tanh", ir.GELUTanh, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8} }), "f32[T,8]"},
		{"gelu tanh of i32", ir.GELUTanh, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: want f32"},
		{"softcap", ir.SoftCap, ir.Attrs{Cap: 30}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "f32[R,8]"},
		{"softcap without a cap", ir.SoftCap, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "error: cap 0"},
		{"mul", ir.Mul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8} }), "f32[T,8]"},
		{"mul shapes differ", ir.Mul, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x4} }), "error: differ"},

		{"rope", ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos, v.table4} }), "f32[T,8]"},
		{"rope heads mismatch", ir.RoPE, ir.Attrs{Heads: 3, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos, v.table4} }), "error: want f32[T,12]"},
		{"rope odd head dim", ir.RoPE, ir.Attrs{Heads: 1, HeadDim: 3}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos, v.table4} }), "error: head dim 3"},
		{"rope no heads", ir.RoPE, ir.Attrs{HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos, v.table4} }), "error: heads 0"},
		{"rope f32 positions", ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.w8, v.table4} }), "error: positions must be i32[T]"},
		{"rope table head dim", ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.pos, v.table8} }), "error: does not match head dim 4"},
		{"rope rows", ir.RoPE, ir.Attrs{Heads: 2, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8, v.pos, v.table4} }), "error: want f32[T,8]"},

		{"kv write", ir.KVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4} }), "state"},
		{"kv write negative layer", ir.KVWrite, ir.Attrs{Layer: -1, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4} }), "error: layer -1"},
		{"kv write v mismatch", ir.KVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x8} }), "error: v: "},
		{"kv write k mismatch", ir.KVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x4} }), "error: k: "},
		{"kv write three inputs", ir.KVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.pos} }), "error: takes 2 inputs"},

		{"attention", ir.Attention, attn, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "f32[T,8]"},
		{"attention windowed", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 2, HeadDim: 4, Scale: 1, Window: 16}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "f32[T,8]"},
		{"attention kv heads do not divide", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 3, HeadDim: 4, Scale: 1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: 2 heads over 3 kv heads"},
		{"attention no kv heads", ir.Attention, ir.Attrs{Heads: 2, HeadDim: 4, Scale: 1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: 2 heads over 0 kv heads"},
		{"attention data instead of state", ir.Attention, attn, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x8} }), "error: must be a kv state"},
		{"attention zero scale", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: scale 0"},
		{"attention negative window", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 1, Window: -1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: window -1"},
		{"attention soft-capped", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 1, Cap: 50}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "f32[T,8]"},
		{"attention negative cap", ir.Attention, ir.Attrs{Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 1, Cap: -1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: window 0, scale 1, cap -1"},
		{"attention negative layer", ir.Attention, ir.Attrs{Layer: -1, Heads: 2, KVHeads: 1, HeadDim: 4, Scale: 1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.state} }), "error: layer -1"},
		{"attention of state", ir.Attention, attn, in(func(v *vals) []*ir.Value { return []*ir.Value{v.state, v.state} }), "error: want f32[T,8]"},

		{"moe", ir.MoE, ir.Attrs{Experts: 1, TopK: 1}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12}
		}), "f32[T,8]"},
		{"moe routing more than it has", ir.MoE, ir.Attrs{Experts: 1, TopK: 2}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12}
		}), "error: moe of 1 experts, 2 a row"},
		{"moe down of the wrong shape", ir.MoE, ir.Attrs{Experts: 1, TopK: 1}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m12x8}
		}), "error: moe expert 0"},
		{"moe missing an expert's matrix", ir.MoE, ir.Attrs{Experts: 1, TopK: 1}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8}
		}), "error: takes 5 inputs"},
		{"moe with a gated shared expert", ir.MoE, ir.Attrs{Experts: 1, TopK: 1, Shared: true, SharedGate: true}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12, v.m4x8, v.m4x8, v.m8x4, v.r1x8}
		}), "f32[T,8]"},
		{"moe shared expert's down of the wrong shape", ir.MoE, ir.Attrs{Experts: 1, TopK: 1, Shared: true}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12, v.m4x8, v.m4x8, v.m8x12}
		}), "error: moe shared expert"},
		{"moe shared expert's gate of the wrong shape", ir.MoE, ir.Attrs{Experts: 1, TopK: 1, Shared: true, SharedGate: true}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12, v.m4x8, v.m4x8, v.m8x4, v.m4x8}
		}), "error: moe shared expert's gate"},
		{"moe shared gate without a shared expert", ir.MoE, ir.Attrs{Experts: 1, TopK: 1, SharedGate: true}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12, v.r1x8}
		}), "error: moe: a shared expert's gate without"},
		{"moe missing the shared expert", ir.MoE, ir.Attrs{Experts: 1, TopK: 1, Shared: true}, in(func(v *vals) []*ir.Value {
			return []*ir.Value{v.x8, v.r1x8, v.m12x8, v.m12x8, v.m8x12}
		}), "error: takes 8 inputs"},
		{"all reduce", ir.AllReduce, ir.Attrs{Ranks: 2}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8} }), "f32[T,8]"},
		{"all reduce of one rank", ir.AllReduce, ir.Attrs{Ranks: 1}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8} }), "error: 1 ranks, want at least 2"},
		{"all reduce i32", ir.AllReduce, ir.Attrs{Ranks: 2}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: want f32"},
		{"all gather", ir.AllGather, ir.Attrs{Ranks: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "f32[R,32]"},
		{"all gather of one rank", ir.AllGather, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "error: 0 ranks, want at least 2"},
		{"all gather of a vector", ir.AllGather, ir.Attrs{Ranks: 2}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8} }), "error: must be f32 [X,N]"},
		{"select rows", ir.SelectRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "f32[R,12]"},
		{"select rows of rows", ir.SelectRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "error: must be [T,D]"},
		{"select rows of vector", ir.SelectRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: must be [T,D]"},
		{"select rows of state", ir.SelectRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.state} }), "error: must be [T,D]"},

		{"add rmsnorm", ir.AddRMSNorm, ir.Attrs{Eps: 1e-6}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8, v.w8} }), "f32[T,8], f32[T,8]"},
		{"add rmsnorm operands differ", ir.AddRMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x12, v.w8} }), "error: add of f32 [T,8] and f32 [T,12]"},
		{"add rmsnorm weight", ir.AddRMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8, v.w4} }), "error: does not match input"},
		{"add rmsnorm two inputs", ir.AddRMSNorm, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8} }), "error: takes 3 inputs"},

		{"swiglu", ir.SwiGLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.x12} }), "f32[T,12]"},
		{"swiglu shapes differ", ir.SwiGLU, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.x8} }), "error: differ"},

		{"rope kv write", ir.RoPEKVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.pos, v.table4} }), "state"},
		{"rope kv write table", ir.RoPEKVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.pos, v.table8} }), "error: does not match head dim 4"},
		{"rope kv write positions", ir.RoPEKVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.x4, v.table4} }), "error: positions must be i32[T]"},
		{"rope kv write k", ir.RoPEKVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.x4, v.pos, v.table4} }), "error: k: "},
		{"rope kv write negative layer", ir.RoPEKVWrite, ir.Attrs{Layer: -2, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.pos, v.table4} }), "error: layer -2"},
		{"rope kv write arity", ir.RoPEKVWrite, kv, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x4, v.x4, v.pos} }), "error: takes 4 inputs"},

		{"split", ir.Split, ir.Attrs{Sizes: []int{8, 4}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "f32[T,8], f32[T,4]"},
		{"split rows", ir.Split, ir.Attrs{Sizes: []int{4, 4}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.r8} }), "f32[R,4], f32[R,4]"},
		{"split sizes do not sum", ir.Split, ir.Attrs{Sizes: []int{8, 8}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "error: split of [T,12] into [8 8]"},
		{"split one size", ir.Split, ir.Attrs{Sizes: []int{12}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "error: split of"},
		{"matmul bias", ir.MatMulBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.m12x8, v.w12} }), "f32[T,12]"},
		{"matmul bias length", ir.MatMulBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.m12x8, v.w8} }), "error: bias vector"},
		{"matmul bias K mismatch", ir.MatMulBias, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.m12x6, v.w12} }), "error: does not fit"},

		{"swiglu packed", ir.SwiGLUPacked, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "f32[T,6]"},
		{"swiglu packed 1-D", ir.SwiGLUPacked, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8} }), "error: want [X,2N]"},
		{"swiglu packed i32", ir.SwiGLUPacked, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.tokens} }), "error: want [X,2N]"},

		{"rope qkv write", ir.RoPEQKVWrite, ir.Attrs{Layer: 1, Heads: 1, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.pos, v.table4} }), "f32[T,4], state"},
		{"rope qkv write width", ir.RoPEQKVWrite, ir.Attrs{Heads: 2, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.pos, v.table4} }), "error: qkv: "},
		{"rope qkv write kv heads do not divide", ir.RoPEQKVWrite, ir.Attrs{Heads: 2, KVHeads: 3, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.pos, v.table4} }), "error: 2 heads over 3 kv heads"},
		{"rope qkv write table", ir.RoPEQKVWrite, ir.Attrs{Heads: 1, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.pos, v.table8} }), "error: does not match head dim 4"},
		{"rope qkv write negative layer", ir.RoPEQKVWrite, ir.Attrs{Layer: -1, Heads: 1, KVHeads: 1, HeadDim: 4}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12, v.pos, v.table4} }), "error: layer -1"},

		{"split no sizes", ir.Split, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "error: split of"},
		{"split zero size", ir.Split, ir.Attrs{Sizes: []int{12, 0}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x12} }), "error: split size 0"},
		{"split 1-D", ir.Split, ir.Attrs{Sizes: []int{4, 4}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8} }), "error: split of [8]"},
		{"split of state", ir.Split, ir.Attrs{Sizes: []int{4, 4}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.state} }), "error: split of []"},
		{"split 3-D", ir.Split, ir.Attrs{Sizes: []int{2, 2}}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.v3} }), "error: split of [2,3,4]"},

		{"concat rows", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.m12x8, v.m4x8, v.m12x8} }), "f32[28,8]"},
		{"concat vectors", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.w8, v.w4} }), "f32[12]"},
		{"concat one input", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.m12x8} }), "error: needs at least 2 inputs"},
		{"concat K differs", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.m12x8, v.m12x6} }), "error: cannot stack [12,6] on [12,8]"},
		{"concat dtypes differ", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.m12x8, v.h12x8} }), "error: cannot stack f16"},
		{"concat ranks differ", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.m12x8, v.w8} }), "error: cannot stack"},
		{"concat 3-D", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.v3, v.v3} }), "error: cannot stack"},
		{"concat symbolic rows", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.x8, v.y8} }), "error: symbolic rows"},
		{"concat states", ir.ConcatRows, ir.Attrs{}, in(func(v *vals) []*ir.Value { return []*ir.Value{v.state, v.state} }), "error: cannot stack"},
	}
	// Every op with inputs rejects a nil one.
	arities := map[ir.Op]int{ir.Embed: 2, ir.RMSNorm: 2, ir.MatMul: 2, ir.Add: 2, ir.AddBias: 2, ir.SiLU: 1, ir.Mul: 2,
		ir.RoPE: 3, ir.KVWrite: 2, ir.Attention: 2, ir.SelectRows: 1, ir.AddRMSNorm: 3, ir.SwiGLU: 2,
		ir.RoPEKVWrite: 4, ir.Split: 1, ir.ConcatRows: 2, ir.SwiGLUPacked: 1, ir.RoPEQKVWrite: 3, ir.MatMulBias: 3}
	for op, k := range arities {
		cases = append(cases, tc{"nil input to " + op.String(), op, ir.Attrs{}, func(v *vals) []*ir.Value {
			in := make([]*ir.Value, k)
			for i := range in {
				in[i] = v.x8
			}
			in[k-1] = nil
			return in
		}, "error: is nil"})
	}

	tested, rejected := map[ir.Op]bool{}, map[ir.Op]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, v := newVals(t)
			before := len(b.G.Nodes)
			n, err := b.G.Add(c.op, c.attrs, c.in(v)...)
			if want, ok := strings.CutPrefix(c.want, "error: "); ok {
				rejected[c.op] = true
				if err == nil {
					t.Fatalf("Add(%v) = %v, want an error mentioning %q", c.op, n, want)
				}
				if !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), c.op.String()+": ") {
					t.Errorf("Add(%v) error %q, want %q prefixed by the op", c.op, err, want)
				}
				if len(b.G.Nodes) != before {
					t.Errorf("failed Add appended a node")
				}
				return
			}
			if err != nil {
				t.Fatalf("Add(%v): %v", c.op, err)
			}
			tested[c.op] = true
			var got []string
			for i, o := range n.Outputs {
				got = append(got, typed(o))
				if o.Def != n || o.Index != i {
					t.Errorf("output %d: Def/Index = %v/%d", i, o.Def, o.Index)
				}
			}
			if strings.Join(got, ", ") != c.want {
				t.Errorf("Add(%v) outputs %s, want %s", c.op, strings.Join(got, ", "), c.want)
			}
			if b.G.Nodes[len(b.G.Nodes)-1] != n {
				t.Errorf("node not appended")
			}
			b.G.Outputs = n.Outputs
			if err := b.G.Verify(); err != nil {
				t.Errorf("Verify after a successful Add: %v", err)
			}
		})
	}
	for _, op := range ir.AllOps() {
		if !tested[op] {
			t.Errorf("no accepted case for %v", op)
		}
		if !rejected[op] {
			t.Errorf("no rejected case for %v", op)
		}
	}
}

func TestNewNodeDoesNotAppend(t *testing.T) {
	b, v := newVals(t)
	before := len(b.G.Nodes)
	n, err := b.G.NewNode(ir.Add, ir.Attrs{}, v.x8, v.y8)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.G.Nodes) != before {
		t.Errorf("NewNode appended")
	}
	if n.Out().Def != n {
		t.Errorf("output Def not set")
	}
	if _, err := b.G.NewNode(ir.Add, ir.Attrs{}, v.x8, v.x12); err == nil || len(b.G.Nodes) != before {
		t.Errorf("NewNode of a bad add: err %v, %d nodes", err, len(b.G.Nodes))
	}
	// The node gets fresh IDs: placing it keeps the graph valid.
	b.G.InsertBefore(b.G.Nodes[before-1], n)
	b.G.Outputs = []*ir.Value{n.Out()}
	if err := b.G.Verify(); err != nil {
		t.Errorf("Verify: %v", err)
	}
}

func TestOpNames(t *testing.T) {
	seen := map[string]bool{}
	for _, op := range ir.AllOps() {
		name := op.String()
		if name == "" || strings.HasPrefix(name, "op(") || seen[name] {
			t.Errorf("op %d has name %q", op, name)
		}
		seen[name] = true
	}
	if got := ir.Op(250).String(); got != "op(250)" {
		t.Errorf("Op(250) = %q", got)
	}
	fused := map[ir.Op]bool{ir.AddRMSNorm: true, ir.SwiGLU: true, ir.RoPEKVWrite: true, ir.Split: true, ir.ConcatRows: true,
		ir.SwiGLUPacked: true, ir.RoPEQKVWrite: true, ir.MatMulBias: true}
	for _, op := range ir.AllOps() {
		if op.Fused() != fused[op] {
			t.Errorf("%v.Fused() = %v", op, op.Fused())
		}
	}
	if ir.Invalid.Fused() || ir.Op(250).Fused() {
		t.Errorf("invalid ops report fused")
	}
}
