package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"kiln/backend/cuda"
	"kiln/tune"
)

const tuneUsage = "usage: kiln tune list | export FILE | import FILE [--dir DIR]"

// cmdTune lists, exports and imports the GPU's cache of tuned choices (the
// choices kiln run, serve and bench time at first use and keep: --tune). An
// export holds the device it was tuned on; import refuses another device's.
func cmdTune(args []string) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	dir := fs.String("dir", tune.DefaultDir(), "the cache's directory [KILN_TUNE_DIR]")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || (pos[0] == "list") != (len(pos) == 1) || len(pos) > 2 {
		return errors.New(tuneUsage)
	}
	switch pos[0] {
	case "list", "export", "import":
	default:
		return fmt.Errorf("unknown action %q (%s)", pos[0], tuneUsage)
	}
	// The cache is filed under the device it was tuned on: this machine's.
	b, err := cuda.Open(0, "auto")
	if err != nil {
		return fmt.Errorf("the cache belongs to a GPU: %w", err)
	}
	c, err := tune.Open(*dir, cuda.TuneDevice(b.Device))
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
		fmt.Fprintln(tw, "family\tdtype\tshape\tchoice\tµs\tdefault\tµs\ttuned")
		for _, e := range c.Entries() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%s\t%.1f\t%s\n", e.Family, e.DType, e.Shape, e.Choice, e.ChoiceUs, e.Default, e.DefaultUs, e.Tuned.Format("2006-01-02 15:04"))
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
