package cu

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"kiln/tensor"
)

// quantE4M3 quantizes v to E4M3 with one float32 scale, which maps the
// largest magnitude to tensor.E4M3Max. It returns the bytes, the scale and
// the values the product sees (each byte's value times the scale).
func quantE4M3(v []float64) ([]byte, []float32, []float64) {
	amax := 0.0
	for _, x := range v {
		amax = max(amax, math.Abs(x))
	}
	s := float32(max(amax, 1e-30) / tensor.E4M3Max)
	q := make([]byte, len(v))
	seen := make([]float64, len(v))
	for i, x := range v {
		q[i] = tensor.F32ToE4M3(float32(x / float64(s)))
		seen[i] = float64(tensor.E4M3ToF32(q[i])) * float64(s)
	}
	return q, []float32{s}, seen
}

// TestBlasLtFP8 runs FP8 (E4M3) products through cuBLASLt, with one scale
// per tensor, into bf16 and f16 outputs (NaN-poisoned), against a float64
// reference of the same quantized values times their scales. Products of
// E4M3 values are exact in float32, so the error is the accumulation's and
// the output's rounding: cuBLASLt's fast accumulation keeps about 14
// mantissa bits in the tensor cores' accumulator (DeepSeek-V3's report),
// about 2^-14·√K ≈ 4e-3 of a sum's scale at K 4096 at worst, so the bound
// is 1e-2 of ‖ref‖ (bf16 output adds 2^-9). Also the products FP8 refuses
// before cuBLASLt sees them.
func TestBlasLtFP8(t *testing.T) {
	d := gpu(t)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	randv := normals(5)
	for _, c := range []struct {
		T, K, N int
		out     DType
	}{
		{7, 96, 130, BF16},
		{7, 96, 130, F16},
		{1, 4096, 200, BF16},
		{64, 4096, 6144, BF16},
		{300, 1024, 258, F16},
		{300, 1024, 257, F16}, // odd N: refused by cuBLASLt 13.0 on the H200
		{256, 14336, 512, BF16},
	} {
		name := fmt.Sprintf("T%d_K%d_N%d_%s", c.T, c.K, c.N, c.out)
		t.Run(name, func(t *testing.T) {
			xq, xs, xv := quantE4M3(randv(c.T * c.K))
			wq, ws, wv := quantE4M3(randv(c.N * c.K))
			px, pw := upload(t, d, bytesU16(xq)), upload(t, d, bytesU16(wq))
			pxs, pws := upload(t, d, xs), upload(t, d, ws)
			ob := make([]byte, c.T*c.N*c.out.Size())
			po, err := d.Alloc(len(ob))
			must(t, err)
			defer d.Free(po)
			must(t, d.Memset8(po, 0xff, len(ob), nil))
			mm := Matmul{T: c.T, K: c.K, N: c.N, In: F8E4M3, Out: c.out, X: px, W: pw, Dst: po, XScale: pxs, WScale: pws}
			if err := lt.Matmul(mm); err != nil {
				// cuBLASLt may refuse a shape (an odd N on the H200,
				// 2026-11-25: "the requested functionality is not
				// supported"); the refusal must be an error naming it.
				if c.N%2 == 1 && strings.Contains(err.Error(), fmt.Sprintf("N=%d", c.N)) {
					t.Logf("%s: refused: %v", name, err)
					return
				}
				t.Fatal(err)
			}
			must(t, d.Sync())
			must(t, d.Download(ob, po))
			e := relErr(decode(c.out, ob), ref(xv, wv, nil, c.T, c.K, c.N))
			t.Logf("%s: ‖out−ref‖/‖ref‖ = %.3g (tolerance 1e-2)", name, e)
			if !(e <= 1e-2) {
				t.Fatalf("relative error %.3g over 1e-2", e)
			}
		})
	}

	for _, c := range []struct {
		what string
		m    Matmul
	}{
		{"no scales", Matmul{T: 1, K: 16, N: 1, In: F8E4M3, Out: BF16, X: 1, W: 1, Dst: 1}},
		{"K 24", Matmul{T: 1, K: 24, N: 1, In: F8E4M3, Out: BF16, X: 1, W: 1, Dst: 1, XScale: 16, WScale: 16}},
		{"f8 output", Matmul{T: 1, K: 16, N: 1, In: F8E4M3, Out: F8E4M3, X: 1, W: 1, Dst: 1, XScale: 16, WScale: 16}},
		{"f32 output", Matmul{T: 1, K: 16, N: 1, In: F8E4M3, Out: F32, X: 1, W: 1, Dst: 1, XScale: 16, WScale: 16}},
		{"scale off by 4", Matmul{T: 1, K: 16, N: 1, In: F8E4M3, Out: BF16, X: 1, W: 1, Dst: 1, XScale: 16, WScale: 20}},
		{"scales on bf16", Matmul{T: 1, K: 16, N: 1, In: BF16, Out: BF16, X: 1, W: 1, Dst: 1, XScale: 16, WScale: 16}},
		{"dtype 9", Matmul{T: 1, K: 16, N: 1, In: 9, Out: BF16, X: 1, W: 1, Dst: 1}},
	} {
		if err := lt.Matmul(c.m); err == nil || !strings.HasPrefix(err.Error(), "cublasLt: ") {
			t.Errorf("%s: err %v, want a refusal", c.what, err)
		}
	}
}

// TestBlasLtFP8Speed times the products of a Llama-3-8B layer in bf16 and
// in FP8 with per-tensor scales (the fastest of cuBLASLt's candidates each),
// at 2048 rows (prefill) and 256 (batched decode), and logs the ratio (a
// figure, not a check; docs/PERF.md).
func TestBlasLtFP8Speed(t *testing.T) {
	d := gpu(t)
	if testing.Short() {
		t.Skip("short")
	}
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()
	timeMs := func(mm Matmul) (float64, error) {
		cands, err := lt.Algorithms(mm)
		if err != nil {
			return 0, err
		}
		best := math.Inf(1)
		for a := range cands {
			m := mm
			m.Algo = a
			if err := lt.Matmul(m); err != nil {
				return 0, err
			}
			best = min(best, medianMs(t, d, 5, 10, func() error { return lt.Matmul(m) }))
		}
		return best, nil
	}
	shapes := []struct {
		name string
		K, N int
	}{{"Q/K/V", 4096, 6144}, {"output", 4096, 4096}, {"gate/up", 4096, 28672}, {"down", 14336, 4096}}
	// Buffers for the largest operand of each role, filled with small
	// values (the timing does not depend on them).
	const maxT, maxKN = 2048, 4096 * 28672 * 2
	px, pw, po := alloc(t, d, maxT*14336*2), alloc(t, d, maxKN), alloc(t, d, maxT*28672*2)
	must(t, d.Memset32(px, 0x3c003c00, maxT*14336/2, nil))
	must(t, d.Memset32(pw, 0x3c003c00, maxKN/4, nil))
	ps := alloc(t, d, 28672*4)
	must(t, d.Memset32(ps, math.Float32bits(1e-3), 28672, nil))
	var lines []string
	for _, rows := range []int{2048, 256} {
		var sum [2]float64 // bf16, FP8
		for _, sh := range shapes {
			flop := 2 * float64(rows) * float64(sh.K) * float64(sh.N)
			line := fmt.Sprintf("| %d | %s (%d, %d) |", rows, sh.name, sh.K, sh.N)
			var ms [2]float64
			for i, m := range []Matmul{
				{T: rows, K: sh.K, N: sh.N, In: BF16, Out: BF16, X: px, W: pw, Dst: po},
				{T: rows, K: sh.K, N: sh.N, In: F8E4M3, Out: BF16, X: px, W: pw, Dst: po, XScale: ps, WScale: ps},
			} {
				v, err := timeMs(m)
				must(t, err)
				ms[i] = v
				sum[i] += v
				line += fmt.Sprintf(" %.1f µs, %.0f TFLOP/s |", v*1e3, flop/(v*1e-3)/1e12)
			}
			lines = append(lines, line+fmt.Sprintf(" %.2f× |", ms[0]/ms[1]))
		}
		lines = append(lines, fmt.Sprintf("| %d | the layer's four | %.1f µs | %.1f µs | %.2f× |", rows, sum[0]*1e3, sum[1]*1e3, sum[0]/sum[1]))
	}
	t.Logf("device %s; bf16 against FP8 (E4M3, per-tensor scales, fast accumulation), bf16 out:\n"+
		"| rows | product (K, N) | bf16 | FP8 | bf16 ÷ FP8 time |\n|---|---|---|---|---|\n%s",
		d.Name, strings.Join(lines, "\n"))
}

// alloc allocates n bytes, freed at the end of the test.
func alloc(t *testing.T, d *Device, n int) Ptr {
	t.Helper()
	p, err := d.Alloc(n)
	must(t, err)
	t.Cleanup(func() { d.Free(p) })
	return p
}
