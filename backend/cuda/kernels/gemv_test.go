package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

var (
	gemvMu   sync.Mutex
	gemvMods = map[string]*GEMV{}
)

// gemvMod returns the (cached) GEMV module of act; sweep: the one with
// every benchmarked configuration.
func gemvMod(t testing.TB, act cu.DType, sweep bool) *GEMV {
	t.Helper()
	d := gpu(t)
	key := fmt.Sprint(act, sweep)
	gemvMu.Lock()
	defer gemvMu.Unlock()
	if g := gemvMods[key]; g != nil {
		return g
	}
	g, err := newGEMV(d, act, sweep)
	if err != nil {
		t.Fatalf("compile %v gemv (sweep %v): %v", act, sweep, err)
	}
	t.Logf("%v gemv module (sweep %v): cubin %v, from cache %v", act, sweep, g.M.Cubin, g.M.Hit)
	gemvMods[key] = g
	return g
}

// parallel runs f over [0, n) cut into one range per CPU.
func parallel(n int, f func(part, lo, hi int)) {
	parts := runtime.GOMAXPROCS(0)
	chunk := (n + parts - 1) / parts
	var wg sync.WaitGroup
	for p := 0; p*chunk < n; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			f(p, p*chunk, min(n, (p+1)*chunk))
		}(p)
	}
	wg.Wait()
}

// gemvRand draws n normal values rounded to dt (in parallel, from seed) and
// their encoding.
func gemvRand(seed uint64, n int, dt cu.DType) ([]float32, []byte) {
	vals := make([]float32, n)
	enc := make([]byte, n*dt.Size())
	parallel(n, func(part, lo, hi int) {
		rng := rand.New(rand.NewPCG(seed, uint64(part)))
		for i := lo; i < hi; i++ {
			v := float32(rng.NormFloat64())
			switch dt {
			case cu.F32:
				binary.LittleEndian.PutUint32(enc[4*i:], math.Float32bits(v))
			case cu.BF16:
				h := tensor.F32ToBF16(v)
				binary.LittleEndian.PutUint16(enc[2*i:], h)
				v = tensor.BF16ToF32(h)
			case cu.F16:
				h := tensor.F32ToF16(v)
				binary.LittleEndian.PutUint16(enc[2*i:], h)
				v = tensor.F16ToF32(h)
			}
			vals[i] = v
		}
	})
	return vals, enc
}

// gemvRef is out[t,n] = x[t,:]·w[n,:] in float64.
func gemvRef(x, w []float32, t, k, n int) []float64 {
	ref := make([]float64, t*n)
	parallel(n, func(_, lo, hi int) {
		for j := lo; j < hi; j++ {
			wr := w[j*k : (j+1)*k]
			for r := 0; r < t; r++ {
				xr := x[r*k : (r+1)*k]
				var s float64
				for i, v := range wr {
					s += float64(xr[i]) * float64(v)
				}
				ref[r*n+j] = s
			}
		}
	})
	return ref
}

func poisonWord(dt cu.DType) uint32 {
	return map[cu.DType]uint32{cu.F32: 0x7fc00001, cu.F16: 0x7e017e01, cu.BF16: 0x7fc17fc1}[dt]
}

// gemvCase runs g on x[t,k] (the first t rows of the uploaded x) and w[n,k]
// into a poisoned buffer with n spare elements plus slack after the output,
// checks the output against ref (the first t·n values) and that the spare
// elements kept the poison, and returns the worst error.
func gemvCase(tb testing.TB, g *GEMV, c gemvCfg, x, w cu.Ptr, k, n int, outF32 bool, ref []float64) float64 {
	tb.Helper()
	d := gpu(tb)
	rows := c.t
	odt := g.Act
	if outF32 {
		odt = cu.F32
	}
	total := (rows+1)*n + 64
	out := outBuf(tb, odt, total)
	must(tb, g.Check(out, x, w, rows, k, n, outF32))
	must(tb, g.run(nil, c, out, x, w, rows, k, n, outF32, Fold{}))
	must(tb, d.Sync())
	raw := make([]byte, total*odt.Size())
	must(tb, d.Download(raw, out))
	what := fmt.Sprintf("gemv %s T=%d k=%d n=%d outF32=%v", c.name(), rows, k, n, outF32)
	worst := compare(tb, what, decode(odt, raw[:rows*n*odt.Size()]), ref[:rows*n], gemvTol(g.Act, outF32))
	checkPoisonTail(tb, what, raw, rows*n*odt.Size(), odt)
	return worst
}

// checkPoisonTail reports a byte of raw (a download of a buffer poisoned
// for dtype dt) past the first n that no longer holds the poison.
func checkPoisonTail(tb testing.TB, what string, raw []byte, n int, dt cu.DType) {
	tb.Helper()
	pw := poisonWord(dt)
	for i := n; i < len(raw); i++ {
		if raw[i] != byte(pw>>(8*(i%4))) {
			tb.Errorf("%s: byte %d after the output overwritten", what, i-n)
			return
		}
	}
}

// gemvTol is the accepted error: that of the output dtype; for f16/bf16
// inputs with an f32 output 1e-4, since the tensor cores' f32 accumulation
// is not IEEE round-to-nearest.
func gemvTol(act cu.DType, outF32 bool) float64 {
	if !outF32 {
		return tol(act)
	}
	if act != cu.F32 {
		return 1e-4
	}
	return tol(cu.F32)
}

type gemvShape struct {
	name string
	k, n int
}

var gemvShapes = []gemvShape{
	{"O", 4096, 4096}, {"QKV", 4096, 6144}, {"gate+up", 4096, 28672}, {"down", 14336, 4096}, {"logits", 4096, 128256},
	{"small", 96, 301}, {"17·8", 136, 5}, {"tail", 4168, 33}, {"tiny", 8, 1},
}

// gemvInputs uploads random x[GEMVMaxT,k] and w[n,k] of dtype act (from
// seed) and returns them with the float64 reference product.
func gemvInputs(t *testing.T, seed uint64, act cu.DType, k, n int) (px, pw cu.Ptr, ref []float64) {
	t.Helper()
	xs, xb := gemvRand(seed, GEMVMaxT*k, act)
	ws, wb := gemvRand(seed+1, n*k, act)
	px, pw = alloc(t, len(xb)), alloc(t, len(wb))
	must(t, gpu(t).Upload(px, xb))
	must(t, gpu(t).Upload(pw, wb))
	return px, pw, gemvRef(xs, ws, GEMVMaxT, k, n)
}

// gemvRows lists the row counts the tests run for activation dtype act and
// K k: every count the vector kernels take, and for the tile kernels
// (f16/bf16, K a multiple of 64) each width's smallest and largest counts
// and one between.
func gemvRows(act cu.DType, k int) []int {
	rows := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if act != cu.F32 && k%tileBK == 0 {
		rows = append(rows, 9, 13, 16, 17, 32, 33, 50, 64)
	}
	return rows
}

// tileSplitsTested are the splits the tests run besides tileSplits' own
// choice: none, and clusters of 3 (uneven ranges of K) and 8 blocks.
var tileSplitsTested = []int{1, 3, 8}

// TestGEMV checks every row count 1..8 and both output dtypes on the
// decode shapes of a Llama-3-8B and on small shapes with tails (K below one
// warp's loads, K past whole groups of loads, N odd and below a warp's
// rows); for f16/bf16 the tile kernels at 9 to 64 rows, K split as
// tileSplits chooses and as tileSplitsTested.
func TestGEMV(t *testing.T) {
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		for _, sh := range gemvShapes {
			t.Run(fmt.Sprintf("%v/%s", act, sh.name), func(t *testing.T) {
				k, n := sh.k, sh.n
				px, pw, ref := gemvInputs(t, rng.Uint64(), act, k, n)
				var worst [3][2]float64 // [CUDA cores, tensor cores, tiles][out act, out f32]
				for _, rows := range gemvRows(act, k) {
					cs := gemvProd(act, rows)
					if rows > GEMVVectorMaxT {
						for _, sp := range tileSplitsTested {
							cs = append(cs, tileCfg(rows, sp))
						}
					}
					for _, c := range cs {
						kind := b2i(c.mma) + 2*b2i(c.tile)
						for i, outF32 := range []bool{false, true} {
							worst[kind][i] = max(worst[kind][i], gemvCase(t, g, c, px, pw, k, n, outF32, ref))
						}
					}
				}
				tc := ""
				if act != cu.F32 {
					tc = fmt.Sprintf("; tensor cores %.3g, %.3g", worst[1][0], worst[1][1])
					if k%tileBK == 0 {
						tc += fmt.Sprintf("; tiles (T=9..64) %.3g, %.3g", worst[2][0], worst[2][1])
					}
				}
				t.Logf("%-5v gemv k=%-5d n=%-6d T=1..8 max err: CUDA cores out %v %.3g (tol %.0e), out f32 %.3g (tol %.0e)%s",
					act, k, n, act, worst[0][0], tol(act), worst[0][1], gemvTol(act, true), tc)
			})
		}
	}
}

// TestGEMVSweepCorrect checks every configuration of the sweep module (bf16)
// on shapes with tails, so that the benchmarked variants are right too.
func TestGEMVSweepCorrect(t *testing.T) {
	act := cu.BF16
	g := gemvMod(t, act, true)
	rng := newRNG(t)
	for _, sh := range []gemvShape{{"small", 96, 301}, {"tail", 4168, 33}, {"QKV", 4096, 6144}} {
		k, n := sh.k, sh.n
		px, pw, ref := gemvInputs(t, rng.Uint64(), act, k, n)
		worst, count := 0.0, 0
		rowsList := []int{1, 2, 3, 4, 5, 6, 7, 8}
		if k%128 == 0 {
			rowsList = append(rowsList, 16, 33, 64) // the tile kernels' configurations
		}
		for _, rows := range rowsList {
			for _, c := range gemvSweep(act, rows) {
				worst = max(worst, gemvCase(t, g, c, px, pw, k, n, false, ref))
				count++
			}
		}
		t.Logf("bf16  gemv sweep k=%d n=%d, %d kernel runs (T=%v): max err %.3g (tol %.0e)", k, n, count, rowsList, worst, tol(act))
	}
}

// cfgLabel names configuration c in the benchmark's tables.
func cfgLabel(c gemvCfg) string {
	if c.tile {
		return fmt.Sprintf("%s/%d", strings.TrimPrefix(c.name(), "gemv_tile_"), c.splits)
	}
	return strings.TrimPrefix(c.name(), "gemv_")
}

// gemvSweep lists the configurations of the sweep module for t rows
// (GEMV_CC, GEMV_EXTRA and the tensor-core kernels in gemv.cu; for more
// than GEMVVectorMaxT rows the tile kernel with K split 1 to 8 ways, on
// tiles of 128 weight rows and of 64).
func gemvSweep(act cu.DType, t int) []gemvCfg {
	if t > GEMVVectorMaxT {
		var cs []gemvCfg
		for _, v := range [][4]int{{64, 4, 1, 0}, {64, 4, 0, 0}, {64, 6, 1, 0}, {128, 3, 1, 0}, {128, 4, 1, 0}, {64, 4, 1, 64}, {64, 6, 1, 64}} {
			if v[3] == 64 && tileCfg(t, 0).nt != 8 && v[1] == 6 {
				continue // 64-row tiles 6 stages deep are built for 8 n8 tiles only
			}
			for _, s := range []int{1, 2, 3, 4, 6, 8} {
				c := tileCfg(t, s)
				c.bk, c.stages, c.pf, c.rows = v[0], v[1], v[2], v[3]
				cs = append(cs, c)
			}
		}
		return cs
	}
	var cs []gemvCfg
	var extra [][2]int
	switch t {
	case 1, 4:
		extra = [][2]int{{1, 4}, {1, 8}, {2, 2}, {2, 8}, {4, 2}, {4, 4}}
	case 8:
		extra = [][2]int{{4, 2}, {2, 4}}
	}
	for lm := 0; lm <= 2; lm++ {
		c := gemvCC(t)
		c.lm = lm
		cs = append(cs, c)
		for _, ru := range extra {
			cs = append(cs, gemvCfg{t: t, r: ru[0], u: ru[1], lm: lm})
		}
		if act == cu.F32 {
			continue
		}
		for _, uw := range [][2]int{{4, 8}, {2, 4}, {4, 4}, {2, 8}, {8, 4}, {4, 16}} {
			c := mmaCfg(t, uw[0], uw[1])
			c.lm = lm
			cs = append(cs, c)
		}
	}
	return cs
}

// TestGEMVErrors: products GEMV does not take are refused with
// ErrGEMVShape (the caller falls back to cuBLASLt); K a multiple of 4 but
// not of 8 is taken for f32 activations and computed right.
func TestGEMVErrors(t *testing.T) {
	for _, act := range allDTypes {
		g := gemvMod(t, act, false)
		rng := newRNG(t)
		const n = 37
		for _, k := range []int{13, 100} {
			xs, xb := gemvRand(rng.Uint64(), GEMVMaxT*k, act)
			ws, wb := gemvRand(rng.Uint64(), n*k, act)
			px, pw := alloc(t, len(xb)), alloc(t, len(wb))
			must(t, gpu(t).Upload(px, xb))
			must(t, gpu(t).Upload(pw, wb))
			out := outBuf(t, cu.F32, GEMVMaxT*n)
			err := g.Run(nil, out, px, pw, 3, k, n, true)
			if k*act.Size()%16 != 0 {
				if !errors.Is(err, ErrGEMVShape) {
					t.Errorf("%v k=%d: err %v, want ErrGEMVShape", act, k, err)
				}
				continue
			}
			must(t, err)
			ref := gemvRef(xs, ws, GEMVMaxT, k, n)
			worst := 0.0
			for _, rows := range gemvRows(act, k) {
				for _, c := range gemvProd(act, rows) {
					worst = max(worst, gemvCase(t, g, c, px, pw, k, n, false, ref))
				}
			}
			report(t, act, fmt.Sprintf("gemv k=%d n=%d T=%v", k, n, gemvRows(act, k)), worst)
		}
		k := 64
		px, pw := alloc(t, GEMVMaxT*k*4+64), alloc(t, n*k*4+64)
		out := alloc(t, GEMVMaxT*n*4+64)
		for _, c := range []struct {
			what         string
			out, x, w    cu.Ptr
			rows, k, n   int
			outF32, fail bool
		}{
			{"ok", out, px, pw, 8, k, n, true, false},
			{"0 rows", out, px, pw, 0, k, n, false, true},
			{"65 rows", out, px, pw, 65, k, n, false, true},
			{"9 rows of f32", out, px, pw, 9, k, n, act == cu.F32, act == cu.F32},
			{"9 rows, k 72", out, px, pw, 9, 72, n, false, true},
			{"k 0", out, px, pw, 1, 0, n, false, true},
			{"n 0", out, px, pw, 1, k, 0, false, true},
			{"x off by 4", out, px.Add(4), pw, 1, k, n, false, true},
			{"w off by 8", out, px, pw.Add(8), 1, k, n, false, true},
			{"f32 out off by 2", out.Add(2), px, pw, 1, k, n, true, true},
			{"null w", out, px, 0, 1, k, n, false, true},
		} {
			err := g.Run(nil, c.out, c.x, c.w, c.rows, c.k, c.n, c.outF32)
			if c.fail != (err != nil) || (err != nil && !errors.Is(err, ErrGEMVShape)) {
				t.Errorf("%v %s: err %v, want failure %v (ErrGEMVShape)", act, c.what, err, c.fail)
			}
		}
		if act != cu.F32 {
			for _, sp := range []int{0, 5, 9} {
				if err := g.RunTileSplits(nil, sp, out, px, pw, 16, k, n, false); !errors.Is(err, ErrGEMVShape) {
					t.Errorf("%v: K of %d split %d ways: err %v, want ErrGEMVShape", act, k, sp, err)
				}
			}
			if got := g.TileSplits(16, k, n); len(got) != 1 || got[0] != 1 {
				t.Errorf("%v: splits of K %d (one stage): %v, want [1]", act, k, got)
			}
		}
		must(t, gpu(t).Sync())
	}
}

// speedRows are the row counts TestGEMVSpeed times: 1, 4, 8, 16, 32 and
// 64, or the comma-separated list in KILN_GEMV_ROWS (to profile one).
func speedRows(t *testing.T) []int {
	env := os.Getenv("KILN_GEMV_ROWS")
	if env == "" {
		return []int{1, 4, 8, 16, 32, 64}
	}
	var rows []int
	for _, f := range strings.Split(env, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 1 || r > GEMVMaxT {
			t.Fatalf("KILN_GEMV_ROWS=%q: want row counts of 1 to %d", env, GEMVMaxT)
		}
		rows = append(rows, r)
	}
	return rows
}

// TestGEMVSpeed compares GEMV with cuBLASLt (bf16 in and out) on the decode
// products of a Llama-3-8B, weights rotated over buffers that L2 cannot
// hold, against the device-to-device copy bandwidth of the same run; it also
// times the other configurations of the sweep module. It logs, asserts
// nothing. The figures of a run are in docs/PERF.md (GPU kernels).
func TestGEMVSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark")
	}
	d := gpu(t)
	act := cu.BF16
	g := gemvMod(t, act, true)
	lt, err := d.NewBlasLt(0)
	must(t, err)
	defer lt.Close()

	const cb = 1 << 30
	src, dst := alloc(t, cb), alloc(t, cb)
	must(t, d.Memset32(src, 0x3f803f80, cb/4, nil))
	cms := gpuTime(t, 3, 11, func(int) error { return d.CopyDtoD(dst, src, cb, nil) })
	copyBW := 2 * cb / (cms * 1e-3) / 1e9
	t.Logf("device %s (%d SMs): cuMemcpyDtoD 1 GiB: %.3f ms, %.0f GB/s (read+write)", d.Name, d.SMs, cms, copyBW)
	must(t, d.Free(src))
	must(t, d.Free(dst))

	rng := newRNG(t)
	var table []string
	for _, sh := range gemvShapes[:5] {
		t.Run(sh.name, func(t *testing.T) {
			k, n := sh.k, sh.n
			bytes := k * n * act.Size()
			nbuf := max(2, (200<<20+bytes-1)/bytes)
			ws := make([]cu.Ptr, nbuf)
			for i := range ws {
				ws[i] = alloc(t, bytes)
				must(t, d.Memset32(ws[i], 0x3c003c00^uint32(i*0x00010001), bytes/4, nil))
			}
			_, xb := gemvRand(rng.Uint64(), GEMVMaxT*k, act)
			x := alloc(t, len(xb))
			must(t, d.Upload(x, xb))
			out := alloc(t, GEMVMaxT*n*4)
			per := max(3, min(50, int(1.5e-3/(float64(bytes)/3e12))))
			gbs := func(ms float64) float64 { return float64(bytes) / (ms * 1e-3) / 1e9 }
			timeCfg := func(c gemvCfg, rows, reps int) float64 {
				return gpuTime(t, per, reps, func(i int) error { return g.run(nil, c, out, x, ws[i%nbuf], rows, k, n, false, Fold{}) })
			}
			for _, rows := range speedRows(t) {
				must(t, g.Check(out, x, ws[0], rows, k, n, false))
				def := g.split(gemvDefault(act, rows), n, k)
				gms := timeCfg(def, rows, 20)
				// cuBLASLt: the heuristic's first algorithm up to 8 rows, the
				// fastest of its candidates beyond (as the executable chooses).
				mm := cu.Matmul{T: rows, K: k, N: n, In: act, Out: act, X: x, W: ws[0], Dst: out}
				cands := 1
				if rows > GEMVVectorMaxT {
					cands, err = lt.Algorithms(mm)
					must(t, err)
				}
				lms := math.Inf(1)
				for a := range cands {
					m := mm
					m.Algo = a
					lms = min(lms, gpuTime(t, per, 20, func(i int) error {
						m.W = ws[i%nbuf]
						return lt.Matmul(m)
					}))
				}
				var sweep []string
				best, bestMs := def, gms
				for _, c := range gemvSweep(act, rows) {
					if c == def {
						continue
					}
					ms := timeCfg(c, rows, 10)
					sweep = append(sweep, fmt.Sprintf("%s %.0f", cfgLabel(c), gbs(ms)))
					if ms < bestMs {
						best, bestMs = c, ms
					}
				}
				line := fmt.Sprintf("| %s (%d,%d) | %d | %.1f µs %.0f GB/s %.1f%% | %.1f µs %.0f GB/s %.1f%% | %.2f× | %s %.0f GB/s %.1f%% |",
					sh.name, k, n, rows, gms*1e3, gbs(gms), 100*gbs(gms)/copyBW, lms*1e3, gbs(lms), 100*gbs(lms)/copyBW, lms/gms,
					cfgLabel(best), gbs(bestMs), 100*gbs(bestMs)/copyBW)
				table = append(table, line)
				t.Logf("%s", line)
				t.Logf("  %d buffers of %.1f MB, %d calls per timing; default %s; others (GB/s): %s", nbuf, float64(bytes)/1e6, per, cfgLabel(def), strings.Join(sweep, ", "))
			}
		})
	}
	t.Logf("copy %.0f GB/s; weight bytes read per second, %% of copy:\n| shape (K,N) | T | GEMV (default) | cuBLASLt bf16 | cuBLASLt / GEMV time | best sweep config |\n|---|---|---|---|---|---|\n%s",
		copyBW, strings.Join(table, "\n"))
}
