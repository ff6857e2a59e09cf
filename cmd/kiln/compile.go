package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kiln/artifact"
	"kiln/backend/cuda"
	"kiln/engine"
	"kiln/tune"
)

const compileUsage = "usage: kiln compile MODEL --device cuda -o DIR [--prefill N] [--depth N] [--batch 1,2,4,...,256] [--tune cached|full] [--dtype D] [--kv-cache-dtype auto|fp8]"

// cmdCompile compiles a model ahead of time for this kind of GPU (kiln
// compile MODEL --device cuda -o DIR): a prompt and decode steps at each
// batch run once (kiln bench model), with the kernel cache and the tune
// cache in DIR, so that DIR ends up holding every kernel image the model's
// steps load and every choice they make at those sizes; then a manifest
// (package artifact) says what it was built for. kiln serve --artifact
// DIR starts from it.
func cmdCompile(args []string) error {
	fs := flag.NewFlagSet("compile", flag.ContinueOnError)
	out := fs.String("o", "", "the artifact's directory (created; an artifact already there is replaced)")
	device := fs.String("device", "cuda", "the device to compile for: cuda (the GPU of this machine)")
	prefill := fs.Int("prefill", 2048, "tokens of the prompt whose steps are compiled and tuned")
	depth := fs.Int("depth", 512, "context each decoding sequence holds first (decode attention's choices are made per context)")
	batches := fs.String("batch", "1,2,4,8,16,32,64,128,256", "the decode batch sizes whose choices are tuned (choices are made per power-of-two bucket of rows: a step of another bucket times its own at run time)")
	mode := fs.String("tune", tune.Cached, "cached: start from this machine's tuned choices (kiln tune) and time the rest; full: time every choice again")
	dtype := fs.String("dtype", "auto", "GPU compute dtype: auto, bf16, f16 or f32")
	kvDType := fs.String("kv-cache-dtype", "auto", "KV cache element type: auto or fp8")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *out == "" {
		return errors.New(compileUsage)
	}
	if *device != "cuda" && *device != "gpu" {
		return fmt.Errorf("--device %q: kiln compile builds GPU artifacts (--device cuda)", *device)
	}
	if m, err := tune.ParseMode(*mode); err != nil || m == tune.Off || m == tune.Defaults {
		return fmt.Errorf("--tune %q: want cached or full", *mode)
	}
	if *prefill < 1 || *depth < 0 {
		return fmt.Errorf("--prefill must be at least 1 and --depth at least 0")
	}
	bs, err := parseBatches(*batches)
	if err != nil {
		return err
	}
	if _, _, err := cuda.ParseDType(*dtype); err != nil {
		return fmt.Errorf("--dtype: %w", err)
	}
	ef := engineFlags{kvDType: *kvDType}
	if err := ef.kvCache(&engine.Options{}); err != nil {
		return err
	}
	m, err := openModel(pos[0])
	if err != nil {
		return err
	}
	fingerprint := artifact.Fingerprint(m)
	m.Close()
	dev, err := tuneDevice("cuda")
	if err != nil {
		return err
	}
	if err := clearArtifactDir(*out); err != nil {
		return err
	}
	tuneDir := filepath.Join(*out, artifact.TuneDir)
	if *mode == tune.Cached {
		if err := seedTuneCache(tuneDir, dev); err != nil {
			return err
		}
	}
	// The bench below opens the device and its caches after these are set.
	for k, v := range map[string]string{"KILN_CACHE_DIR": filepath.Join(*out, artifact.KernelsDir), "KILN_TUNE_DIR": tuneDir} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	benchArgs := []string{"model", pos[0], "--device", "cuda", "--tune", *mode, "--dtype", *dtype, "--kv-cache-dtype", *kvDType,
		"--pp", strconv.Itoa(*prefill), "--tg", "8", "--depth", strconv.Itoa(*depth), "--batch", *batches, "--reps", "1"}
	fmt.Printf("kiln bench %s\n", strings.Join(benchArgs, " "))
	if err := cmdBench(benchArgs); err != nil {
		return err
	}
	path, err := filepath.Abs(pos[0])
	if err != nil {
		path = pos[0]
	}
	man := artifact.Manifest{Kiln: tune.KilnVersion(), Device: dev, Model: artifact.ModelID{Path: path, Fingerprint: fingerprint},
		DType: *dtype, KVCache: *kvDType, Plan: artifact.Plan{Buckets: bucketsFor(&cuda.Backend{}), Prefill: *prefill, Depth: *depth, Batches: bs},
		Created: time.Now().UTC()}
	a, err := artifact.Write(*out, man)
	if err != nil {
		return err
	}
	images, size := 0, int64(0)
	for _, f := range a.Files {
		if strings.HasPrefix(f.Path, artifact.KernelsDir+"/") {
			images++
			size += f.Size
		}
	}
	c, err := tune.Open(tuneDir, dev)
	if err != nil {
		return err
	}
	fmt.Printf("\nwrote the artifact %s for %v: %d kernel images (%.1f MB), %d tuned choices; start from it with --artifact %s\n",
		*out, dev, images, float64(size)/1e6, c.Len(), *out)
	return nil
}

// clearArtifactDir makes dir an empty directory: created when missing, an
// artifact there removed; any other non-empty directory is refused.
func clearArtifactDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return err
	case len(entries) == 0:
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, artifact.ManifestFile)); err != nil {
		return fmt.Errorf("-o %s: the directory holds files and no artifact: give an empty or new directory", dir)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// seedTuneCache copies this machine's tuned choices for dev (the tune
// cache kiln tune and first uses fill) into dir, where the compile's runs
// take them instead of timing them again.
func seedTuneCache(dir string, dev tune.Device) error {
	src, err := tune.Open(tune.DefaultDir(), dev)
	if err != nil || src.Len() == 0 {
		return err
	}
	var b bytes.Buffer
	if err := src.Export(&b); err != nil {
		return err
	}
	dst, err := tune.Open(dir, dev)
	if err != nil {
		return err
	}
	n, _, err := dst.Import(&b)
	if err == nil {
		fmt.Printf("took %d tuned choices from %s\n", n, tune.DefaultDir())
	}
	return err
}
