package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/backend"
	"kiln/backend/cpu"
	"kiln/engine"
	"kiln/internal/devsample"
	"kiln/internal/stephook"
	"kiln/internal/testshared"
	"kiln/model"
)

// stories opens stories260K (a real trained model, 512-token vocabulary) on
// the CPU with room for maxSeqs sequences and kvBlocks blocks of 16 tokens
// (0: a full context for each), with prefix caching.
func stories(t testing.TB, maxSeqs, kvBlocks int) *engine.Engine {
	return storiesOn(t, &cpu.Backend{}, maxSeqs, kvBlocks)
}

// storiesOn is stories on backend b.
func storiesOn(t testing.TB, b backend.Backend, maxSeqs, kvBlocks int) *engine.Engine {
	return storiesDrafting(t, b, maxSeqs, kvBlocks, false)
}

// storiesDrafting is storiesOn, with the model as its own draft model
// (engine.Options.DraftModel) when draft is set.
func storiesDrafting(t testing.TB, b backend.Backend, maxSeqs, kvBlocks int, draft bool) *engine.Engine {
	t.Helper()
	m, err := model.Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	o := engine.Options{MaxSeqs: maxSeqs, KVBlocks: kvBlocks, BlockSize: 16, PrefixCaching: true}
	if draft {
		o.DraftModel = m
	}
	e, err := engine.New(m, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// prompts are distinct prompts of different lengths.
func prompts(n int) [][]int {
	var out [][]int
	for i := 0; i < n; i++ {
		p := []int{1}
		for j := 0; j < 3+7*i%40; j++ {
			p = append(p, 10+(i*31+j*17)%480)
		}
		out = append(out, p)
	}
	return out
}

// alone generates each prompt by itself, greedily.
func alone(t *testing.T, e *engine.Engine, ps [][]int, maxTokens int) [][]int {
	var out [][]int
	for _, p := range ps {
		var ids []int
		if _, err := e.Generate(p, engine.SamplingParams{MaxTokens: maxTokens, IgnoreStop: true}, func(id int) bool {
			ids = append(ids, id)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		out = append(out, ids)
	}
	return out
}

// collect reads a request's events to the end.
func collect(t *testing.T, r *Request) ([]int, Event) {
	t.Helper()
	var ids []int
	for {
		select {
		case ev := <-r.Events:
			if ev.Done {
				return ids, ev
			}
			ids = append(ids, ev.Token)
		case <-time.After(30 * time.Second):
			t.Fatal("request did not finish")
		}
	}
}

// timedStories is stories on the CPU for at most maxSeqs sequences, each
// step taking cost(its tokens) more: a device's step times. The clock it
// returns moves by those costs alone, so that a scheduler reading it
// (runTimed) judges drafting by the modeled device, however busy the
// machine running the test is.
func timedStories(t *testing.T, maxSeqs int, cost func(tokens int) time.Duration) (*engine.Engine, *stepClock) {
	t.Helper()
	c := &stepClock{}
	timed := &stephook.Backend{Backend: &cpu.Backend{}, Before: func(b *backend.Batch) error {
		d := cost(len(b.Tokens))
		c.ns.Add(int64(d))
		time.Sleep(d) // arrivals keep their pace in steps
		return nil
	}}
	return storiesOn(t, timed, maxSeqs, 0), c
}

// stepClock is a modeled device's clock: the sum of its steps' costs.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) now() time.Time { return time.Unix(0, c.ns.Load()) }

// runTimed is runScheduler with steps and drafts timed by c.
func runTimed(t testing.TB, e *engine.Engine, c *stepClock, cfg Config) *Scheduler {
	t.Helper()
	s, err := NewScheduler(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.now = c.now
	run(t, s)
	return s
}

// expectOutputs collects each of rs and checks that it ended without an
// error with the tokens of want.
func expectOutputs(t *testing.T, rs []*Request, want [][]int) {
	t.Helper()
	for i, r := range rs {
		got, end := collect(t, r)
		if end.Err != nil || !slices.Equal(got, want[i]) {
			t.Errorf("request %d ended %+v:\n got %v\nwant %v", i, end, got, want[i])
		}
	}
}

func runScheduler(t testing.TB, e *engine.Engine, cfg Config) *Scheduler {
	t.Helper()
	s, err := NewScheduler(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	return s
}

// run runs s's loop until the test ends.
func run(t testing.TB, s *Scheduler) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestBatchedEqualsAlone: greedy outputs of requests batched together (with
// chunked prefill under a small token budget, and preemption when the cache
// is short) equal those of the same requests run one at a time, and every
// KV block comes back.
func TestBatchedEqualsAlone(t *testing.T) {
	ps := prompts(12)
	want := alone(t, stories(t, 1, 0), ps, 40)
	for _, tc := range []struct {
		name             string
		kvBlocks, budget int
		wantPreemptions  bool
	}{
		{"roomy", 0, 64, false},
		{"short cache", 12, 32, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := stories(t, 8, tc.kvBlocks)
			s := runScheduler(t, e, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: tc.budget})
			var reqs []*Request
			for _, p := range ps {
				r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 40, IgnoreStop: true}}
				if err := s.Submit(r); err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, r)
			}
			for i, r := range reqs {
				got, end := collect(t, r)
				if end.Err != nil || end.Finish != engine.FinishLength || end.GeneratedTokens != 40 {
					t.Errorf("request %d ended %+v", i, end)
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("request %d:\n got %v\nwant %v", i, got, want[i])
				}
			}
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%+v", st)
			if st.FreeBlocks != st.TotalBlocks {
				t.Errorf("%d of %d blocks free after all requests finished", st.FreeBlocks, st.TotalBlocks)
			}
			if tc.wantPreemptions && st.Preemptions == 0 {
				t.Error("no preemption with a short cache")
			}
		})
	}
}

func waitIdle(t *testing.T, s *Scheduler) {
	t.Helper()
	for i := 0; i < 1000 && !s.Idle(); i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if !s.Idle() {
		t.Fatalf("scheduler not idle: %+v", s.Stats())
	}
}

// TestCancel: a cancelled request ends with its context's error and its
// blocks return.
func TestCancel(t *testing.T) {
	e := stories(t, 4, 0)
	s := runScheduler(t, e, Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 64})
	ctx, cancel := context.WithCancel(context.Background())
	r := &Request{Prompt: prompts(1)[0], Params: engine.SamplingParams{MaxTokens: 400, IgnoreStop: true}, Ctx: ctx}
	if err := s.Submit(r); err != nil {
		t.Fatal(err)
	}
	<-r.Events // running
	cancel()
	_, end := collect(t, r)
	if !errors.Is(end.Err, context.Canceled) {
		t.Errorf("ended %+v, want context.Canceled", end)
	}
	waitIdle(t, s)
	if st := s.Stats(); st.FreeBlocks != st.TotalBlocks {
		t.Errorf("%d of %d blocks free after the cancel", st.FreeBlocks, st.TotalBlocks)
	}
}

// TestAdmission: a full queue refuses at once; a prompt the cache can never
// hold is an error; higher priority runs first.
func TestAdmission(t *testing.T) {
	e := stories(t, 1, 8)
	s, err := NewScheduler(e, Config{MaxNumSeqs: 1, MaxNumBatchedTokens: 64, MaxQueuedRequests: 2})
	if err != nil {
		t.Fatal(err)
	}
	p := prompts(1)[0]
	low := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 2}, Priority: 0}
	high := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 2}, Priority: 5}
	for _, r := range []*Request{low, high} {
		if err := s.Submit(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Submit(&Request{Prompt: p}); !errors.Is(err, ErrOverloaded) {
		t.Errorf("third request: %v, want ErrOverloaded", err)
	}
	if err := s.Submit(&Request{Prompt: make([]int, 200)}); err == nil {
		t.Error("a prompt larger than the cache was accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	collect(t, high)
	collect(t, low)
	// Both Done events may be waiting by now, so the order they are read
	// says nothing: compare when each was admitted.
	if !high.admittedAt.Before(low.admittedAt) {
		t.Errorf("the priority-5 request was admitted at %v, after the priority-0 one at %v", high.admittedAt, low.admittedAt)
	}
}

// TestChunkedPrefillKeepsDecoding: while a long prompt is prefilled in
// chunks, a running stream gets a token at every step (its inter-token
// latency stays one step), and the prompt takes the rest of the budget.
func TestChunkedPrefillKeepsDecoding(t *testing.T) {
	e := stories(t, 2, 0)
	s, err := NewScheduler(e, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	a := &Request{Prompt: prompts(1)[0], Params: engine.SamplingParams{MaxTokens: 100, IgnoreStop: true}}
	if err := s.Submit(a); err != nil {
		t.Fatal(err)
	}
	s.step() // a's prompt
	s.step() // a decodes
	long := make([]int, 300)
	for i := range long {
		long[i] = 1 + (i*7)%500
	}
	b := &Request{Prompt: long, Params: engine.SamplingParams{MaxTokens: 1}}
	if err := s.Submit(b); err != nil {
		t.Fatal(err)
	}
	steps := 0
	for b.generated == 0 && b.seq != nil || steps == 0 {
		before := a.generated
		s.step()
		steps++
		if a.generated != before+1 {
			t.Fatalf("step %d of the long prompt: the running stream got %d tokens, want 1", steps, a.generated-before)
		}
		if steps > 20 {
			t.Fatal("the long prompt did not finish")
		}
	}
	// 300 prompt tokens at 31 a step (one token of the budget goes to a).
	if want := (300 + 30) / 31; steps != want {
		t.Errorf("the prompt took %d steps, want %d", steps, want)
	}
}

// TestDecodingBoundsPrefill: while a sequence decodes, a step takes at
// most DecodePrefillTokens of a new prompt (the budget allows more); with
// none decoding, the budget's worth.
func TestDecodingBoundsPrefill(t *testing.T) {
	e := stories(t, 3, 0)
	s, err := NewScheduler(e, Config{MaxNumSeqs: 3, MaxNumBatchedTokens: 128, DecodePrefillTokens: 24})
	if err != nil {
		t.Fatal(err)
	}
	long := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = 1 + (i*7)%500
		}
		return p
	}
	first := &Request{Prompt: long(300), Params: engine.SamplingParams{MaxTokens: 100, IgnoreStop: true}}
	if err := s.Submit(first); err != nil {
		t.Fatal(err)
	}
	s.step()
	if n := len(s.items[0].Tokens); n != 128 {
		t.Errorf("with nothing decoding the prompt took %d tokens of the step, want the budget's 128", n)
	}
	for first.generated == 0 {
		s.step()
	}
	b := &Request{Prompt: long(200), Params: engine.SamplingParams{MaxTokens: 1}}
	if err := s.Submit(b); err != nil {
		t.Fatal(err)
	}
	for steps := 0; b.generated == 0; steps++ {
		before := first.generated
		s.step()
		prompt := 0
		for _, it := range s.items {
			if it.Seq != first.seq {
				prompt += len(it.Tokens)
			}
		}
		if prompt > 24 || first.generated != before+1 {
			t.Fatalf("step %d: %d prompt tokens beside the decoding stream (want at most 24), %d tokens to it", steps, prompt, first.generated-before)
		}
		if steps > 20 {
			t.Fatal("the prompt did not finish")
		}
	}
}

// TestGroupForks: the n choices of one prompt compute the prompt once (the
// others fork its blocks, copying the shared partial block on write), and
// each choice generates what it would alone.
func TestGroupForks(t *testing.T) {
	prompt := prompts(6)[5] // not a whole number of 16-token blocks
	if len(prompt)%16 == 0 {
		t.Fatalf("prompt of %d tokens", len(prompt))
	}
	params := []engine.SamplingParams{{MaxTokens: 20, IgnoreStop: true}, {MaxTokens: 20, Temperature: 0.9, Seed: 5, IgnoreStop: true},
		{MaxTokens: 12, Temperature: 1.1, TopK: 20, Seed: 6, IgnoreStop: true}}
	// Each alone.
	var want [][]int
	for _, p := range params {
		e := stories(t, 1, 0)
		var ids []int
		if _, err := e.Generate(prompt, p, func(id int) bool { ids = append(ids, id); return true }); err != nil {
			t.Fatal(err)
		}
		want = append(want, ids)
	}
	e := stories(t, 4, 0)
	s := runScheduler(t, e, Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 64})
	var group []*Request
	for _, p := range params {
		group = append(group, &Request{Prompt: prompt, Params: p})
	}
	if err := s.SubmitGroup(group); err != nil {
		t.Fatal(err)
	}
	expectOutputs(t, group, want)
	waitIdle(t, s)
	st := s.Stats()
	if st.PromptTokens != uint64(len(prompt)+2) {
		t.Errorf("%d prompt tokens computed, want %d (the prompt once, and its last token by each of the two forks)", st.PromptTokens, len(prompt)+2)
	}
	if e.Copies() != 2 || st.FreeBlocks != st.TotalBlocks {
		t.Errorf("%d copies on write (want 2), %d of %d blocks free", e.Copies(), st.FreeBlocks, st.TotalBlocks)
	}
}

// TestSchedulerMinTokens: a stop token is never chosen before min_tokens
// (its logit is -inf), and ends the request after.
func TestSchedulerMinTokens(t *testing.T) {
	e := stories(t, 4, 0)
	s := runScheduler(t, e, Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 64})
	prompt := prompts(1)[0]
	free := alone(t, e, [][]int{prompt}, 20)[0]
	stop := free[2] // greedy would stop at the third token
	r := &Request{Prompt: prompt, Params: engine.SamplingParams{MaxTokens: 20, MinTokens: 10, StopTokens: []int{stop}}}
	if err := s.Submit(r); err != nil {
		t.Fatal(err)
	}
	ids, ev := collect(t, r)
	if ev.Err != nil || len(ids) < 10 || slices.Contains(ids[:10], stop) {
		t.Fatalf("min_tokens 10, stop token %d: %v (%s, %v)", stop, ids, ev.Finish, ev.Err)
	}
	if i := slices.Index(ids, stop); i >= 0 {
		t.Errorf("stop token %d emitted at %d: %v", stop, i, ids)
	}
}

// outOfMemory is the error of a step that failed for lack of device memory
// (a stand-in for a GPU out of memory).
var outOfMemory = fmt.Errorf("test: cuMemAlloc: %w", backend.ErrOutOfMemory)

// oneTokenTwice fails every step until two one-token steps have failed.
func oneTokenTwice() func(int, *backend.Batch) bool {
	ones := 0
	return func(_ int, b *backend.Batch) bool {
		if ones >= 2 {
			return false
		}
		if len(b.Tokens) == 1 {
			ones++
		}
		return true
	}
}

// TestOutOfMemoryRetries: steps that fail for lack of device memory are
// retried smaller (and a one-token step's request preempted), never failing
// a request while a smaller step fits: greedy outputs equal those of the
// requests run alone. When nothing fits, the requests fail with the error
// instead of waiting for ever.
func TestOutOfMemoryRetries(t *testing.T) {
	ps := prompts(10)
	want := alone(t, stories(t, 1, 0), ps, 30)
	m, err := model.Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, tc := range []struct {
		name    string
		fail    func(step int, b *backend.Batch) bool
		ok      bool
		preempt bool // a one-token step fails twice in a row
	}{
		{"steps over 8 tokens", func(_ int, b *backend.Batch) bool { return len(b.Tokens) > 8 }, true, false},
		// Halved down to one token, which fails twice (retried, then
		// preempted); then every step runs.
		{"down to one token, twice", oneTokenTwice(), true, true},
		{"every other step", func(step int, _ *backend.Batch) bool { return step%2 == 1 }, true, false},
		{"every step", func(int, *backend.Batch) bool { return true }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, fails := 0, 0
			ob := &stephook.Backend{Backend: &cpu.Backend{}, Before: func(b *backend.Batch) error {
				step++
				if tc.fail(step-1, b) {
					fails++
					return outOfMemory
				}
				return nil
			}}
			e, err := engine.New(m, ob, engine.Options{MaxSeqs: 8, BlockSize: 16, PrefixCaching: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			s := runScheduler(t, e, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 64})
			var reqs []*Request
			for _, p := range ps {
				r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 30, IgnoreStop: true}}
				if err := s.Submit(r); err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, r)
			}
			failed := 0
			for i, r := range reqs {
				got, end := collect(t, r)
				if end.Err != nil {
					failed++
					if !errors.Is(end.Err, backend.ErrOutOfMemory) {
						t.Errorf("request %d failed with %v, want the out-of-memory error", i, end.Err)
					}
					continue
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("request %d:\n got %v\nwant %v", i, got, want[i])
				}
			}
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%d failed steps, %d retries, %d preemptions, %d requests failed", fails, st.OOMRetries, st.Preemptions, failed)
			if tc.ok && (failed > 0 || st.OOMRetries == 0) {
				t.Errorf("%d requests failed, %d retries: want none failed, some retries", failed, st.OOMRetries)
			}
			if tc.preempt != (st.Preemptions > 0) {
				t.Errorf("%d preemptions", st.Preemptions)
			}
			if !tc.ok && failed != len(reqs) {
				t.Errorf("%d of %d requests failed when no step can run", failed, len(reqs))
			}
			if st.FreeBlocks != st.TotalBlocks {
				t.Errorf("%d of %d blocks free after all requests", st.FreeBlocks, st.TotalBlocks)
			}
		})
	}
}

// TestSpeculativeServing: with prompt-lookup speculation, the scheduler's
// greedy outputs are each prompt's alone, requests with log-probabilities
// get the plain step's, whether every step speculates or only small ones,
// with room for all and with a cache short enough to preempt; drafts are
// kept, and every block is free at the end. Without log-probabilities on a
// backend that chooses tokens where the logits are (devsample), the drafts
// are verified by every row's greedy choice, no logits brought back.
func TestSpeculativeServing(t *testing.T) {
	ps := prompts(6)
	for i := range ps { // make the prompts repeat themselves: lookups find them
		ps[i] = append(ps[i], ps[i][1:]...)
	}
	want := alone(t, stories(t, 1, 0), ps, 60)
	plainLogprobs := map[int][]float32{}
	for _, tc := range []struct {
		name               string
		kvBlocks, maxSpecs int
		model              bool // the model drafts for itself instead of prompt lookup
		device             bool // on devsample, no request wanting log-probabilities
	}{
		{"plain", 0, -1, false, false}, // the log-probabilities the others must give
		{"every step", 0, 8, false, false},
		{"small batches", 0, 2, false, false},
		{"short cache", 16, 8, false, false},
		{"draft model", 0, 8, true, false}, // its entries in the target's blocks
		{"draft model, short cache", 16, 8, true, false},
		{"greedy on the device", 0, 8, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b backend.Backend = &cpu.Backend{}
			ds := &devsample.Backend{Backend: b}
			if tc.device {
				b = ds
			}
			e := storiesDrafting(t, b, 6, tc.kvBlocks, tc.model)
			cfg := Config{MaxNumSeqs: 6, MaxNumBatchedTokens: 64}
			if tc.maxSpecs >= 0 {
				var d engine.Drafter = engine.NGram{MinN: 1, MaxN: 3}
				if tc.model {
					d = engine.ModelDrafter{E: e.Draft()}
				}
				cfg.SpeculateMaxSeqs, cfg.Speculation = tc.maxSpecs, &engine.Speculation{Drafter: d, K: 4, Always: true}
			}
			s := runScheduler(t, e, cfg)
			var reqs []*Request
			for i, p := range ps {
				r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 60, IgnoreStop: true}, Logprobs: i%2 == 0 && !tc.device}
				if err := s.Submit(r); err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, r)
			}
			for i, r := range reqs {
				var got []int
				var lps []float32
				for ev := range r.Events {
					if ev.Done {
						if ev.Err != nil || ev.GeneratedTokens != 60 {
							t.Errorf("request %d ended %+v", i, ev)
						}
						break
					}
					got = append(got, ev.Token)
					lps = append(lps, ev.Logprob)
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("request %d:\n got %v\nwant %v", i, got, want[i])
				}
				if r.Logprobs {
					if prev, ok := plainLogprobs[i]; ok {
						for j := range prev {
							if d := prev[j] - lps[j]; d > 1e-4 || d < -1e-4 {
								t.Errorf("request %d token %d: log-probability %g, %g in the first run", i, j, lps[j], prev[j])
								break
							}
						}
					} else {
						plainLogprobs[i] = lps
					}
				}
			}
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%d drafts, %d drafted, %d kept, %d preemptions", st.SpecDrafts, st.SpecDraftTokens, st.SpecAcceptedTokens, st.Preemptions)
			if st.SpecAcceptedTokens == 0 && tc.maxSpecs >= 0 {
				t.Error("no draft kept")
			}
			if tc.device && ds.MultiRowChoices() == 0 {
				t.Error("no verifying step chose its rows' tokens on the (emulated) device")
			}
			if st.FreeBlocks != st.TotalBlocks {
				t.Errorf("%d of %d blocks free after all requests finished", st.FreeBlocks, st.TotalBlocks)
			}
			if tc.model && st.SpecAcceptedTokens != st.SpecDraftTokens {
				t.Errorf("the model drafting for itself: %d of %d drafts kept", st.SpecAcceptedTokens, st.SpecDraftTokens)
			}
		})
	}
}

// TestBrokenGroup: when a tensor-parallel group's collectives are aborted
// (a rank's step failed), the step's requests fail, Broken says why and
// every later request is refused at once, instead of steps running on a
// group that cannot.
func TestBrokenGroup(t *testing.T) {
	m, err := model.Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g := cpu.NewGroup(2, cpu.Backend{})
	e, err := engine.New(m, g, engine.Options{MaxSeqs: 2, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s := runScheduler(t, e, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 64})
	g.Ranks[1].(*cpu.Backend).Comm.Abort(errors.New("injected"))
	r := &Request{Prompt: []int{1, 20, 30}, Params: engine.SamplingParams{MaxTokens: 4}}
	if err := s.Submit(r); err != nil {
		t.Fatal(err)
	}
	if _, end := collect(t, r); end.Err == nil || !errors.Is(end.Err, backend.ErrGroupAborted) {
		t.Fatalf("request on an aborted group ended %+v", end)
	}
	if s.Broken() == nil {
		t.Fatal("Broken is nil after the group aborted")
	}
	if err := s.Submit(&Request{Prompt: []int{1, 2}, Params: engine.SamplingParams{MaxTokens: 2}}); !errors.Is(err, backend.ErrGroupAborted) {
		t.Errorf("a request after: %v", err)
	}
}

// TestDraftsNeverPreempt: when the cache holds every decoding sequence's
// next token but not its drafts, the step goes without drafts and no
// request is preempted; with room, the same step carries them.
func TestDraftsNeverPreempt(t *testing.T) {
	for _, tc := range []struct {
		kvBlocks   int
		wantTokens int // an item's tokens: its next one and its drafts
	}{
		{2, 1}, // one block a sequence, full: no room for drafts
		{4, 4}, // three tokens follow the last match
	} {
		e := stories(t, 2, tc.kvBlocks)
		spec := &engine.Speculation{Drafter: engine.NGram{MinN: 1, MaxN: 3}, K: 4, Always: true}
		s, err := NewScheduler(e, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 64, SpeculateMaxSeqs: 2, Speculation: spec})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			toks := make([]int, 16) // repeats itself: prompt lookup drafts
			for i := range toks {
				toks[i] = 10 + i%3
			}
			r := &Request{Prompt: toks, Params: engine.SamplingParams{MaxTokens: 60}}
			r.tokens, r.seq, r.cached = toks, e.NewSequence(), 15
			if _, err := e.Prefill(r.seq, toks[:15], false); err != nil {
				t.Fatal(err)
			}
			r.sampler = engine.NewSampler(r.Params, e.Vocab(), r.Prompt)
			s.running = append(s.running, r)
		}
		s.gather()
		if st := s.Stats(); st.Preemptions != 0 || len(s.items) != 2 {
			t.Fatalf("%d blocks: %d preemptions, %d items; want none and 2", tc.kvBlocks, st.Preemptions, len(s.items))
		}
		for i, it := range s.items {
			if len(it.Tokens) != tc.wantTokens {
				t.Errorf("%d blocks: item %d has %d tokens, want %d", tc.kvBlocks, i, len(it.Tokens), tc.wantTokens)
			}
		}
		for _, r := range s.running {
			e.Free(r.seq)
		}
	}
}

// TestSlowStep: a step far over the steps' moving mean is told to
// Config.SlowStep, once, with its time and shape; the steady steps around
// it are not.
func TestSlowStep(t *testing.T) {
	m, err := model.Load(testshared.Path(t, "models", "stories260K", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	const stall = 400 * time.Millisecond
	step := 0
	ob := &stephook.Backend{Backend: &cpu.Backend{}, Before: func(*backend.Batch) error {
		step++
		if step == 30 {
			time.Sleep(stall)
		}
		return nil
	}}
	e, err := engine.New(m, ob, engine.Options{MaxSeqs: 4, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	var mu sync.Mutex
	var slow []SlowStep
	s := runScheduler(t, e, Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 64, SlowStep: func(st SlowStep) {
		mu.Lock()
		slow = append(slow, st)
		mu.Unlock()
	}})
	var reqs []*Request
	for _, p := range prompts(2) {
		r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 60, IgnoreStop: true}}
		if err := s.Submit(r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		if _, end := collect(t, r); end.Err != nil {
			t.Fatal(end.Err)
		}
	}
	waitIdle(t, s)
	mu.Lock()
	defer mu.Unlock()
	if step < 40 {
		t.Fatalf("%d steps ran, want the stall (step 30) well inside the run", step)
	}
	if len(slow) != 1 {
		t.Fatalf("slow steps told: %+v, want the one stalled step", slow)
	}
	st := slow[0]
	t.Logf("%+v", st)
	if st.Took < stall || st.Mean <= 0 || st.Mean*slowStepFactor >= st.Took || st.Seqs < 1 || st.Tokens < st.Seqs || st.Speculating {
		t.Errorf("slow step %+v: want over %v, a mean under an eighth of it, its sequences and tokens", st, stall)
	}
}

// TestSpeculationGovernor: without Speculation.Always, a request's drafting
// pauses while its verifying steps do not pay, and goes on while they do.
// The steps' time is set by a backend that sleeps a fixed part and a part a
// token: drafts that are always wrong (a token the model never chooses)
// on a device where each token costs 10 ms are verified a few times only;
// right drafts (the plain run's own tokens) on a device where a step's
// fixed part rules are verified at most steps; a probe after a pause
// judges afresh. The output is plain
// greedy's either way.
func TestSpeculationGovernor(t *testing.T) {
	p := prompts(2)[1]
	want := alone(t, stories(t, 1, 0), [][]int{p}, 60)[0]
	for _, tc := range []struct {
		name           string
		fixed, a       time.Duration // a step's time: fixed + a×tokens
		right          bool
		minDrafts, max int
	}{
		// Timed by the modeled device's clock (timedStories), not the
		// machine's, whose stalls under load once turned ratios around.
		{"wrong drafts, compute-bound", 0, 10 * time.Millisecond, false, 1, 12},
		{"right drafts, fixed costs", 20 * time.Millisecond, 500 * time.Microsecond, true, 10, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, c := timedStories(t, 2, func(tokens int) time.Duration { return tc.fixed + time.Duration(tokens)*tc.a })
			d := knownDrafter{plain: append(slices.Clone(p), want...), right: tc.right, vocab: e.Vocab()}
			s := runTimed(t, e, c, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 64, SpeculateMaxSeqs: 2,
				Speculation: &engine.Speculation{Drafter: d, K: 4}})
			r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 60, IgnoreStop: true}}
			if err := s.Submit(r); err != nil {
				t.Fatal(err)
			}
			got, end := collect(t, r)
			if end.Err != nil || !slices.Equal(got, want) {
				t.Errorf("ended %+v with\n got %v\nwant %v", end, got, want)
			}
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%d verifying steps, %d drafted, %d kept", st.SpecDrafts, st.SpecDraftTokens, st.SpecAcceptedTokens)
			if int(st.SpecDrafts) < tc.minDrafts || int(st.SpecDrafts) > tc.max {
				t.Errorf("%d verifying steps, want %d to %d", st.SpecDrafts, tc.minDrafts, tc.max)
			}
		})
	}
}

// knownDrafter drafts the tokens of plain that follow a sequence (right),
// or as many copies of the vocabulary's last token, which the model never
// chooses here.
type knownDrafter struct {
	plain []int
	right bool
	vocab int
}

func (d knownDrafter) Draft(tokens []int, k int) []int {
	n := len(tokens)
	if !d.right {
		return slices.Repeat([]int{d.vocab - 1}, k)
	}
	if n >= len(d.plain) || !slices.Equal(tokens, d.plain[:n]) {
		return nil
	}
	return slices.Clone(d.plain[n:min(n+k, len(d.plain))])
}

// batchDrafter drafts, for any of its prompts, the first right tokens of
// its plain continuation and then tokens the model never chooses here.
type batchDrafter struct {
	plains [][]int
	right  int
	vocab  int
}

func (d batchDrafter) Draft(tokens []int, k int) []int {
	for _, p := range d.plains {
		n := len(tokens)
		if n >= len(p) || !slices.Equal(tokens, p[:n]) {
			continue
		}
		out := slices.Clone(p[n:min(n+k, len(p))])
		for i := d.right; i < len(out); i++ {
			out[i] = d.vocab - 1
		}
		return out
	}
	return nil
}

// TestSpeculationInBatch: 8 requests arriving a few steps apart, each
// keeping half of its drafts. Where a step's cost is mostly fixed they
// draft at most steps; where it grows with its tokens (compute-bound)
// drafting does not pay for the batch, and the batch's governor pauses it
// although each request's own governor sees it pay; the output is the
// same either way.
func TestSpeculationInBatch(t *testing.T) {
	ps := prompts(8)
	want := alone(t, stories(t, 8, 0), ps, 40)
	var plains [][]int
	for i, p := range ps {
		plains = append(plains, append(slices.Clone(p), want[i]...))
	}
	for _, tc := range []struct {
		name       string
		fixed, a   time.Duration // a step's time: fixed + a×(its tokens' power-of-two bucket)
		minV, maxV int           // verifying request-steps
	}{
		// Plain steps of 8 tokens take 10 ms. One request drafting takes
		// the step to 18 ms and yields it 3 tokens, more than its 1 in a
		// plain step's 10 ms, so its governor sees drafting pay; but the
		// batch's 8 take 10 ms, and so at every number drafting.
		// (The requests' governors alone drafted in about 100
		// request-steps.)
		{"compute-bound", 2 * time.Millisecond, time.Millisecond, 0, 30},
		// 40.8 ms plain, 46.4 ms drafting.
		{"fixed costs", 40 * time.Millisecond, 100 * time.Microsecond, 80, 320},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, c := timedStories(t, 8, func(tokens int) time.Duration {
				padded := 1 // the step's bucket, as a GPU runs it
				for padded < tokens {
					padded *= 2
				}
				return tc.fixed + time.Duration(padded)*tc.a
			})
			d := batchDrafter{plains: plains, right: 2, vocab: e.Vocab()}
			s := runTimed(t, e, c, Config{MaxNumSeqs: 8, MaxNumBatchedTokens: 512, SpeculateMaxSeqs: 8,
				Speculation: &engine.Speculation{Drafter: d, K: 4}})
			var rs []*Request
			for _, p := range ps {
				r := &Request{Prompt: p, Params: engine.SamplingParams{MaxTokens: 40, IgnoreStop: true}}
				if err := s.Submit(r); err != nil {
					t.Fatal(err)
				}
				rs = append(rs, r)
				// Arrivals a few steps apart, as a server's: each
				// request's governor starts at its own time.
				time.Sleep(3 * (tc.fixed + 8*tc.a))
			}
			expectOutputs(t, rs, want)
			waitIdle(t, s)
			st := s.Stats()
			t.Logf("%d verifying request-steps, %d drafted, %d kept, %d steps", st.SpecDrafts, st.SpecDraftTokens, st.SpecAcceptedTokens, st.Steps)
			if int(st.SpecDrafts) < tc.minV || int(st.SpecDrafts) > tc.maxV {
				t.Errorf("%d verifying request-steps, want %d to %d", st.SpecDrafts, tc.minV, tc.maxV)
			}
		})
	}
}
