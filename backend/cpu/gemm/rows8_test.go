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

// rows8Types are the block types PackRows8 interleaves, with their Go
// reference over a packed group (dots) and their assembly kernel (asm).
var rows8Types = []struct {
	d    tensor.DType
	dots func(p []byte, nb int, a *qx, out []float32)
	asm  func(p []byte, nb, groups int, a *qx, out []float32)
}{
	{tensor.Q4_K,
		func(p []byte, nb int, a *qx, out []float32) { dotsQ4K8(p, nb, a.q, a.d, a.sums, out) },
		func(p []byte, nb, groups int, a *qx, out []float32) {
			rowsQ4K8(unsafe.Pointer(&p[0]), &a.q[0], &a.d[0], &a.sums[0], nb, groups, &out[0])
		}},
	{tensor.Q6_K,
		func(p []byte, nb int, a *qx, out []float32) { dotsQ6K8(p, nb, a.q, a.d, out) },
		func(p []byte, nb, groups int, a *qx, out []float32) {
			rowsQ6K8(unsafe.Pointer(&p[0]), &a.q[0], &a.d[0], &a.sums16[0], nb, groups, &out[0])
		}},
	{tensor.Q8_0,
		func(p []byte, nb int, a *qx, out []float32) { dotsQ8_08(p, nb, a.q16, a.d, out) },
		func(p []byte, nb, groups int, a *qx, out []float32) {
			rowsQ8_08(unsafe.Pointer(&p[0]), &a.q16[0], &a.d[0], nb, groups, &out[0])
		}},
	{tensor.Q4_0,
		func(p []byte, nb int, a *qx, out []float32) { dotsQ4_08(p, nb, a.q, a.d, a.sums, out) },
		func(p []byte, nb, groups int, a *qx, out []float32) {
			rowsQ4_08(unsafe.Pointer(&p[0]), &a.q[0], &a.d[0], &a.sums[0], nb, groups, &out[0])
		}},
}

// TestRows8: rows interleaved by eights (PackRows8's layouts) give the row
// kernels' Go results (dotQ4K, dotQ8_0, dotQ4_0) bit for bit through their
// Go references, and the assembly kernels the same to float32 rounding (the
// blocks' float terms summed in another order), on fresh random blocks.
func TestRows8(t *testing.T) {
	if !haveSIMD {
		t.Skip("no assembly kernels on this CPU (PackRows8 packs nothing)")
	}
	r := newRand(t)
	for _, c := range rows8Types {
		bs := xBlock(c.d)
		for _, nb := range []int{1, 3, 8} {
			for _, groups := range []int{1, 3, 160} { // 160: packed in several shares
				N, K := 8*groups, bs*nb
				w := randBlocks(r, c.d, N, K)
				x := randVec(r, K)
				var a qx
				a.quantize(x, 1, K, bs, xBits(c.d))
				p := PackRows8(w)
				gb := packedBytes(w) / groups
				want, ref := make([]float32, N), make([]float32, N)
				rowsGo(c.d, w.Data, w.rowBytes(), &a, want)
				for g := 0; g < groups; g++ {
					c.dots(p[g*gb:], nb, &a, ref[8*g:])
				}
				for i := range want {
					if ref[i] != want[i] {
						t.Fatalf("%v nb %d row %d: packed %v, row kernel %v", c.d, nb, i, ref[i], want[i])
					}
				}
				got := make([]float32, N+1)
				got[N] = 42
				c.asm(p, nb, groups, &a, got)
				if got[N] != 42 {
					t.Fatalf("%v: wrote past the rows", c.d)
				}
				row := make([]float32, K)
				for i := range want {
					var mag float64
					if err := tensor.ToF32(c.d, w.Data[i*w.rowBytes():(i+1)*w.rowBytes()], row); err != nil {
						t.Fatal(err)
					}
					for k := range row {
						mag += math.Abs(float64(row[k]) * float64(x[k]))
					}
					if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*mag+1e-6 {
						t.Errorf("%v nb %d row %d: asm %v, Go %v (|Δ| %g, scale %g)", c.d, nb, i, got[i], want[i], d, mag)
					}
				}
			}
		}
	}
}

// BenchmarkRows8 compares the row kernels with the interleaved ones, one
// thread, weight bytes a second (KILN_BENCH_HOT: one matrix, in cache).
func BenchmarkRows8(b *testing.B) {
	if !haveSIMD {
		b.Skip("no assembly kernels")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range rows8Types {
		for _, s := range [][2]int{{2048, 768}, {768, 2048}} {
			N, K := s[0], s[1]
			bs := xBlock(c.d)
			one := randBlocks(r, c.d, N, K)
			n := max(1, benchSetBytes/len(one.Data))
			if os.Getenv("KILN_BENCH_HOT") != "" {
				n = 1
			}
			ws, ps := make([]Weights, n), make([][]byte, n)
			for i := range ws {
				ws[i] = randBlocks(r, c.d, N, K)
				ps[i] = PackRows8(ws[i])
			}
			var a qx
			a.quantize(randVec(r, K), 1, K, bs, xBits(c.d))
			out := make([]float32, N)
			b.Run(fmt.Sprintf("%v/rows/%dx%d", c.d, N, K), func(b *testing.B) {
				b.SetBytes(int64(len(one.Data)))
				for i := 0; b.Loop(); i++ {
					rowsSIMD(c.d, ws[i%n].Data, ws[i%n].rowBytes(), &a, out)
				}
			})
			b.Run(fmt.Sprintf("%v/x8/%dx%d", c.d, N, K), func(b *testing.B) {
				b.SetBytes(int64(len(one.Data)))
				for i := 0; b.Loop(); i++ {
					c.asm(ps[i%n], K/bs, N/8, &a, out)
				}
			})
		}
	}
}

// The Go references of the interleaved layouts: the row kernels' arithmetic
// (dotQ4K, dotQ6K, dotQ8_0, dotQ4_0) read from a packed group of 8 rows.

// dotsQ4K8 is dotQ4K of the 8 rows of group p (nb blocks) into out[:8],
// the same arithmetic in the same order.
func dotsQ4K8(p []byte, nb int, q []int8, xd []float32, sums []int16, out []float32) {
	for r := 0; r < 8; r++ {
		var s float32
		for b := 0; b < nb; b++ {
			blk := p[b*q4k8Block:][:q4k8Block]
			xq := q[256*b : 256*b+256]
			var isum, msum int32
			for j := 0; j < 8; j++ {
				var sub int32
				for l := 0; l < 32; l++ {
					c, k := j/2, l
					v := blk[160+32*(8*c+k/4)+4*r+k%4]
					if j%2 == 0 {
						v &= 0xF
					} else {
						v >>= 4
					}
					sub += int32(v) * int32(xq[32*j+l])
				}
				isum += int32(blk[32+8*j+r]) * sub
				msum += int32(blk[96+16*(j/2)+2*r+j%2]) * int32(sums[8*b+j])
			}
			s += f16(blk[2*r:])*xd[b]*float32(isum) - f16(blk[16+2*r:])*xd[b]*float32(msum)
		}
		out[r] = s
	}
}

// dotsQ8_08 is dotQ8_0 of the 8 rows of group p (nb blocks) into out[:8],
// the same arithmetic in the same order.
func dotsQ8_08(p []byte, nb int, q []int16, xd []float32, out []float32) {
	for r := 0; r < 8; r++ {
		var s float32
		for b := 0; b < nb; b++ {
			blk := p[b*q808Block:][:q808Block]
			var isum int32
			for i := 0; i < 32; i++ {
				isum += int32(int8(blk[16+16*(i/2)+2*r+i%2])) * int32(q[32*b+i])
			}
			s += f16(blk[2*r:]) * xd[b] * float32(isum)
		}
		out[r] = s
	}
}

// dotsQ4_08 is dotQ4_0 of the 8 rows of group p (nb blocks) into out[:8],
// the same arithmetic in the same order.
func dotsQ4_08(p []byte, nb int, q []int8, xd []float32, sums []int16, out []float32) {
	for r := 0; r < 8; r++ {
		var s float32
		for b := 0; b < nb; b++ {
			blk := p[b*q408Block:][:q408Block]
			var isum int32
			for l := 0; l < 16; l++ {
				v := blk[16+32*(l/4)+4*r+l%4]
				isum += int32(v&0xF)*int32(q[32*b+l]) + int32(v>>4)*int32(q[32*b+16+l])
			}
			s += f16(blk[2*r:]) * xd[b] * float32(isum-8*int32(sums[b]))
		}
		out[r] = s
	}
}

// dotsQ6K8 is dotQ6K of the 8 rows of group p (nb blocks) into out[:8],
// the same arithmetic in the same order.
func dotsQ6K8(p []byte, nb int, q []int8, xd []float32, out []float32) {
	for r := 0; r < 8; r++ {
		var s float32
		for b := 0; b < nb; b++ {
			blk := p[b*q6k8Block:][:q6k8Block]
			ql := func(i int) byte { return blk[144+32*(i/4)+4*r+i%4] }
			qh := func(i int) byte { return blk[1168+32*(i/4)+4*r+i%4] }
			var isum int32
			for h := 0; h < 2; h++ {
				xq := q[256*b+128*h:]
				for l := 0; l < 32; l++ {
					is := l / 16
					a, c, hh := ql(64*h+l), ql(64*h+l+32), qh(32*h+l)
					v := [4]int32{
						int32(a&0xF|(hh>>0&3)<<4) - 32,
						int32(c&0xF|(hh>>2&3)<<4) - 32,
						int32(a>>4|(hh>>4&3)<<4) - 32,
						int32(c>>4|(hh>>6&3)<<4) - 32,
					}
					for g := 0; g < 4; g++ {
						isum += int32(int8(blk[16+8*(8*h+is+2*g)+r])) * v[g] * int32(xq[l+32*g])
					}
				}
			}
			s += f16(blk[2*r:]) * xd[b] * float32(isum)
		}
		out[r] = s
	}
}

// BenchmarkPackRows8: PackRows8 of a 4096×4096 matrix of each type, on the
// machine's threads (packed bytes a second: a plan's start-up cost).
func BenchmarkPackRows8(b *testing.B) {
	if !haveSIMD {
		b.Skip("no assembly kernels (PackRows8 packs nothing)")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range rows8Types {
		w := randBlocks(r, c.d, 4096, 4096)
		b.Run(c.d.String(), func(b *testing.B) {
			b.SetBytes(int64(len(w.Data)))
			for b.Loop() {
				PackRows8(w)
			}
		})
	}
}
