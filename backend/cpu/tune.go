package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"kiln/backend/cpu/gemm"
	"kiln/backend/cpu/workers"
	"kiln/tensor"
	"kiln/tune"
)

// productWeights is matrix t in the form its products read: FP8 (E4M3)
// widened to bf16 with its scales (the CPU multiplies bf16 faster than it
// widens E4M3 codes, docs/PERF.md), block types with their rows
// interleaved by eights (gemm.PackRows8, as llama.cpp repacks them for its
// CPU kernels; the file's pages behind the blocks are then given back),
// others as stored.
func productWeights(t *tensor.Tensor) (gemm.Weights, error) {
	w := gemm.Weights{DType: t.DType, Data: t.Data, N: t.Shape[0], K: t.Shape[1]}
	if t.DType == tensor.F8_E4M3 {
		f, err := t.F32s() // codes times their scales
		if err != nil {
			return w, err
		}
		b, err := tensor.Encode(t.Name, t.Shape, tensor.BF16, f)
		if err != nil {
			return w, err
		}
		w.DType, w.Data = tensor.BF16, b.Data
	}
	if t.DType.Quantized() {
		w.Packed = gemm.PackRows8(w) // nil for the types it does not pack
		if w.Packed != nil && t.Release != nil {
			t.Release() // the products read the copy
		}
	}
	return w, nil
}

// matrix is productWeights with the tiling kiln tune found for its shape
// on this machine, if any.
func (l *loaded) matrix(t *tensor.Tensor) (gemm.Weights, error) {
	w, err := productWeights(t)
	if err != nil {
		return w, err
	}
	if c := l.tuneCache(); c != nil {
		w.Tiling = cachedTiling(c, w, l.pool.Size())
	}
	return w, nil
}

// tuneCache opens the backend's cache once (nil under tune.Off, or when it
// cannot be opened: the default tilings then run); what it skipped is
// written to standard error.
func (l *loaded) tuneCache() *tune.Cache {
	l.tuneOnce.Do(func() {
		if l.backend.Reference {
			return
		}
		var notes []string
		l.tuned, notes = tune.OpenMode(l.backend.Tune, l.backend.TuneDir, TuneDevice())
		for _, n := range notes {
			fmt.Fprintf(os.Stderr, "kiln: %s\n", n)
		}
	})
	return l.tuned
}

// TuneDevice identifies this machine's CPU for the tune cache: its model
// name, the architecture and whether the SIMD kernels run, the Go runtime
// and kiln's build.
func TuneDevice() tune.Device {
	name := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				name = strings.TrimSpace(v)
				break
			}
		}
	}
	arch := runtime.GOARCH
	if gemm.SIMD() {
		arch += " simd"
	}
	return tune.Device{Name: name, Arch: arch, Runtime: runtime.Version(), Kiln: tune.KilnVersion()}
}

// The tune cache's families of CPU tilings: the grain of the row groups
// (decode steps, and the block formats at any T), and the float formats'
// prefill units.
const (
	familyGrain   = "cpu product grain"
	familyPrefill = "cpu prefill tiling"
)

// tilingKey is the cache's key of w's products in family on threads
// workers.
func tilingKey(family string, w gemm.Weights, threads int) tune.Key {
	return tune.Key{Family: family, DType: w.DType.String(), Shape: fmt.Sprintf("K=%d N=%d threads=%d", w.K, w.N, threads)}
}

// tilingName names a tiling's fields for the cache.
func tilingName(t gemm.Tiling) string {
	return fmt.Sprintf("rows %d, tokens %d, kblock %d, grain %d", t.UnitRows, t.UnitTokens, t.KBlock, t.GrainBytes)
}

// parseTiling reads tilingName's form back, refusing one MatMul cannot run.
func parseTiling(s string) (gemm.Tiling, bool) {
	var t gemm.Tiling
	n, err := fmt.Sscanf(s, "rows %d, tokens %d, kblock %d, grain %d", &t.UnitRows, &t.UnitTokens, &t.KBlock, &t.GrainBytes)
	if err != nil || n != 4 || tilingName(t) != s || t.Check() != nil {
		return gemm.Tiling{}, false
	}
	return t, true
}

// cachedTiling is the tiling the cache holds for w's products on threads
// workers: the grain of its grain entry, the prefill fields of its
// prefill entry (the default for what it lacks).
func cachedTiling(c *tune.Cache, w gemm.Weights, threads int) gemm.Tiling {
	var t gemm.Tiling
	if e, ok := c.Get(tilingKey(familyGrain, w, threads)); ok {
		if g, ok := parseTiling(e.Choice); ok {
			t.GrainBytes = g.GrainBytes
		}
	}
	if e, ok := c.Get(tilingKey(familyPrefill, w, threads)); ok {
		if p, ok := parseTiling(e.Choice); ok {
			t.UnitRows, t.UnitTokens, t.KBlock = p.UnitRows, p.UnitTokens, p.KBlock
		}
	}
	return t
}

// TuneResult is one race of kiln tune: a product shape's family, the
// candidates' median times (µs a product) and the tiling kept.
type TuneResult struct {
	tune.Entry
	Tried int // candidates, the default included
}

// TuneProducts races tilings for the products of each distinct matrix
// shape of ws on p's workers and files the winners in c: for every format
// the grain of the row groups at one token (decode steps, the only ones
// that take it), and for the float formats the prefill units and k block
// at prefill tokens (which every product of more than one token takes). Each candidate is first
// checked against the default tiling's product on fresh random inputs
// (‖Δ‖₂ ≤ 1e-5·‖ref‖₂: the tilings change only the order of sums), then
// the candidates race (tune.Race: kept only if faster than the default in
// every timing but its own slowest) on copies of the matrix rotated past the caches, as
// a model's steps find their weights. Each candidate's check and timings
// run as trials of trials (nil: none), the journal of a tuner in a child
// process (tune.Supervise). progress receives a line a race.
func TuneProducts(p *workers.Pool, ws []gemm.Weights, prefill int, c *tune.Cache, trials *tune.Trials, progress func(string)) ([]TuneResult, error) {
	seen := map[tune.Key]bool{}
	var out []TuneResult
	for _, w := range ws {
		w.Tiling = gemm.Tiling{}
		races := []tilingRace{{familyGrain, 1, grainCandidates()}}
		if !w.DType.Quantized() && prefill > 1 {
			races = append(races, tilingRace{familyPrefill, prefill, prefillCandidates()})
		}
		var copies []gemm.Weights // made once for the matrix's races
		for _, r := range races {
			key := tilingKey(r.family, w, p.Size())
			if seen[key] {
				continue
			}
			seen[key] = true
			if copies == nil {
				copies = coldCopies(w, 256<<20)
			}
			res, ok := raceTilings(p, copies, r.T, r.cands, trialsOf(trials, key))
			if !ok {
				return out, fmt.Errorf("cpu: tune %v: no tiling ran", key)
			}
			res.Key = key
			out = append(out, res)
			if progress != nil {
				progress(fmt.Sprintf("%s %s %s: %d tried, %d rejected, kept %s: %.1f µs against the default's %.1f (noise %.1f)",
					key.Family, key.DType, key.Shape, res.Tried, len(res.Rejected), res.Choice, res.ChoiceUs, res.DefaultUs, res.NoiseUs))
			}
			if c != nil {
				if err := c.Put(res.Entry); err != nil {
					return out, err
				}
			}
		}
	}
	return out, nil
}

// trialsOf runs a candidate tiling of the choice under key as a trial of
// trials (journaled, so that a tiling that crashes the tuner's process is
// known to its supervisor), or refuses it when it crashed an earlier one.
func trialsOf(trials *tune.Trials, key tune.Key) func(c gemm.Tiling, f func()) error {
	return func(c gemm.Tiling, f func()) error {
		id := tune.TrialID(key, tilingName(c))
		if trials.Barred(id) {
			return tune.ErrBarred
		}
		end := trials.Begin(id)
		f()
		end(nil)
		return nil
	}
}

// tilingRace is one family's race for a matrix: its candidates (the
// default first) at T tokens.
type tilingRace struct {
	family string
	T      int
	cands  []gemm.Tiling
}

// grainCandidates are the row groups' grains tried (the default first).
func grainCandidates() []gemm.Tiling {
	d := gemm.DefaultTiling
	cs := []gemm.Tiling{d}
	for _, g := range []int{16 << 10, 32 << 10, 128 << 10, 256 << 10} {
		t := d
		t.GrainBytes = g
		cs = append(cs, t)
	}
	return cs
}

// prefillCandidates are the prefill tilings tried: the default, and each
// of its fields halved and doubled.
func prefillCandidates() []gemm.Tiling {
	d := gemm.DefaultTiling
	cs := []gemm.Tiling{d}
	for _, f := range []func(*gemm.Tiling, int){
		func(t *gemm.Tiling, m int) { t.UnitRows = d.UnitRows * m / 2 },
		func(t *gemm.Tiling, m int) { t.UnitTokens = d.UnitTokens * m / 2 },
		func(t *gemm.Tiling, m int) { t.KBlock = d.KBlock * m / 2 },
	} {
		for _, m := range []int{1, 4} {
			t := d
			f(&t, m)
			cs = append(cs, t)
		}
	}
	return cs
}

// raceTilings checks and races cands (cands[0] the default) for the
// product of T tokens by the matrix of copies (coldCopies: copies[0] the
// matrix itself); false when none ran.
func raceTilings(p *workers.Pool, copies []gemm.Weights, T int, cands []gemm.Tiling, trial func(c gemm.Tiling, f func()) error) (TuneResult, bool) {
	w := copies[0]
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w.N*w.K+T)))
	x := make([]float32, T*w.K)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ref := make([]float32, T*w.N)
	out := make([]float32, T*w.N)
	w.Tiling = cands[0]
	gemm.MatMul(p, ref, x, T, w)
	errs := make([]error, len(cands))
	for i, c := range cands[1:] {
		w.Tiling = c
		if err := trial(c, func() { gemm.MatMul(p, out, x, T, w) }); err != nil {
			errs[i+1] = err
			continue
		}
		if d := relDiff(out, ref); !(d <= 1e-5) {
			errs[i+1] = fmt.Errorf("‖Δ‖₂/‖ref‖₂ = %.3g against the default tiling's product", d)
		}
	}
	// The products read the copies of the weights in turn, more bytes than
	// the caches hold, so that each finds its weights in memory as a
	// model's step does; enough products a timing for about 20 ms.
	next := 0
	product := func(tl gemm.Tiling) {
		c := copies[next%len(copies)]
		next++
		c.Tiling = tl
		gemm.MatMul(p, out, x, T, c)
	}
	t0 := time.Now()
	product(cands[0])
	reps := max(1, int(20*time.Millisecond/max(time.Since(t0), time.Microsecond)))
	r := tune.Race(len(cands), func(i int) (float64, error) {
		if errs[i] != nil {
			return 0, errs[i]
		}
		var took time.Duration
		run := func() {
			t0 := time.Now()
			for range reps {
				product(cands[i])
			}
			took = time.Since(t0)
		}
		if i == 0 {
			run() // the default: no trial
		} else if err := trial(cands[i], run); err != nil {
			return 0, err
		}
		return float64(took.Nanoseconds()) / 1e3 / float64(reps), nil
	})
	if r.Best < 0 {
		return TuneResult{}, false
	}
	best := r.Best
	res := TuneResult{Entry: tune.Entry{Choice: tilingName(cands[best]), Default: tilingName(cands[0]),
		ChoiceUs: r.Median[best], DefaultUs: r.Median[0], NoiseUs: r.Noise, Tuned: time.Now().UTC()}, Tried: len(cands)}
	for i, err := range r.Errs {
		if err != nil {
			res.Rejected = append(res.Rejected, tilingName(cands[i])+": "+err.Error())
		}
	}
	return res, true
}

// TuneWeights is the product form (productWeights) of one matrix of each
// format and shape of ts, for TuneProducts.
func TuneWeights(ts []*tensor.Tensor) ([]gemm.Weights, error) {
	var ws []gemm.Weights
	type shape struct {
		dt   tensor.DType
		k, n int
	}
	seen := map[shape]bool{}
	for _, t := range ts {
		if len(t.Shape) != 2 || seen[shape{t.DType, t.Shape[1], t.Shape[0]}] {
			continue
		}
		seen[shape{t.DType, t.Shape[1], t.Shape[0]}] = true
		w, err := productWeights(t)
		if err != nil {
			return nil, fmt.Errorf("cpu: %s: %w", t.Name, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// coldCopies is w and copies of the bytes its products read (the
// interleaved rows where the SIMD kernels take them, else the rows as
// stored), at least total bytes in all (at most 64 copies).
func coldCopies(w gemm.Weights, total int) []gemm.Weights {
	packed := w.Packed != nil && gemm.SIMD()
	size := len(w.Data)
	if packed {
		size = len(w.Packed)
	}
	cs := []gemm.Weights{w}
	for len(cs) < 64 && len(cs)*max(1, size) < total {
		c := w
		if packed {
			c.Packed = slices.Clone(w.Packed)
		} else {
			c.Data = slices.Clone(w.Data)
		}
		cs = append(cs, c)
	}
	return cs
}

// relDiff is ‖a−b‖₂/‖b‖₂.
func relDiff(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		e := float64(a[i]) - float64(b[i])
		d += e * e
		n += float64(b[i]) * float64(b[i])
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}
