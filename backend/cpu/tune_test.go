package cpu

import (
	"math/rand/v2"
	"strings"
	"testing"

	"kiln/backend/cpu/gemm"
	"kiln/backend/cpu/workers"
	"kiln/tensor"
	"kiln/tune"
)

// TestTuneProducts: kiln tune's races on a float and a block-format matrix
// file one entry a family and shape (the default or a tiling that beat
// it), every candidate verified; a backend with the cache binds those
// matrices with the tilings kept, one with tune.Off or the reference
// kernels with the default; the cache's names read back and a malformed or
// unrunnable one is refused.
func TestTuneProducts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) []float32 {
		f := make([]float32, n)
		for i := range f {
			f[i] = float32(r.NormFloat64())
		}
		return f
	}
	var ts []*tensor.Tensor
	for _, c := range []struct {
		name string
		dt   tensor.DType
	}{{"a", tensor.BF16}, {"b", tensor.Q4_K}} {
		tt, err := tensor.Encode(c.name, tensor.Shape{48, 512}, c.dt, rnd(48*512))
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tt)
	}
	ws, err := TuneWeights(ts)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := tune.Open(dir, TuneDevice())
	if err != nil {
		t.Fatal(err)
	}
	p := workers.New(2)
	defer p.Close()
	var lines []string
	res, err := TuneProducts(p, append(ws, ws[0]), 6, c, nil, func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatal(err)
	}
	// bf16: grain and prefill; Q4_K: grain; the repeated matrix not again.
	if len(res) != 3 || c.Len() != 3 || len(lines) != 3 {
		t.Fatalf("%d results, %d entries, %d lines:\n%s", len(res), c.Len(), len(lines), strings.Join(lines, "\n"))
	}
	for _, e := range res {
		if len(e.Rejected) != 0 || e.Tried < 5 || !(e.ChoiceUs > 0) || !(e.DefaultUs > 0) {
			t.Errorf("%v: %+v", e.Key, e)
		}
	}
	bind := func(b *Backend) []gemm.Tiling {
		l := &loaded{backend: b, pool: p}
		var got []gemm.Tiling
		for _, tt := range ts {
			w, err := l.matrix(tt)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, w.Tiling)
		}
		return got
	}
	got := bind(&Backend{TuneDir: dir})
	for i, w := range ws {
		if want := cachedTiling(c, w, 2); got[i] != want {
			t.Errorf("%s bound with tiling %+v, want the cache's %+v", ts[i].Name, got[i], want)
		}
	}
	for _, b := range []*Backend{{TuneDir: dir, Tune: tune.Off}, {TuneDir: dir, Reference: true}} {
		for i, tl := range bind(b) {
			if tl != (gemm.Tiling{}) {
				t.Errorf("%+v: %s bound with %+v", b, ts[i].Name, tl)
			}
		}
	}
	for _, tl := range []gemm.Tiling{gemm.DefaultTiling, {UnitRows: 32, UnitTokens: 96, KBlock: 512, GrainBytes: 1 << 20}} {
		if back, ok := parseTiling(tilingName(tl)); !ok || back != tl {
			t.Errorf("%+v read back as %+v, %v", tl, back, ok)
		}
	}
	for _, bad := range []string{"", "rows 6, tokens 48, kblock 1024, grain 65536", "rows 64, tokens 48, kblock 1024, grain 65536 more", "grain 1"} {
		if _, ok := parseTiling(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}
