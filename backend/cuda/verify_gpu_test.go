package cuda_test

import (
	"slices"
	"strings"
	"testing"

	"kiln/backend/cuda"
	"kiln/bench"
	"kiln/tensor"
	"kiln/tune"
)

// TestVerifyRejectsWrongCandidates: every candidate a first-use race would
// time is first checked against the default's result. Unperturbed, no
// candidate is found wrong (the tolerances hold the kernels' rounding).
// With every candidate's result perturbed (cuda.CorruptCandidates), each
// race rejects all but its default ("wrong result" in Stats.Choices and
// in the tune cache entry's Rejected), every entry keeps its default, and
// the logits are bit for bit those of a run that takes the defaults
// without racing (cuBLASLt's first algorithm, PlanDecode's split): no
// rejected candidate was kept, and the products' operands the checks
// replaced with random values were put back.
func TestVerifyRejectsWrongCandidates(t *testing.T) {
	s := bench.Shape{Name: "vr", Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 500, Context: 256}
	model := randomModel(t, s, tensor.F32, 11)
	const seqs, steps = 16, 3
	run := func(b *cuda.Backend) [][]float32 { return decodeSteps(t, model, b, seqs, steps) }
	// No norm folded: a step that races a product on its first use keeps
	// the norm before it (normFold.decide), while the defaults' run folds
	// from its first step (TestNormFolds checks the folds).
	tuned := func(dir string) *cuda.Backend {
		b := backendOf(t, "bf16")
		b.Tune, b.TuneDir, b.NoFoldNorms = tune.Cached, dir, true
		return b
	}
	entries := func(b *cuda.Backend, dir string) []tune.Entry {
		c, err := tune.Open(dir, cuda.TuneDevice(b.Device))
		if err != nil {
			t.Fatal(err)
		}
		return c.Entries()
	}

	clean := tuned(t.TempDir())
	run(clean)
	choices := clean.Stats().Choices
	for _, c := range choices {
		if strings.Contains(c, "wrong result") || strings.Contains(c, "not verified") {
			t.Errorf("unperturbed, a candidate was rejected: %s", c)
		}
	}
	t.Logf("unperturbed choices:\n%s", strings.Join(choices, "\n"))

	undo := cuda.CorruptCandidates(func(string) bool { return true })
	defer undo()
	dir := t.TempDir()
	wrong := tuned(dir)
	calls := 0
	wrong.OnRace = func(string, cuda.RaceCounts) { calls++ }
	got := run(wrong)
	undo()
	// Every race but its default rejected, each reported to OnRace.
	if rc := wrong.Stats().Raced; rc.Races == 0 || calls != rc.Races || rc.Rejected != rc.Candidates-rc.Races {
		t.Errorf("races %+v, %d reported to OnRace: want every candidate but each race's default rejected, each race reported", rc, calls)
	}
	choices = wrong.Stats().Choices
	t.Logf("perturbed choices:\n%s", strings.Join(choices, "\n"))
	families := map[string]int{}
	for _, e := range entries(wrong, dir) {
		families[e.Family]++
		if e.Choice != e.Default {
			t.Errorf("%v: %q kept over the default %q, every other candidate being wrong", e.Key, e.Choice, e.Default)
		}
		n := 0
		for _, r := range e.Rejected {
			if strings.Contains(r, "wrong result") {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%v: no candidate rejected as wrong (rejected: %q)", e.Key, e.Rejected)
		}
	}
	for _, f := range []string{"decode product", "cublaslt algorithm", "decode attention"} {
		if families[f] == 0 {
			t.Errorf("no %s raced (entries: %v)", f, families)
		}
	}
	n := 0
	for _, c := range choices {
		if strings.Contains(c, "failed (wrong result") {
			n++
		}
	}
	if n == 0 {
		t.Error("no Stats.Choices line lists a candidate failed as wrong")
	}

	defaults := backendOf(t, "bf16")
	defaults.Products, defaults.FixedDecodePlan, defaults.NoFoldNorms = "cublaslt", true, true
	want := run(defaults)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("step %d: logits with every candidate rejected differ from the defaults'", i)
		}
	}
}
