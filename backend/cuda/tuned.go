package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/tune"
)

// The choices timed at first use (GEMV or cuBLASLt and the tile kernels'
// split of K, cuBLASLt's algorithm, decode attention's plan) are kept in a
// tune.Cache filed under the device, so that a later start on the same
// kind of device takes them without timing again (Backend.Tune: the
// tune.Cached, tune.Off and tune.Full modes).

// TuneDevice identifies d for the cache: its name and compute capability,
// the driver API's version, and the NVRTC and cuBLASLt versions whose
// kernels and algorithms the choices name.
func TuneDevice(d *cu.Device) tune.Device {
	libs := cu.Loaded()
	return tune.Device{
		Name:    d.Name,
		Arch:    fmt.Sprintf("%d.%d", d.Major, d.Minor),
		Driver:  strconv.Itoa(libs.DriverVersion),
		Runtime: fmt.Sprintf("nvrtc %d.%d, cublasLt %d", libs.NVRTCVersion[0], libs.NVRTCVersion[1], libs.BlasLtVersion),
		Kiln:    tune.KilnVersion(),
	}
}

// tuneCache opens b's cache once (nil under tune.Off, or when it cannot be
// opened: the choices are then timed as without a cache); what it skipped
// and why are added to Stats.Choices.
func (b *Backend) tuneCache() *tune.Cache {
	b.tuneOnce.Do(func() {
		var notes []string
		b.tuned, notes = tune.OpenMode(b.Tune, b.TuneDir, TuneDevice(b.Device))
		if b.tuned != nil && b.tuneInMemory {
			b.tuned.KeepInMemory()
		}
		b.stats.Choices = append(b.stats.Choices, notes...)
	})
	return b.tuned
}

// cachedChoice returns the cache's choice for k when b takes cached
// choices (tune.Cached).
func (l *loaded) cachedChoice(k tune.Key) (string, bool) {
	c := l.b.tuneCache()
	if c == nil || l.b.Tune == tune.Full {
		return "", false
	}
	e, ok := c.Get(k)
	return e.Choice, ok
}

// keep files the choice a race made (r.Best among cands, which ran;
// cands[0] the default); a failed write is noted in Stats.Choices.
func (l *loaded) keep(k tune.Key, choice, def string, r raceResult, cands []candidate) {
	c := l.b.tuneCache()
	if c == nil {
		return
	}
	e := tune.Entry{Key: k, Choice: choice, Default: def, ChoiceUs: r.us(r.Best), NoiseUs: r.us(-1), Tuned: time.Now().UTC()}
	if r.Errs[0] == nil {
		e.DefaultUs = r.us(0) // else 0: the default failed (listed in Rejected)
	}
	for i, err := range r.Errs {
		if err != nil {
			e.Rejected = append(e.Rejected, fmt.Sprintf("%s: %v", cands[i].name, err))
		}
	}
	if err := c.Put(e); err != nil {
		l.b.stats.Choices = append(l.b.stats.Choices, fmt.Sprintf("tune cache: %v", err))
	}
}

// candidate is one way to run a step's operation, for race.
type candidate struct {
	name string
	run  func() error
	// check computes the result verify compares, when run computes more
	// (nil: run).
	check func() error
	// rejected is verify's verdict against the candidate (nil: none):
	// the race does not time it and records this as its error.
	rejected error
	// trial is its id in the journal of a tuner's trials (Backend.Trials;
	// "" for the default, which is not journaled: the step runs it anyway).
	trial string
	// id, when set, names it for the journal instead of name (a stable
	// identity where name is a place in a list).
	id string
}

// forTrials names cands' trials under the choice tk for Backend.Trials's
// journal (the default aside), and rejects those that killed an earlier
// tuner.
func (l *loaded) forTrials(tk tune.Key, cands []candidate) {
	for i := 1; i < len(cands); i++ {
		cands[i].trial = tune.TrialID(tk, cmp.Or(cands[i].id, cands[i].name))
		if l.b.Trials.Barred(cands[i].trial) {
			cands[i].rejected = rejection(tune.ErrBarred.Error())
		}
	}
}

// trial runs f, a candidate's check or timing, as trial id of
// Backend.Trials: journaled, and when f's error says the device is lost,
// the end of the process with the trial open.
func (l *loaded) trial(id string, f func() error) error {
	end := l.b.Trials.Begin(id)
	err := f()
	if cu.ContextLost(err) {
		end(err) // ends the process, the trial left open
	} else {
		end(nil)
	}
	return err
}

// checker is what verify runs of c.
func (c candidate) checker() func() error {
	if c.check != nil {
		return c.check
	}
	return c.run
}

// raceResult is tune.Race's result over candidates timed by timeOn (ms of
// its 5 runs).
type raceResult struct{ tune.Result }

// race races cands on the stream (tune.Race: cands[0] the default, kept
// unless another beats it in every timing but its own slowest), each
// timing one timeOn; a
// candidate verify rejected fails without running.
func (l *loaded) race(cands []candidate) raceResult {
	r := raceResult{tune.Race(len(cands), func(i int) (float64, error) {
		if err := cands[i].rejected; err != nil {
			return 0, err
		}
		var ms float32
		err := l.trial(cands[i].trial, func() (err error) {
			ms, err = l.timeOn(cands[i].run)
			return err
		})
		return float64(ms), err
	})}
	l.b.races.Add(1)
	l.b.stats.Raced.Candidates += len(cands)
	for _, err := range r.Errs {
		if err != nil {
			l.b.stats.Raced.Rejected++
		}
	}
	return r
}

// us is candidate i's median time a run in µs (i = -1: the noise).
func (r raceResult) us(i int) float64 {
	if i < 0 {
		return r.Noise * 1e3 / 5
	}
	return r.Median[i] * 1e3 / 5
}

// line lists the candidates' times (µs a run) and the noise for
// Stats.Choices.
func (r raceResult) line(cands []candidate) string {
	var b strings.Builder
	for i, c := range cands {
		if r.Errs[i] != nil {
			fmt.Fprintf(&b, " %s failed (%v),", c.name, r.Errs[i])
			continue
		}
		fmt.Fprintf(&b, " %s %.1f µs,", c.name, r.us(i))
	}
	return fmt.Sprintf("%s (medians of %d interleaved rounds, noise %.1f µs)", strings.TrimSuffix(b.String(), ","), tune.Rounds, r.us(-1))
}

// racedWays are the ways of a vector product of t rows that its race
// times: ways (the GEMV's, kernels.VectorWays), but at one row the CUDA
// cores' alone. A race times each way back to back, and at one row the
// tensor cores' kernel won some of them by less than a microsecond (the
// Llama-3-8B shape's output projection on an H200, also when each run
// followed a 4 µs kernel bound by latency: docs/attempts/race-after-latency.diff),
// yet lost inside every step measured: every product of the model at one
// row on tensor cores gave 223–224 tokens/s against the CUDA cores'
// 237–238 (TP=2: 370 against 377–379), and the output projection alone
// on tensor cores, as the races kept it, 229–233 (docs/PERF.md, Tensor
// parallelism, session 35).
func racedWays(ways []string, t int) []string {
	if t == 1 && slices.Contains(ways, kernels.WayCUDACores) {
		return []string{kernels.WayCUDACores}
	}
	return ways
}

// raceGEMV decides how product mm (with ep, the reader the GEMV can run
// in its epilogue) runs, for up to rows rows: cuBLASLt with the algorithm
// it would run (followed by ep's own kernel) is the default, raced against
// the GEMV where it fits (in the tile kernels, each split of K; with ep
// in its epilogue) and the external kernels that take the product
// (followed by ep's own kernel). All ways write what the step writes. It
// sets the tile kernels' split kept, notes the race in Stats.Choices and
// files it in the tune cache under tk. Before the race, each way's plain
// product is checked against cuBLASLt's (verifyProduct).
func (l *loaded) raceGEMV(x *stepState, mm cu.Matmul, rows int, fits bool, ep *node, tk tune.Key) productWay {
	f32 := mm.Out == cu.F32
	lt := mm
	lt.Algo = l.algorithm(x, mm)
	fused := ep != nil && fits
	if fused {
		// The GEMV takes the epilogue for this shape, or the race is between
		// the plain products.
		err := l.gemvEpilogue(x, ep, mm, 0)
		if errors.Is(err, kernels.ErrGEMVShape) {
			fused = false
		}
	}
	// then runs product, and ep's own kernel after it when the GEMV
	// would take ep.
	then := func(product func() error) func() error {
		if ep == nil {
			return product
		}
		return func() error {
			if err := product(); err != nil {
				return err
			}
			return ep.launch(x, ep)
		}
	}
	product := func() error { return l.lt.Matmul(lt) }
	cands := []candidate{{name: "cuBLASLt", run: product}}
	if ep != nil {
		cands[0] = candidate{name: "cuBLASLt + " + ep.kernel, run: then(product), check: product}
	}
	var splits []int
	if fits {
		splits = l.gemv.TileSplits(mm.T, mm.K, mm.N)
	}
	// plain is the GEMV's plain product with K split s ways (0: the
	// vector kernels'), which verify checks for a fused candidate too:
	// the kernels package's tests (TestGEMVSwiGLU, TestGEMVRoPEQKV) hold
	// each fused epilogue to the plain product followed by its reader's
	// kernel bit for bit, and a plain product sets no split, nor writes
	// the KV cache as the RoPE epilogue does.
	plain := func(s int) func() error {
		return func() error {
			if s > 0 {
				return l.gemv.RunTileSplits(l.stream, s, mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, f32)
			}
			return l.gemv.Run(l.stream, mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N, f32)
		}
	}
	gemv := func(s int) candidate {
		name := "gemv"
		if s > 0 {
			name = fmt.Sprintf("gemv K split %d", s)
		}
		switch {
		case fused:
			return candidate{name: name, run: func() error {
				if s > 0 {
					l.gemv.SetTileSplits(mm.T, mm.K, mm.N, s)
				}
				return l.gemvEpilogue(x, ep, mm, 0)
			}, check: plain(s)}
		case ep != nil:
			return candidate{name: name, run: then(plain(s)), check: plain(s)}
		}
		return candidate{name: name, run: plain(s)}
	}
	// A vector product (no tile splits) races its ways, the default way
	// first (kernels.VectorWays); each candidate sets its way before it
	// runs, as the tile candidates their split.
	var ways []string
	if fits && len(splits) == 0 {
		ways = racedWays(l.gemv.VectorWays(mm.T), mm.T)
		for i, w := range ways {
			c := gemv(0)
			if i > 0 {
				c.name = "gemv on " + w
			}
			c.run, c.check = withWay(l.gemv, mm, w, c.run), withWay(l.gemv, mm, w, c.checker())
			cands = append(cands, c)
		}
	}
	for _, s := range splits {
		cands = append(cands, gemv(s))
	}
	gemvs := len(cands) // cands[1:gemvs] the GEMV's, then the external kernels
	exts := l.externalsFor(mm, rows)
	for _, e := range exts {
		run := func() error { return e.Run(l.stream, mm.Dst, mm.X, mm.W, mm.T, mm.K, mm.N) }
		cands = append(cands, candidate{name: e.Spec.ChoiceName(), run: then(run), check: run})
	}
	l.forTrials(tk, cands)
	l.verifyProduct(mm, cands)
	// The fused candidates set the split their launch takes, and the
	// vector candidates their way; the race must leave the split or way it
	// found (products of the same shape share them), or the one set before.
	was, wasSet := l.gemv.TileSplit(mm.T, mm.K, mm.N)
	wasWay, wasWaySet := l.gemv.VectorWay(mm.T, mm.K, mm.N)
	r := l.race(cands)
	if l.b.Products == "external" {
		// Forced: the first external kernel that passed its check.
		for i := gemvs; i < len(cands); i++ {
			if cands[i].rejected == nil && r.Errs[i] == nil {
				r.Best = i
				break
			}
		}
	}
	var way productWay
	var choice gemvChoice
	switch {
	case r.Best >= gemvs:
		way.ext = exts[r.Best-gemvs]
	case r.Best > 0:
		way.gemv, choice.use = true, true
		if len(splits) > 0 {
			choice.split = splits[r.Best-1]
		} else if r.Best > 1 {
			choice.way = ways[r.Best-1] // not the default way
		}
	}
	if len(ways) > 0 {
		switch {
		case choice.use:
			l.gemv.SetVectorWay(mm.T, mm.K, mm.N, cmp.Or(choice.way, ways[0]))
		case wasWaySet:
			l.gemv.SetVectorWay(mm.T, mm.K, mm.N, wasWay)
		default:
			l.gemv.ForgetVectorWay(mm.T, mm.K, mm.N)
		}
	}
	split := choice.split
	switch {
	case split > 0:
		l.gemv.SetTileSplits(mm.T, mm.K, mm.N, split)
	case wasSet:
		l.gemv.SetTileSplits(mm.T, mm.K, mm.N, was)
	default:
		l.gemv.ForgetTileSplits(mm.T, mm.K, mm.N)
	}
	what := ""
	if ep != nil {
		what = " with " + ep.kernel
	}
	kept := "cuBLASLt"
	if r.Best > 0 {
		kept = cands[r.Best].name
	}
	l.b.raced(fmt.Sprintf("T=%d K=%d N=%d%s:%s: %s kept", mm.T, mm.K, mm.N, what, r.line(cands), kept))
	if r.Best >= 0 && l.b.Products == "" {
		name := choice.name()
		if way.ext != nil {
			name = way.ext.Spec.ChoiceName()
		}
		l.keep(tk, name, gemvChoice{}.name(), r, cands)
	}
	return way
}

// withWay runs f with the vector products of mm's shape set to way.
func withWay(g *kernels.GEMV, mm cu.Matmul, way string, f func() error) func() error {
	return func() error {
		if err := g.SetVectorWay(mm.T, mm.K, mm.N, way); err != nil {
			return err
		}
		return f()
	}
}

// raced records a race's line in Stats.Choices and hands it to
// Backend.OnRace with the counts so far.
func (b *Backend) raced(line string) {
	b.stats.Choices = append(b.stats.Choices, line)
	if b.OnRace != nil {
		b.OnRace(line, b.raceCounts())
	}
}

// raceCounts is Stats.Raced: the races run (counted for JITWork too) and
// their candidates.
func (b *Backend) raceCounts() RaceCounts {
	rc := b.stats.Raced
	rc.Races = int(b.races.Load())
	return rc
}

// noteCached records in Stats.Choices a choice taken from the cache.
func (l *loaded) noteCached(k tune.Key, choice string) {
	l.b.stats.Choices = append(l.b.stats.Choices, fmt.Sprintf("%s: %s (tune cache)", k.Shape, choice))
}

// The cache's keys and choices for the three decisions.

func gemvKey(act cu.DType, key mmKey, epi string) tune.Key {
	out := act.String()
	if key.outF32 {
		out = "f32"
	}
	shape := fmt.Sprintf("T≤%d K=%d N=%d out %s", key.t, key.k, key.n, out)
	if epi != "" {
		shape += " with " + epi
	}
	return tune.Key{Family: "decode product", DType: act.String(), Shape: shape}
}

// gemvChoice is a GEMV-or-cuBLASLt choice: use the GEMV, with K split
// split ways (the tile kernels; 0: their default) or on way (a vector
// product's, kernels.VectorWays; "": its default).
type gemvChoice struct {
	use   bool
	split int
	way   string
}

// name names c for the cache: "cublaslt", "gemv", "gemv, K split S" or
// "gemv, on WAY".
func (c gemvChoice) name() string {
	switch {
	case !c.use:
		return "cublaslt"
	case c.split > 0:
		return fmt.Sprintf("gemv, K split %d", c.split)
	case c.way != "":
		return "gemv, on " + c.way
	}
	return "gemv"
}

// parseGEMVChoice reads gemvChoice.name's form back.
func parseGEMVChoice(s string) (gemvChoice, bool) {
	switch {
	case s == "cublaslt":
		return gemvChoice{}, true
	case s == "gemv":
		return gemvChoice{use: true}, true
	case strings.HasPrefix(s, "gemv, K split "):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "gemv, K split "))
		return gemvChoice{use: true, split: n}, err == nil && n > 0
	case strings.HasPrefix(s, "gemv, on ") && len(s) > len("gemv, on "):
		return gemvChoice{use: true, way: strings.TrimPrefix(s, "gemv, on ")}, true
	}
	return gemvChoice{}, false
}

func algoTuneKey(key algoKey) tune.Key {
	return tune.Key{Family: "cublaslt algorithm", DType: key.in.String(),
		Shape: fmt.Sprintf("T≤%d K=%d N=%d out %s bias %v ldd %d", key.rows, key.k, key.n, key.out, key.bias, key.ldd)}
}

func decodeTuneKey(act cu.DType, key decodeKey) tune.Key {
	return tune.Key{Family: "decode attention", DType: act.String(),
		Shape: fmt.Sprintf("T≤%d ctx≤%d heads %d/%d ×%d window %d fp8 cache %v", key.t, key.ctx, key.heads, key.kvHeads, key.headDim, key.window, key.fp8)}
}

// planName names a decode plan for the cache (its fields but the
// workspace, which each batch sizes; kv heads a block only past one).
func planName(p kernels.DecodePlan) string {
	name := fmt.Sprintf("chunk %d, splits %d, cluster %v, mma %v, stages %d", p.Chunk, p.MaxSplits, p.Cluster, p.MMA, p.Stages)
	if p.Heads > 1 {
		name += fmt.Sprintf(", kv heads a block %d", p.Heads)
	}
	return name
}

// cachedPlan is the candidate named name, if one is.
func cachedPlan(cands []kernels.DecodePlan, name string) (kernels.DecodePlan, bool) {
	for _, p := range cands {
		if planName(p) == name {
			return p, true
		}
	}
	return kernels.DecodePlan{}, false
}

// normKey identifies the norms of a bucket of rows for the choice of their
// register path's weight prefetch (kernels.SetNormPrefetch).
type normKey struct {
	rows, dim int // rows: a power-of-two bucket
	wt        cu.DType
}

// normPath decides, the first time norms of t rows of dim (weights of
// dtype wt) are met in their power-of-two bucket, whether the norms'
// register path loads its weights before the PDL wait for that bucket:
// the default (kernels.NormPrefetch: up to 256 rows) raced against the
// other (race), each first checked against it (verify), the choice kept
// in the tune cache. run launches the norm as the step would, writing o
// (its normed rows) and dst (dstBytes). The memory plan never puts a
// node's output over its inputs (compile/plan.go), but the norm kernels
// allow it (AddRMSNorm's sum over its residual), so dst's bytes are saved
// to host memory first and put back before each candidate's check and
// after the race: the step's own launch reads what it would have either
// way. Captures, a
// fixed Backend.Products and tune.Defaults keep the default, as a norm
// the register path does not take.
func (l *loaded) normPath(x *stepState, key normKey, t int, dst cu.Ptr, dstBytes int, o output, run func() error) {
	if l.normChoice[key] || x.capturing || l.b.Products != "" || l.b.Tune == tune.Defaults {
		return
	}
	l.normChoice[key] = true
	tk := tune.Key{Family: "norm", DType: l.act.String(), Shape: fmt.Sprintf("T≤%d dim %d weight %v", key.rows, key.dim, key.wt)}
	name := func(on bool) string { return map[bool]string{true: "prefetch", false: "plain"}[on] }
	if c, ok := l.cachedChoice(tk); ok && (c == name(true) || c == name(false)) {
		l.noteCached(tk, c)
		l.k.SetNormPrefetch(t, key.dim, c == name(true))
		return
	}
	saved, err := l.dev.AllocHost(dstBytes)
	if err != nil {
		return // the default, untimed
	}
	defer func() {
		l.stream.Sync()
		saved.Free()
	}()
	if l.dev.CopyDtoHAsync(saved, 0, dst, dstBytes, l.stream) != nil || l.stream.Sync() != nil {
		return
	}
	restore := func() error { return l.dev.CopyHtoDAsync(dst, saved, 0, dstBytes, l.stream) }
	def := l.k.NormPrefetch(t, key.dim)
	ways := []bool{def, !def}
	cands := make([]candidate, len(ways))
	for i, on := range ways {
		cands[i] = candidate{name: name(on), run: func() error {
			l.k.SetNormPrefetch(t, key.dim, on)
			return run()
		}, check: func() error {
			if err := restore(); err != nil {
				return err
			}
			l.k.SetNormPrefetch(t, key.dim, on)
			return run()
		}}
	}
	l.forTrials(tk, cands)
	tol := tolProduct16
	if o.dt == cu.F32 {
		tol = tolProductF32
	}
	l.verify(cands, o, tol)
	r := l.race(cands)
	best := 0
	if r.Best > 0 {
		best = r.Best
	}
	l.k.SetNormPrefetch(t, key.dim, ways[best])
	if err := restore(); err != nil {
		return // the step's launch meets the device's failure
	}
	l.b.raced(fmt.Sprintf("norms T=%d (≤ %d) dim %d:%s: %s kept", t, key.rows, key.dim, r.line(cands), cands[best].name))
	if r.Best >= 0 {
		l.keep(tk, cands[best].name, cands[0].name, r, cands)
	}
}
