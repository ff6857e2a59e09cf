package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"kiln/convert"
	"kiln/tensor"
)

// cmdQuantize writes MODEL as a GGUF file with its matrices in --to
// (convert.GGUF), through a temporary file renamed at the end, so that a
// failure leaves nothing half-written; --to fp8 writes a Hugging Face
// checkpoint directory instead (convert.FP8).
func cmdQuantize(args []string) error {
	fs := flag.NewFlagSet("quantize", flag.ContinueOnError)
	names := strings.Join(append(convert.SchemeNames(), "fp8"), ", ")
	to := fs.String("to", "q8_0", "dtype of the matrices: "+names+" (q4_k_m, q5_k_m: Q4_K or Q5_K with the output matrix and some layers' value and down projections in Q6_K, as llama-quantize's Q4_K_M and Q5_K_M; fp8: OUT is a Hugging Face checkpoint directory, the layers' matrices in FP8 E4M3 with a scale a row, compressed-tensors' format)")
	tokFlag := fs.String("tokenizer", "", "the vocabulary to write (default: MODEL's own; a GGUF MODEL's travels with it)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("usage: kiln quantize MODEL OUT.gguf [--to %s] (--to fp8: OUT a directory)", strings.Join(append(convert.SchemeNames(), "fp8"), "|"))
	}
	fp8 := strings.EqualFold(*to, "fp8")
	scheme, err := convert.ParseScheme(*to)
	if err != nil && !fp8 {
		return fmt.Errorf("--to %q: want one of %s", *to, names)
	}
	src, out := pos[0], pos[1]
	if a, err := filepath.Abs(src); err == nil {
		if b, err := filepath.Abs(out); err == nil && a == b {
			return fmt.Errorf("OUT %s is MODEL itself", out)
		}
	}
	m, err := openModel(src)
	if err != nil {
		return err
	}
	defer m.Close()
	if fp8 {
		rep, err := convert.FP8(out, m, src)
		if err != nil {
			return err
		}
		fmt.Printf("wrote %s (fp8): matrices %d as f8_e4m3 with a scale a row, %d kept in their dtype, %d vectors, %.1f MB of tensors\n",
			out, rep.Matrices[tensor.F8_E4M3], rep.Kept, rep.Vectors, float64(rep.Bytes)/1e6)
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // gone once renamed
	var vocab map[string]any
	if m.Metadata == nil {
		tok, err := openTokenizer(*tokFlag, m)
		if err == nil {
			vocab, err = tok.GGUFMetadata()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kiln: the file gets no vocabulary: %v\n", err)
		}
	}
	rep, err := convert.GGUF(f, m, scheme, vocab)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	var as []string
	for _, d := range slices.Sorted(maps.Keys(rep.Matrices)) {
		as = append(as, fmt.Sprintf("%d as %v", rep.Matrices[d], d))
	}
	fmt.Printf("wrote %s (%s): matrices %s, %d vectors as f32, %.1f MB of tensors\n",
		out, scheme.Name, strings.Join(as, ", "), rep.Vectors, float64(rep.Bytes)/1e6)
	if rep.Kept > 0 {
		fmt.Printf("%d matrices kept in their own dtype: their rows are not whole %v blocks of %d\n", rep.Kept, scheme.Base, scheme.Base.BlockSize())
	}
	if !rep.Vocabulary {
		fmt.Printf("the file holds no vocabulary: run it with --tokenizer %s\n", src)
	}
	return nil
}
