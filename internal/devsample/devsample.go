// Package devsample makes any backend's executables
// backend.SamplingExecutables, as the GPU's are, so that the engine's and
// the server's paths for backends that choose tokens where the logits are
// run in tests on the CPU.
package devsample

import (
	"fmt"
	"sync"

	"kiln/backend"
	"kiln/compile"
	"kiln/engine"
)

// Backend wraps B: its executables' RunSample takes greedy choices only
// (zero SampleParams), each row's engine.Argmax over the rows Run computes.
type Backend struct {
	backend.Backend
	mu   sync.Mutex
	rows int // rows chosen in steps of more rows than sequences
}

// MultiRowChoices counts the rows RunSample chose in steps that asked for
// more rows than sequences (verifying drafts).
func (b *Backend) MultiRowChoices() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rows
}

// Load implements backend.Backend.
func (b *Backend) Load(c *compile.Compiled) (backend.Loaded, error) {
	l, err := b.Backend.Load(c)
	if err != nil {
		return nil, err
	}
	return &loaded{Loaded: l, b: b}, nil
}

type loaded struct {
	backend.Loaded
	b *Backend
}

func (l *loaded) Executable(p *compile.Plan) (backend.Executable, error) {
	x, err := l.Loaded.Executable(p)
	if err != nil {
		return nil, err
	}
	return &executable{Executable: x, b: l.b, vocab: p.Graph.Outputs[0].Shape.Last()}, nil
}

type executable struct {
	backend.Executable
	b     *Backend
	vocab int
}

// RunSample implements backend.SamplingExecutable.
func (x *executable) RunSample(b *backend.Batch, kv backend.KVCache, params []backend.SampleParams, ids []int32) error {
	for r, p := range params {
		if p.Temperature != 0 || len(p.History) != 0 || p.RepetitionPenalty != 0 || p.FrequencyPenalty != 0 || p.PresencePenalty != 0 {
			return fmt.Errorf("devsample: row %d: %+v: greedy choices only", r, p)
		}
	}
	logits := make([]float32, len(b.Rows)*x.vocab)
	if err := x.Run(b, kv, logits); err != nil {
		return err
	}
	seqs := map[int32]bool{}
	for r, tok := range b.Rows {
		seqs[b.SeqIndex[tok]] = true
		ids[r] = int32(engine.Argmax(logits[r*x.vocab : (r+1)*x.vocab]))
	}
	if len(b.Rows) > len(seqs) {
		x.b.mu.Lock()
		x.b.rows += len(b.Rows)
		x.b.mu.Unlock()
	}
	return nil
}
