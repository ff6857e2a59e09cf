package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"kiln/bench"
	"kiln/loadgen"
)

// cmdBenchCompare compares kiln bench results (bench serve's, bench model's
// or bench throughput's): one file or several
// (comma-separated: repeated runs) a side. With two or more runs a side a
// regression is called from the runs' spread (loadgen.CompareRuns), so
// that run-to-run noise does not fail a CI gate; with one run a side the
// changes are reported and nothing is gated. Files of different workloads
// are refused.
func cmdBenchCompare(args []string) error {
	fs := flag.NewFlagSet("bench compare", flag.ContinueOnError)
	tol := fs.Float64("tolerance", 0.05, "relative change a figure may take in the bad direction before it is a regression")
	anyWorkload := fs.Bool("allow-different-workloads", false, "compare files whose workloads (prompt and output lengths, requests, concurrency, model) differ")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("give the base and the new results: BASE.json[,BASE2.json...] NEW.json[,NEW2.json...]")
	}
	var sides [2][]resultFile
	for i, list := range pos {
		for _, p := range strings.Split(list, ",") {
			raw, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var head struct {
				Schema string
				Config map[string]any
			}
			if err := json.Unmarshal(raw, &head); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			sides[i] = append(sides[i], resultFile{p, raw, head.Schema, head.Config})
		}
	}
	first := sides[0][0]
	for _, side := range sides {
		for _, f := range side {
			if f.schema != first.schema {
				return fmt.Errorf("%s and %s hold different kinds of results (%q, %q)", first.path, f.path, first.schema, f.schema)
			}
			if d := workloadDiff(first.config, f.config); d != "" {
				if !*anyWorkload {
					return fmt.Errorf("%s and %s ran different workloads (%s): --allow-different-workloads to compare them anyway", first.path, f.path, d)
				}
				fmt.Fprintf(os.Stderr, "kiln: %s and %s ran different workloads (%s)\n", first.path, f.path, d)
			}
		}
	}
	var changes []loadgen.Change
	switch first.schema {
	case "kiln.bench.serve/v1":
		docs, err := decodeSides[struct{ Requests []loadgen.Result }](sides)
		if err != nil {
			return err
		}
		var runs [2][][]loadgen.Result
		for i, side := range docs {
			for _, doc := range side {
				runs[i] = append(runs[i], doc.Requests)
			}
		}
		changes = loadgen.CompareRuns(runs[0], runs[1], *tol)
	case "kiln.bench.model/v1":
		reps, err := decodeSides[bench.ModelReport](sides)
		if err != nil {
			return err
		}
		for _, b := range reps[0][0].Results {
			name := fmt.Sprintf("%s batch %d tokens/s", b.Test, b.Batch)
			var bv, nv [][]float64
			for i, side := range reps {
				for _, r := range side {
					for _, x := range r.Results {
						if x.Test == b.Test && x.Batch == b.Batch {
							if i == 0 {
								bv = append(bv, x.Samples)
							} else {
								nv = append(nv, x.Samples)
							}
						}
					}
				}
			}
			if len(nv) == 0 {
				continue
			}
			if len(bv) < 2 || len(nv) < 2 {
				c := loadgen.CompareSamples(name, true, bv[0], nv[0], *tol)
				c.Regression = false // one run a side: between-run noise unknown
				changes = append(changes, c)
				continue
			}
			changes = append(changes, loadgen.CompareRunSamples(name, true, means(bv), means(nv), *tol))
		}
	case "kiln.bench.throughput/v1":
		reps, err := decodeSides[throughputReport](sides)
		if err != nil {
			return err
		}
		for _, fg := range []struct {
			name string
			of   func(throughputReport) float64
		}{
			{"output tokens/s", func(r throughputReport) float64 { return r.OutputPerSec }},
			{"total tokens/s", func(r throughputReport) float64 { return r.TotalPerSec }},
			{"requests/s", func(r throughputReport) float64 { return r.RequestsPerSec }},
		} {
			var v [2][]float64
			for i, side := range reps {
				for _, r := range side {
					v[i] = append(v[i], fg.of(r))
				}
			}
			if len(v[0]) < 2 || len(v[1]) < 2 {
				c := loadgen.CompareSamples(fg.name, true, v[0], v[1], *tol)
				c.Regression = false // one run a side: between-run noise unknown
				changes = append(changes, c)
				continue
			}
			changes = append(changes, loadgen.CompareRunSamples(fg.name, true, v[0], v[1], *tol))
		}
	default:
		return fmt.Errorf("unknown result schema %q", first.schema)
	}
	gated := len(sides[0]) > 1 && len(sides[1]) > 1
	fmt.Printf("| figure | base | new | change | 95%% interval | between-run SD | |\n|---|---|---|---|---|---|---|\n")
	regressions := 0
	for _, c := range changes {
		mark := ""
		if c.Regression {
			mark = "REGRESSION"
			regressions++
		}
		sd := "-"
		if c.Gated {
			sd = fmt.Sprintf("%.1f%%", 100*c.BetweenRunSD)
		}
		fmt.Printf("| %s | %.4g | %.4g | %+.1f%% | %+.1f%% .. %+.1f%% | %s | %s |\n", c.Name, c.Base, c.New, 100*c.Delta, 100*c.Low, 100*c.High, sd, mark)
	}
	if gated {
		fmt.Printf("\n%d and %d runs: intervals of the runs' means from their spread (Student's t); a regression is an interval wholly beyond %.0f%% in the bad direction\n",
			len(sides[0]), len(sides[1]), 100**tol)
	} else {
		fmt.Printf("\none run a side: the intervals (bootstrap of each run's requests or repetitions) show only the noise within a run, not between runs, so nothing is called a regression; give two or more runs a side (BASE1.json,BASE2.json NEW1.json,NEW2.json) to gate\n")
	}
	if regressions > 0 {
		return fmt.Errorf("%d regressions", regressions)
	}
	return nil
}

// means is each run's mean.
func means(runs [][]float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		for _, x := range r {
			out[i] += x / float64(len(r))
		}
	}
	return out
}

// workloadDiff names the workload settings two result files differ in
// (where they ran and when aside), or "".
func workloadDiff(a, b map[string]any) string {
	var diffs []string
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if k == "url" || k == "date" {
			continue
		}
		if fmt.Sprint(a[k]) != fmt.Sprint(b[k]) {
			diffs = append(diffs, fmt.Sprintf("%s %v, %v", k, a[k], b[k]))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// resultFile is a kiln bench result file as compare reads it: its bytes,
// schema and workload.
type resultFile struct {
	path   string
	raw    []byte
	schema string
	config map[string]any
}

// decodeSides reads every file of both sides as a T.
func decodeSides[T any](sides [2][]resultFile) ([2][]T, error) {
	var out [2][]T
	for i, side := range sides {
		for _, f := range side {
			var v T
			if err := json.Unmarshal(f.raw, &v); err != nil {
				return out, fmt.Errorf("%s: %w", f.path, err)
			}
			out[i] = append(out[i], v)
		}
	}
	return out, nil
}
