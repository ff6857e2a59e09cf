package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"kiln/backend/cuda"
	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/bench"
	"kiln/demo"
	"kiln/engine"
	"kiln/loadgen"
	"kiln/tensor"
)

func cmdBench(args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "model":
			return cmdBenchModel(args[1:])
		case "serve":
			return cmdBenchServe(args[1:])
		case "compare":
			return cmdBenchCompare(args[1:])
		case "spec":
			return cmdBenchSpec(args[1:])
		case "throughput":
			return cmdBenchThroughput(args[1:])
		}
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Print(benchUsage)
		return flag.ErrHelp
	}
	return fmt.Errorf("want a subcommand: kiln bench model, serve, throughput, compare or spec (kiln help bench)")
}

func cmdBenchModel(args []string) error {
	fs := flag.NewFlagSet("bench model", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	pp := fs.Int("pp", 512, "prompt tokens for the prompt-processing test (0: skip)")
	tg := fs.Int("tg", 128, "tokens generated per sequence in the generation test (0: skip)")
	batches := fs.String("batch", "1,4", "sequences decoding together in the generation test, comma-separated")
	depth := fs.Int("depth", 0, "context each generation-test sequence holds before decoding (prefilled, untimed)")
	mixed := fs.Int("mixed", 0, "add to every generation-test step a new prompt of this many tokens, as a server mixes prefills into running decodes (0: decode alone)")
	reps := fs.Int("reps", 3, "repetitions of each test, after its warm-up")
	warmup := fs.Duration("warmup", 0, "each test's untimed warm-up: its run repeated until this long has passed, at least once (on a GPU 1s unless given, so that the power cap acts before the timed runs)")
	keep := fs.String("keep", "", "write the --random model into this directory and keep it (reused when it is already there)")
	random := fs.String("random", "", "benchmark a random-weight model of this shape instead of MODEL ("+bench.ShapeNames()+")")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	output := fs.String("output", "", "also write the JSON report to this file")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the benchmark to this file")
	profile := fs.Bool("profile", false, fmt.Sprintf("GPU: after each test (prefill and generation), run %d more of its steps (prefills) kernel by kernel and print the device time of each kernel", bench.ProfileSteps))
	budgetFile := fs.String("budget", "", `TOML file of targets ([min_tokens_per_s] "tg128 batch 1" = 60, [min_roofline] ...): exit 1 when one is missed`)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	bs, err := parseBatches(*batches)
	if err != nil {
		return err
	}
	if *pp < 0 || *tg < 0 || *depth < 0 || *reps < 1 || *warmup < 0 {
		return fmt.Errorf("--pp, --tg, --depth, --warmup must be >= 0 and --reps >= 1")
	}
	var budget *bench.ModelBudget
	if *budgetFile != "" {
		text, err := os.ReadFile(*budgetFile)
		if err != nil {
			return err
		}
		if budget, err = bench.ParseModelBudget(string(text)); err != nil {
			return err
		}
	}
	clock := time.Now()
	var start []engine.Phase // the start's parts, for the report
	lap := func(name string) {
		start = append(start, engine.Phase{Name: name, Time: time.Since(clock)})
		clock = time.Now()
	}
	be, err := ef.backend()
	if err != nil {
		return err
	}
	defer closeBackend(be)
	lap("device")
	gpu := gpuOf(be)
	if *profile && gpu == nil {
		return fmt.Errorf("--profile needs the GPU (--device cuda)")
	}
	// The --random model's weights are written in --dtype (already checked
	// by ParseDType); under auto, f32 for the CPU and bf16 for the GPU.
	cd, auto, _ := cuda.ParseDType(ef.dtype)
	if auto && gpu == nil {
		cd = cu.F32
	}
	d := map[cu.DType]tensor.DType{cu.F32: tensor.F32, cu.F16: tensor.F16, cu.BF16: tensor.BF16}[cd]
	dtype := d.String()
	path := ""
	switch {
	case *random != "" && len(pos) == 0:
		shape, ok := bench.Shapes[*random]
		if !ok {
			return fmt.Errorf("--random: unknown shape %q (%s)", *random, bench.ShapeNames())
		}
		dir := *keep
		if dir == "" {
			if dir, err = os.MkdirTemp("", "kiln-bench-"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			defer removeOnSignal(dir)()
		}
		path = filepath.Join(dir, shape.Name+"-"+d.String())
		if _, err := os.Stat(filepath.Join(path, "config.json")); err != nil || *keep == "" {
			fmt.Fprintf(os.Stderr, "writing a random %s model (%s) to %s\n", shape.Name, d, path)
			if err := bench.WriteRandomModel(path, shape, d, 1); err != nil {
				return err
			}
		}
	case *random == "" && len(pos) == 1:
		path = pos[0]
	case *random == "" && len(pos) == 0:
		path = "demo"
		fmt.Fprintf(os.Stderr, "kiln: no model given, using the built-in %s\n", demo.Name)
	default:
		return fmt.Errorf("give one MODEL or --random SHAPE")
	}
	clock = time.Now() // a --random model's writing left out
	m, err := openModel(path)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := ef.startFrom(be, m); err != nil {
		return err
	}
	lap("model file")
	maxBatch := 1
	for _, b := range bs {
		maxBatch = max(maxBatch, b)
	}
	gen := *tg // tokens a generation sequence decodes
	if *profile && gen > 0 {
		gen += bench.ProfileSteps
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if room := m.Config.MaxPositions - 1; ef.ctx == 0 && max(*pp, *depth+gen) > room {
		// The defaults (those not given) fit the model: a shorter prompt
		// or generation.
		if !set["pp"] {
			*pp = min(*pp, room)
		}
		if !set["tg"] {
			*tg = max(1, min(*tg, room-*depth))
			gen = *tg
			if *profile {
				gen += bench.ProfileSteps
			}
		}
		fmt.Fprintf(os.Stderr, "kiln: the model's context is %d: --pp %d, --tg %d\n", m.Config.MaxPositions, *pp, *tg)
	}
	if *mixed < 0 {
		return fmt.Errorf("--mixed %d: want a prompt chunk of 0 or more tokens", *mixed)
	}
	ctx := max(*pp, *depth+gen, *mixed) + 1
	if ef.ctx > 0 {
		ctx = ef.ctx
	}
	if ctx > m.Config.MaxPositions {
		return fmt.Errorf("the test needs a context of %d (--pp %d; --depth %d + --tg %d), the model has %d: lower --pp, --tg or --depth", ctx, *pp, *depth, *tg, m.Config.MaxPositions)
	}
	// The cache holds what the tests need at once: the prompt of pp, or
	// every generation sequence at its depth plus tg.
	blocks := func(tokens int) int { return (tokens + 15) / 16 }
	kvBlocks := max(blocks(*pp+1), maxBatch*blocks(*depth+gen+1)+blocks(*mixed))
	seqs := maxBatch
	if *mixed > 0 {
		seqs++ // the prompt chunk's
	}
	eo := engine.Options{ContextLen: ctx, MaxSeqs: seqs, BlockSize: 16, KVBlocks: kvBlocks, Buckets: bucketsFor(be)}
	if err := ef.kvCache(&eo); err != nil {
		return err
	}
	e, err := engine.New(m, be, eo)
	if err != nil {
		return err
	}
	defer e.Close()
	start = append(start, e.Startup...)
	if most := e.MaxStepTokens(); *mixed > 0 && maxBatch+*mixed > most {
		return fmt.Errorf("--mixed %d with batch %d: a step of %d tokens, the engine takes %d", *mixed, maxBatch, maxBatch+*mixed, most)
	}
	opts := bench.ModelOptions{PromptTokens: *pp, GenTokens: *tg, Batches: bs, Reps: *reps, Depth: *depth, MixedChunk: *mixed, WarmUp: *warmup}
	if gpu != nil && !set["warmup"] {
		opts.WarmUp = time.Second
	}
	// Progress on a terminal: one line redrawn as each repetition starts.
	if w := progressWriter(); w != nil {
		opts.Progress = func(test string) { fmt.Fprintf(w, "\r\033[K%s", test) }
		defer fmt.Fprint(w, "\r\033[K")
	}
	threads := ef.threads
	var gemm *cuda.GEMM // the GPU's reference matrix rate
	if gpu != nil {
		mem, err := gpu.NewMemory(1 << 30)
		if err != nil {
			return err
		}
		defer mem.Close()
		opts.Memory = mem
		opts.Devices = ef.tp
		opts.WeightElemBytes = gpu.ComputeDType(e.Compiled.Graph).Size()
		opts.FP8Weights = gpu.FP8(gpu.ComputeDType(e.Compiled.Graph))
		if !gpu.WidenBlocks {
			opts.Blocks = kernels.DequantFormats
		}
		opts.WidenExperts = true // the expert kernels read the activation dtype
		opts.KVElemBytes = opts.WeightElemBytes
		act := gpu.ComputeDType(e.Compiled.Graph)
		if *pp > 0 {
			if gemm, err = gpu.NewGEMM(act, 8192); err != nil {
				return err
			}
			defer gemm.Close()
			opts.PeakFLOPS = gemm.Rate
		}
		gpu.Timing = true
		opts.DeviceTime = func() time.Duration { return gpu.Stats().DeviceTime }
		threads = 0
	}
	var profiles []kernelProfile
	if *profile {
		opts.Profile = func(label string, run func() error) error {
			gpu.ResetProfile()
			gpu.Profile = true
			err := run()
			gpu.Profile = false
			st := gpu.Stats()
			profiles = append(profiles, kernelProfile{label, st.Profile, st.ProfileSteps})
			return err
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.RunModel(e, m, be.Name(), threads, opts)
	if err != nil {
		return err
	}
	if *random != "" {
		rep.Model = "random " + *random + " " + dtype
	}
	switch {
	case eo.KVCacheFP8:
		rep.KVCache = "fp8"
	case eo.KVCacheF16:
		rep.KVCache = "f16"
	case gpu != nil:
		rep.KVCache = gpu.ComputeDType(e.Compiled.Graph).String()
	default:
		rep.KVCache = "f32"
	}
	if err := writeReport(rep, *output, *asJSON); err != nil {
		return err
	}
	if !*asJSON {
		printModelReport(rep)
		if gemm != nil {
			fmt.Printf("\nthe 8192³ GEMM: %s\n", gemm.Choice)
		}
		for _, p := range profiles {
			p.print(rep)
		}
		fmt.Printf("\nstart: %s\n", phaseList(start))
		if gpu != nil {
			gs := gpu.Stats()
			ranks := ""
			if ef.tp > 1 {
				ranks = fmt.Sprintf(" (rank 0 of %d; each rank uploads its own shard at once)", ef.tp)
			}
			fmt.Printf("weights: %.2f GB uploaded in %.1f s (%.1f GB/s)%s; kernels ready in %.1f s, alongside\n",
				float64(gs.Uploaded)/1e9, gs.UploadTime.Seconds(), float64(gs.Uploaded)/1e9/max(gs.UploadTime.Seconds(), 1e-9), ranks, gs.KernelTime.Seconds())
			if gs.NormFolds > 0 {
				fmt.Printf("norms folded into the products around them: %d (launches, graph captures included)\n", gs.NormFolds)
			}
			if gs.BlockMatrices > 0 {
				fmt.Printf("matrices kept in their GGUF blocks: %d", gs.BlockMatrices)
				if gs.ExpertScratch > 0 {
					fmt.Printf(", a mixture's experts among them (widened a step at a time into %.2f GB)", float64(gs.ExpertScratch)/1e9)
				}
				fmt.Println()
			}
			modules, choices := gpu.JITWork()
			fmt.Printf("compiled and timed at run time: %d kernel modules (%.1f s of NVRTC, summed), %d first-use choices\n",
				modules, gpu.Device.KernelCache().Stats().BuildTime.Seconds(), choices)
			if c := gpu.Stats().Compiles; len(c) > 0 {
				fmt.Printf("modules compiled at once: %s\n", strings.Join(c, ", "))
			}
		}
		if gpu != nil && len(gpu.Stats().Choices) > 0 {
			fmt.Printf("\nproducts, timed at first use (GEMV against cuBLASLt up to %d rows):\n", kernels.GEMVMaxT)
			for _, c := range gpu.Stats().Choices {
				fmt.Println("  " + c)
			}
		}
	}
	if budget == nil {
		return nil
	}
	return printVerdicts(os.Stdout, budget.Check(rep))
}

// printVerdicts prints a budget's verdicts as a table to w and fails when
// a target was missed.
func printVerdicts(w io.Writer, vs []loadgen.Verdict) error {
	missed := 0
	fmt.Fprintf(w, "\n| budget | target | measured | |\n|---|---|---|---|\n")
	for _, v := range vs {
		mark := "ok"
		if !v.OK {
			mark, missed = "MISSED", missed+1
		}
		fmt.Fprintf(w, "| %s | %g | %.4g | %s |\n", v.Name, v.Target, v.Measured, mark)
	}
	if missed > 0 {
		return fmt.Errorf("%d budget targets missed", missed)
	}
	return nil
}

func printModelReport(r *bench.ModelReport) {
	fmt.Printf("model %s (%s), %s params, %s weights; backend %s", r.Model, r.Format, groupDigits(r.Params), bytesString(r.WeightBytes), r.Backend)
	if r.KVCache != "" {
		fmt.Printf(", KV cache %s", r.KVCache)
	}
	fmt.Println()
	if r.ReadBandwidth > 0 {
		fmt.Printf("memory: copy %.1f GB/s (read+write), read pass %.1f GB/s (a read-only workload's ceiling: %.0f%% of copy)\n\n",
			r.CopyBandwidth/1e9, r.ReadBandwidth/1e9, 100*r.ReadBandwidth/r.CopyBandwidth)
	} else {
		fmt.Printf("memory: device-to-device copy %.1f GB/s (read+write)\n\n", r.CopyBandwidth/1e9)
	}
	fmt.Printf("| %-7s | %5s | %18s | %10s | %8s | %9s |\n", "test", "batch", "tokens/s", "GB/s read", "roofline", "read pass")
	fmt.Printf("|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 9), strings.Repeat("-", 7), strings.Repeat("-", 20), strings.Repeat("-", 12), strings.Repeat("-", 10), strings.Repeat("-", 11))
	pct := func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }
	for _, x := range r.Results {
		bw, roof, read := "", "", ""
		if x.Bandwidth > 0 {
			bw = strconv.FormatFloat(x.Bandwidth/1e9, 'f', 2, 64)
			roof = pct(x.Roofline)
			if x.ReadFraction > 0 {
				read = pct(x.ReadFraction)
			}
		}
		fmt.Printf("| %-7s | %5d | %9.2f ± %6.2f | %10s | %8s | %9s |\n", x.Test, x.Batch, x.TokensPerSec, x.StdDev, bw, roof, read)
	}
	for _, x := range r.Results {
		if x.DeviceBusy > 0 {
			fmt.Printf("\n%s batch %d: the device is busy %.1f%% of a step; %.1f µs per step outside device work", x.Test, x.Batch, 100*x.DeviceBusy, 1e6*x.OutsideSeconds)
		}
		if x.PromptTokensPerSec > 0 {
			fmt.Printf("\n%s batch %d: %.2f prompt tokens/s beside the decoded tokens; %.1f µs a step", x.Test, x.Batch, x.PromptTokensPerSec, 1e6*float64(x.Batch)/x.TokensPerSec)
		}
		if x.FLOPS > 0 {
			fmt.Printf("\n%s: %.2f TFLOP/s of model FLOPs", x.Test, x.FLOPS/1e12)
			if x.PeakFraction > 0 {
				fmt.Printf(", %.1f%% of an 8192³ GEMM's %.1f TFLOP/s measured in the same run\n(median of each repetition's ratio to the GEMM timed just before it)", 100*x.PeakFraction, r.PeakFLOPS/1e12)
			}
		}
	}
	var warm []string
	for _, x := range r.Results {
		warm = append(warm, fmt.Sprintf("%s batch %d %d in %.1f s", x.Test, x.Batch, x.WarmUpRuns, x.WarmUpSeconds))
	}
	if len(warm) > 0 {
		fmt.Printf("\n\nuntimed warm-up runs before each test: %s", strings.Join(warm, ", "))
	}
	fmt.Println("\n\nroofline: weights and KV cache read per decode step × steps/s over the copy bandwidth (read+write),\nmedian of each repetition's ratio to a copy measured just before it; read pass: the same against a plain SIMD read")
}

// kernelProfile is the device time of each kernel over a generation test's
// profiled steps (bench model --profile).
type kernelProfile struct {
	label   string
	entries []cuda.ProfileEntry
	steps   int
}

// print writes the profile as a table, the slowest kernels first, with the
// test's own step time (from rep) beside the profiled total.
func (p kernelProfile) print(rep *bench.ModelReport) {
	if p.steps == 0 {
		return
	}
	es := slices.Clone(p.entries)
	slices.SortStableFunc(es, func(a, b cuda.ProfileEntry) int { return cmp.Compare(b.Time, a.Time) })
	var total time.Duration
	for _, e := range es {
		total += e.Time
	}
	fmt.Printf("\nprofile of %s: %d steps run kernel by kernel, an event after each (µs a step)\n\n", p.label, p.steps)
	fmt.Printf("| kernel | calls a step | µs a step | share |\n|---|---|---|---|\n")
	perStep := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(p.steps) }
	for _, e := range es {
		fmt.Printf("| %s | %g | %.1f | %.1f%% |\n", e.Name, float64(e.Calls)/float64(p.steps), perStep(e.Time), 100*float64(e.Time)/float64(total))
	}
	fmt.Printf("| total | | %.1f | |\n", perStep(total))
	for _, r := range rep.Results {
		if fmt.Sprintf("%s batch %d", r.Test, r.Batch) == p.label && r.TokensPerSec > 0 {
			fmt.Printf("\nthe timed steps (graphs replayed): %.1f µs a step\n", 1e6*float64(r.Batch)/r.TokensPerSec)
		}
	}
}

// parseBatches reads a --batch list of batch sizes, each at least 1.
func parseBatches(s string) ([]int, error) {
	bs, err := parseIDs(s)
	if err != nil {
		return nil, fmt.Errorf("--batch: %w", err)
	}
	for _, b := range bs {
		if b < 1 {
			return nil, fmt.Errorf("--batch %d must be at least 1", b)
		}
	}
	return bs, nil
}

// phaseList prints the parts of a start ("device 0.4 s, model file 0.0 s,
// …, in all 2.3 s").
func phaseList(ps []engine.Phase) string {
	var b strings.Builder
	var all time.Duration
	for _, p := range ps {
		fmt.Fprintf(&b, "%s %.1f s, ", p.Name, p.Time.Seconds())
		all += p.Time
	}
	return fmt.Sprintf("%sin all %.1f s", b.String(), all.Seconds())
}

// writeReport writes v as indented JSON to the file path (none when
// empty) and, with toStdout, to standard output.
func writeReport(v any, path string, toStdout bool) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if path != "" {
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	if toStdout {
		fmt.Println(string(data))
	}
	return nil
}
