package gemm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"kiln/backend/cpu/gemm/internal/asmgen"
	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// Tolerance: every output must satisfy
//
//	|out - ref| <= 1e-5 * sum_k |x[t][k]|*|w[n][k]| + 1e-6
//
// where ref is MatMulRef (float64 sums); this allows float32 rounding of any
// summation order.
const relTol, absTol = 1e-5, 1e-6

func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed %d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// randWeights returns random weights [N,K] of dtype d; with offset 1 the
// data starts one byte into a larger buffer (unaligned).
func randWeights(r *rand.Rand, d tensor.DType, N, K, offset int) Weights {
	eb := elemBytes(d)
	buf := make([]byte, N*K*eb+offset+3)
	data := buf[offset : offset+N*K*eb]
	for i := 0; i < N*K; i++ {
		v := float32(r.Float64()*2 - 1)
		if r.IntN(16) == 0 {
			v *= 8
		}
		switch d {
		case tensor.F32:
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		case tensor.BF16:
			binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToBF16(v))
		case tensor.F16:
			binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToF16(v))
		}
	}
	return Weights{DType: d, Data: data, N: N, K: K}
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.Float64()*2 - 1)
	}
	return v
}

// checkProduct runs MatMul into a NaN-poisoned buffer and compares it with
// ref element by element.
func checkProduct(t *testing.T, p *workers.Pool, ref, x []float32, T int, w Weights, what string) {
	t.Helper()
	out := make([]float32, T*w.N+2)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	MatMul(p, out[:T*w.N], x, T, w)
	for i := T * w.N; i < len(out); i++ {
		if !math.IsNaN(float64(out[i])) {
			t.Fatalf("%s: wrote past the end of out", what)
		}
	}
	for tk := 0; tk < T; tk++ {
		for n := 0; n < w.N; n++ {
			var mag float64
			for k := 0; k < w.K; k++ {
				mag += math.Abs(float64(x[tk*w.K+k]) * float64(weightAt(w, n*w.K+k)))
			}
			got, want := out[tk*w.N+n], ref[tk*w.N+n]
			if math.IsNaN(float64(got)) || math.Abs(float64(got)-float64(want)) > relTol*mag+absTol {
				t.Fatalf("%s: out[%d][%d] = %v, want %v (tolerance %g)", what, tk, n, got, want, relTol*mag+absTol)
			}
		}
	}
}

func TestMatMul(t *testing.T) {
	r := newRand(t)
	p := workers.New(3)
	defer p.Close()
	defer SetPure(false)
	Ts := []int{1, 2, 3, 5, 17, 64}
	// Ks: K%8 tails, and for the decode kernels kr (256 weight bytes per
	// main-loop step) K < one step, whole steps, and steps plus 1 to 15
	// groups of 8 (200: 1 BF16 step + 9, 376: 2 + 15, 3 F32 steps + 1).
	Ks := []int{0, 1, 3, 8, 16, 17, 24, 40, 56, 100, 200, 376, 768, 2049}
	Ns := []int{1, 3, 5, 13, 67}
	if testing.Short() {
		Ks = []int{1, 3, 17, 100}
	}
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, T := range Ts {
			for _, K := range Ks {
				for _, N := range Ns {
					offset := (T + K + N) % 2 // half the shapes unaligned
					w := randWeights(r, d, N, K, offset)
					x := randVec(r, T*K)
					ref := make([]float32, T*N)
					MatMulRef(ref, x, T, w)
					for _, mode := range []string{"simd", "avx2", "plain", "pure"} {
						pure := mode == "pure"
						if pure && T*N*K > 1<<20 {
							continue // the pure path shares the driver; keep the test fast
						}
						if (mode == "avx2" || mode == "plain") && T != 1 || mode == "avx2" && !haveAVX512 {
							continue // decode kernel choices
						}
						SetPure(pure)
						decodeKernels.Store(map[string]int32{"avx2": kernAVX2, "plain": kernPlain}[mode])
						what := d.String() + " " + mode
						checkProduct(t, p, ref, x, T, w, what+" pool")
						if T*N <= 64 {
							checkProduct(t, nil, ref, x, T, w, what+" nil pool")
						}
					}
					SetPure(false)
					decodeKernels.Store(kernAuto)
				}
			}
		}
	}
}

// TestMatMulLarge exercises several prefill work units and k blocks.
func TestMatMulLarge(t *testing.T) {
	r := newRand(t)
	p := workers.New(2)
	defer p.Close()
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, sh := range [][3]int{{1, 301, 1100}, {100, 133, 1100}, {50, 200, 64}} {
			T, N, K := sh[0], sh[1], sh[2]
			w := randWeights(r, d, N, K, 1)
			x := randVec(r, T*K)
			ref := make([]float32, T*N)
			MatMulRef(ref, x, T, w)
			checkProduct(t, p, ref, x, T, w, d.String()+" large")
		}
	}
}

func TestNoAlloc(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p := workers.New(2)
	defer p.Close()
	w := randWeights(r, tensor.BF16, 300, 256, 1)
	x := randVec(r, 7*256)
	out := make([]float32, 7*300)
	for _, T := range []int{1, 7} {
		if a := testing.AllocsPerRun(50, func() { MatMul(p, out, x, T, w) }); a != 0 {
			t.Errorf("MatMul T=%d allocates %v times per call", T, a)
		}
	}
	if a := testing.AllocsPerRun(50, func() { Dot(x, x); Dots(out[:3], x[:256], x, 256); Axpys(x[:3], x, 256, out[:256]) }); a != 0 {
		t.Errorf("Dot/Dots/Axpys allocate %v times per call", a)
	}
}

func TestDot(t *testing.T) {
	r := newRand(t)
	defer SetPure(false)
	for _, pure := range []bool{false, true} {
		SetPure(pure)
		for n := 0; n < 300; n += 1 + n/8 {
			a, b := randVec(r, n+1), randVec(r, n+1)
			var want, mag float64
			for i := 0; i < n; i++ {
				want += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			if got := Dot(a[:n], b); math.Abs(float64(got)-want) > relTol*mag+absTol {
				t.Fatalf("pure=%v Dot n=%d: %v, want %v", pure, n, got, want)
			}
		}
	}
}

// TestGenerated checks that gemm_amd64.s is what internal/asmgen generates
// (run `go generate` in this package after changing the generator).
func TestGenerated(t *testing.T) {
	have, err := os.ReadFile("gemm_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, asmgen.Generate()) {
		t.Fatal("gemm_amd64.s is stale: run go generate ./backend/cpu/gemm")
	}
}

// randBlocks returns weights [N,K] of GGML block type d: random bytes, each
// block redrawn until every value it decodes to is finite.
func randBlocks(r *rand.Rand, d tensor.DType, N, K int) Weights {
	bs, bb := d.BlockSize(), d.BlockBytes()
	data := make([]byte, N*K/bs*bb)
	y := make([]float32, bs)
	for b := 0; b < len(data)/bb; b++ {
		blk := data[b*bb : (b+1)*bb]
		for finite := false; !finite; {
			for i := range blk {
				blk[i] = byte(r.Uint32())
			}
			if err := tensor.ToF32(d, blk, y); err != nil {
				panic(err)
			}
			finite = true
			for _, v := range y {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 1e4 {
					finite = false
				}
			}
		}
	}
	return Weights{DType: d, Data: data, N: N, K: K}
}

// TestMatMulBlocks checks products with weights in every GGML block type
// (read in place, decoded block by block, or multiplied in integers with x
// rounded to 8 bits for the types of intDot) against MatMulRef, which
// decodes whole rows with tensor.ToF32, on fresh random blocks. The integer
// path is allowed quantBound more than float32 rounding. Q4_K rows in
// multiples of 8 also run interleaved (PackRows8), as do Q6_K, Q8_0 and Q4_0 ones.
func TestMatMulBlocks(t *testing.T) {
	r := newRand(t)
	p := workers.New(3)
	defer p.Close()
	for _, d := range []tensor.DType{tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0,
		tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_NL} {
		bs := d.BlockSize()
		for _, T := range []int{1, 3, 17} {
			for _, N := range []int{1, 5, 24, 67} {
				for _, blocks := range []int{1, 3} {
					K := blocks * bs
					w := randBlocks(r, d, N, K)
					x := randVec(r, T*K)
					ref := make([]float32, T*N)
					MatMulRef(ref, x, T, w)
					row := make([]float32, K)
					packed := PackRows8(w)
					for i, pool := range []*workers.Pool{p, nil, p, p, nil} {
						if i >= 3 && packed == nil {
							continue
						}
						out := make([]float32, T*N)
						for i := range out {
							out[i] = float32(math.NaN())
						}
						SetPure(i == 2) // the Go kernels
						wi := w
						if i >= 3 {
							wi.Packed = packed
						}
						MatMul(pool, out, x, T, wi)
						SetPure(false)
						for n := 0; n < N; n++ {
							rb := len(w.Data) / N
							if err := tensor.ToF32(d, w.Data[n*rb:(n+1)*rb], row); err != nil {
								t.Fatal(err)
							}
							for tk := 0; tk < T; tk++ {
								var mag float64
								for k := range row {
									mag += math.Abs(float64(x[tk*K+k]) * float64(row[k]))
								}
								tol := relTol*mag + absTol
								if intDot(d) {
									tol += quantBound(x[tk*K:(tk+1)*K], row, xBlock(d), xBits(d))
								}
								got, want := out[tk*N+n], ref[tk*N+n]
								if math.IsNaN(float64(got)) || math.Abs(float64(got)-float64(want)) > tol {
									t.Fatalf("%v T=%d N=%d K=%d: out[%d][%d] = %v, want %v", d, T, N, K, tk, n, got, want)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestMatMulBlocksNoAlloc: products from blocks allocate nothing either.
// TestMatMulTilings: every tiling computes the product within the
// tolerance of the reference (units smaller and larger than the shape,
// k blocks that split K unevenly or not at all, grains of one row group
// and of the whole matrix), for the float formats (prefill and decode) and
// the block formats (row groups and the interleaved groups of eight); a
// tiling MatMul cannot run panics.
func TestMatMulTilings(t *testing.T) {
	r := newRand(t)
	p := workers.New(3)
	defer p.Close()
	tilings := []Tiling{{}, {UnitRows: 4, UnitTokens: 3, KBlock: 8, GrainBytes: 1}, {UnitRows: 128, UnitTokens: 96, KBlock: 4096, GrainBytes: 1 << 30},
		{UnitRows: 32, KBlock: 136}, {UnitTokens: 24, GrainBytes: 4096}}
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.Q8_0, tensor.Q4_K} {
		for _, T := range []int{1, 2, 7, 50} {
			K, N := 512, 72
			var w Weights
			if d.Quantized() {
				w = randBlocks(r, d, N, K)
				w.Packed = PackRows8(w)
			} else {
				w = randWeights(r, d, N, K, T%2)
			}
			x := randVec(r, T*K)
			ref := make([]float32, T*N)
			if d.Quantized() {
				// The block formats' sums do not depend on the split
				// (TestMatMulBlocks checks the default against MatMulRef).
				MatMul(p, ref, x, T, w)
			} else {
				MatMulRef(ref, x, T, w)
			}
			for _, tl := range tilings {
				w.Tiling = tl
				what := fmt.Sprintf("%v T=%d tiling %+v", d, T, tl)
				if !d.Quantized() {
					checkProduct(t, p, ref, x, T, w, what)
					continue
				}
				out := make([]float32, T*N)
				MatMul(p, out, x, T, w)
				if !slices.Equal(out, ref) {
					t.Errorf("%s: differs from the default tiling's product", what)
				}
			}
		}
	}
	for _, bad := range []Tiling{{UnitRows: 6}, {UnitTokens: 4}, {KBlock: 12}, {GrainBytes: -1}, {UnitRows: 1 << 62}, {KBlock: 1 << 40}, {GrainBytes: 1 << 40}} {
		if bad.Check() == nil {
			t.Errorf("tiling %+v accepted", bad)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("MatMul ran tiling %+v", bad)
				}
			}()
			w := randWeights(r, tensor.F32, 4, 8, 0)
			w.Tiling = bad
			MatMul(p, make([]float32, 8), randVec(r, 16), 2, w)
		}()
	}
}

func TestMatMulBlocksNoAlloc(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := workers.New(2)
	defer p.Close()
	w := randBlocks(r, tensor.Q4_K, 40, 512)
	x := randVec(r, 3*512)
	out := make([]float32, 3*40)
	for _, T := range []int{1, 3} {
		if a := testing.AllocsPerRun(50, func() { MatMul(p, out, x, T, w) }); a != 0 {
			t.Errorf("MatMul of q4_k blocks, T=%d, allocates %v times per call", T, a)
		}
		if wp := (Weights{DType: w.DType, Data: w.Data, N: w.N, K: w.K, Packed: PackRows8(w)}); wp.Packed != nil {
			if a := testing.AllocsPerRun(50, func() { MatMul(p, out, x, T, wp) }); a != 0 {
				t.Errorf("MatMul of interleaved q4_k rows, T=%d, allocates %v times per call", T, a)
			}
		}
	}
}

// TestDotsAxpys checks Dots and Axpys, SIMD and pure, against float64 sums
// on fresh random rows: lengths around the 8- and 32-value steps, 1 to 19
// rows at a stride longer than a row.
func TestDotsAxpys(t *testing.T) {
	r := newRand(t)
	defer SetPure(false)
	for _, pure := range []bool{false, true} {
		SetPure(pure)
		for _, k := range []int{1, 7, 8, 9, 31, 32, 33, 64, 80, 128, 136} {
			for _, n := range []int{1, 2, 5, 19} {
				stride := k + r.IntN(9)
				a, b := randVec(r, k), randVec(r, (n-1)*stride+k)
				w, y := randVec(r, n), randVec(r, k)
				out := make([]float32, n+1)
				out[n] = 42
				Dots(out[:n], a, b, stride)
				for i := 0; i < n; i++ {
					var want, mag float64
					for j := 0; j < k; j++ {
						want += float64(a[j]) * float64(b[i*stride+j])
						mag += math.Abs(float64(a[j]) * float64(b[i*stride+j]))
					}
					if math.Abs(float64(out[i])-want) > relTol*mag+absTol {
						t.Fatalf("pure %v k=%d n=%d: Dots row %d = %v, want %v", pure, k, n, i, out[i], want)
					}
				}
				if out[n] != 42 {
					t.Fatalf("pure %v k=%d n=%d: Dots wrote past out", pure, k, n)
				}
				got := append([]float32(nil), y...)
				Axpys(w, b, stride, got)
				for j := 0; j < k; j++ {
					want, mag := float64(y[j]), math.Abs(float64(y[j]))
					for i := 0; i < n; i++ {
						want += float64(w[i]) * float64(b[i*stride+j])
						mag += math.Abs(float64(w[i]) * float64(b[i*stride+j]))
					}
					if math.Abs(float64(got[j])-want) > relTol*mag+absTol {
						t.Fatalf("pure %v k=%d n=%d: Axpys element %d = %v, want %v", pure, k, n, j, got[j], want)
					}
				}
			}
		}
	}
}

// TestDotsAxpysE4M3: DotsE4M3 and AxpysE4M3 against Dots and Axpys on the
// same rows widened by tensor.E4M3ToF32, bit for bit (the same sums in the
// same order), over row lengths with and without a tail of fewer than 8,
// runs of rows and strides past the row, every finite code in every lane;
// and the NaN codes give NaN.
func TestDotsAxpysE4M3(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, nan := range []byte{0x7F, 0xFF} {
		codes := make([]byte, 16)
		codes[3] = nan
		out := make([]float32, 1)
		DotsE4M3(out, make([]float32, 16), codes, 16)
		y := make([]float32, 16)
		AxpysE4M3([]float32{1}, codes, 16, y)
		if out[0] == out[0] || y[3] == y[3] || y[2] != 0 {
			t.Fatalf("code %#02x: dot %v, axpy %v, want NaN", nan, out[0], y[:4])
		}
	}
	for _, k := range []int{8, 13, 16, 40, 64, 72, 128} {
		for _, n := range []int{1, 2, 3, 16} {
			stride := k + r.IntN(3)*8
			codes := make([]byte, (n-1)*stride+k)
			for i := range codes {
				codes[i] = byte(37*i + k) // every code, in every lane of the 8
				if codes[i]&0x7F == 0x7F {
					codes[i] ^= 1 // no NaN here: a NaN compares unequal to itself
				}
			}
			checkWidened(t, "E4M3", r, codes, stride, k, n, tensor.E4M3ToF32, DotsE4M3, AxpysE4M3)
		}
	}
}

// TestDotsAxpysF16: DotsF16 and AxpysF16 against Dots and Axpys on the same
// rows widened by tensor.F16ToF32, bit for bit (the same sums in the same
// order), over row lengths with and without a tail of fewer than 8, runs
// of rows and strides past the row, and values of every exponent
// (subnormals and infinities included).
func TestDotsAxpysF16(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, k := range []int{8, 13, 16, 40, 64, 72, 128} {
		for _, n := range []int{1, 2, 3, 16} {
			stride := k + r.IntN(3)*8
			vals := make([]uint16, (n-1)*stride+k)
			for i := range vals {
				vals[i] = uint16(r.Uint32())
				if vals[i]&0x7C00 == 0x7C00 && vals[i]&0x3FF != 0 {
					vals[i] &^= 0x3FF // no NaN: a NaN compares unequal to itself
				}
			}
			checkWidened(t, "F16", r, vals, stride, k, n, tensor.F16ToF32, DotsF16, AxpysF16)
		}
	}
}

// checkWidened requires dots and axpys over n rows of codes (k values
// each, stride apart) to give Dots and Axpys on the rows widened by widen,
// bit for bit (NaN where both are NaN), for fresh a, w and y.
func checkWidened[T any](t *testing.T, name string, r *rand.Rand, codes []T, stride, k, n int, widen func(T) float32,
	dots func(out, a []float32, b []T, stride int), axpys func(w []float32, x []T, stride int, y []float32)) {
	t.Helper()
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b) }
	wide := make([]float32, len(codes))
	for i, c := range codes {
		wide[i] = widen(c)
	}
	a := make([]float32, k)
	for i := range a {
		a[i] = float32(r.NormFloat64())
	}
	got, want := make([]float32, n), make([]float32, n)
	dots(got, a, codes, stride)
	Dots(want, a, wide, stride)
	for i := range got {
		if !same(got[i], want[i]) {
			t.Fatalf("Dots%s k %d, %d rows at stride %d: row %d = %v, want %v", name, k, n, stride, i, got[i], want[i])
		}
	}
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	y, yw := make([]float32, k), make([]float32, k)
	for i := range y {
		y[i] = float32(i)
		yw[i] = y[i]
	}
	axpys(w, codes, stride, y)
	Axpys(w, wide, stride, yw)
	for i := range y {
		if !same(y[i], yw[i]) {
			t.Fatalf("Axpys%s k %d, %d rows at stride %d: y[%d] = %v, want %v", name, k, n, stride, i, y[i], yw[i])
		}
	}
}
