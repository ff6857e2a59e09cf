package gemm

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// Benchmarks. Decode (T=1) is memory bound, so it cycles through a weight
// set of at least 256 MB (several copies of the matrix) and reports weight
// bytes read per second; compare with BenchmarkCopy/BenchmarkCopyParallel
// (bytes copied per second by memmove, single goroutine and one per worker;
// a copy moves twice those bytes) and BenchmarkReadParallel (a plain SIMD
// read pass).
// Prefill reports GFLOP/s (2*T*N*K per product).

const benchSetBytes = 256 << 20

// benchWeights returns copies of an [N,K] matrix of dtype d filling at least
// total bytes, all starting one byte into their buffers (unaligned).
func benchWeights(d tensor.DType, N, K, total int) []Weights {
	eb := elemBytes(d)
	size := N * K * eb
	copies := max(1, (total+size-1)/size)
	row := make([]byte, K*eb)
	for k := 0; k < K; k++ {
		v := float32(k%13-6) / 16
		switch d {
		case tensor.F32:
			binary.LittleEndian.PutUint32(row[4*k:], math.Float32bits(v))
		case tensor.BF16:
			binary.LittleEndian.PutUint16(row[2*k:], tensor.F32ToBF16(v))
		case tensor.F16:
			binary.LittleEndian.PutUint16(row[2*k:], tensor.F32ToF16(v))
		}
	}
	ws := make([]Weights, copies)
	for i := range ws {
		buf := make([]byte, size+1)
		for off := 1; off < len(buf); off += copy(buf[off:], row) {
		}
		ws[i] = Weights{DType: d, Data: buf[1:], N: N, K: K}
	}
	return ws
}

var benchShapes = [][2]int{{768, 2048}, {2048, 768}, {32000, 768}} // N, K

func BenchmarkDecode(b *testing.B) { benchDecode(b) }

// BenchmarkDecodeAVX2 is BenchmarkDecode without the AVX-512 kernels.
func BenchmarkDecodeAVX2(b *testing.B) {
	setAVX512(false)
	defer setAVX512(true)
	benchDecode(b)
}

func benchDecode(b *testing.B) {
	p := workers.New(0)
	defer p.Close()
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, sh := range benchShapes {
			N, K := sh[0], sh[1]
			b.Run(fmt.Sprintf("%v/%dx%d", d, N, K), func(b *testing.B) {
				ws := benchWeights(d, N, K, benchSetBytes)
				x := make([]float32, K)
				for i := range x {
					x[i] = 1
				}
				out := make([]float32, N)
				b.SetBytes(int64(len(ws[0].Data)))
				i := 0
				for b.Loop() {
					MatMul(p, out, x, 1, ws[i])
					i = (i + 1) % len(ws)
				}
			})
		}
	}
}

func BenchmarkPrefill(b *testing.B) {
	p := workers.New(0)
	defer p.Close()
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, sh := range [][2]int{{768, 768}, {2048, 768}} {
			for _, T := range []int{64, 512} {
				N, K := sh[0], sh[1]
				b.Run(fmt.Sprintf("%v/T%d/%dx%d", d, T, N, K), func(b *testing.B) {
					w := benchWeights(d, N, K, 0)[0]
					x := make([]float32, T*K)
					for i := range x {
						x[i] = float32(i%7) / 8
					}
					out := make([]float32, T*N)
					for b.Loop() {
						MatMul(p, out, x, T, w)
					}
					b.ReportMetric(2*float64(T*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

var copyBuf []byte

func copyBufs() (dst, src []byte) {
	if copyBuf == nil {
		copyBuf = make([]byte, 2*benchSetBytes)
		for i := range copyBuf {
			copyBuf[i] = byte(i)
		}
	}
	return copyBuf[:benchSetBytes], copyBuf[benchSetBytes:]
}

// BenchmarkCopy is memmove bandwidth of a 256 MB buffer (bytes copied).
func BenchmarkCopy(b *testing.B) {
	dst, src := copyBufs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

type copyTask struct{ dst, src []byte }

func (c *copyTask) Do(lo, hi int) {
	const chunk = 1 << 20
	copy(c.dst[lo*chunk:min(hi*chunk, len(c.dst))], c.src[lo*chunk:])
}

// BenchmarkCopyParallel is BenchmarkCopy split over the workers of a pool.
func BenchmarkCopyParallel(b *testing.B) {
	p := workers.New(0)
	defer p.Close()
	dst, src := copyBufs()
	t := &copyTask{dst, src}
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		p.Run(len(src)>>20, 1, t)
	}
}

type readTask struct {
	buf  []float32
	sums [64]float32
}

func (r *readTask) Do(lo, hi int) {
	const chunk = 1 << 18 // floats (1 MB)
	s := Dot(r.buf[lo*chunk:min(hi*chunk, len(r.buf))], r.buf[lo*chunk:])
	r.sums[lo%64] += s
}

// BenchmarkReadParallel is the read bandwidth of a plain SIMD pass over 256
// MB (Dot of a buffer with itself, split over the workers), another reference
// for BenchmarkDecode.
func BenchmarkReadParallel(b *testing.B) {
	p := workers.New(0)
	defer p.Close()
	dst, _ := copyBufs()
	t := &readTask{buf: unsafe.Slice((*float32)(unsafe.Pointer(&dst[0])), len(dst)/4)}
	b.SetBytes(int64(len(dst)))
	for b.Loop() {
		p.Run(len(t.buf)>>18, 1, t)
	}
}

func BenchmarkDot(b *testing.B) {
	x := make([]float32, 4096)
	b.SetBytes(int64(8 * len(x)))
	for b.Loop() {
		Dot(x, x)
	}
}

// BenchmarkDecodeQuant is BenchmarkDecode for the integer products
// (quant.go) of the block types, on random blocks: weight bytes a second.
func BenchmarkDecodeQuant(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	p := workers.New(0)
	defer p.Close()
	for _, d := range []tensor.DType{tensor.Q8_0, tensor.Q6_K, tensor.Q5_K, tensor.Q4_K, tensor.Q4_0} {
		for _, s := range [][2]int{{768, 768}, {2048, 768}, {768, 2048}} {
			N, K := s[0], s[1]
			one := randBlocks(r, d, N, K)
			ws := make([]Weights, max(1, benchSetBytes/len(one.Data)))
			if os.Getenv("KILN_BENCH_HOT") != "" {
				ws = ws[:1]
			}
			for i := range ws {
				ws[i] = randBlocks(r, d, N, K)
			}
			x, out := randVec(r, K), make([]float32, N)
			b.Run(fmt.Sprintf("%v/%dx%d", d, N, K), func(b *testing.B) {
				b.SetBytes(int64(len(one.Data)))
				for i := 0; b.Loop(); i++ {
					MatMul(p, out, x, 1, ws[i%len(ws)])
				}
			})
		}
	}
}
