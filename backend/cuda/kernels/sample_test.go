package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"kiln/backend/cuda/cu"
)

// sampleTol is the draw's tolerated closeness to a boundary of the chosen
// candidate's interval, relative to the total mass: within it, float64
// rounding in the CPU's sums may pick a neighbour, and a mismatch is
// counted, not failed.
const sampleTol = 1e-6

type refCand struct {
	id int32
	p  float32 // logit, then probability
}

func refByLogitDesc(a, b refCand) int {
	switch {
	case a.p > b.p:
		return -1
	case a.p < b.p:
		return 1
	}
	return int(a.id - b.id)
}

// refArgmax mirrors engine.Argmax.
func refArgmax(l []float32) int {
	best := 0
	for i, v := range l {
		if v > l[best] || (l[best] != l[best] && v == v) {
			best = i
		}
	}
	return best
}

type refResult struct {
	id      int
	drawAmb bool // the draw lies within sampleTol·total of a boundary (or fell through)
	toppAmb bool // top-p's cumulative sum came within 1e-9 of top_p at the cut
}

// refSample mirrors engine.Sampler.Sample and penalize (engine/sample.go)
// line by line, with the penalty state given as history entries and the
// draw's uniform number sp.U given instead of drawn from the sampler's
// generator. It also reports how close the decisions that depend on float64
// sums came to going the other way.
func refSample(row []float32, sp SampleParams, hist []HistoryEntry) refResult {
	seen := make([]bool, len(row))
	outCount := make([]int32, len(row))
	banned := make([]bool, len(row))
	for _, e := range hist {
		seen[e.ID], outCount[e.ID], banned[e.ID] = e.Seen, e.Count, e.Banned
	}
	l := slices.Clone(row)
	// penalize
	rep := float32(sp.RepetitionPenalty)
	freq, pres := float32(sp.FrequencyPenalty), float32(sp.PresencePenalty)
	if !((rep == 0 || rep == 1) && freq == 0 && pres == 0) {
		for i := range l {
			if rep != 0 && rep != 1 && seen[i] {
				if l[i] > 0 {
					l[i] /= rep
				} else {
					l[i] *= rep
				}
			}
			if n := outCount[i]; n > 0 {
				l[i] -= float32(freq*float32(n)) + pres // the conversion forbids a fused multiply-add, as on amd64
			}
		}
	}
	for i, b := range banned {
		if b {
			l[i] = float32(math.Inf(-1))
		}
	}
	if sp.Temperature == 0 {
		return refResult{id: refArgmax(l)}
	}
	inv := float32(1 / sp.Temperature)
	c := make([]refCand, 0, len(l))
	for i, v := range l {
		c = append(c, refCand{id: int32(i), p: v * inv})
	}
	if sp.TopK > 0 && sp.TopK < len(c) {
		slices.SortFunc(c, refByLogitDesc)
		c = c[:sp.TopK]
	}
	// Softmax over the survivors.
	maxL := float32(math.Inf(-1))
	for _, x := range c {
		maxL = max(maxL, x.p)
	}
	var sum float64
	for i := range c {
		e := math.Exp(float64(c[i].p - maxL))
		c[i].p = float32(e)
		sum += e
	}
	for i := range c {
		c[i].p = float32(float64(c[i].p) / sum)
	}
	var res refResult
	if sp.TopP > 0 && sp.TopP < 1 {
		slices.SortFunc(c, refByLogitDesc)
		var cum float64
		keep := len(c)
		for i, x := range c {
			prev := cum
			cum += float64(x.p)
			if cum >= sp.TopP {
				keep = i + 1
				res.toppAmb = cum-sp.TopP <= 1e-9 || sp.TopP-prev <= 1e-9
				break
			}
		}
		if keep == len(c) && math.Abs(cum-sp.TopP) <= 1e-9 {
			res.toppAmb = true
		}
		c = c[:keep]
	}
	if sp.MinP > 0 {
		var top float32
		for _, x := range c {
			top = max(top, x.p)
		}
		cut := float32(sp.MinP) * top
		kept := c[:0]
		for _, x := range c {
			if x.p >= cut {
				kept = append(kept, x)
			}
		}
		c = kept
	}
	var total float64
	for _, x := range c {
		total += float64(x.p)
	}
	r := sp.U * total
	tol := sampleTol * total
	for _, x := range c {
		before := r
		r -= float64(x.p)
		if r < 0 {
			res.id = int(x.id)
			res.drawAmb = before < tol || -r < tol
			return res
		}
	}
	res.id, res.drawAmb = int(c[len(c)-1].id), true
	return res
}

// sampleSets are the parameter sets of the test; each row takes one, with
// its own u.
var sampleSets = []struct {
	name    string
	p       SampleParams
	pen     bool // random history
	halfK   bool // top-k vocab/2
	nanRows bool // greedy: NaN logits in some rows
}{
	{name: "greedy", nanRows: true},
	{name: "greedy+penalties", p: SampleParams{RepetitionPenalty: 1.3, FrequencyPenalty: 0.5, PresencePenalty: 0.3}, pen: true, nanRows: true},
	{name: "temperature 0.7", p: SampleParams{Temperature: 0.7}},
	{name: "temperature 1", p: SampleParams{Temperature: 1}},
	{name: "top-k 1", p: SampleParams{Temperature: 0.8, TopK: 1}},
	{name: "top-k 5", p: SampleParams{Temperature: 1, TopK: 5}},
	{name: "top-k 50", p: SampleParams{Temperature: 0.9, TopK: 50}},
	{name: "top-k vocab/2", p: SampleParams{Temperature: 1.5}, halfK: true},
	{name: "top-p 0.5", p: SampleParams{Temperature: 1, TopP: 0.5}},
	{name: "top-p 0.9", p: SampleParams{Temperature: 0.8, TopP: 0.9}},
	{name: "top-p 0.99", p: SampleParams{Temperature: 1.5, TopP: 0.99}},
	{name: "min-p 0.05", p: SampleParams{Temperature: 1, MinP: 0.05}},
	{name: "top-k 100 min-p 0.1", p: SampleParams{Temperature: 1.2, TopK: 100, MinP: 0.1}},
	{name: "top-k 50 top-p 0.9 min-p 0.05", p: SampleParams{Temperature: 0.8, TopK: 50, TopP: 0.9, MinP: 0.05}},
	{name: "penalties", p: SampleParams{Temperature: 0.9, RepetitionPenalty: 1.2, FrequencyPenalty: 0.4, PresencePenalty: 0.2}, pen: true},
	{name: "penalties top-k 40 top-p 0.95", p: SampleParams{Temperature: 0.9, TopK: 40, TopP: 0.95, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2, PresencePenalty: 0.5}, pen: true},
	{name: "negative penalties top-p 0.9 min-p 0.02", p: SampleParams{Temperature: 1, TopP: 0.9, MinP: 0.02, RepetitionPenalty: 0.8, FrequencyPenalty: -0.5, PresencePenalty: -0.3}, pen: true},
}

// sampleBatch is one test batch of rows over one vocabulary.
type sampleBatch struct {
	vocab, rows int
	logits      []float32 // [rows, vocab]
	params      []SampleParams
	hist        [][]HistoryEntry
	desc        []string
}

// genSampleBatch makes perSet rows of each parameter set, with fresh logits
// of four kinds in turn: normal (random scale), quantized to a few values
// (ties), normal with -Inf entries, quantized with -Inf entries; some greedy
// rows hold NaN, and some hold only -Inf and one NaN.
func genSampleBatch(rng *rand.Rand, vocab, perSet int) *sampleBatch {
	b := &sampleBatch{vocab: vocab}
	for _, set := range sampleSets {
		for k := 0; k < perSet; k++ {
			row := make([]float32, vocab)
			kind := k % 4
			if kind == 1 || kind == 3 {
				levels, step := 2+rng.IntN(5), 0.5+2*rng.Float64()
				for i := range row {
					row[i] = float32(float64(rng.IntN(levels)) * step)
				}
			} else {
				scale := 0.5 + 5.5*rng.Float64()
				for i := range row {
					row[i] = float32(rng.NormFloat64() * scale)
				}
			}
			if kind >= 2 {
				finite := 0
				for i := range row {
					if rng.IntN(10) < 3 {
						row[i] = float32(math.Inf(-1))
					} else {
						finite++
					}
				}
				if finite == 0 {
					row[rng.IntN(vocab)] = 0
				}
			}
			nans := 0
			if set.nanRows && k%4 == 2 { // no number above -Inf
				for i := range row {
					row[i] = float32(math.Inf(-1))
				}
				row[rng.IntN(vocab)] = float32(math.NaN())
				nans = 1
			}
			if set.nanRows && k%2 == 1 {
				nans = 1 + rng.IntN(3)
				for j := 0; j < nans; j++ {
					i := rng.IntN(vocab)
					if j == 0 && k%4 == 1 {
						i = 0
					}
					row[i] = float32(math.NaN())
				}
			}
			p := set.p
			if set.halfK {
				p.TopK = max(vocab/2, 1)
			}
			p.U = rng.Float64()
			var h []HistoryEntry
			if set.pen {
				n := 1 + rng.IntN(min(vocab, 300))
				ids := rng.Perm(vocab)[:n]
				if rng.IntN(2) == 0 { // the row's top tokens too, so that penalties move the maximum
					top := make([]int, 0, 3)
					for i := range row {
						top = append(top, i)
						slices.SortFunc(top, func(a, b int) int { return refByLogitDesc(refCand{int32(a), row[a]}, refCand{int32(b), row[b]}) })
						top = top[:min(len(top), 3)]
					}
					for _, t := range top {
						if !slices.Contains(ids, t) {
							ids = append(ids, t)
						}
					}
				}
				for _, id := range ids {
					cnt := int32(rng.IntN(4))
					h = append(h, HistoryEntry{ID: int32(id), Count: cnt, Seen: cnt > 0 || rng.IntN(2) == 0})
				}
			}
			// Stop tokens banned before min_tokens: on rows without -Inf or
			// NaN, up to three of the row's largest logits (merged with
			// the penalties' entries when there are some), so that a ban
			// moves the choice.
			if kind < 2 && nans == 0 && vocab > 4 && rng.IntN(3) == 0 {
				top := make([]int, vocab)
				for i := range top {
					top[i] = i
				}
				slices.SortFunc(top, func(a, b int) int { return refByLogitDesc(refCand{int32(a), row[a]}, refCand{int32(b), row[b]}) })
				for _, id := range top[:1+rng.IntN(3)] {
					if at := slices.IndexFunc(h, func(e HistoryEntry) bool { return e.ID == int32(id) }); at >= 0 {
						h[at].Banned = true
					} else {
						h = append(h, HistoryEntry{ID: int32(id), Banned: true})
					}
				}
			}
			b.logits = append(b.logits, row...)
			b.params = append(b.params, p)
			b.hist = append(b.hist, h)
			b.desc = append(b.desc, fmt.Sprintf("%s, logits kind %d, %d NaN, %d history entries, u %.17g", set.name, kind, nans, len(h), p.U))
			b.rows++
		}
	}
	return b
}

type sampleStats struct {
	rows, exact          int
	drawAmb, drawAmbMiss int
	toppAmb, toppAmbMiss int
	mismatch, badID      int
}

func (s *sampleStats) add(o sampleStats) {
	s.rows += o.rows
	s.exact += o.exact
	s.drawAmb += o.drawAmb
	s.drawAmbMiss += o.drawAmbMiss
	s.toppAmb += o.toppAmb
	s.toppAmbMiss += o.toppAmbMiss
	s.mismatch += o.mismatch
	s.badID += o.badID
}

func (s sampleStats) String() string {
	return fmt.Sprintf("%d rows: %d identical; draw within %.0e of a boundary: %d (%d of them differ); top-p sum within 1e-9 of the cut: %d (%d differ); other mismatches: %d; ids unwritten or out of range: %d",
		s.rows, s.exact, sampleTol, s.drawAmb, s.drawAmbMiss, s.toppAmb, s.toppAmbMiss, s.mismatch, s.badID)
}

// checkSampleBatch compares got with the CPU reference, row by row: every id
// written and in range, identical to the reference unless the reference
// marks the row ambiguous.
func checkSampleBatch(t testing.TB, b *sampleBatch, got []int32) sampleStats {
	t.Helper()
	refs := make([]refResult, b.rows)
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for r := range next {
				refs[r] = refSample(b.logits[r*b.vocab:(r+1)*b.vocab], b.params[r], b.hist[r])
			}
		})
	}
	for r := range b.rows {
		next <- r
	}
	close(next)
	wg.Wait()
	st := sampleStats{rows: b.rows}
	for r, ref := range refs {
		g := int(got[r])
		switch {
		case g < 0 || g >= b.vocab:
			st.badID++
			t.Errorf("vocab %d row %d (%s): id %d not written or out of range", b.vocab, r, b.desc[r], g)
			continue
		case g == ref.id:
			st.exact++
		}
		if ref.drawAmb {
			st.drawAmb++
		}
		if ref.toppAmb {
			st.toppAmb++
		}
		if g == ref.id {
			continue
		}
		switch {
		case ref.toppAmb:
			st.toppAmbMiss++
		case ref.drawAmb:
			st.drawAmbMiss++
		default:
			st.mismatch++
			if st.mismatch <= 10 {
				t.Errorf("vocab %d row %d (%s): got id %d, want %d", b.vocab, r, b.desc[r], g, ref.id)
			}
		}
	}
	return st
}

var sampleVocabs = []struct{ vocab, perSet int }{{1, 8}, {7, 8}, {1000, 8}, {32000, 4}, {128256, 4}}

func TestSample(t *testing.T) {
	d := gpu(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %#x", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t0 := time.Now()
	s, err := NewSampler(d)
	if err != nil {
		t.Fatalf("compile the sampling kernel: %v", err)
	}
	defer s.Close()
	t.Logf("sampling kernel for %s (%s): %v, cubin %v, from cache %v", d.Name, d.Arch(), time.Since(t0), s.M.Cubin, s.M.Hit)
	var all sampleStats
	for _, v := range sampleVocabs {
		b := genSampleBatch(rng, v.vocab, v.perSet)
		logits := up(t, cu.F32, b.logits)
		ids := alloc(t, 4*b.rows)
		must(t, d.Memset32(ids, 0xffffffff, b.rows, nil))
		must(t, s.Sample(nil, logits, b.rows, b.vocab, b.params, b.hist, ids))
		must(t, d.Sync())
		raw := make([]int32, b.rows)
		must(t, d.Download(cu.AsBytes(raw), ids))
		st := checkSampleBatch(t, b, raw)
		t.Logf("vocab %6d: %v", b.vocab, st)
		all.add(st)

		// The logits are left as they were.
		after := down(t, cu.F32, logits, b.rows*b.vocab)
		for i, x := range after {
			if math.Float32bits(x) != math.Float32bits(b.logits[i]) {
				t.Fatalf("vocab %d: logit %d changed from %v to %v", b.vocab, i, b.logits[i], x)
			}
		}
		// SampleIDs gives the same ids (the kernel is deterministic).
		again, err := s.SampleIDs(nil, logits, b.rows, b.vocab, b.params, b.hist, nil)
		must(t, err)
		if !slices.Equal(again, raw) {
			t.Errorf("vocab %d: SampleIDs differs from Sample", b.vocab)
		}
	}
	t.Logf("all: %v", all)
	if all.mismatch > 0 || all.badID > 0 {
		t.Errorf("%d mismatches outside the tolerance, %d bad ids", all.mismatch, all.badID)
	}
}

func TestSampleRejects(t *testing.T) {
	mark := make([]uint64, 1)
	bad := []struct {
		p SampleParams
		h []HistoryEntry
	}{
		{p: SampleParams{Temperature: -1}},
		{p: SampleParams{Temperature: math.NaN()}},
		{p: SampleParams{Temperature: 1, U: 1}},
		{p: SampleParams{Temperature: 1, TopK: -1}},
		{p: SampleParams{Temperature: 1, RepetitionPenalty: 1.2}, h: []HistoryEntry{{ID: 7}}},
		{p: SampleParams{Temperature: 1, RepetitionPenalty: 1.2}, h: []HistoryEntry{{ID: 3}, {ID: 3}}},
	}
	for _, c := range bad {
		if _, _, err := encodeSample(nil, 1, 7, []SampleParams{c.p}, [][]HistoryEntry{c.h}, mark); err == nil {
			t.Errorf("%+v %v accepted", c.p, c.h)
		}
		if mark[0] != 0 {
			t.Fatalf("marks left set: %#x", mark[0])
		}
	}
	// Penalties off but a token banned: the history is uploaded.
	buf, pen, err := encodeSample(nil, 1, 7, []SampleParams{{Temperature: 1}}, [][]HistoryEntry{{{ID: 3, Banned: true}}}, mark)
	if err != nil || !pen || len(buf) != sampleRowBytes+12 {
		t.Errorf("a banned token: %d bytes, penalty %v, %v", len(buf), pen, err)
	}
	// Penalties off: the history is not uploaded.
	buf, pen, err = encodeSample(nil, 1, 7, []SampleParams{{Temperature: 1, RepetitionPenalty: 1}}, [][]HistoryEntry{{{ID: 3, Count: 1}}}, mark)
	if err != nil || pen || len(buf) != sampleRowBytes {
		t.Errorf("penalties off: %d bytes, penalty %v, %v", len(buf), pen, err)
	}
}

// TestSampleTime logs the time of one Sample call at vocab 128256 (CUDA
// events, median of 20 calls).
func TestSampleTime(t *testing.T) {
	d := gpu(t)
	s, err := NewSampler(d)
	must(t, err)
	defer s.Close()
	rng := newRNG(t)
	const vocab = 128256
	sets := []struct {
		name string
		p    SampleParams
		pen  bool
	}{
		{"greedy", SampleParams{}, false},
		{"temperature 1", SampleParams{Temperature: 1}, false},
		{"top-k 50", SampleParams{Temperature: 0.8, TopK: 50}, false},
		{"top-p 0.9", SampleParams{Temperature: 0.8, TopP: 0.9}, false},
		{"top-k 50 top-p 0.9 min-p 0.05", SampleParams{Temperature: 0.8, TopK: 50, TopP: 0.9, MinP: 0.05}, false},
		{"top-k 2000 (beyond the compact path)", SampleParams{Temperature: 0.8, TopK: 2000}, false},
		{"penalties (256 entries) top-p 0.9", SampleParams{Temperature: 0.8, TopP: 0.9, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2, PresencePenalty: 0.2}, true},
	}
	// The fixed cost: the parameters' upload and the launch.
	one := up(t, cu.F32, []float32{0})
	ids1 := alloc(t, 4)
	ms := gpuTime(t, 1, 20, func(int) error { return s.Sample(nil, one, 1, 1, []SampleParams{{}}, nil, ids1) })
	t.Logf("sample  1 row  × 1 (fixed cost)                          %8.1f µs per call", ms*1000)
	for _, rows := range []int{1, 64} {
		logits := up(t, cu.F32, randn(rng, rows*vocab, 3))
		ids := alloc(t, 4*rows)
		for _, set := range sets {
			params := make([]SampleParams, rows)
			hist := make([][]HistoryEntry, rows)
			for r := range params {
				params[r] = set.p
				params[r].U = rng.Float64()
				if set.pen {
					for _, id := range rng.Perm(vocab)[:256] {
						hist[r] = append(hist[r], HistoryEntry{ID: int32(id), Count: int32(rng.IntN(3)), Seen: true})
					}
				}
			}
			ms := gpuTime(t, 1, 20, func(int) error { return s.Sample(nil, logits, rows, vocab, params, hist, ids) })
			t.Logf("sample %2d rows × %d, %-38s %8.1f µs per call", rows, vocab, set.name, ms*1000)
		}
	}
}
