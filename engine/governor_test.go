package engine

import (
	"testing"
	"time"
)

// TestGovernor: a verifying step before any plain one is followed by a
// plain step to compare with, and is not counted (a slow first step does
// not stop drafting that pays); drafting goes on while verifying yields more
// tokens a second than plain steps; when it yields fewer, drafting pauses 8
// steps (or as many as keep probes that do not pay to 2% of the time),
// then twice as long each time it still does not pay, up to 256; a
// step that pays again ends the backoff; after 32 verifying steps in a row
// one plain step is taken, and a plain step faster than the plain steps'
// mean replaces it.
func TestGovernor(t *testing.T) {
	ms := time.Millisecond
	var g Governor
	g.Verified(200*ms, 2) // a draft model's prefill of the prompt in it
	if g.Drafting() || !g.Drafting() {
		t.Fatal("not one plain step after the first verifying step")
	}
	g.PlainStep(1 * ms)
	g.Verified(3*ms, 4) // 4 tokens in 3 ms against 1 in 1 ms: it pays
	if !g.Drafting() {
		t.Fatal("paused while drafting pays")
	}
	var h Governor
	h.PlainStep(1 * ms)
	for _, want := range []int{8, 16, 32, 64, 128, 256, 256} {
		h.Verified(1100*time.Microsecond, 1) // 1 token in 1.1 ms: a small loss
		paused := 0
		for !h.Drafting() {
			paused++
		}
		if paused != want {
			t.Fatalf("paused %d steps, want %d", paused, want)
		}
	}
	h.Verified(2*ms, 3) // pays again: judged afresh after a pause
	if h.backoff != 0 || !h.Drafting() {
		t.Errorf("backoff %d after a step that paid", h.backoff)
	}
	// A costly probe (a draft model's drafts: 1 token in 3 ms against 1
	// ms) pauses long enough that such probes lose at most 2% of the
	// time: (3-1)/0.02 = 100 steps.
	var c Governor
	c.PlainStep(1 * ms)
	c.Verified(3*ms, 1)
	if c.pause != 100 {
		t.Errorf("paused %d steps after a probe that lost 2 ms, want 100", c.pause)
	}
	var r Governor
	r.PlainStep(4 * ms) // a slow first plain step (a graph capture)
	steps := 0
	for r.Drafting() {
		r.Verified(2*ms, 2) // 2 tokens in 2 ms against 1 in 4 ms: it seems to pay
		steps++
	}
	if steps != 32 {
		t.Fatalf("%d verifying steps before a plain one, want 32", steps)
	}
	r.PlainStep(1 * ms) // the plain step's true time
	if r.plain != 0.001 || !r.Drafting() {
		t.Fatalf("after a plain step of 1 ms: the plain mean %v s, drafting %v; want 0.001, true", r.plain, r.Drafting())
	}
	r.verify, r.yield = 0, 0
	r.Verified(3*ms, 2) // 2 tokens in 3 ms against 1 in 1 ms: a loss
	if r.Drafting() {
		t.Error("drafting goes on where it no longer pays")
	}
}
