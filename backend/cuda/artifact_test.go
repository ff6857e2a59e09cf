package cuda_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kiln/artifact"
	"kiln/backend/cuda"
	"kiln/backend/cuda/kcache"
	"kiln/bench"
	"kiln/tensor"
	"kiln/tune"
)

// TestStartFromArtifact: a first start with its kernel and tune caches in
// an artifact's directory compiles modules and times choices; a backend
// started from the artifact (StartFrom), with an empty kernel cache as on
// another machine of the kind, compiles and times nothing (JITWork 0, 0)
// and gives the same logits bit for bit; a step of a batch outside the
// artifact's buckets times its choices at run time and is counted; the
// artifact is not changed by the runs.
func TestStartFromArtifact(t *testing.T) {
	s := bench.Shape{Name: "art", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 256}
	model := randomModel(t, s, tensor.F32, 11)
	dev := backendOf(t, "bf16").Device
	saved := dev.KernelCache()
	defer dev.SetKernelCache(saved)
	art := t.TempDir()
	dev.SetKernelCache(kcache.New(filepath.Join(art, artifact.KernelsDir)))
	run := func(b *cuda.Backend, seqs int) [][]float32 { return decodeSteps(t, model, b, seqs, 3) }
	b1 := backendOf(t, "bf16")
	b1.Tune, b1.TuneDir = tune.Cached, filepath.Join(art, artifact.TuneDir)
	first := run(b1, 16)
	if modules, choices := b1.JITWork(); modules == 0 || choices == 0 {
		t.Fatalf("the compiling start compiled %d modules and timed %d choices: want some of each", modules, choices)
	}
	_, err := artifact.Write(art, artifact.Manifest{Kiln: tune.KilnVersion(), Device: cuda.TuneDevice(dev),
		Model: artifact.ModelID{Path: model, Fingerprint: "test"}, DType: "bf16", Created: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := artifact.Read(art)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(cuda.TuneDevice(dev), tune.KilnVersion(), "test"); err != nil {
		t.Fatal(err)
	}
	dev.SetKernelCache(kcache.New(t.TempDir()))
	b2 := backendOf(t, "bf16")
	b2.StartFrom(art)
	second := run(b2, 16)
	if modules, choices := b2.JITWork(); modules != 0 || choices != 0 {
		t.Errorf("the start from the artifact compiled %d modules and timed %d choices: want none\n%v", modules, choices, b2.Stats().Choices)
	}
	for i := range first {
		if !slices.Equal(first[i], second[i]) {
			t.Fatalf("step %d: logits from the artifact differ from the compiling start's", i)
		}
	}
	b3 := backendOf(t, "bf16")
	b3.StartFrom(art)
	run(b3, 3) // decode steps of 3 rows: a bucket the artifact lacks
	if modules, choices := b3.JITWork(); modules != 0 || choices == 0 {
		t.Errorf("a batch outside the artifact's buckets: %d modules compiled, %d choices timed (want 0 and some)", modules, choices)
	}
	if _, err := artifact.Read(art); err != nil {
		t.Errorf("the runs changed the artifact: %v", err)
	}
}
