package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

var (
	k8set = map[cu.DType]*Kernels{}
	// fp8Acts are the activation dtypes an FP8 KV cache serves.
	fp8Acts = []cu.DType{cu.F16, cu.BF16}
)

// kern8 returns the (cached) module of FP8 KV caches for act, or skips
// on a device without FP8.
func kern8(t testing.TB, act cu.DType) *Kernels {
	t.Helper()
	d := gpu(t)
	if !d.FP8() {
		t.Skipf("%s has no FP8 (compute capability %d.%d)", d.Name, d.Major, d.Minor)
	}
	kmu.Lock()
	defer kmu.Unlock()
	if k := k8set[act]; k != nil {
		return k
	}
	k, err := NewFP8KV(d, act)
	if err != nil {
		t.Fatalf("compile the %v kernels of an FP8 cache: %v", act, err)
	}
	k8set[act] = k
	return k
}

// e4m3Codes rounds x to E4M3 codes as tensor.F32ToE4M3 does, and returns
// the codes with their values.
func e4m3Codes(x []float32) ([]byte, []float32) {
	codes, vals := make([]byte, len(x)), make([]float32, len(x))
	for i, v := range x {
		codes[i] = tensor.F32ToE4M3(v)
		vals[i] = tensor.E4M3ToF32(codes[i])
	}
	return codes, vals
}

func upBytes(t testing.TB, b []byte) cu.Ptr {
	t.Helper()
	p := alloc(t, max(len(b), 4))
	must(t, gpu(t).Upload(p, b))
	return p
}

func downBytes(t testing.TB, p cu.Ptr, n int) []byte {
	t.Helper()
	must(t, gpu(t).Sync())
	b := make([]byte, n)
	must(t, gpu(t).Download(b, p))
	return b
}

// checkCodes compares cache codes written on the device with the codes of
// ref (tensor.F32ToE4M3 of each value rounded to float32). exact demands
// every code (copies of activations); otherwise a value the device computed
// in float32 (RoPE) may land on the other side of a rounding boundary of
// E4M3 than float64's, so a code may be a neighbour of the reference's, a
// step of E4M3 away (at most 1 in 200 of them), never further.
func checkCodes(t *testing.T, what string, got []byte, ref []float64, exact bool) {
	t.Helper()
	off := 0
	for i, r := range ref {
		want := tensor.F32ToE4M3(float32(r))
		if got[i] == want {
			continue
		}
		g, w := float64(tensor.E4M3ToF32(got[i])), float64(tensor.E4M3ToF32(want))
		if exact || math.Abs(g-w) > e4m3Step(min(math.Abs(g), math.Abs(w))) {
			t.Fatalf("%s: code %d is %#02x (%g), want %#02x (%g, from %g)", what, i, got[i], g, want, w, r)
		}
		off++
	}
	if off*200 > len(ref) {
		t.Errorf("%s: %d of %d codes a step from the reference's", what, off, len(ref))
	}
	t.Logf("%s: %d of %d codes a step off", what, off, len(ref))
}

// e4m3Step is the gap between E4M3 values at magnitude v: 2^(e−3) for
// normals of exponent e, 2^−9 among the subnormals.
func e4m3Step(v float64) float64 {
	if v < math.Ldexp(1, -6) {
		return math.Ldexp(1, -9)
	}
	_, e := math.Frexp(v) // v = f·2^e, f in [0.5, 1)
	return math.Ldexp(1, e-1-3)
}

// TestFP8KVWrite checks the cache writers of the FP8 cache's module: keys
// and values stored as E4M3 codes in their slots (copies bit for bit as
// tensor.F32ToE4M3 rounds the activations, rotated keys within a step of
// it), the other slots untouched, the queries of RoPEQKVWrite as the
// activation module writes them.
func TestFP8KVWrite(t *testing.T) {
	const bs, maxPos = 16, 4096
	for _, act := range fp8Acts {
		k := kern8(t, act)
		rng := newRNG(t)
		for _, hs := range [][3]int{{32, 8, 128}, {4, 4, 64}, {5, 1, 80}} {
			heads, kvHeads, hd := hs[0], hs[1], hs[2]
			qw, width := heads*hd, kvHeads*hd
			cols := qw + 2*width
			tab := ropeTable(maxPos, hd, 500000)
			ptab := up(t, cu.F32, tab)
			for _, rows := range testRows {
				nslot, slots, pos := randSlots(rng, rows, bs, maxPos)
				pslots, ppos := upI32(t, slots), upI32(t, pos)
				kc0, kv0 := e4m3Codes(randn(rng, nslot*width, 2))
				vc0, vv0 := e4m3Codes(randn(rng, nslot*width, 2))
				for _, op := range []string{"kv_write", "rope_kv_write", "rope_qkv_write"} {
					for _, il := range []bool{false, true} {
						if op == "kv_write" && il {
							continue
						}
						pkc, pvc := upBytes(t, kc0), upBytes(t, vc0)
						qkv := roundTo(act, randn(rng, rows*cols, 3))
						kx, vx := make([]float32, rows*width), make([]float32, rows*width)
						for r := 0; r < rows; r++ {
							copy(kx[r*width:], qkv[r*cols+qw:r*cols+qw+width])
							copy(vx[r*width:], qkv[r*cols+qw+width:(r+1)*cols])
						}
						var pq cu.Ptr
						switch op {
						case "kv_write":
							must(t, k.KVWrite(nil, pkc, pvc, up(t, act, kx), up(t, act, vx), pslots, rows, width))
						case "rope_kv_write":
							must(t, k.RoPEKVWrite(nil, pkc, pvc, up(t, act, kx), up(t, act, vx), ppos, pslots, ptab, rows, kvHeads, hd, il))
						default:
							pq = outBuf(t, act, rows*qw)
							must(t, k.RoPEQKVWrite(nil, pq, pkc, pvc, up(t, act, qkv), ProductScales{}, ppos, pslots, ptab, rows, heads, kvHeads, hd, il))
						}
						qref, kref, vref := refRoPEQKV(f64(qkv), pos, slots, tab, kv0, vv0, heads, kvHeads, hd, il)
						if op == "kv_write" {
							kref = f64(kv0)
							for r, s := range slots {
								copy(kref[int(s)*width:(int(s)+1)*width], f64(kx[r*width:(r+1)*width]))
							}
						}
						what := fmt.Sprintf("%v %s interleaved=%v rows=%d heads=%d/%d hd=%d", act, op, il, rows, heads, kvHeads, hd)
						checkCodes(t, what+" k", downBytes(t, pkc, nslot*width), kref, op == "kv_write")
						checkCodes(t, what+" v", downBytes(t, pvc, nslot*width), vref, true)
						if pq != 0 {
							e := compare(t, what+" q", down(t, act, pq, rows*qw), qref, tol(act))
							report(t, act, what+" q", e)
						}
					}
				}
			}
		}
	}
}

// newFP8Attn is newAttn over caches of E4M3 codes (from the same random
// values, rounded by tensor.F32ToE4M3), whose values the reference reads.
func newFP8Attn(t *testing.T, rng *rand.Rand, act cu.DType, c attnCfg) *attnSetup {
	st := newAttn(t, rng, act, c)
	n := len(st.kc)
	kc, kv := e4m3Codes(randn(rng, n, 1))
	vc, vv := e4m3Codes(randn(rng, n, 1))
	st.kc, st.vc = kv, vv
	st.a.KCache, st.a.VCache, st.a.FP8 = upBytes(t, kc), upBytes(t, vc), true
	return st
}

// TestFP8CacheAttention runs the tensor-core attention of the FP8 cache's
// module (every decode plan DecodePlans offers over an FP8 cache, the
// prefill of 4, 2 and 1 heads a block) on the cases of the activation
// caches' tests whose shapes take an FP8 cache, against the float64
// reference over the codes' values, held to the measure of the activation
// caches' tensor-core kernels (checkDecodeMMA, checkMMA): the codes are
// exact in f16 and bf16, so only P's rounding remains (the decode computes
// in f16, Q scaled into its range: a case with |q| up to 1e5 checks that).
// The CUDA-core kernels are refused.
func TestFP8CacheAttention(t *testing.T) {
	ws := alloc(t, 64<<20)
	counters := alloc(t, DecodeCounterBytes(64, 64))
	for _, act := range fp8Acts {
		k := kern8(t, act)
		rng := newRNG(t)
		ran := 0
		for _, c := range append(append([]attnCfg{}, prefillCases...), decodeCases...) {
			if FP8OK(c.heads, c.kvHeads, c.hd) != nil {
				continue
			}
			ran++
			st := newFP8Attn(t, rng, act, c)
			ref := st.ref()
			n := len(st.q)
			plans := DecodePlans(st.a, st.meta, gpu(t).SMs, gpu(t).Clusters(), act)
			if len(plans) == 0 {
				t.Fatalf("%v: no decode plan over an FP8 cache", c)
			}
			for _, p := range plans {
				if !p.MMA {
					t.Fatalf("%v: plan %v over an FP8 cache", c, p)
				}
				if p.WorkspaceBytes > 64<<20 {
					t.Fatalf("%v: plan %+v needs more than the test's workspace", c, p)
				}
				poison(t, act, st.a.Out, n)
				must(t, k.DecodeAttention(nil, st.a, st.dm, p, ws, counters))
				checkDecodeMMA(t, act, fmt.Sprintf("fp8 decode %v on %v", p, c), down(t, act, st.a.Out, n), ref, c.hd)
			}
			variants := []string{"mma"}
			if h := mmaHeads(c.heads / c.kvHeads); h > 2 {
				variants = append(variants, "mma2", "mma1")
			} else if h > 1 {
				variants = append(variants, "mma1")
			}
			for _, v := range variants {
				poison(t, act, st.a.Out, n)
				must(t, k.prefill(nil, st.a, st.dm, v))
				got := down(t, act, st.a.Out, n)
				e := compareRows(t, "fp8 prefill "+v+" "+c.String(), got, ref, c.hd, mmaTol(act))
				if l2 := l2rel(got, ref); l2 > tol(act)/2 {
					t.Errorf("fp8 prefill %s %v: relative L2 error %.3g, limit %.3g", v, c, l2, tol(act)/2)
				}
				report(t, act, "fp8-prefill-"+v+" "+c.String(), e)
			}
			if err := k.prefill(nil, st.a, st.dm, "attn"); err == nil {
				t.Errorf("%v: the CUDA-core prefill ran over an FP8 cache", c)
			}
			// The activation module refuses an FP8 cache, and this one a cache of the activation dtype.
			if err := kern(t, act).PrefillAttention(nil, st.a, st.dm); err == nil {
				t.Errorf("%v: the activation cache's module ran over an FP8 cache", c)
			}
			plain := st.a
			plain.FP8 = false
			if err := k.PrefillAttention(nil, plain, st.dm); err == nil {
				t.Errorf("%v: the FP8 cache's module ran over an activation cache", c)
			}
		}
		if ran < 20 {
			t.Errorf("%v: only %d cases take an FP8 cache", act, ran)
		}
		if act == cu.BF16 {
			// Queries past f16's range (the decode's products are f16's:
			// Q is scaled into it by a power of two).
			c := attnCfg{heads: 32, kvHeads: 8, hd: 128, seqs: batchSeqs(8, 100, 900, 1)}
			st := newFP8Attn(t, rng, act, c)
			for i := range st.q {
				st.q[i] *= 3e4
			}
			roundTo(act, st.q)
			st.a.Q = up(t, act, st.q)
			ref := st.ref()
			for _, p := range DecodePlans(st.a, st.meta, gpu(t).SMs, gpu(t).Clusters(), act) {
				poison(t, act, st.a.Out, len(st.q))
				must(t, k.DecodeAttention(nil, st.a, st.dm, p, ws, counters))
				checkDecodeMMA(t, act, fmt.Sprintf("fp8 decode %v, |q| to 1e5, on %v", p, c), down(t, act, st.a.Out, len(st.q)), ref, c.hd)
			}
		}
	}
}

// TestFP8OK: the shapes an FP8 cache serves are those of the tensor-core
// kernels.
func TestFP8OK(t *testing.T) {
	for _, c := range []struct {
		heads, kvHeads, hd int
		ok                 bool
	}{
		{32, 8, 128, true}, {32, 1, 64, true}, {8, 2, 80, true}, {64, 2, 128, true},
		{4, 2, 16, true}, {8, 4, 8, false}, {66, 2, 128, false}, {8, 3, 128, false}, {8, 2, 48, false},
	} {
		if err := FP8OK(c.heads, c.kvHeads, c.hd); (err == nil) != c.ok {
			t.Errorf("FP8OK(%d, %d, %d) = %v, want ok %v", c.heads, c.kvHeads, c.hd, err, c.ok)
		}
	}
}

// TestFP8Widening: attention over one key returns its value row, so decode
// and prefill over sequences of one token whose values are every E4M3 code
// (NaNs excepted) must return each code's value exactly (every E4M3 value
// is an f16 and a bf16): the widening of codes, subnormals included.
func TestFP8Widening(t *testing.T) {
	const hd = 128
	for _, act := range fp8Acts {
		k := kern8(t, act)
		rng := newRNG(t)
		c := attnCfg{heads: 1, kvHeads: 1, hd: hd, seqs: [][2]int{{1, 1}, {1, 1}}}
		st := newFP8Attn(t, rng, act, c)
		// Token i's value row: codes 128i..128i+127, −0 for the NaNs.
		vc := make([]byte, len(st.vc))
		for tok := range st.b.Tokens {
			slot := int(st.b.Seqs[st.b.SeqIndex[tok]].Blocks[0]) * st.spec.BlockSize
			for d := 0; d < hd; d++ {
				if c := byte(tok*hd + d); c&0x7f != 0x7f {
					vc[slot*hd+d] = c
				} else {
					vc[slot*hd+d] = 0x80
				}
			}
		}
		st.a.VCache = upBytes(t, vc)
		n := len(st.q)
		check := func(what string) {
			got := down(t, act, st.a.Out, n)
			for tok := range st.b.Tokens {
				slot := int(st.b.Seqs[st.b.SeqIndex[tok]].Blocks[0]) * st.spec.BlockSize
				for d := 0; d < hd; d++ {
					want := tensor.E4M3ToF32(vc[slot*hd+d])
					if g := got[tok*hd+d]; g != want { // −0 comes back +0: P·V sums from +0
						t.Fatalf("%v %s: code %#02x widened to %g, want %g", act, what, vc[slot*hd+d], g, want)
					}
				}
			}
		}
		for _, p := range DecodePlans(st.a, st.meta, gpu(t).SMs, gpu(t).Clusters(), act) {
			poison(t, act, st.a.Out, n)
			must(t, k.DecodeAttention(nil, st.a, st.dm, p, alloc(t, p.WorkspaceBytes), alloc(t, DecodeCounterBytes(st.meta.T, 1))))
			check(fmt.Sprintf("decode %v", p))
		}
		poison(t, act, st.a.Out, n)
		must(t, k.PrefillAttention(nil, st.a, st.dm))
		check("prefill")
	}
}
