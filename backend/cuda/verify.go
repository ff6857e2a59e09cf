package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/tensor"
)

// Before a first-use race (race) times its candidates, each is checked
// against the default's result (verify): one whose result differs from
// it beyond the tolerance below is rejected with its error, as one whose
// launch failed is, so that a faster but wrong kernel is never kept nor
// filed in the tune cache (whose entry lists it under Rejected).

// The tolerances, on ‖got−ref‖₂/‖ref‖₂ against the default's result. A
// candidate sums the same products as the default in another order (its
// split of K, tiles, kernel), so the two differ by rounding alone; a
// wrong kernel is off by the order of the result itself.
const (
	// tolProduct16 holds products into bf16 or f16: f32 accumulation in
	// another order, then each rounded to 16 bits (bf16's half ulp is
	// 2^-9 ≈ 2e-3 of a value; where the two sums round apart they differ
	// by an ulp).
	tolProduct16 = 1e-2
	// tolProductF32 holds products into f32: the order of the f32
	// accumulation alone (about √K·2^-24, 1e-5 at K 16384, at worst).
	tolProductF32 = 1e-4
	// tolProductFP8 holds FP8 products (into bf16 or f16): cuBLASLt's fast
	// accumulation keeps about 14 bits, about 2^-14·√K of a sum's scale
	// (cu's TestBlasLtFP8 holds each algorithm within 1e-2 of the exact
	// product), and two algorithms may err on opposite sides.
	tolProductFP8 = 3e-2
	// tolAttention holds attention (into the compute dtype): decode's
	// splits' partial softmaxes merged in another order, the tensor-core
	// kernels' 16-bit probabilities, then rounding to 16 bits.
	tolAttention = 2e-2
)

// rejection is verify's error for a candidate it rejected (its result
// wrong, or not verifiable): a verdict on the candidate, not a failure of
// the step.
type rejection string

func (r rejection) Error() string { return string(r) }

// isRejection reports whether err is verify's rejection.
func isRejection(err error) bool {
	var r rejection
	return errors.As(err, &r)
}

// corruptCandidate, when not nil (tests only), names the candidates whose
// results verify perturbs before comparing them (doubled, plus 1: off by
// about the result's own size), to show that a wrong candidate is
// rejected.
var corruptCandidate func(name string) bool

// relErr is ‖got−ref‖₂/‖ref‖₂ (‖got‖₂ when ref is all zeros, so that
// zero against zero is 0); +Inf when got holds a NaN or an infinity, or
// its length is not ref's.
func relErr(ref, got []float32) float64 {
	if len(got) != len(ref) {
		return math.Inf(1)
	}
	var d, r float64
	for i, g := range got {
		if math.IsNaN(float64(g)) || math.IsInf(float64(g), 0) {
			return math.Inf(1)
		}
		e := float64(g) - float64(ref[i])
		d += e * e
		r += float64(ref[i]) * float64(ref[i])
	}
	if r == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / r)
}

// finite reports whether every value of v is a number and finite.
func finite(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}

// tensorDType is cu dtype dt as the tensor package names it (F32, F16,
// BF16, F8E4M3).
func tensorDType(dt cu.DType) (tensor.DType, bool) {
	switch dt {
	case cu.F32:
		return tensor.F32, true
	case cu.F16:
		return tensor.F16, true
	case cu.BF16:
		return tensor.BF16, true
	case cu.F8E4M3:
		return tensor.F8_E4M3, true
	}
	return 0, false
}

// floats widens device bytes of dtype dt (cu.F32, F16, BF16 or F8E4M3)
// to float32.
func floats(dt cu.DType, b []byte) ([]float32, error) {
	td, ok := tensorDType(dt)
	if !ok || len(b)%dt.Size() != 0 {
		return nil, fmt.Errorf("cuda: %d bytes of %v", len(b), dt)
	}
	v := make([]float32, len(b)/dt.Size())
	return v, tensor.ToF32(td, b, v)
}

// randomBytes is n values uniform in [-1, 1), rounded to dtype dt, as
// device bytes.
func randomBytes(dt cu.DType, n int, r *rand.Rand) ([]byte, error) {
	td, ok := tensorDType(dt)
	if !ok {
		return nil, fmt.Errorf("cuda: random values of %v", dt)
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = 2*r.Float32() - 1
	}
	return tensor.EncodeF32(td, v)
}

// output is the result verify compares: rows of cols values of dtype dt,
// ld values apart, from p.
type output struct {
	p              cu.Ptr
	rows, cols, ld int
	dt             cu.DType
}

// result runs check on the stream, waits for it and reads o back (its
// rows' cols values, packed).
func (l *loaded) result(check func() error, o output) ([]float32, error) {
	if err := check(); err != nil {
		return nil, err
	}
	// Download copies after the default stream's work, not the stream's.
	if err := l.stream.Sync(); err != nil {
		return nil, err
	}
	b := make([]byte, ((o.rows-1)*o.ld+o.cols)*o.dt.Size())
	if err := l.dev.Download(b, o.p); err != nil {
		return nil, err
	}
	v, err := floats(o.dt, b)
	if err != nil || o.ld == o.cols {
		return v, err
	}
	packed := make([]float32, 0, o.rows*o.cols)
	for r := range o.rows {
		packed = append(packed, v[r*o.ld:r*o.ld+o.cols]...)
	}
	return packed, nil
}

// verify checks cands (cands[0] the default, the reference) before a race:
// it runs each one's check (its run unless it has one), each writing its
// result into o from the same operands, and rejects (candidate.rejected)
// each other candidate whose result is off the reference's by more than
// tol. When the reference fails, nothing is rejected: the race times the
// default as ever and meets its failure. A reference that is not finite
// (the operands overflow the output's dtype) cannot tell right from
// wrong: the others are rejected, so that only the default may be kept.
func (l *loaded) verify(cands []candidate, o output, tol float64) {
	ref, err := l.result(cands[0].checker(), o)
	if err != nil {
		return
	}
	if !finite(ref) {
		rejectAll(cands, errors.New("the default's result is not finite"))
		return
	}
	for i := 1; i < len(cands); i++ {
		if cands[i].rejected != nil {
			continue // barred (Backend.Trials)
		}
		var got []float32
		err := l.trial(cands[i].trial, func() (err error) {
			got, err = l.result(cands[i].checker(), o)
			return err
		})
		if err != nil {
			cands[i].rejected = err
			continue
		}
		if corruptCandidate != nil && corruptCandidate(cands[i].name) {
			for j := range got {
				got[j] = 2*got[j] + 1
			}
		}
		if e := relErr(ref, got); !(e <= tol) {
			cands[i].rejected = rejection(fmt.Sprintf("wrong result: ‖Δ‖₂/‖ref‖₂ %.3g > %g", e, tol))
		}
	}
}

// rejectAll rejects every candidate but the default that verify did not
// reject already: why says why they could not be verified.
func rejectAll(cands []candidate, why error) {
	for i := 1; i < len(cands); i++ {
		if cands[i].rejected == nil {
			cands[i].rejected = rejection(fmt.Sprintf("not verified: %v", why))
		}
	}
}

// withRandom runs f with the n values of dtype dt at p (an input of the
// candidates) replaced by fresh random ones, uniform in [-1, 1), and puts
// the values back after. It keeps them in pinned memory on the host,
// copied on the stream, so that putting them back allocates nothing: a
// copy queued as the one that saved them fails only when the device
// itself has (then the step's next call fails too). Its error says that
// the values could not be saved or replaced (f did not run), or put back.
func (l *loaded) withRandom(p cu.Ptr, n int, dt cu.DType, f func()) error {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	vals, err := randomBytes(dt, n, rng)
	if err != nil {
		return err
	}
	saved, err := l.dev.AllocHost(len(vals))
	if err != nil {
		return err
	}
	defer saved.Free()
	if err := l.dev.CopyDtoHAsync(saved, 0, p, len(vals), l.stream); err != nil {
		return err
	}
	if err := l.stream.Sync(); err != nil {
		return err
	}
	// Upload copies on the default stream, and waits for it; the stream
	// is idle.
	err = l.dev.Upload(p, vals)
	if err == nil {
		f()
	}
	if e := l.dev.CopyHtoDAsync(p, saved, 0, len(vals), l.stream); e != nil {
		return e
	}
	if e := l.stream.Sync(); e != nil {
		return e
	}
	return err
}

// verifyProduct checks cands before a race: products of mm's shape, each
// computing mm's output (at mm.Dst, rows mm.LDD apart when set) from its
// operands. They run on fresh random values of X rather than the step's
// activation, which may be small or zero in much of its rows: random
// values give every output a sum of the same scale. X is put back before
// the race, so that its timed runs leave the step's product.
func (l *loaded) verifyProduct(mm cu.Matmul, cands []candidate) {
	tol := tolProduct16
	switch {
	case mm.In == cu.F8E4M3:
		tol = tolProductFP8
	case mm.Out == cu.F32:
		tol = tolProductF32
	}
	ld := mm.LDD
	if ld == 0 {
		ld = mm.N
	}
	o := output{p: mm.Dst, rows: mm.T, cols: mm.N, ld: ld, dt: mm.Out}
	if err := l.withRandom(mm.X, mm.T*mm.K, mm.In, func() { l.verify(cands, o, tol) }); err != nil {
		rejectAll(cands, err)
	}
}

// verifyAttention checks cands before a race: attention kernels (decode
// attention's plans, prefill attention's builds), each computing
// attention at for the step's t tokens (Q of dtype q). The KV cache is
// live state (the sequences' keys and values), read as it is. Q is not the
// step's yet when a decode plan is chosen (decodeWorkspace plans before
// the step's kernels, which write it, run), so it may hold whatever an
// earlier step left there, possibly not numbers at all: the check gives it
// fresh random values, and puts the old ones back after, as a product's X.
func (l *loaded) verifyAttention(at kernels.Attn, t int, q cu.DType, cands []candidate) {
	row := at.Heads * at.HeadDim
	o := output{p: at.Out, rows: t, cols: row, ld: row, dt: l.k.Act}
	if err := l.withRandom(at.Q, t*row, q, func() { l.verify(cands, o, tolAttention) }); err != nil {
		rejectAll(cands, err)
	}
}
