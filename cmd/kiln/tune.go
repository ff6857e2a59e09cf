package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"kiln/backend/cpu"
	"kiln/backend/cpu/workers"
	"kiln/backend/cuda"
	"kiln/tensor"
	"kiln/tune"
)

const tuneUsage = "usage: kiln tune MODEL [--device cpu|cuda] [--threads N] [--prefill N] [--batch 1,16,64,256] [--depth 512] [--kernels DIR] [--trial-timeout 2m] [--in-process] | kiln tune list | export FILE | import FILE [--device auto|cpu|cuda] [--dir DIR]"

// cmdTune tunes this machine for a model (kiln tune MODEL: the CPU's
// products' tilings, or with --device cuda every first-use choice of the
// GPU), and lists, exports and imports a device's cache of tuned choices
// (the CPU's tilings; a GPU's choices, which kiln run, serve and bench time
// at first use and keep: --tune). An export holds the device it was tuned
// on; import refuses another device's.
func cmdTune(args []string) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	dir := fs.String("dir", tune.DefaultDir(), "the cache's directory [KILN_TUNE_DIR]")
	device := fs.String("device", "auto", "which device: auto (for list, export and import the GPU when one is usable, else the CPU; kiln tune MODEL tunes the CPU), cpu or cuda")
	threads := fs.Int("threads", envInt("KILN_THREADS", 0), "CPU worker threads the tilings are tuned for, 0 for all cores (kiln run and serve take the tilings of their own thread count) [KILN_THREADS]")
	prefill := fs.Int("prefill", 128, "tokens of the prefill products whose tiling is tuned (the CPU's float formats), or of the prompt prefilled (a GPU)")
	batches := fs.String("batch", "1,16,64,256", "a GPU: the decode batch sizes whose choices are tuned")
	depth := fs.Int("depth", 512, "a GPU: the context each decoding sequence holds first (decode attention's choices are made per context)")
	trialTimeout := fs.Duration("trial-timeout", 2*time.Minute, "a candidate's check or timing that runs longer is taken for a hang: the tuner's process is killed and the candidate barred")
	kernelsDir := fs.String("kernels", envString("KILN_KERNELS_DIR", ""), "a GPU: a directory of external kernels offered to the races (docs/EXTERNAL_KERNELS.md) [KILN_KERNELS_DIR]")
	inProcess := fs.Bool("in-process", false, "run the trials in this process, not a child (a candidate that faults then takes kiln tune down)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || len(pos) > 2 {
		return errors.New(tuneUsage)
	}
	switch pos[0] {
	case "list", "export", "import":
		if (pos[0] == "list") != (len(pos) == 1) {
			return errors.New(tuneUsage)
		}
	default:
		if len(pos) != 1 {
			return errors.New(tuneUsage)
		}
		if *prefill < 1 {
			return fmt.Errorf("--prefill %d: want at least 1", *prefill)
		}
		if *trialTimeout <= 0 {
			return fmt.Errorf("--trial-timeout %v: want more than 0", *trialTimeout)
		}
		if !*inProcess {
			return superviseTune(args, *trialTimeout)
		}
		trials, err := tune.OpenTrials()
		if err != nil {
			return err
		}
		defer trials.Close()
		switch *device {
		case "cuda", "gpu":
			if *depth < 0 {
				return fmt.Errorf("--depth %d: want 0 or more", *depth)
			}
			return tuneGPU(pos[0], *dir, *prefill, *depth, *batches, *kernelsDir, trials)
		case "auto", "", "cpu":
		default:
			return fmt.Errorf("--device %q: want auto, cpu or cuda", *device)
		}
		return tuneCPU(pos[0], *dir, *threads, *prefill, trials)
	}
	dev, err := tuneDevice(*device)
	if err != nil {
		return err
	}
	c, err := tune.Open(*dir, dev)
	if err != nil {
		return err
	}
	for _, w := range c.Warnings {
		fmt.Fprintf(os.Stderr, "kiln tune: %s\n", w)
	}
	switch pos[0] {
	case "list":
		fmt.Printf("%s: %d entries for %v\n", *dir, c.Len(), c.Device())
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "family\tdtype\tshape\tchoice\tµs\tdefault\tµs\tnoise µs\ttuned")
		for _, e := range c.Entries() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%s\t%.1f\t%.1f\t%s\n", e.Family, e.DType, e.Shape, e.Choice, e.ChoiceUs, e.Default, e.DefaultUs, e.NoiseUs, e.Tuned.Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	case "export":
		f, err := os.Create(pos[1])
		if err != nil {
			return err
		}
		if err := c.Export(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Printf("exported %d entries for %v to %s\n", c.Len(), c.Device(), pos[1])
		return nil
	}
	f, err := os.Open(pos[1])
	if err != nil {
		return err
	}
	defer f.Close()
	n, warnings, err := c.Import(f)
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "kiln tune: %s\n", w)
	}
	if err != nil {
		return err
	}
	fmt.Printf("imported %d entries into %s (%d in all)\n", n, *dir, c.Len())
	return nil
}

// superviseTune runs kiln tune with args in a child process (--in-process)
// under tune.Supervise: when a candidate's trial kills it (a fault, a
// crash, a lost device, a hang past timeout), the candidate is barred and
// the child starts again.
func superviseTune(args []string, timeout time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kiln-tune-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mk := func() *exec.Cmd {
		// --in-process last, so that no --in-process=false in args starts
		// children of children.
		cmd := exec.Command(self, append(append([]string{"tune"}, args...), "--in-process")...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
		return cmd
	}
	s, err := tune.Supervise(mk, dir, timeout, func(note string) { fmt.Printf("kiln tune: %s\n", note) })
	if len(s.Barred) > 0 {
		fmt.Printf("%d candidates barred after they killed the tuner (filed under the entries' rejected):\n", len(s.Barred))
		for _, id := range s.Barred {
			fmt.Printf("  %s\n", id)
		}
	}
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() > 0 {
		return exitCode(ee.ExitCode()) // the child said why, outside any trial
	}
	return err
}

// tuneDevice identifies the device whose cache --device names.
func tuneDevice(device string) (tune.Device, error) {
	switch device {
	case "cpu":
		return cpu.TuneDevice(), nil
	case "auto", "":
		if cuda.Available() != nil {
			return cpu.TuneDevice(), nil
		}
	case "cuda", "gpu":
	default:
		return tune.Device{}, fmt.Errorf("--device %q: want auto, cpu or cuda", device)
	}
	b, err := cuda.Open(0, "auto")
	if err != nil {
		return tune.Device{}, err
	}
	defer b.Close()
	return cuda.TuneDevice(b.Device), nil
}

// tuneCPU races the tilings of the products of the model at path on
// threads workers and keeps the winners in dir's cache of this CPU,
// printing each race and a table of the gains.
func tuneCPU(path, dir string, threads, prefill int, trials *tune.Trials) error {
	m, err := openModel(path)
	if err != nil {
		return err
	}
	defer m.Close()
	var ts []*tensor.Tensor
	for _, name := range m.Names() {
		ts = append(ts, m.Tensors[name])
	}
	ws, err := cpu.TuneWeights(ts)
	if err != nil {
		return err
	}
	c, err := tune.Open(dir, cpu.TuneDevice())
	if err != nil {
		return err
	}
	for _, w := range c.Warnings {
		fmt.Fprintf(os.Stderr, "kiln tune: %s\n", w)
	}
	p := workers.New(threads)
	defer p.Close()
	fmt.Printf("tuning the products of %d matrices of %s on %d threads for %v\n", len(ws), path, p.Size(), c.Device())
	races := 0
	res, err := cpu.TuneProducts(p, ws, prefill, c, trials, func(line string) {
		races++
		fmt.Printf("[%d] %s\n", races, line)
	})
	if err != nil {
		return err
	}
	es := make([]tune.Entry, len(res))
	for i, r := range res {
		es[i] = r.Entry
	}
	return printGains(es, dir)
}

// tuneGPU tunes a GPU's choices for the model at path: kiln bench model
// with every first-use choice raced again and kept (--tune full), a
// prompt of prefill tokens and a few decode steps at each of batches after
// depth tokens of context; then the gains of the choices it filed.
func tuneGPU(path, dir string, prefill, depth int, batches, kernelsDir string, trials *tune.Trials) error {
	start := time.Now()
	if err := os.Setenv("KILN_TUNE_DIR", dir); err != nil {
		return err
	}
	args := []string{"model", path, "--device", "cuda", "--tune", tune.Full, "--pp", strconv.Itoa(prefill), "--tg", "8",
		"--depth", strconv.Itoa(depth), "--batch", batches, "--reps", "1", "--kernels", kernelsDir}
	fmt.Printf("kiln bench %s\n", strings.Join(args, " "))
	var last cuda.RaceCounts
	gpuRaceProgress = func(line string, so cuda.RaceCounts) {
		last = so
		fmt.Printf("[race %d: %d candidates tried, %d rejected so far] %s\n", so.Races, so.Candidates, so.Rejected, line)
	}
	gpuTrials = trials
	defer func() { gpuRaceProgress, gpuTrials = nil, nil }()
	if err := cmdBench(args); err != nil {
		return err
	}
	fmt.Printf("\n%d races: %d candidates tried (the defaults included), %d rejected (a wrong result or a failed launch), %d timed\n",
		last.Races, last.Candidates, last.Rejected, last.Candidates-last.Rejected)
	dev, err := tuneDevice("cuda")
	if err != nil {
		return err
	}
	c, err := tune.Open(dir, dev)
	if err != nil {
		return err
	}
	var es []tune.Entry
	for _, e := range c.Entries() {
		if !e.Tuned.Before(start) {
			es = append(es, e)
		}
	}
	return printGains(es, dir)
}

// printGains prints a table of es (the default's time, the kept choice's,
// the gain) and their sums.
func printGains(es []tune.Entry, dir string) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nfamily\tdtype\tshape\tdefault µs\tkept µs\tgain\tkept")
	var def, kept float64
	summed := 0
	for _, e := range es {
		gain := "(the default failed)"
		if e.DefaultUs > 0 {
			def += e.DefaultUs
			kept += e.ChoiceUs
			summed++
			gain = fmt.Sprintf("%+.1f%%", 100*(e.DefaultUs/e.ChoiceUs-1))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\n", e.Family, e.DType, e.Shape, e.DefaultUs, e.ChoiceUs, gain, e.Choice)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if kept > 0 {
		fmt.Printf("%d choices, once each: %.1f µs against the defaults' %.1f (%+.1f%%; %d whose default failed left out); kept in %s\n",
			summed, kept, def, 100*(def/kept-1), len(es)-summed, dir)
	}
	return nil
}
