package kernels

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"kiln/backend/cuda/cu"
)

// Sampling on the GPU (sample.cu, its own module): the semantics of
// engine.Sampler.Sample, for rows of f32 logits on the device, so that only
// the chosen ids cross back to the host.

//go:embed sample.cu
var sampleSource string

// SampleSource is the CUDA C source of the sampling kernel.
func SampleSource() string { return sampleSource }

const (
	sampleThreads  = 1024  // NT in sample.cu
	sampleRowBytes = 64    // sizeof(RowParams)
	sampleShared   = 65536 // dynamic shared memory: DYN_WORDS in sample.cu

	sampleGreedy  = 1
	samplePenalty = 2
	sampleTopK    = 4
	sampleTopP    = 8
)

// SampleParams are one row's sampling parameters, those of
// engine.SamplingParams, and the row's uniform draw.
type SampleParams struct {
	Temperature       float64 // 0: greedy
	TopK              int     // 0 (or >= vocab): off
	TopP              float64 // 0 or >= 1: off
	MinP              float64 // 0: off
	RepetitionPenalty float64 // 0 or 1: off
	FrequencyPenalty  float64
	PresencePenalty   float64
	// U is the row's uniform number in [0, 1), drawn by the host: the CPU
	// sampler draws r = U·total over the surviving probabilities.
	U float64
}

// HistoryEntry is one token of a row's penalty state: the tokens absent from
// a row's entries were neither seen nor generated.
type HistoryEntry struct {
	ID    int32
	Count int32 // times generated (frequency and presence penalties)
	Seen  bool  // in the prompt or the output (repetition penalty)
	// Banned makes the token's logit -inf, whatever the penalties (a stop
	// token before the request's min_tokens).
	Banned bool
}

// Sampler is the compiled sampling kernel and its buffers: scratch of one
// or two f32 [rows, vocab] arrays, the uploaded parameters and a pinned host
// staging buffer. One Sampler serves one caller at a time; a call waits for
// the previous call's kernel before it reuses the buffers.
type Sampler struct {
	D *cu.Device
	M *cu.Module

	scratch, args, ids cu.Ptr
	scratchN, argsN    int
	idsN               int
	hostArgs, hostIDs  *cu.HostBuf
	done               *cu.Event // recorded after the last call's work
	pending            bool
	buf                []byte
	mark               []uint64 // duplicate check of history ids
}

// NewSampler compiles (or loads from the kernel cache) the sampling kernel.
func NewSampler(d *cu.Device) (*Sampler, error) {
	m, err := d.Compile("kiln_sample", sampleSource, "--std=c++17")
	if err != nil {
		return nil, err
	}
	f, err := m.Function("sample_rows")
	if err == nil {
		err = f.SetMaxDynamicShared(sampleShared)
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	done, err := d.NewEvent(false)
	if err != nil {
		m.Close()
		return nil, err
	}
	return &Sampler{D: d, M: m, done: done}, nil
}

// Close waits for the last call and frees the buffers and the module.
func (s *Sampler) Close() error {
	err := s.wait()
	for _, p := range []cu.Ptr{s.scratch, s.args, s.ids} {
		s.D.Free(p)
	}
	s.scratch, s.args, s.ids = 0, 0, 0
	for _, h := range []*cu.HostBuf{s.hostArgs, s.hostIDs} {
		if h != nil {
			h.Free()
		}
	}
	s.hostArgs, s.hostIDs = nil, nil
	s.done.Close()
	if e := s.M.Close(); err == nil {
		err = e
	}
	return err
}

func (s *Sampler) wait() error {
	if !s.pending {
		return nil
	}
	s.pending = false
	return s.done.Sync()
}

// grow makes *p at least n bytes of device memory (its contents are lost).
func (s *Sampler) grow(p *cu.Ptr, have *int, n int) error {
	if n <= *have {
		return nil
	}
	n = max(n, *have*5/4)
	if *p != 0 {
		if err := s.D.Free(*p); err != nil {
			return err
		}
		*p, *have = 0, 0
	}
	q, err := s.D.Alloc(n)
	if err != nil {
		return err
	}
	*p, *have = q, n
	return nil
}

func (s *Sampler) growHost(h **cu.HostBuf, n int) error {
	if *h != nil && len((*h).Bytes()) >= n {
		return nil
	}
	if *h != nil {
		n = max(n, len((*h).Bytes())*5/4)
		if err := (*h).Free(); err != nil {
			return err
		}
		*h = nil
	}
	b, err := s.D.AllocHost(n)
	if err != nil {
		return err
	}
	*h = b
	return nil
}

// encodeSample writes the kernel's arguments for rows of vocab ids into buf
// (grown as needed): the rows' RowParams, then the int32 triples (id, count,
// seen) of the rows whose penalties are active. penalty reports whether any
// row needs the penalized scratch row.
func encodeSample(buf []byte, rows, vocab int, params []SampleParams, history [][]HistoryEntry, mark []uint64) (out []byte, penalty bool, err error) {
	if len(params) != rows {
		return buf, false, fmt.Errorf("kernels: sample: %d params for %d rows", len(params), rows)
	}
	if history != nil && len(history) != rows {
		return buf, false, fmt.Errorf("kernels: sample: %d histories for %d rows", len(history), rows)
	}
	if len(mark) < (vocab+63)/64 {
		mark = make([]uint64, (vocab+63)/64)
	}
	buf = buf[:0]
	le := binary.LittleEndian
	entries := 0
	var hist []byte
	for r, p := range params {
		switch {
		case !(p.Temperature >= 0) || math.IsInf(p.Temperature, 0):
			return buf, false, fmt.Errorf("kernels: sample row %d: temperature %g", r, p.Temperature)
		case p.TopK < 0, !(p.TopP >= 0), !(p.MinP >= 0), !(p.RepetitionPenalty >= 0),
			math.IsNaN(p.FrequencyPenalty), math.IsNaN(p.PresencePenalty):
			return buf, false, fmt.Errorf("kernels: sample row %d: parameters %+v", r, p)
		case !(p.U >= 0 && p.U < 1):
			return buf, false, fmt.Errorf("kernels: sample row %d: u %g not in [0, 1)", r, p.U)
		}
		flags := int32(0)
		inv := float32(1)
		if p.Temperature == 0 {
			flags |= sampleGreedy
		} else {
			inv = float32(1 / p.Temperature)
		}
		rep, freq, pres := float32(p.RepetitionPenalty), float32(p.FrequencyPenalty), float32(p.PresencePenalty)
		var h []HistoryEntry
		if history != nil {
			h = history[r]
		}
		off, n := entries, 0
		penalized := !((rep == 0 || rep == 1) && freq == 0 && pres == 0)
		if (penalized || slices.ContainsFunc(h, func(e HistoryEntry) bool { return e.Banned })) && len(h) > 0 {
			flags |= samplePenalty
			penalty = true
			for _, e := range h {
				if e.ID < 0 || int(e.ID) >= vocab || e.Count < 0 {
					clearMarks(mark, h)
					return buf, false, fmt.Errorf("kernels: sample row %d: history entry %+v (vocab %d)", r, e, vocab)
				}
				if mark[e.ID/64]&(1<<(e.ID%64)) != 0 {
					clearMarks(mark, h)
					return buf, false, fmt.Errorf("kernels: sample row %d: token %d twice in the history", r, e.ID)
				}
				mark[e.ID/64] |= 1 << (e.ID % 64)
				seen := int32(0) // flags: 1 seen, 2 banned
				if e.Seen {
					seen |= 1
				}
				if e.Banned {
					seen |= 2
				}
				hist = le.AppendUint32(hist, uint32(e.ID))
				hist = le.AppendUint32(hist, uint32(e.Count))
				hist = le.AppendUint32(hist, uint32(seen))
			}
			clearMarks(mark, h)
			n = len(h)
			entries += n
		}
		topP := 0.0
		if p.TopK > 0 && p.TopK < vocab {
			flags |= sampleTopK
		}
		if p.TopP > 0 && p.TopP < 1 {
			flags |= sampleTopP
			topP = p.TopP
		}
		buf = le.AppendUint64(buf, math.Float64bits(topP))
		buf = le.AppendUint64(buf, math.Float64bits(p.U))
		for _, f := range []float32{inv, float32(p.MinP), rep, freq, pres} {
			buf = le.AppendUint32(buf, math.Float32bits(f))
		}
		for _, v := range []int32{int32(min(p.TopK, vocab)), flags, int32(off), int32(n), 0, 0, 0} {
			buf = le.AppendUint32(buf, uint32(v))
		}
	}
	return append(buf, hist...), penalty, nil
}

func clearMarks(mark []uint64, h []HistoryEntry) {
	for _, e := range h {
		if e.ID >= 0 && int(e.ID/64) < len(mark) {
			mark[e.ID/64] &^= 1 << (e.ID % 64)
		}
	}
}

// Reserve allocates the buffers for calls of up to rows rows of vocab ids
// with penalties and up to entries history entries in all, so that such
// calls allocate nothing.
func (s *Sampler) Reserve(rows, vocab, entries int) error {
	if err := checkRows("sample", rows, vocab); err != nil {
		return err
	}
	if err := s.wait(); err != nil {
		return err
	}
	args := rows*sampleRowBytes + 12*entries
	if err := s.grow(&s.scratch, &s.scratchN, 2*rows*vocab*4); err != nil {
		return err
	}
	if err := s.grow(&s.args, &s.argsN, args); err != nil {
		return err
	}
	return s.growHost(&s.hostArgs, args)
}

// Sample draws one token per row of logits (f32 [rows, vocab] on the device,
// not modified) into ids (int32 [rows] on the device), asynchronously on
// stream st (nil: the default stream), with the semantics of
// engine.Sampler.Sample given each row's parameters and uniform number
// params[r].U. history[r] lists the tokens row r has seen or generated
// (each at most once), for the penalties; history may be nil.
func (s *Sampler) Sample(st *cu.Stream, logits cu.Ptr, rows, vocab int, params []SampleParams, history [][]HistoryEntry, ids cu.Ptr) error {
	if err := checkRows("sample", rows, vocab); err != nil {
		return err
	}
	if err := s.wait(); err != nil {
		return err
	}
	if need := (vocab + 63) / 64; len(s.mark) < need {
		s.mark = make([]uint64, need)
	}
	buf, penalty, err := encodeSample(s.buf, rows, vocab, params, history, s.mark)
	s.buf = buf
	if err != nil {
		return err
	}
	plane := rows * vocab * 4
	scratchN := plane
	if penalty {
		scratchN = 2 * plane
	}
	if err := s.grow(&s.scratch, &s.scratchN, scratchN); err != nil {
		return err
	}
	if err := s.grow(&s.args, &s.argsN, len(buf)); err != nil {
		return err
	}
	if err := s.growHost(&s.hostArgs, len(buf)); err != nil {
		return err
	}
	copy(s.hostArgs.Bytes(), buf)
	if err := s.D.CopyHtoDAsync(s.args, s.hostArgs, 0, len(buf), st); err != nil {
		return err
	}
	xs := cu.Ptr(0)
	if penalty {
		xs = s.scratch.Add(plane)
	}
	err = launchOn(s.M, "sample_rows", cu.D1(rows), cu.D1(sampleThreads), sampleShared, st,
		logits, int32(vocab), s.args, s.args.Add(rows*sampleRowBytes), xs, s.scratch, ids)
	if err != nil {
		return err
	}
	if err := s.done.Record(st); err != nil {
		return err
	}
	s.pending = true
	return nil
}

// SampleIDs is Sample into the sampler's own id buffer; it waits for the
// stream and returns the ids in out (grown as needed).
func (s *Sampler) SampleIDs(st *cu.Stream, logits cu.Ptr, rows, vocab int, params []SampleParams, history [][]HistoryEntry, out []int32) ([]int32, error) {
	if err := s.wait(); err != nil {
		return out, err
	}
	if err := s.grow(&s.ids, &s.idsN, 4*max(rows, 1)); err != nil {
		return out, err
	}
	if err := s.growHost(&s.hostIDs, 4*max(rows, 1)); err != nil {
		return out, err
	}
	if err := s.Sample(st, logits, rows, vocab, params, history, s.ids); err != nil {
		return out, err
	}
	if err := s.D.CopyDtoHAsync(s.hostIDs, 0, s.ids, 4*rows, st); err != nil {
		return out, err
	}
	if err := s.done.Record(st); err != nil {
		return out, err
	}
	if err := s.wait(); err != nil {
		return out, err
	}
	b := s.hostIDs.Bytes()
	out = out[:0]
	for r := range rows {
		out = append(out, int32(binary.LittleEndian.Uint32(b[4*r:])))
	}
	return out, nil
}
