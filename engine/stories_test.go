package engine_test

import (
	"os"
	"strings"
	"testing"

	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/testshared"
	"kiln/model"
	"kiln/tokenizer"
)

// TestStories260KGreedy checks that greedy decoding of a real trained model
// reproduces llama2.c's output byte for byte, from both checkpoint formats,
// on the fast and the reference kernels.
func TestStories260KGreedy(t *testing.T) {
	dir := testshared.Path(t, "models", "stories260K")
	want, err := os.ReadFile(dir + "/expected_greedy_200steps.txt")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir + "/tok512.bin")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"stories260K.bin", "stories260K_v1.bin"} {
		for _, ref := range []bool{false, true} {
			m, err := model.Load(dir + "/" + file)
			if err != nil {
				t.Fatal(err)
			}
			e, err := engine.New(m, &cpu.Backend{Reference: ref, StackProjections: !ref}, engine.Options{Compile: compileVerify})
			if err != nil {
				t.Fatal(err)
			}
			ids := []int{1}
			_, err = e.Generate([]int{1}, engine.SamplingParams{MaxTokens: 200, StopTokens: []int{1}}, func(id int) bool {
				ids = append(ids, id)
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			got := tok.Decode(ids)
			t.Logf("%s reference=%v: %d tokens, %q...", file, ref, len(ids), got[:min(len(got), 60)])
			if strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
				t.Errorf("%s (reference=%v): greedy output differs\ngot:  %q\nwant: %q", file, ref, got, want)
			}
			e.Close()
			m.Close()
		}
	}
}
