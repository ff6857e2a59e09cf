package gemm

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"

	"kiln/backend/cpu/workers"
	"kiln/tensor"
)

// TestDecodeCompare (run with KILN_GEMM_COMPARE=rounds) times the decode
// kernel choices (plain: k4x1 per 4-row group; avx2: kr<D>; zmm: the
// default, krBF16z for BF16)
// against each other and against a plain read pass (BenchmarkReadParallel),
// in short interleaved slices of random order, on weights unaligned (as
// BenchmarkDecode) and aligned, and logs per-variant medians of GB/s and of
// the ratio to the read pass of the same round: on a noisy shared machine
// that pairs each measurement with one taken moments apart. With
// KILN_GEMM_CACHED=1 each product reuses one copy of its weights (from
// cache where they fit) instead of cycling through 256 MB.
func TestDecodeCompare(t *testing.T) {
	var rounds int
	if _, err := fmt.Sscan(os.Getenv("KILN_GEMM_COMPARE"), &rounds); err != nil || rounds <= 0 {
		t.Skip("set KILN_GEMM_COMPARE=rounds to run")
	}
	defer decodeKernels.Store(kernAuto)
	p := workers.New(0)
	defer p.Close()
	dst, _ := copyBufs()
	rt := &readTask{buf: unsafe.Slice((*float32)(unsafe.Pointer(&dst[0])), len(dst)/4)}
	const slice = 40 * time.Millisecond
	timeIt := func(f func()) float64 { // seconds per call
		n := 0
		start := time.Now()
		for time.Since(start) < slice || n < 2 {
			f()
			n++
		}
		return time.Since(start).Seconds() / float64(n)
	}
	type variant struct {
		name string
		kern int32
	}
	variants := []variant{{"plain", kernPlain}, {"avx2", kernAVX2}}
	if haveAVX512 {
		variants = append(variants, variant{"zmm", kernAuto})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, d := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, sh := range append([][2]int{{768, 768}}, benchShapes...) {
			for _, aligned := range []bool{false, true} {
				N, K := sh[0], sh[1]
				set := benchSetBytes
				if os.Getenv("KILN_GEMM_CACHED") != "" {
					set = 0 // one copy: from cache
				}
				ws := benchWeights(d, N, K, set)
				if aligned {
					for i := range ws {
						ws[i].Data = append(make([]byte, 0, len(ws[i].Data)), ws[i].Data...)
					}
				}
				x := make([]float32, K)
				for i := range x {
					x[i] = 1
				}
				out := make([]float32, N)
				bytes := float64(len(ws[0].Data))
				gbs := map[string][]float64{}
				ratio := map[string][]float64{}
				for range rounds {
					read := float64(len(dst)) / timeIt(func() { p.Run(len(rt.buf)>>18, 1, rt) }) / 1e9
					gbs["read"] = append(gbs["read"], read)
					for _, i := range r.Perm(len(variants)) {
						v := variants[i]
						decodeKernels.Store(v.kern)
						j := 0
						g := bytes / timeIt(func() {
							MatMul(p, out, x, 1, ws[j])
							j = (j + 1) % len(ws)
						}) / 1e9
						gbs[v.name] = append(gbs[v.name], g)
						ratio[v.name] = append(ratio[v.name], g/read)
					}
				}
				line := fmt.Sprintf("%v/%dx%d aligned=%v: read %.1f", d, N, K, aligned, median(gbs["read"]))
				for _, v := range variants {
					line += fmt.Sprintf(" | %s %.1f GB/s (%.2f of read)", v.name, median(gbs[v.name]), median(ratio[v.name]))
				}
				t.Log(line)
			}
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
