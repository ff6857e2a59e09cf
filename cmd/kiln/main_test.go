package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"kiln/loadgen"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/backend/cuda"
	"kiln/internal/testshared"
)

var kilnBin string

// TestMain builds the kiln binary once so tests see real exit codes and
// output streams.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kiln-cmd-test")
	if err != nil {
		panic(err)
	}
	kilnBin = filepath.Join(dir, "kiln")
	// The tests' runs take no tilings tuned on this machine.
	os.Setenv("KILN_TUNE_DIR", filepath.Join(dir, "tune"))
	if out, err := exec.Command("go", "build", "-o", kilnBin, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// kiln runs the binary on the CPU (KILN_DEVICE=cpu, so that the output does
// not depend on the machine having a GPU).
func kiln(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return kilnEnv(t, []string{"KILN_DEVICE=cpu"}, args...)
}

func kilnEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(kilnBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func stories(t *testing.T) (bin, tok string) {
	dir := testshared.Path(t, "models", "stories260K")
	return filepath.Join(dir, "stories260K.bin"), filepath.Join(dir, "tok512.bin")
}

// TestBadInputIsOneLine checks that bad flags, missing files and unsupported
// input give one clear line on stderr and a non-zero exit, never a panic.
func TestBadInputIsOneLine(t *testing.T) {
	bin, tok := stories(t)
	garbage := filepath.Join(t.TempDir(), "garbage.bin")
	os.WriteFile(garbage, []byte("this is not a model file at all, not even close"), 0o644)
	cases := [][]string{
		{"frobnicate"},
		{"run", "a", "b"},
		{"run", "/no/such/model"},
		{"run", bin}, // llama2.c needs --tokenizer
		{"run", bin, "--tokenizer", tok, "--temperature", "-1"},
		{"run", bin, "--tokenizer", tok, "--max-tokens", "0"},
		{"run", bin, "--tokenizer", tok, "--tensor-parallel-size", "0"},
		{"run", "demo", "--tokenizer", tok, "--prompt", "x"}, // the demo model with stories260K's tokenizer
		{"run", bin, "--tokenizer", tok, "--bogus-flag"},
		{"run", bin, "--tokenizer", tok, "--temperature", "2.5"},
		{"bench"},
		{"help", "nosuch"},
		{"serve", "--speculative", "eagle"},
		{"serve", "--speculative", "ngram", "--num-speculative-tokens", "0"},
		{"run", bin, "--tokenizer", tok, "--tensor-parallel-size", "3", "--device", "cpu"},
		{"run", bin, "--tokenizer", tok, "--ids", "1,x"},
		{"run", bin, "--tokenizer", tok, "--prompt", "a", "--ids", "1"},
		{"run", garbage, "--tokenizer", tok},
		{"logits", bin},
		{"logits", bin, "--ids", "1,99999"},
		{"bench", "serve", "--url", "http://127.0.0.1:1", "--concurrency", "1", "--num-requests", "2"},
		{"bench", "serve", "--concurrency", "1", "--num-requests", "2", "--prompt-tokens", "zipf:3"},
		{"bench", "throughput", "--num-requests", "0"},
		{"bench", "throughput", "--output-tokens", "zipf:3"},
		{"bench", "throughput", "--max-num-seqs", "0"},
		{"bench", "serve", "--concurrency", "1", "--num-requests", "2", "--budget", garbage},
		{"bench", "compare", garbage, garbage},
		{"bench", "compare", garbage},
		{"tokenize", "--text", "hi"},
		{"tokenize", "--tokenizer", garbage, "--text", "hi"},
		{"detokenize", "--tokenizer", tok, "--ids", "600"},
		{"inspect", bin, "--after", "no-such-pass"},
		{"bench", "model", "--random", "nope"},
		{"bench", "model", "--random", "tiny", "--profile"}, // the profile times GPU kernels
		{"quantize", bin},
		{"quantize", "../../demo/files", filepath.Join(t.TempDir(), "x.gguf"), "--to", "q9_9"},
		{"quantize", garbage, filepath.Join(t.TempDir(), "x.gguf")},
		{"quantize", "../../demo/files", "../../demo/files"},
		{"run", bin, "--tokenizer", tok, "--no-such-flag"},
		{"serve", bin, "--tokenizer", tok, "--block-size", "0"},
		{"run", bin, "--tokenizer", tok, "--kv-cache-dtype", "int4"},
		{"run", bin, "--tokenizer", tok, "--tune", "sometimes"},
		{"run", bin, "--tokenizer", tok, "--kernels", t.TempDir()}, // CUDA kernels on the CPU
		{"tune", bin, "--trial-timeout", "0s"},
		{"tune"},
		{"tune", "list", "extra"},
		{"tune", "/no/such/model"},
		{"tune", bin, "--prefill", "0"},
		{"tune", bin, "--device", "cuda", "--prefill", "0"},
		{"tune", "import", garbage, "--device", "cpu"},
		{"tune", "list", "--device", "tpu"},
		{"compile"},
		{"compile", bin},
		{"compile", bin, "-o", t.TempDir(), "--device", "cpu"},
		{"compile", "/no/such/model", "-o", t.TempDir()},
		{"compile", bin, "-o", filepath.Dir(garbage)}, // not empty, no artifact
		{"compile", bin, "-o", t.TempDir(), "--batch", "0"},
		{"run", bin, "--tokenizer", tok, "--artifact", t.TempDir(), "--device", "cpu"},
	}
	for _, args := range cases {
		_, stderr, code := kiln(t, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code == 0 || strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
			t.Errorf("kiln %q: exit %d, stderr %q", args, code, stderr)
			continue
		}
		// The flag package prints usage after a bad flag; otherwise one line.
		if !strings.Contains(stderr, "flag provided but not defined") && len(lines) != 1 {
			t.Errorf("kiln %q: %d lines on stderr, want 1:\n%s", args, len(lines), stderr)
		}
	}
}

// runResult is kiln run --json's output.
type runResult struct {
	IDs  []int  `json:"ids"`
	Text string `json:"text"`
}

// runJSON runs kiln run with args and --json, and reads its output.
func runJSON(t *testing.T, args ...string) runResult {
	t.Helper()
	out, stderr, code := kiln(t, append(append([]string{"run"}, args...), "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res runResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	return res
}

func TestRunGreedyJSON(t *testing.T) {
	bin, tok := stories(t)
	res := runJSON(t, bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "20")
	want, _ := os.ReadFile(filepath.Join(filepath.Dir(bin), "expected_greedy_200steps.txt"))
	if len(res.IDs) != 20 || !strings.HasPrefix(string(want), res.Text) || len(res.Text) < 40 {
		t.Errorf("greedy run gave %d ids and %q, want 20 ids starting llama2.c's output %q", len(res.IDs), res.Text, want[:60])
	}
}

// TestRunTensorParallelCPU: kiln run sharded over 2 and 4 CPU ranks
// (--tensor-parallel-size, one process) gives llama2.c's greedy text on
// stories260K, as one rank does.
func TestRunTensorParallelCPU(t *testing.T) {
	bin, tok := stories(t)
	want, _ := os.ReadFile(filepath.Join(filepath.Dir(bin), "expected_greedy_200steps.txt"))
	for _, n := range []string{"2", "4"} {
		res := runJSON(t, bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "20", "--device", "cpu", "--tensor-parallel-size", n)
		if len(res.IDs) != 20 || !strings.HasPrefix(string(want), res.Text) || len(res.Text) < 40 {
			t.Errorf("tp %s: greedy run gave %d ids and %q, want 20 ids starting llama2.c's output %q", n, len(res.IDs), res.Text, want[:60])
		}
	}
}

// TestRunSpeculative: kiln run --speculative ngram, and --draft-model with
// the model drafting for itself (every draft kept), give the same greedy
// text as plain decoding on stories260K and say how many drafts they kept;
// bad speculation flags get one line.
func TestRunSpeculative(t *testing.T) {
	bin, tok := stories(t)
	plain := runJSON(t, bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "80")
	for _, k := range []string{"1", "5"} {
		out, stderr, code := kiln(t, "run", bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "80", "--json",
			"--speculative", "ngram", "--num-speculative-tokens", k)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var res runResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.IDs, plain.IDs) {
			t.Errorf("k %s: speculative greedy ids %v, plain %v", k, res.IDs, plain.IDs)
		}
		if !strings.Contains(stderr, "speculative decoding:") || !strings.Contains(stderr, "kept") {
			t.Errorf("k %s: stderr %q says nothing of the drafts", k, stderr)
		}
	}
	// The model drafting for itself keeps every greedy draft.
	out, stderr, code := kiln(t, "run", bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "80", "--json", "--draft-model", bin)
	if code != 0 {
		t.Fatalf("--draft-model: exit %d: %s", code, stderr)
	}
	var res runResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.IDs, plain.IDs) || !strings.Contains(stderr, "(100%)") {
		t.Errorf("--draft-model itself: ids %v (plain %v), %q", res.IDs, plain.IDs, stderr)
	}
	for _, c := range [][]string{{"--speculative", "eagle"}, {"--speculative", "draft"}, {"--draft-model", "/no/such/model"}} {
		if _, stderr, code := kiln(t, append([]string{"run", bin, "--tokenizer", tok}, c...)...); code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("%v: exit %d, %q", c, code, stderr)
		}
	}
}

// TestRunFP8KVCache: kiln run --kv-cache-dtype fp8 on a real trained model
// (stories260K): its greedy text starts as llama2.c's (the float32 cache's)
// for 20 tokens (engine.TestFP8KVCache measured 107 the same).
func TestRunFP8KVCache(t *testing.T) {
	bin, tok := stories(t)
	res := runJSON(t, bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "20", "--kv-cache-dtype", "fp8")
	want, _ := os.ReadFile(filepath.Join(filepath.Dir(bin), "expected_greedy_200steps.txt"))
	if len(res.IDs) != 20 || !strings.HasPrefix(string(want), res.Text) || len(res.Text) < 40 {
		t.Errorf("greedy run with an FP8 KV cache gave %d ids and %q, want 20 ids starting llama2.c's output %q", len(res.IDs), res.Text, want[:60])
	}
}

// TestRunF16KVCache: kiln run --kv-cache-dtype f16 on stories260K gives
// llama2.c's greedy text (the float32 cache's) for 100 tokens
// (engine.TestF16KVCache measures the logits' distance).
func TestRunF16KVCache(t *testing.T) {
	bin, tok := stories(t)
	res := runJSON(t, bin, "--tokenizer", tok, "--temperature", "0", "--max-tokens", "100", "--kv-cache-dtype", "f16", "--device", "cpu")
	want, _ := os.ReadFile(filepath.Join(filepath.Dir(bin), "expected_greedy_200steps.txt"))
	if len(res.IDs) != 100 || !strings.HasPrefix(string(want), res.Text) || len(res.Text) < 200 {
		t.Errorf("greedy run with an f16 KV cache gave %d ids and %q, want 100 ids starting llama2.c's output %q", len(res.IDs), res.Text, want[:60])
	}
}

// TestRunIDsWithoutTokenizer checks that a model without a tokenizer runs
// from --ids and prints ids: JSON with an empty text, or the ids on the
// terminal.
func TestRunIDsWithoutTokenizer(t *testing.T) {
	bin, _ := stories(t) // llama2.c: no tokenizer inside
	res := runJSON(t, bin, "--ids", "1,403", "--temperature", "0", "--max-tokens", "6")
	if len(res.IDs) != 6 || res.Text != "" {
		t.Errorf("got %d ids and text %q, want 6 ids and no text", len(res.IDs), res.Text)
	}
	plain, stderr, code := kiln(t, "run", bin, "--ids", "1,403", "--temperature", "0", "--max-tokens", "6")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var want []string
	for _, id := range res.IDs {
		want = append(want, strconv.Itoa(id))
	}
	if strings.TrimSpace(plain) != strings.Join(want, " ") {
		t.Errorf("plain output %q, want the ids %q", plain, strings.Join(want, " "))
	}
	if _, stderr, code := kiln(t, "run", bin, "--ids", "1", "--stop", "x"); code == 0 || !strings.Contains(stderr, "tokenizer") {
		t.Errorf("--stop without a tokenizer: exit %d, stderr %q", code, stderr)
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	_, tok := stories(t)
	out, stderr, code := kiln(t, "tokenize", "--tokenizer", tok, "--text", "Once upon a time")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var ids struct {
		IDs []int `json:"ids"`
	}
	if err := json.Unmarshal([]byte(out), &ids); err != nil || len(ids.IDs) == 0 {
		t.Fatalf("%v: %q", err, out)
	}
	s := make([]string, len(ids.IDs))
	for i, id := range ids.IDs {
		s[i] = strconv.Itoa(id)
	}
	out, stderr, code = kiln(t, "detokenize", "--tokenizer", tok, "--ids", strings.Join(s, ","))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var text struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(out), &text); err != nil || strings.TrimSpace(text.Text) != "Once upon a time" {
		t.Errorf("round trip gave %q (%v)", text.Text, err)
	}
}

// TestCPUFallbackNotice: without a usable GPU, the default device (auto)
// runs on the CPU after one line on stderr saying so and why.
func TestCPUFallbackNotice(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("this machine has a usable GPU")
	}
	bin, _ := stories(t)
	out, stderr, code := kilnEnv(t, []string{"KILN_DEVICE=auto"}, "logits", bin, "--ids", "1,403")
	if code != 0 || !strings.Contains(out, "logits") {
		t.Fatalf("exit %d, stdout %.80q, stderr %q", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "kiln: running on the CPU (no usable GPU: ") {
		t.Errorf("stderr %q, want one line announcing the CPU", stderr)
	}
	_, stderr, code = kilnEnv(t, []string{"KILN_DEVICE=cuda"}, "logits", bin, "--ids", "1,403")
	if code == 0 || len(strings.Split(strings.TrimSpace(stderr), "\n")) != 1 {
		t.Errorf("--device cuda without a GPU: exit %d, stderr %q (want one error line)", code, stderr)
	}
}

func TestLogitsRows(t *testing.T) {
	bin, _ := stories(t)
	out, stderr, code := kiln(t, "logits", bin, "--ids", "1,403,407")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Logits [][]float32 `json:"logits"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Logits) != 3 || len(res.Logits[0]) != 512 {
		t.Errorf("got %d rows of %d logits, want 3 of 512", len(res.Logits), len(res.Logits[0]))
	}
}

func TestInspect(t *testing.T) {
	bin, _ := stories(t)
	out, stderr, code := kiln(t, "inspect", bin, "--after", "fuse-swiglu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"260,032", "# graph after fuse-swiglu", "swiglu", "buffer plan", "peak", "kernels", "gemm.matmul"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q", want)
		}
	}
}

// TestRunDemo checks that kiln run without a model uses the embedded demo
// model and says so in one line on stderr.
func TestRunDemo(t *testing.T) {
	out, stderr, code := kiln(t, "run", "--prompt", "In the beginning", "--max-tokens", "8", "--seed", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.Contains(stderr, "demo model") {
		t.Errorf("stderr %q, want one line naming the demo model", stderr)
	}
	if len(strings.TrimSpace(out)) == 0 {
		t.Error("no text generated")
	}
}

// startServe starts kiln serve on a free port with args (on the CPU, unless
// args say otherwise), waits for /health, and gives its address; the
// process is killed when the test ends.
func startServe(t *testing.T, args ...string) (base string, cmd *exec.Cmd, stderr *strings.Builder) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd = exec.Command(kilnBin, append([]string{"serve", "--port", port}, args...)...)
	cmd.Env = append(os.Environ(), "KILN_DEVICE=cpu")
	stderr = &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base = "http://127.0.0.1:" + port
	for i := 0; ; i++ {
		resp, err := http.Get(base + "/health")
		if err == nil && resp.StatusCode == 200 {
			resp.Body.Close()
			return base, cmd, stderr
		}
		if i == 300 {
			t.Fatalf("no /health after 30 s: %v\n%s", err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServeDemoByName: `kiln serve demo` is `kiln serve`: the same model
// name and the demo's chat template.
func TestServeDemoByName(t *testing.T) {
	base, _, stderr := startServe(t, "demo", "--max-num-seqs", "2")
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(models), `"kiln-demo"`) {
		t.Errorf("/v1/models: %s", models)
	}
	resp, err = http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages": [{"role": "user", "content": "Who made the heaven?"}], "max_tokens": 4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("chat: status %d: %s\n%s", resp.StatusCode, body, stderr.String())
	}
}

// TestServeDemo starts kiln serve with no model (the demo), asks it for a
// completion over HTTP, and stops it with SIGTERM: it exits 0.
func TestServeDemo(t *testing.T) {
	base, cmd, stderr := startServe(t, "--max-num-seqs", "4")
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "In the beginning", "max_tokens": 8, "temperature": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Model   string
		Choices []struct{ Text string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out.Model != "kiln-demo" || len(out.Choices) != 1 || out.Choices[0].Text == "" {
		t.Fatalf("status %d, %+v", resp.StatusCode, out)
	}
	// The demo's chat template (tokenizer_config.json) renders the conversation.
	resp, err = http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages": [{"role": "user", "content": "Who made the heaven?"}], "max_tokens": 8, "temperature": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	var chatOut struct {
		Choices []struct {
			Message struct{ Role, Content string }
		}
	}
	json.NewDecoder(resp.Body).Decode(&chatOut)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(chatOut.Choices) != 1 || chatOut.Choices[0].Message.Role != "assistant" {
		t.Fatalf("chat: status %d, %+v", resp.StatusCode, chatOut)
	}
	// kiln bench serve against it: a budget it meets exits 0 and writes the
	// results; one it misses exits 1.
	dir := t.TempDir()
	pass, fail := filepath.Join(dir, "pass.toml"), filepath.Join(dir, "fail.toml")
	os.WriteFile(pass, []byte("p99_ttft_ms = 60000\nmax_error_rate = 0\nmin_output_tokens_per_s = 1\n"), 0o644)
	os.WriteFile(fail, []byte("p99_ttft_ms = 0.001\n"), 0o644)
	results := filepath.Join(dir, "results.json")
	bench := func(budget string) (string, string, int) {
		return kiln(t, "bench", "serve", "--url", base, "--concurrency", "4", "--num-requests", "12", "--prompt-tokens", "32",
			"--output-tokens", "8", "--budget", budget, "--output", results)
	}
	if out, stderr, code := bench(pass); code != 0 || !strings.Contains(out, "| p99_ttft_ms | 60000 |") {
		t.Errorf("bench serve with a budget it meets: exit %d\n%s\n%s", code, out, stderr)
	}
	var saved struct {
		Schema   string
		Summary  struct{ Requests int }
		Requests []json.RawMessage
	}
	if data, err := os.ReadFile(results); err != nil || json.Unmarshal(data, &saved) != nil || saved.Schema != "kiln.bench.serve/v1" ||
		saved.Summary.Requests != 12 || len(saved.Requests) != 12 {
		t.Errorf("results file: %v %+v", err, saved.Summary)
	}
	if _, stderr, code := bench(fail); code != 1 || !strings.Contains(stderr, "budget targets missed") {
		t.Errorf("bench serve with a budget it misses: exit %d, %q", code, stderr)
	}
	if out, stderr, code := kiln(t, "bench", "compare", results, results); code != 0 || !strings.Contains(out, "p99_ttft_ms") {
		t.Errorf("bench compare of a run with itself: exit %d\n%s\n%s", code, out, stderr)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, stderr.String())
	}
}

// TestQuantize writes the demo model as Q8_0 GGUF, its vocabulary included,
// and as an FP8 checkpoint, and runs them: the greedy text is the bf16
// model's (convert's TestQuantizedQuality checks 64 tokens of Q8_0), and a
// failed run leaves no file behind.
func TestQuantize(t *testing.T) {
	out := filepath.Join(t.TempDir(), "demo-q8_0.gguf")
	stdout, stderr, code := kiln(t, "quantize", "../../demo/files", out, "--to", "q8_0")
	if code != 0 || !strings.Contains(stdout, "matrices 43 as q8_0") || strings.Contains(stdout, "no vocabulary") {
		t.Fatalf("quantize: exit %d\n%s%s", code, stdout, stderr)
	}
	// The file carries the demo's vocabulary: it runs on its own.
	got := runJSON(t, out, "--prompt", "In the beginning", "--max-tokens", "16", "--temperature", "0")
	want := runJSON(t, "../../demo/files", "--prompt", "In the beginning", "--max-tokens", "16", "--temperature", "0")
	if got.Text == "" || got.Text != want.Text {
		t.Errorf("q8_0 text %q, bf16 %q", got.Text, want.Text)
	}
	// FP8: a checkpoint directory that runs as it is, here giving bf16's
	// greedy text too.
	fp8 := filepath.Join(t.TempDir(), "demo-fp8")
	if stdout, stderr, code := kiln(t, "quantize", "../../demo/files", fp8, "--to", "fp8"); code != 0 || !strings.Contains(stdout, "42 as f8_e4m3") {
		t.Fatalf("quantize --to fp8: exit %d\n%s%s", code, stdout, stderr)
	}
	if got := runJSON(t, fp8, "--prompt", "In the beginning", "--max-tokens", "16", "--temperature", "0"); got.Text != want.Text {
		t.Errorf("fp8 text %q, bf16 %q", got.Text, want.Text)
	}
	if _, _, code := kiln(t, "quantize", "../../demo/files", fp8, "--to", "fp8"); code == 0 {
		t.Error("quantize --to fp8 over an existing directory succeeded")
	}
	dir := filepath.Dir(out)
	if _, _, code := kiln(t, "quantize", "../../demo/files", filepath.Join(dir, "no/such/dir/x.gguf")); code == 0 {
		t.Error("quantize into a missing directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d files left in %s, want only %s", len(entries), dir, filepath.Base(out))
	}
}

// TestTuneCPU: kiln tune races the tilings of a model's products and
// keeps them; kiln tune list shows them; export and import carry them to
// another cache directory; kiln run with tilings far from the defaults
// (put into the export: the smallest units and grain, a k block longer
// than stories260K's rows, so the sums are the same) gives the greedy text
// it gives without them.
func TestTuneCPU(t *testing.T) {
	bin, tok := stories(t)
	dir, other := t.TempDir(), t.TempDir()
	env := []string{"KILN_DEVICE=cpu", "KILN_TUNE_DIR=" + dir}
	out, stderr, code := kilnEnv(t, env, "tune", bin, "--threads", "1", "--prefill", "6")
	if code != 0 || !strings.Contains(out, "once each") || !strings.Contains(out, "cpu prefill tiling") {
		t.Fatalf("kiln tune: exit %d\n%s\n%s", code, out, stderr)
	}
	out, _, code = kilnEnv(t, env, "tune", "list", "--device", "cpu")
	if code != 0 || !strings.Contains(out, "cpu product grain") {
		t.Fatalf("kiln tune list: exit %d\n%s", code, out)
	}
	file := filepath.Join(t.TempDir(), "tuned.json")
	if out, stderr, code = kilnEnv(t, env, "tune", "export", file, "--device", "cpu"); code != 0 {
		t.Fatalf("kiln tune export: exit %d\n%s%s", code, out, stderr)
	}
	forceTiling(t, file, "rows 4, tokens 3, kblock 2048, grain 1")
	out, stderr, code = kilnEnv(t, []string{"KILN_TUNE_DIR=" + other}, "tune", "import", file, "--device", "cpu")
	if code != 0 || !strings.HasPrefix(out, "imported ") || strings.HasPrefix(out, "imported 0 ") || stderr != "" {
		t.Fatalf("kiln tune import: exit %d\n%s%s", code, out, stderr)
	}
	run := func(tuneDir string) string {
		o, e, c := kilnEnv(t, []string{"KILN_DEVICE=cpu", "KILN_TUNE_DIR=" + tuneDir}, "run", bin, "--tokenizer", tok, "--threads", "1",
			"--temperature", "0", "--max-tokens", "24", "--json")
		if c != 0 {
			t.Fatalf("kiln run: exit %d: %s", c, e)
		}
		return o
	}
	if tuned, plain := run(other), run(t.TempDir()); tuned != plain {
		t.Errorf("with the tuned tilings:\n%s\nwithout:\n%s", tuned, plain)
	}
}

// TestTuneFaultyCandidate: kiln tune runs its trials in a child process;
// a candidate that kills it (the test hook tune.EnvFault: the grain of 16
// KiB, one candidate of each matrix's grain race) is barred, the child
// starts again, the tuning ends, and each grain race's entry lists the
// candidate as rejected. The same candidate under --in-process takes kiln
// tune down.
func TestTuneFaultyCandidate(t *testing.T) {
	bin, _ := stories(t)
	dir := t.TempDir()
	env := []string{"KILN_DEVICE=cpu", "KILN_TUNE_DIR=" + dir, "KILN_TUNE_FAULT=grain 16384"}
	out, stderr, code := kilnEnv(t, env, "tune", bin, "--threads", "1", "--prefill", "6")
	if code != 0 || !strings.Contains(out, "once each") || !strings.Contains(out, "barred after they killed the tuner") {
		t.Fatalf("kiln tune: exit %d\n%s\n%s", code, out, stderr)
	}
	file := filepath.Join(t.TempDir(), "tuned.json")
	if out, stderr, code := kilnEnv(t, env, "tune", "export", file, "--device", "cpu"); code != 0 {
		t.Fatalf("kiln tune export: exit %d\n%s%s", code, out, stderr)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Entries []struct {
			Entry struct {
				Family   string   `json:"family"`
				Rejected []string `json:"rejected"`
			} `json:"entry"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(data, &exp); err != nil {
		t.Fatal(err)
	}
	grains := 0
	for _, sealed := range exp.Entries {
		e := sealed.Entry
		if e.Family != "cpu product grain" {
			continue
		}
		grains++
		if !slices.ContainsFunc(e.Rejected, func(r string) bool {
			return strings.Contains(r, "grain 16384") && strings.Contains(r, "killed the tuner")
		}) {
			t.Errorf("a grain race's rejected: %q", e.Rejected)
		}
	}
	if grains == 0 || strings.Count(out, "barred, starting again") != grains {
		t.Errorf("%d grain races, %d restarts:\n%s", grains, strings.Count(out, "barred, starting again"), out)
	}
	if _, _, code := kilnEnv(t, env, "tune", bin, "--threads", "1", "--prefill", "6", "--in-process"); code == 0 {
		t.Error("kiln tune --in-process survived a candidate that kills it")
	}
}

// forceTiling sets every entry of the kiln tune export at file to choice,
// resealing each with its checksum.
func forceTiling(t *testing.T, file, choice string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	entries, _ := f["entries"].([]any)
	if len(entries) == 0 {
		t.Fatalf("no entries in %s", b)
	}
	for _, s := range entries {
		sealed := s.(map[string]any)
		e := sealed["entry"].(map[string]any)
		e["choice"] = choice
		raw, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(raw)
		sealed["entry"], sealed["sha256"] = json.RawMessage(raw), hex.EncodeToString(sum[:])
	}
	if b, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHelp: every command has help with a description, examples and its
// flags (kiln help CMD, CMD -h, exit 0), kiln bench --help and kiln version
// answer, a bad flag is one line naming the help, and the shell completion
// scripts know the commands and, through kiln __flags, their flags.
func TestHelp(t *testing.T) {
	for _, c := range []string{"run", "serve", "logits", "perplexity", "tokenize", "detokenize", "inspect", "quantize", "tune", "compile"} {
		out, stderr, code := kiln(t, "help", c)
		if code != 0 || !strings.HasPrefix(out, "usage: kiln "+c) || !strings.Contains(out, "examples:") || !strings.Contains(out, "flags:") {
			t.Errorf("kiln help %s: exit %d, %q, %q", c, code, out, stderr)
		}
	}
	for _, c := range [][]string{{"help", "bench", "model"}, {"bench", "serve", "-h"}, {"bench", "compare", "--help"}} {
		if out, _, code := kiln(t, c...); code != 0 || !strings.Contains(out, "usage: kiln bench") {
			t.Errorf("%v: exit %d, %q", c, code, out)
		}
	}
	if out, _, code := kiln(t, "bench", "--help"); code != 0 || !strings.Contains(out, "kiln bench compare") {
		t.Errorf("kiln bench --help: exit %d, %q", code, out)
	}
	for _, c := range [][]string{{"version"}, {"--version"}} {
		if out, _, code := kiln(t, c...); code != 0 || !strings.HasPrefix(out, "kiln ") {
			t.Errorf("%v: exit %d, %q", c, code, out)
		}
	}
	if out, _, code := kiln(t, "--help"); code != 0 || !strings.Contains(out, "kiln bench serve") || !strings.Contains(out, "kiln completion") {
		t.Errorf("kiln --help: exit %d, %q", code, out)
	}
	_, stderr, code := kiln(t, "run", "--max-tokenz", "3")
	if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "max-tokenz") || !strings.Contains(stderr, "kiln help run") {
		t.Errorf("a bad flag: exit %d, %q", code, stderr)
	}
	if out, _, code := kiln(t, "__flags", "run"); code != 0 || !strings.Contains(out, "--max-tokens") || !strings.Contains(out, "--speculative") {
		t.Errorf("kiln __flags run: exit %d, %q", code, out)
	}
	for sh, want := range map[string]string{"bash": "complete -F _kiln kiln", "zsh": "compdef _kiln kiln", "fish": "complete -c kiln"} {
		if out, _, code := kiln(t, "completion", sh); code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "serve") {
			t.Errorf("kiln completion %s: exit %d, %q", sh, code, out)
		}
	}
}

// TestRunFromStdin: with no prompt given, kiln run reads it from standard
// input; a generation cut by the context says so; another model's tokenizer
// is refused by its size; demo names the built-in model for logits and
// bench model, whose defaults fit its context.
func TestRunFromStdin(t *testing.T) {
	cmd := exec.Command(kilnBin, "run", "--temperature", "0", "--max-tokens", "4", "--json")
	cmd.Stdin = strings.NewReader("In the beginning\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	withFlag := runJSON(t, "--prompt", "In the beginning", "--temperature", "0", "--max-tokens", "4")
	var res runResult
	if err := json.Unmarshal(out, &res); err != nil || !slices.Equal(res.IDs, withFlag.IDs) {
		t.Errorf("stdin prompt gave %s (%v), --prompt %v", out, err, withFlag.IDs)
	}
	_, stderr, code := kiln(t, "run", "demo", "--prompt", "And", "--temperature", "0", "--max-tokens", "600")
	if code != 0 || !strings.Contains(stderr, "stopped at the context length of 512") {
		t.Errorf("past the context: exit %d, %q", code, stderr)
	}
	_, tok := stories(t)
	if _, stderr, code := kiln(t, "run", "demo", "--tokenizer", tok, "--prompt", "x"); code == 0 || !strings.Contains(stderr, "the tokenizer has 512 tokens, the model 4096") {
		t.Errorf("another model's tokenizer: exit %d, %q", code, stderr)
	}
	if out, stderr, code := kiln(t, "logits", "demo", "--ids", "1,2"); code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Errorf("kiln logits demo: exit %d, %q, %q", code, out[:min(len(out), 80)], stderr)
	}
	out2, stderr, code := kiln(t, "bench", "model", "--batch", "1", "--reps", "1", "--tg", "4", "--device", "cpu")
	if code != 0 || !strings.Contains(stderr, "the model's context is 512: --pp 511, --tg 4") || !strings.Contains(out2, "pp511") {
		t.Errorf("kiln bench model with its defaults: exit %d, %q, %q", code, out2, stderr)
	}
}

// TestServeBindsFirst: kiln serve takes its port before it loads the model:
// a port in use fails at once, before the model's path is even looked at.
func TestServeBindsFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_, stderr, code := kiln(t, "serve", "/no/such/model", "--port", port)
	if code == 0 || !strings.Contains(stderr, "address already in use") {
		t.Errorf("a port in use: exit %d, %q", code, stderr)
	}
}

// TestPerplexityInterrupted: kiln perplexity shows its progress (plain
// lines when stderr is not a terminal) and, interrupted, prints the result
// of what it scored and exits 0.
func TestPerplexityInterrupted(t *testing.T) {
	text := testshared.Path(t, "corpora", "war-and-peace.txt")
	cmd := exec.Command(kilnBin, "perplexity", "--file", text, "--window", "128", "--device", "cpu")
	var out strings.Builder
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "perplexity ") && strings.Contains(sc.Text(), " after ") {
			cmd.Process.Signal(os.Interrupt)
			break
		}
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %q", err, lines)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "interrupted: the result of the") || !strings.HasPrefix(out.String(), "perplexity ") {
		t.Errorf("stdout %q, stderr %q", out.String(), lines)
	}
}

// TestRunInterrupted: Ctrl-C ends kiln run's generation with a newline, a
// line saying so, and exit 0.
func TestRunInterrupted(t *testing.T) {
	cmd := exec.Command(kilnBin, "run", "demo", "--prompt", "And", "--max-tokens", "500", "--ctx", "512", "--reference", "--device", "cpu")
	var errOut strings.Builder
	cmd.Stderr = &errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := stdout.Read(buf); err != nil { // the first piece of text
		t.Fatal(err)
	}
	cmd.Process.Signal(os.Interrupt)
	rest, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	if !strings.HasSuffix(string(rest), "\n") || !strings.Contains(errOut.String(), "kiln: interrupted after") {
		t.Errorf("stdout %q, stderr %q", string(buf)+string(rest), errOut.String())
	}
}

// writeServeRun writes a kiln bench serve result file of 40 requests whose
// latencies are scale times nominal (with a little noise of seed), for
// workload prompt tokens.
func writeServeRun(t *testing.T, path string, scale float64, seed uint64, prompt int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	start := time.Unix(0, 0)
	var rs []loadgen.Result
	for range 40 {
		d := func(ms float64) time.Duration {
			return time.Duration(scale * ms * (1 + 0.05*rng.NormFloat64()) * float64(time.Millisecond))
		}
		r := loadgen.Result{Start: start, TTFT: d(40), InputTokens: prompt, OutputTokens: 32}
		for range 31 {
			r.ITL = append(r.ITL, d(10))
		}
		r.E2E = r.TTFT
		for _, x := range r.ITL {
			r.E2E += x
		}
		rs = append(rs, r)
		start = start.Add(r.E2E / 4)
	}
	doc := map[string]any{"schema": "kiln.bench.serve/v1", "date": time.Now().Format(time.RFC3339),
		"config": map[string]any{"url": "http://x", "prompt_tokens": prompt, "output_tokens": 32, "num_requests": 40}, "requests": rs}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBenchCompareRuns: kiln bench compare gates on repeated runs: three
// runs of the same workload against three more pass, three 20% slower fail;
// one run a side is reported, never failed; files of different workloads
// are refused.
func TestBenchCompareRuns(t *testing.T) {
	dir := t.TempDir()
	files := func(prefix string, scale float64, seeds ...uint64) string {
		var ps []string
		for _, s := range seeds {
			p := filepath.Join(dir, fmt.Sprintf("%s-%d.json", prefix, s))
			writeServeRun(t, p, scale*(1+0.01*float64(s%3)), s, 128)
			ps = append(ps, p)
		}
		return strings.Join(ps, ",")
	}
	base, same, slow := files("base", 1, 1, 2, 3), files("same", 1, 4, 5, 6), files("slow", 1.2, 7, 8, 9)
	if out, stderr, code := kiln(t, "bench", "compare", base, same); code != 0 || strings.Contains(out, "REGRESSION") || !strings.Contains(out, "3 and 3 runs") {
		t.Errorf("same workload: exit %d\n%s%s", code, out, stderr)
	}
	if out, _, code := kiln(t, "bench", "compare", base, slow); code == 0 || !strings.Contains(out, "REGRESSION") {
		t.Errorf("20%% slower: exit %d\n%s", code, out)
	}
	one := strings.Split(base, ",")[0]
	slowOne := strings.Split(slow, ",")[0]
	if out, _, code := kiln(t, "bench", "compare", one, slowOne); code != 0 || strings.Contains(out, "REGRESSION") || !strings.Contains(out, "one run a side") {
		t.Errorf("one run a side: exit %d\n%s", code, out)
	}
	other := filepath.Join(dir, "other.json")
	writeServeRun(t, other, 1, 10, 512)
	if _, stderr, code := kiln(t, "bench", "compare", one, other); code == 0 || !strings.Contains(stderr, "ran different workloads (prompt_tokens 128, 512)") {
		t.Errorf("different workloads: exit %d, %q", code, stderr)
	}
}

// TestBenchCompareThroughput: kiln bench compare takes kiln bench
// throughput's reports: two real runs of one workload are compared and not
// gated; three runs against three 20% slower fail, against three the same
// pass; a run of another workload is refused.
func TestBenchCompareThroughput(t *testing.T) {
	dir := t.TempDir()
	run := func(name string, extra ...string) string {
		p := filepath.Join(dir, name+".json")
		args := append([]string{"bench", "throughput", "--num-requests", "8", "--warmup-requests", "0", "--max-num-seqs", "4",
			"--prompt-tokens", "16", "--output-tokens", "8", "--output", p}, extra...)
		if _, stderr, code := kiln(t, args...); code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, stderr)
		}
		return p
	}
	a, b := run("a"), run("b", "--seed", "2")
	if out, stderr, code := kiln(t, "bench", "compare", a, b); code != 0 || !strings.Contains(out, "output tokens/s") || strings.Contains(out, "REGRESSION") {
		t.Errorf("two runs: exit %d\n%s%s", code, out, stderr)
	}
	other := run("other", "--output-tokens", "4")
	if _, stderr, code := kiln(t, "bench", "compare", a, other); code == 0 || !strings.Contains(stderr, "ran different workloads") {
		t.Errorf("another workload: exit %d, %q", code, stderr)
	}
	raw, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	var r throughputReport
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	files := func(prefix string, scale float64) string {
		var ps []string
		for i, f := range []float64{1, 1.01, 0.99} {
			c := r
			c.OutputPerSec, c.TotalPerSec, c.RequestsPerSec = 1000*scale*f, 2000*scale*f, 10*scale*f
			js, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, fmt.Sprintf("%s-%d.json", prefix, i))
			if err := os.WriteFile(p, js, 0o644); err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		return strings.Join(ps, ",")
	}
	base, same, slow := files("base", 1), files("same", 1.005), files("slow", 0.8)
	if out, stderr, code := kiln(t, "bench", "compare", base, same); code != 0 || strings.Contains(out, "REGRESSION") {
		t.Errorf("the same: exit %d\n%s%s", code, out, stderr)
	}
	if out, _, code := kiln(t, "bench", "compare", base, slow); code == 0 || strings.Count(out, "REGRESSION") != 3 {
		t.Errorf("20%% slower: exit %d\n%s", code, out)
	}
}

// TestChat: kiln chat takes each line of standard input as a user turn of
// the demo model's chat template and streams each reply on its own line;
// /clear starts over (the same first turn gives the same greedy reply); a
// model without a chat template is refused.
func TestChat(t *testing.T) {
	chatOut := func(input string) string {
		cmd := exec.Command(kilnBin, "chat", "--temperature", "0", "--max-tokens", "12", "--device", "cpu")
		cmd.Stdin = strings.NewReader(input)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return string(out)
	}
	first := chatOut("Who made the heaven?\n")
	all := chatOut("Who made the heaven?\nAnd the earth?\n/clear\nWho made the heaven?\n")
	if first == "" || !strings.HasPrefix(all, first) || !strings.HasSuffix(all, first) || len(all) <= 2*len(first) || strings.Contains(all, ">>>") {
		t.Errorf("one turn gave %q; the conversation %q", first, all)
	}
	// A turn past the context is dropped, and the conversation goes on as
	// if it had not been said.
	long := strings.Repeat("And God said, let there be light. ", 200)
	two := chatOut("Who made the heaven?\nAnd the earth?\n")
	if got := chatOut("Who made the heaven?\n" + long + "\nAnd the earth?\n"); got != two {
		t.Errorf("with a turn past the context %q, without it %q", got, two)
	}
	bin, tok := stories(t)
	if _, stderr, code := kiln(t, "chat", bin, "--tokenizer", tok); code == 0 || !strings.Contains(stderr, "no chat template") {
		t.Errorf("a model without a chat template: exit %d, %q", code, stderr)
	}
}

// TestBenchRandomCleanup: kiln bench model --random interrupted leaves no
// temporary model behind.
func TestBenchRandomCleanup(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(kilnBin, "bench", "model", "--random", "tiny", "--device", "cpu", "--pp", "64", "--tg", "64", "--batch", "1,2,4", "--reps", "200")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "writing a random") {
			break
		}
	}
	time.Sleep(300 * time.Millisecond) // into the benchmark
	cmd.Process.Signal(os.Interrupt)
	for sc.Scan() {
	}
	cmd.Wait()
	left, _ := filepath.Glob(filepath.Join(tmp, "kiln-bench-*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestServeTensorParallelSpeculative: kiln serve over 2 CPU ranks with
// prompt-lookup speculation answers a greedy completion with kiln run's
// text, counts its drafts in /metrics, and exits 0 on SIGTERM.
func TestServeTensorParallelSpeculative(t *testing.T) {
	prompt := "In the beginning God created the heaven and the earth. In the beginning God"
	want := runJSON(t, "--prompt", prompt, "--temperature", "0", "--max-tokens", "24", "--device", "cpu")
	base, cmd, stderr := startServe(t, "--device", "cpu", "--tensor-parallel-size", "2", "--speculative", "ngram")
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 24, "temperature": 0})
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Choices []struct{ Text string } }
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if len(out.Choices) != 1 || out.Choices[0].Text != want.Text {
		t.Errorf("served %+v, kiln run %q", out, want.Text)
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "kiln:spec_decode_num_draft_tokens_total") {
		t.Error("no speculative decoding counters in /metrics")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("kiln serve did not exit after SIGTERM\n%s", stderr.String())
	}
}

// TestBenchSpec: kiln bench spec on the demo model (f32 on the CPU) keeps
// every draft when each is right (p 1), fewer when half are, and gives
// plain greedy output in both; a bad --accept gets one line.
func TestBenchSpec(t *testing.T) {
	out, stderr, code := kiln(t, "bench", "spec", "--tg", "40", "--reps", "1", "--accept", "1,0.5", "--num-speculative-tokens", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	t.Log(out)
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) == 10 {
			rows[strings.TrimSpace(f[1])] = f[2:9]
		}
	}
	full, half := rows["1.00"], rows["0.50"]
	if rows["plain"] == nil || full == nil || half == nil {
		t.Fatalf("want rows plain, 1.00 and 0.50:\n%s", out)
	}
	if kept := strings.TrimSpace(full[4]); !strings.HasSuffix(kept, "(100%)") || strings.TrimSpace(full[3]) == "0" {
		t.Errorf("p 1: drafted %s, kept %s, want every draft kept", full[3], kept)
	}
	if kept := strings.TrimSpace(half[4]); strings.HasSuffix(kept, "(100%)") || strings.HasSuffix(kept, "(0%)") {
		t.Errorf("p 0.5: kept %s, want some drafts kept and some not", kept)
	}
	for p, row := range map[string][]string{"1.00": full, "0.50": half} {
		if same := strings.TrimSpace(row[5]); same != "all" {
			t.Errorf("p %s: plain's tokens %q, want all", p, same)
		}
		if n := strings.TrimSpace(row[6]); n != "0" {
			t.Errorf("p %s: drafts re-derived %s times, want 0 where every run kept plain's tokens", p, n)
		}
	}
	if _, stderr, code := kiln(t, "bench", "spec", "--accept", "0.5,x"); code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("--accept 0.5,x: exit %d, stderr %q: want one line and a failure", code, stderr)
	}
}

// TestBenchThroughput: every request runs to its length through serve's
// scheduler in process, many a step, and the report's figures agree with
// one another.
func TestBenchThroughput(t *testing.T) {
	out, stderr, code := kiln(t, "bench", "throughput", "--num-requests", "24", "--warmup-requests", "4", "--max-num-seqs", "8",
		"--prompt-tokens", "16", "--output-tokens", "12", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r throughputReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Logf("%+v", r)
	if r.Requests != 24 || r.Warmup != 4 || r.OutputTokens != 24*12 || r.PromptTokens < 24*16 {
		t.Fatalf("requests %d (warm-up %d), output tokens %d, prompt tokens %d: want 24 (4), 288, at least 384",
			r.Requests, r.Warmup, r.OutputTokens, r.PromptTokens)
	}
	if r.OutputPerStep <= 4 || r.OutputPerStep > 8 || r.Preemptions != 0 {
		t.Errorf("%.1f output tokens a step, %d preemptions: want 4 to 8 (8 running), none", r.OutputPerStep, r.Preemptions)
	}
	if r.CachedPrompt > 0.1 {
		t.Errorf("%.0f%% of prompt tokens from the prefix cache: want prompts of their own", 100*r.CachedPrompt)
	}
	if want := float64(r.OutputTokens) / r.Seconds; math.Abs(r.OutputPerSec-want) > 1e-6*want || r.StepMs <= 0 {
		t.Errorf("output %.1f tok/s over %.3f s, %.2f ms a step: want %.1f, a step time", r.OutputPerSec, r.Seconds, r.StepMs, want)
	}
	// kiln bench serve's workload flags: a dataset's items in turn with
	// their own output lengths; a shared prefix the prefix cache serves.
	data := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(data, []byte(`{"prompt": "In the beginning God created", "output_tokens": 5}`+"\n"+`{"prompt": "And the earth was without form", "output_tokens": 7}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args   []string
		check  func(r throughputReport) bool
		wanted string
	}{
		{[]string{"--dataset", data}, func(r throughputReport) bool { return r.OutputTokens == 5+7+5+7 }, "24 output tokens (5, 7, 5, 7)"},
		{[]string{"--prompt-tokens", "96", "--output-tokens", "4", "--shared-prefix", "0.9"}, func(r throughputReport) bool { return r.CachedPrompt > 0.3 },
			"over 30% of prompt tokens from the prefix cache"},
	} {
		out, stderr, code := kiln(t, append([]string{"bench", "throughput", "--num-requests", "4", "--warmup-requests", "0", "--max-num-seqs", "2", "--json"}, c.args...)...)
		var r throughputReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil || !c.check(r) {
			t.Errorf("%v: exit %d (%s), report %+v: want %s", c.args, code, stderr, r, c.wanted)
		}
	}
	// A budget: met, missed (exit 1), misspelled (refused before the run).
	for _, c := range []struct {
		budget string
		code   int
		want   string
	}{
		{"min_output_tokens_per_s = 1\nmin_requests_per_s = 0.01\n", 0, "| min_requests_per_s | 0.01 |"},
		{"min_output_tokens_per_s = 1e12\n", 1, "MISSED"},
		{"min_output_tokens = 1\n", 1, "unknown keys min_output_tokens"},
	} {
		f := filepath.Join(t.TempDir(), "budget.toml")
		if err := os.WriteFile(f, []byte(c.budget), 0o644); err != nil {
			t.Fatal(err)
		}
		out, stderr, code := kiln(t, "bench", "throughput", "--num-requests", "4", "--warmup-requests", "0", "--max-num-seqs", "2", "--budget", f)
		if code != c.code || !strings.Contains(out+stderr, c.want) {
			t.Errorf("budget %q: exit %d, want %d and %q:\n%s%s", c.budget, code, c.code, c.want, out, stderr)
		}
	}
}
