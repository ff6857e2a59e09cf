package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"kiln/tensor"
)

// TestQ4K8: rows interleaved by eights (packQ4K8) give dotQ4K's results bit
// for bit through dotsQ4K8, and the assembly kernel the same to float32
// rounding, on fresh random blocks.
func TestQ4K8(t *testing.T) {
	r := newRand(t)
	for _, nb := range []int{1, 3, 8} {
		for _, groups := range []int{1, 3} {
			N, K := 8*groups, 256*nb
			w := randBlocks(r, tensor.Q4_K, N, K)
			x := randVec(r, K)
			var a qx
			a.quantize(x, 1, K, 256, 8)
			p := packQ4K8(w.Data, N, nb)
			want, ref := make([]float32, N), make([]float32, N)
			rowsGo(tensor.Q4_K, w.Data, w.rowBytes(), &a, want)
			for g := 0; g < groups; g++ {
				dotsQ4K8(p[g*nb*q4k8Block:], nb, a.q, a.d, a.sums, ref[8*g:])
			}
			for i := range want {
				if ref[i] != want[i] {
					t.Fatalf("nb %d row %d: packed %v, dotQ4K %v", nb, i, ref[i], want[i])
				}
			}
			if !haveSIMD {
				continue
			}
			got := make([]float32, N+1)
			got[N] = 42
			rowsQ4K8(unsafe.Pointer(&p[0]), &a.q[0], &a.d[0], &a.sums[0], nb, groups, &got[0])
			if got[N] != 42 {
				t.Fatalf("wrote past the rows")
			}
			for i := range want {
				// The blocks' float terms in another order: a few ulps of
				// the largest term.
				var mag float64
				row := make([]float32, K)
				if err := tensor.ToF32(tensor.Q4_K, w.Data[i*w.rowBytes():(i+1)*w.rowBytes()], row); err != nil {
					t.Fatal(err)
				}
				for k := range row {
					mag += math.Abs(float64(row[k]) * float64(x[k]))
				}
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*mag+1e-6 {
					t.Errorf("nb %d row %d: asm %v, Go %v (|Δ| %g, scale %g)", nb, i, got[i], want[i], d, mag)
				}
			}
		}
	}
}

// BenchmarkQ4K8 compares the row kernel with the interleaved one, one
// thread, weight bytes a second (KILN_BENCH_HOT: one matrix, in cache).
func BenchmarkQ4K8(b *testing.B) {
	if !haveSIMD {
		b.Skip("no assembly kernels")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][2]int{{2048, 768}, {768, 2048}} {
		N, K := s[0], s[1]
		nb := K / 256
		n := max(1, benchSetBytes/(N*nb*144))
		if os.Getenv("KILN_BENCH_HOT") != "" {
			n = 1
		}
		ws, ps := make([][]byte, n), make([][]byte, n)
		for i := range ws {
			ws[i] = randBlocks(r, tensor.Q4_K, N, K).Data
			ps[i] = packQ4K8(ws[i], N, nb)
		}
		var a qx
		a.quantize(randVec(r, K), 1, K, 256, 8)
		out := make([]float32, N)
		b.Run(fmt.Sprintf("rows/%dx%d", N, K), func(b *testing.B) {
			b.SetBytes(int64(N * nb * 144))
			for i := 0; b.Loop(); i++ {
				rowsQ4K(unsafe.Pointer(&ws[i%n][0]), uintptr(nb*144), &a.q[0], &a.d[0], &a.sums[0], nb, N, &out[0])
			}
		})
		b.Run(fmt.Sprintf("x8/%dx%d", N, K), func(b *testing.B) {
			b.SetBytes(int64(N * nb * 144))
			for i := 0; b.Loop(); i++ {
				rowsQ4K8(unsafe.Pointer(&ps[i%n][0]), &a.q[0], &a.d[0], &a.sums[0], nb, N/8, &out[0])
			}
		})
	}
}

// TestQ8_08: Q8_0 rows interleaved by eights (packQ8_08) give dotQ8_0's
// results bit for bit through dotsQ8_08, and the assembly kernel the same
// to float32 rounding, on fresh random blocks.
func TestQ8_08(t *testing.T) {
	r := newRand(t)
	for _, nb := range []int{1, 3, 8} {
		for _, groups := range []int{1, 3} {
			N, K := 8*groups, 32*nb
			w := randBlocks(r, tensor.Q8_0, N, K)
			x := randVec(r, K)
			var a qx
			a.quantize(x, 1, K, 32, 16)
			p := packQ8_08(w.Data, N, nb)
			want, ref := make([]float32, N), make([]float32, N)
			rowsGo(tensor.Q8_0, w.Data, w.rowBytes(), &a, want)
			for g := 0; g < groups; g++ {
				dotsQ8_08(p[g*nb*q808Block:], nb, a.q16, a.d, ref[8*g:])
			}
			for i := range want {
				if ref[i] != want[i] {
					t.Fatalf("nb %d row %d: packed %v, dotQ8_0 %v", nb, i, ref[i], want[i])
				}
			}
			if !haveSIMD {
				continue
			}
			got := make([]float32, N+1)
			got[N] = 42
			rowsQ8_08(unsafe.Pointer(&p[0]), &a.q16[0], &a.d[0], nb, groups, &got[0])
			if got[N] != 42 {
				t.Fatalf("wrote past the rows")
			}
			for i := range want {
				var mag float64
				row := make([]float32, K)
				if err := tensor.ToF32(tensor.Q8_0, w.Data[i*w.rowBytes():(i+1)*w.rowBytes()], row); err != nil {
					t.Fatal(err)
				}
				for k := range row {
					mag += math.Abs(float64(row[k]) * float64(x[k]))
				}
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*mag+1e-6 {
					t.Errorf("nb %d row %d: asm %v, Go %v (|Δ| %g, scale %g)", nb, i, got[i], want[i], d, mag)
				}
			}
		}
	}
}

// BenchmarkQ8_08 is BenchmarkQ4K8 for Q8_0.
func BenchmarkQ8_08(b *testing.B) {
	if !haveSIMD {
		b.Skip("no assembly kernels")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][2]int{{2048, 768}, {768, 2048}} {
		N, K := s[0], s[1]
		nb := K / 32
		n := max(1, benchSetBytes/(N*nb*34))
		if os.Getenv("KILN_BENCH_HOT") != "" {
			n = 1
		}
		ws, ps := make([][]byte, n), make([][]byte, n)
		for i := range ws {
			ws[i] = randBlocks(r, tensor.Q8_0, N, K).Data
			ps[i] = packQ8_08(ws[i], N, nb)
		}
		var a qx
		a.quantize(randVec(r, K), 1, K, 32, 16)
		out := make([]float32, N)
		b.Run(fmt.Sprintf("rows/%dx%d", N, K), func(b *testing.B) {
			b.SetBytes(int64(N * nb * 34))
			for i := 0; b.Loop(); i++ {
				rowsQ8_0(unsafe.Pointer(&ws[i%n][0]), uintptr(nb*34), &a.q16[0], &a.d[0], nb, N, &out[0])
			}
		})
		b.Run(fmt.Sprintf("x8/%dx%d", N, K), func(b *testing.B) {
			b.SetBytes(int64(N * nb * 34))
			for i := 0; b.Loop(); i++ {
				rowsQ8_08(unsafe.Pointer(&ps[i%n][0]), &a.q16[0], &a.d[0], nb, N/8, &out[0])
			}
		})
	}
}
