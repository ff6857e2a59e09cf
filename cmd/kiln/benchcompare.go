package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"kiln/bench"
	"kiln/loadgen"
)

// cmdBenchCompare compares two kiln bench result files and fails on a
// regression beyond noise.
func cmdBenchCompare(args []string) error {
	fs := flag.NewFlagSet("bench compare", flag.ContinueOnError)
	tol := fs.Float64("tolerance", 0.05, "relative change a figure may take in the bad direction before it is a regression")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("give two result files: BASE.json NEW.json")
	}
	var schemas [2]string
	var raw [2][]byte
	for i, p := range pos {
		if raw[i], err = os.ReadFile(p); err != nil {
			return err
		}
		var head struct{ Schema string }
		if err := json.Unmarshal(raw[i], &head); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		schemas[i] = head.Schema
	}
	if schemas[0] != schemas[1] {
		return fmt.Errorf("the files hold different kinds of results (%q, %q)", schemas[0], schemas[1])
	}
	var changes []loadgen.Change
	switch schemas[0] {
	case "kiln.bench.serve/v1":
		var runs [2]struct{ Requests []loadgen.Result }
		for i := range runs {
			if err := json.Unmarshal(raw[i], &runs[i]); err != nil {
				return fmt.Errorf("%s: %w", pos[i], err)
			}
		}
		changes = loadgen.CompareRequests(runs[0].Requests, runs[1].Requests, *tol)
	case "kiln.bench.model/v1":
		var reps [2]bench.ModelReport
		for i := range reps {
			if err := json.Unmarshal(raw[i], &reps[i]); err != nil {
				return fmt.Errorf("%s: %w", pos[i], err)
			}
		}
		for _, b := range reps[0].Results {
			for _, n := range reps[1].Results {
				if b.Test == n.Test && b.Batch == n.Batch {
					changes = append(changes, loadgen.CompareSamples(fmt.Sprintf("%s batch %d tokens/s", b.Test, b.Batch), true, b.Samples, n.Samples, *tol))
				}
			}
		}
	default:
		return fmt.Errorf("unknown result schema %q", schemas[0])
	}
	fmt.Printf("| figure | base | new | change | 95%% interval | |\n|---|---|---|---|---|---|\n")
	regressions := 0
	for _, c := range changes {
		mark := ""
		if c.Regression {
			mark = "REGRESSION"
			regressions++
		}
		fmt.Printf("| %s | %.4g | %.4g | %+.1f%% | %+.1f%% .. %+.1f%% | %s |\n", c.Name, c.Base, c.New, 100*c.Delta, 100*c.Low, 100*c.High, mark)
	}
	fmt.Printf("\nintervals: bootstrap, 1,000 resamples of each run's requests (or repetitions); a regression is an interval wholly beyond %.0f%% in the bad direction\n", 100**tol)
	if regressions > 0 {
		return fmt.Errorf("%d regressions", regressions)
	}
	return nil
}
