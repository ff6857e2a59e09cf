package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"kiln/backend/cuda/cu"
)

// TestPeerAllReduce: the one-shot all-reduce of groups of 2 to 8 ranks,
// each rank a stream of the one test device with a region of its own, so
// that the ranks' kernels run at once and wait for each other as on a
// group's devices. A sequence of calls of changing sizes (one vector, a
// decode row, 64 and 256 rows, a size that leaves a block part full), in
// place and not, on fresh random partial sums each call: every rank must
// hold the sum in rank order in float32, rounded to the dtype, bit for bit.
// Each call uses other buffers than the one before, and blocks of calls
// before, so the epochs and the buffers' reuse are checked too. It runs in
// the Lamport form, in the flag form, and taking turns (the two share the
// epochs); the partials hold zeros of both signs and, in f32, the Lamport
// form's empty word, none of which it may take for an empty element.
// Past PeerOneShotBytes, groups of more than two ranks sum in two shots
// (the 256-row calls, 131×4000 whose vectors split unevenly over the
// ranks, 512×2048 in place, and in f32 the 64-row ones).
func TestPeerAllReduce(t *testing.T) {
	for _, form := range []string{"lamport", "flags", "turns"} {
		t.Run(form, func(t *testing.T) { peerAllReduce(t, form) })
	}
}

func peerAllReduce(t *testing.T, form string) {
	d := gpu(t)
	const capBytes = 256 * 4096 * 4
	for _, ranks := range []int{2, 3, 4, 8} {
		for _, act := range allDTypes {
			k, rng, regions, streams := streamRanks(t, d, act, ranks, capBytes)
			call := 0
			group := func(i int) PeerGroup {
				return PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes, Flags: form == "flags" || form == "turns" && call%2 == 1}
			}
			vec := 16 / act.Size()
			for ci, c := range []struct {
				rows, dim int
				inPlace   bool
			}{
				{1, vec, false}, {1, 4096, false}, {64, 4096, false}, {64, 4096, true}, {256, 4096, false},
				{3, 1000 * vec, false}, {200, 96, false}, {1, 4096, true}, {256, 1024, true}, {1, 4096, false},
				{131, 4000, false}, {512, 2048, true}, {64, 4096, false},
			} {
				call = ci
				what := fmt.Sprintf("%d ranks, %v, call %d (%d×%d, in place %v)", ranks, act, call, c.rows, c.dim, c.inPlace)
				n := c.rows * c.dim
				parts := make([][]float32, ranks)
				src := make([]cu.Ptr, ranks)
				dst := make([]cu.Ptr, ranks)
				for i := range ranks {
					parts[i] = withZeros(roundTo(act, randn(rng, n, 1)))
					if act == cu.F32 && i == 0 {
						// The Lamport form's empty word, a subnormal in
						// f32: pushed as -0, which every rank's sum takes
						// alike (another rank's value at the same place
						// is normal, so the sums do not change).
						for j := 11; j < n; j += 64 {
							parts[i][j] = math.Float32frombits(peerEmpty)
						}
					}
					src[i] = up(t, act, parts[i])
					dst[i] = src[i]
					if !c.inPlace {
						dst[i] = outBuf(t, act, n)
					}
				}
				must(t, d.Sync()) // the buffers' memsets ran on the default stream
				for i := range ranks {
					must(t, k.PeerAllReduce(streams[i], group(i), dst[i], src[i], n, act))
				}
				for _, s := range streams {
					if err := s.Sync(); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				ref := rankSum(act, parts)
				for i := range ranks {
					compare(t, what+fmt.Sprintf(", rank %d's sum", i), down(t, act, dst[i], n), ref, 0)
				}
				if t.Failed() {
					return
				}
			}
		}
	}
}

// TestPeerAllReduceNorm: the two-shot all-reduce with the residual add and
// RMSNorm after it in one kernel (PeerAllReduceNorm), over groups of 3, 4
// and 8 ranks as streams of the one test device (TestPeerAllReduce's way),
// for each compute dtype: 131 uneven rows of 4000, 256 of 4096, 512 of
// 2048, 300 of 1024 and 200 of 1536, the sum apart, over r or over the
// partials, the norm over the partials or over a part of them a third of
// the rows further on (with sync), gains of every dtype, each call on
// fresh random partials between calls of PeerAllReduce (the two share the
// epochs). Every rank's sum must be the ranks' partials summed in rank
// order in float32, rounded, plus r, rounded (-0 and +0 alike); its norm
// that of the sum within tol; every rank the same bits; and both equal in
// value to what PeerAllReduce then AddRMSNorm give.
func TestPeerAllReduceNorm(t *testing.T) {
	d := gpu(t)
	const capBytes = 256 * 4096 * 4
	const eps = float32(1e-5)
	for _, ranks := range []int{3, 4, 8} {
		for _, act := range allDTypes {
			k, rng, regions, streams := streamRanks(t, d, act, ranks, capBytes)
			group := func(i int) PeerGroup { return PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes} }
			for ci, c := range []struct {
				rows, dim int
				alias     int // 0 apart, 1 sum over r, 2 sum over src, 3 normed over src, 4 normed over src rows/3 rows on
				wt        cu.DType
			}{
				{131, 4000, 2, cu.F32}, {256, 4096, 1, cu.BF16}, {300, 1024, 3, cu.F16}, {512, 2048, 0, act},
				{256, 4096, 4, cu.F32}, {200, 1536, 4, act},
			} {
				what := fmt.Sprintf("%d ranks, %v, call %d (%d×%d, alias %d, gain %v)", ranks, act, ci, c.rows, c.dim, c.alias, c.wt)
				n := c.rows * c.dim
				w := roundTo(c.wt, randn(rng, c.dim, 1))
				pw := up(t, c.wt, w)
				r := roundTo(act, randn(rng, n, 1))
				parts := make([][]float32, ranks)
				src, rs, sums, normed := make([]cu.Ptr, ranks), make([]cu.Ptr, ranks), make([]cu.Ptr, ranks), make([]cu.Ptr, ranks)
				for i := range ranks {
					parts[i] = withZeros(roundTo(act, randn(rng, n, 1)))
					src[i], rs[i] = up(t, act, parts[i]), up(t, act, r)
					sums[i], normed[i] = outBuf(t, act, n), outBuf(t, act, n)
					switch c.alias {
					case 1:
						sums[i] = rs[i]
					case 2:
						sums[i] = src[i]
					case 3:
						normed[i] = src[i]
					case 4:
						// src's buffer reused from a third of its rows on.
						shift := c.rows / 3 * c.dim
						whole := alloc(t, (n+shift)*act.Size())
						must(t, d.Upload(whole, encode(act, parts[i])))
						src[i], normed[i] = whole, whole+cu.Ptr(shift*act.Size())
					}
				}
				must(t, d.Sync())
				for i := range ranks {
					must(t, k.PeerAllReduceNorm(streams[i], group(i), sums[i], normed[i], src[i], rs[i], pw, c.wt, c.rows, c.dim, eps, c.alias == 4))
				}
				for _, s := range streams {
					if err := s.Sync(); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				x := rankSum(act, parts)
				sum := make([]float32, n)
				for j := range sum {
					sum[j] = float32(x[j] + float64(r[j]))
				}
				roundTo(act, sum)
				refSum, refNorm := f64(sum), refRMSNorm(f64(sum), w, c.rows, c.dim, eps)
				var first []byte
				for i := range ranks {
					compare(t, what+fmt.Sprintf(", rank %d's sum", i), down(t, act, sums[i], n), refSum, 0)
					e := compare(t, what+fmt.Sprintf(", rank %d's norm", i), down(t, act, normed[i], n), refNorm, tol(act))
					if i == 0 {
						report(t, act, fmt.Sprintf("peer all-reduce + norm, %d ranks, %d×%d", ranks, c.rows, c.dim), e)
					}
					b := make([]byte, n*act.Size())
					must(t, d.Download(b, normed[i]))
					if i == 0 {
						first = b
					} else if !bytes.Equal(b, first) {
						t.Errorf("%s: rank %d's norm is not rank 0's bit for bit", what, i)
					}
				}
				// The same partials through PeerAllReduce, then AddRMSNorm.
				// Every upload first, and every rank's all-reduce before
				// any norm: an upload waits for the device, and so may a
				// kernel's first launch (CUDA's lazy loading), where a
				// rank's all-reduce waits for the others'.
				xs := make([]cu.Ptr, ranks)
				for i := range ranks {
					xs[i] = outBuf(t, act, n)
					rs[i], sums[i], normed[i], src[i] = up(t, act, r), outBuf(t, act, n), outBuf(t, act, n), up(t, act, parts[i])
				}
				must(t, d.Sync())
				for i := range ranks {
					must(t, k.PeerAllReduce(streams[i], group(i), xs[i], src[i], n, act))
				}
				for i := range ranks {
					must(t, k.AddRMSNorm(streams[i], sums[i], normed[i], xs[i], rs[i], ProductScales{}, pw, c.wt, c.rows, c.dim, eps))
				}
				for _, s := range streams {
					must(t, s.Sync())
				}
				got := down(t, act, normed[0], n)
				for i := range ranks {
					compare(t, what+fmt.Sprintf(", rank %d's sum apart", i), down(t, act, sums[i], n), refSum, 0)
				}
				// Through the same float32 steps: the same values.
				compare(t, what+": the norm apart against in one kernel", got, f64(decode(act, first)), 0)
				if t.Failed() {
					return
				}
			}
		}
	}
}

// streamRanks readies ranks ranks in dtype act as streams of device d
// (oneDeviceRanks, for calls of at most capBytes): the kernels (every
// rank's blocks checked to fit the device at once, residentPeerBlocks), a
// fresh generator, the regions and the streams.
func streamRanks(t *testing.T, d *cu.Device, act cu.DType, ranks, capBytes int) (*Kernels, *rand.Rand, []cu.Ptr, []*cu.Stream) {
	t.Helper()
	k := kern(t, act)
	residentPeerBlocks(t, d, k, act, ranks)
	rng := newRNG(t)
	regions, streams := oneDeviceRanks(t, d, ranks, capBytes, 0)
	return k, rng, regions, streams
}

// oneDeviceRanks readies ranks ranks as streams of device d, each with a
// region (cleared) for calls of at most capBytes and staging bytes of
// staging past it.
func oneDeviceRanks(t *testing.T, d *cu.Device, ranks, capBytes, staging int) ([]cu.Ptr, []*cu.Stream) {
	t.Helper()
	regions := make([]cu.Ptr, ranks)
	streams := make([]*cu.Stream, ranks)
	for i := range ranks {
		regions[i] = alloc(t, PeerRegionBytes(ranks, capBytes)+staging)
		must(t, ClearPeerRegion(d, regions[i], ranks, capBytes, nil))
		s, err := d.NewStream()
		must(t, err)
		t.Cleanup(func() { s.Close() })
		streams[i] = s
	}
	return regions, streams
}

// residentPeerBlocks fails the test unless every form's kernel keeps the
// blocks of ranks grids of PeerSlots blocks on device d at once: the
// test's ranks are streams of d, and a block waits for the other ranks'.
func residentPeerBlocks(t *testing.T, d *cu.Device, k *Kernels, dt cu.DType, ranks int) {
	t.Helper()
	for _, name := range []string{"peer_allreduce_" + cname(dt), "peer_lamport_" + cname(dt), "peer_lamport2_" + cname(dt),
		"peer_lamport2_norm_wf32"} {
		m, err := k.module(name)
		must(t, err)
		f, err := m.Function(name)
		must(t, err)
		per, err := f.Occupancy(peerThreads, 0)
		must(t, err)
		if per*d.SMs < ranks*PeerSlots {
			t.Fatalf("%s: %d blocks a multiprocessor, %d on the device: not the %d of %d ranks at once", name, per, per*d.SMs, ranks*PeerSlots, ranks)
		}
	}
}

// rankSum is what every rank's all-reduce must hold: the ranks' partials
// summed in rank order in float32, rounded to dt.
func rankSum(dt cu.DType, parts [][]float32) []float64 {
	reduced := make([]float32, len(parts[0]))
	for j := range reduced {
		var acc float32
		for _, p := range parts {
			acc += p[j]
		}
		reduced[j] = acc
	}
	ref := make([]float64, len(reduced))
	for j, v := range roundTo(dt, reduced) {
		ref[j] = float64(v)
	}
	return ref
}

// withZeros sets every 16th element of x to +0 and every 16th after the
// 7th to -0, and returns x.
func withZeros(x []float32) []float32 {
	for j := 0; j < len(x); j += 16 {
		x[j] = 0
		if j+7 < len(x) {
			x[j+7] = float32(math.Copysign(0, -1))
		}
	}
	return x
}

// TestPeerScatterRows: the logits' exchange by rows over groups of 2 to 8
// ranks (streams of the one test device, as in TestPeerAllReduce), for
// row counts below, at and above the ranks and shards of several widths,
// each call on fresh random f32 shards (holding the Lamport form's empty
// word, which this exchange moves as it is), with a one-shot all-reduce
// between calls (the two share the epochs): each rank's staging must hold
// its rows of the whole logits (every rank's columns in rank order), bit
// for bit.
func TestPeerScatterRows(t *testing.T) {
	d := gpu(t)
	k := kern(t, cu.BF16)
	const capBytes = 1 << 16
	for _, ranks := range []int{2, 3, 4, 8} {
		residentPeerBlocks(t, d, k, cu.BF16, ranks)
		m, err := k.module("peer_scatter_rows")
		must(t, err)
		f, err := m.Function("peer_scatter_rows")
		must(t, err)
		if per, err := f.Occupancy(peerThreads, 0); err != nil || per*d.SMs < ranks*PeerSlots {
			t.Fatalf("peer_scatter_rows: %d blocks a multiprocessor (%v): not %d ranks' at once", per, err, ranks)
		}
		rng := newRNG(t)
		const staging = 2 << 20
		regions, streams := oneDeviceRanks(t, d, ranks, capBytes, staging)
		for ci, c := range []struct{ rows, n int }{{1, 128}, {3, 1000}, {8, 4}, {17, 1000}, {ranks, 256}, {200, 64}, {64, 2000}} {
			what := fmt.Sprintf("%d ranks, call %d (%d rows of %d a rank)", ranks, ci, c.rows, c.n)
			shards := make([][]float32, ranks)
			src := make([]cu.Ptr, ranks)
			for i := range ranks {
				shards[i] = randn(rng, c.rows*c.n, 1)
				shards[i][rng.IntN(len(shards[i]))] = math.Float32frombits(peerEmpty)
				src[i] = up(t, cu.F32, shards[i])
			}
			sums := make([]cu.Ptr, ranks)
			for i := range ranks {
				sums[i] = up(t, cu.BF16, randn(rng, 64, 1))
			}
			must(t, d.Sync())
			for i := range ranks {
				g := PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes, StagingBytes: staging}
				if !g.PeerScatterFits(src[i], c.rows, c.n) {
					t.Fatalf("%s: does not fit", what)
				}
				must(t, k.PeerScatterRows(streams[i], g, src[i], c.rows, c.n))
				must(t, k.PeerAllReduce(streams[i], g, sums[i], sums[i], 64, cu.BF16))
			}
			for _, s := range streams {
				if err := s.Sync(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			for q := range ranks {
				g := PeerGroup{Rank: q, Regions: regions, CapBytes: capBytes, StagingBytes: staging}
				lo, hi := PeerRowShare(c.rows, q, ranks)
				if hi == lo {
					continue
				}
				got := down(t, cu.F32, g.PeerStaging(), (hi-lo)*ranks*c.n)
				for r := lo; r < hi; r++ {
					for i := range ranks {
						for j := range c.n {
							want, have := shards[i][r*c.n+j], got[((r-lo)*ranks+i)*c.n+j]
							if math.Float32bits(want) != math.Float32bits(have) {
								t.Fatalf("%s: rank %d's row %d, rank %d's column %d: %v, want %v", what, q, r, i, j, have, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestPeerAllReduceRefuses: sizes past the capacity, unaligned operands and
// groups the kernels do not take are errors, not launches.
func TestPeerAllReduceRefuses(t *testing.T) {
	k := kern(t, cu.BF16)
	p := alloc(t, 1<<16)
	g := PeerGroup{Rank: 0, Regions: []cu.Ptr{p, p}, CapBytes: 1024}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"past the capacity", k.PeerAllReduce(nil, g, p, p, 1024, cu.BF16)},
		{"unaligned", k.PeerAllReduce(nil, g, p+2, p+2, 64, cu.BF16)},
		{"a partial vector", k.PeerAllReduce(nil, g, p, p, 12, cu.BF16)},
		{"one rank", k.PeerAllReduce(nil, PeerGroup{Regions: []cu.Ptr{p}, CapBytes: 1024}, p, p, 64, cu.BF16)},
		{"nine ranks", k.PeerAllReduce(nil, PeerGroup{Regions: make([]cu.Ptr, 9), CapBytes: 1024}, p, p, 64, cu.BF16)},
		{"FP8 codes", k.PeerAllReduce(nil, g, p, p, 64, cu.F8E4M3)},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.what)
		}
	}
}

// TestPeerAllReduceBackToBack: on two devices with peer access (skipped
// on one), and where there are more on all of them (up to eight, the
// calls of 200 and 512 rows then in two shots), calls queued one after another with no wait on the host
// between them and dependent launches, as a step's are: each rank's
// partial sums written by a kernel launched just before the call, the
// sizes and grids (PeerSlots blocks, or PeerGroup.Blocks of one or two a
// multiprocessor) changing from call to call, in place
// and not, in the Lamport form and one call in three in the flag form, and
// one rank held back at times (Spin) so that the other runs
// ahead into the next calls' buffers, the call counter wrapping past 2³²
// on the way. Every call's result, checked at the
// end, must be the sum of its own partials, and no rank may have waited
// in vain (the regions' diagnostic word is set, so a wait past the
// timeout is recorded instead of trapping). On one device the ranks'
// kernels would have to fit on it at once, which back-to-back calls do
// not promise: TestPeerAllReduce covers one device, a call at a time.
func TestPeerAllReduceBackToBack(t *testing.T) {
	rs := peerRanks(t)
	t.Run("2 ranks", func(t *testing.T) { backToBack(t, rs[:2]) })
	if len(rs) > 2 {
		// Every device, the larger calls in two shots.
		t.Run(fmt.Sprintf("%d ranks", len(rs)), func(t *testing.T) { backToBack(t, rs) })
	}
}

// arRank is one rank of backToBack: its device and kernels.
type arRank struct {
	d *cu.Device
	k *Kernels
}

// wrapStart is the call count backToBack's regions start from.
const wrapStart = 1<<32 - 16

func backToBack(t *testing.T, rs []arRank) {
	const capBytes = 512 * 4096 * 2
	ranks := len(rs)
	rng := newRNG(t)
	regions := make([]cu.Ptr, ranks)
	streams := make([]*cu.Stream, ranks)
	for i, r := range rs {
		regions[i] = allocOn(t, r.d, PeerRegionBytes(ranks, capBytes))
		must(t, ClearPeerRegion(r.d, regions[i], ranks, capBytes, nil))
		// The regions as after wrapStart calls: every flag and the call
		// counter there, so that the counter wraps past 2³² 16 calls in.
		must(t, r.d.Memset32(regions[i], wrapStart, PeerSlots*PeerMaxRanks+1, nil))
		must(t, r.d.Upload(regions[i]+peerDiag, cu.AsBytes([]uint32{1})))
		s, err := r.d.NewStream()
		must(t, err)
		t.Cleanup(func() { s.Close() })
		streams[i] = s
	}
	type call struct {
		rows, dim int
		inPlace   bool
		flags     bool        // the flag form (else the Lamport form)
		blocks    int         // PeerGroup.Blocks (0: PeerSlots)
		parts     [][]float32 // each rank's partial sums, as the sum of a and b
		a, b, src []cu.Ptr
		dst       []cu.Ptr
	}
	var calls []*call
	for range 60 {
		rows := []int{1, 1, 4, 64, 17, 1, 64, 512, 200}[rng.IntN(9)]
		cl := &call{rows: rows, dim: 4096, inPlace: rng.IntN(2) == 0, flags: rng.IntN(3) == 0}
		cl.blocks = []int{0, rs[0].d.SMs, 2 * rs[0].d.SMs}[rng.IntN(3)]
		n := rows * cl.dim
		for _, r := range rs {
			a, b := roundTo(cu.BF16, randn(rng, n, 1)), roundTo(cu.BF16, randn(rng, n, 1))
			sum := make([]float32, n)
			for j := range sum {
				sum[j] = a[j] + b[j]
			}
			cl.parts = append(cl.parts, roundTo(cu.BF16, sum))
			cl.a, cl.b = append(cl.a, upOn(t, r.d, cu.BF16, a)), append(cl.b, upOn(t, r.d, cu.BF16, b))
			cl.src = append(cl.src, allocOn(t, r.d, 2*n))
			if cl.inPlace {
				cl.dst = append(cl.dst, cl.src[len(cl.src)-1])
			} else {
				cl.dst = append(cl.dst, allocOn(t, r.d, 2*n))
			}
		}
		calls = append(calls, cl)
	}
	for _, r := range rs {
		must(t, r.d.Sync()) // the buffers' memsets ran on the default stream
	}
	for c, cl := range calls {
		n := cl.rows * cl.dim
		for i, r := range rs {
			if c%7 == 3 && i == c%ranks {
				must(t, r.k.Spin(streams[i], 200*time.Microsecond))
			}
			must(t, r.k.Add(streams[i], cl.src[i], cl.a[i], cl.b[i], n))
			g := PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes, Flags: cl.flags, Blocks: cl.blocks}
			must(t, r.k.PeerAllReduce(streams[i], g, cl.dst[i], cl.src[i], n, cu.BF16))
		}
	}
	for _, s := range streams {
		must(t, s.Sync())
	}
	for i, r := range rs {
		b := make([]byte, 40)
		must(t, r.d.Download(b, regions[i]+peerDiag-8))
		w := make([]uint32, 10)
		for j := range w {
			w[j] = binary.LittleEndian.Uint32(b[4*j:])
		}
		t.Logf("rank %d made %d calls of %d", i, w[0]-wrapStart, len(calls))
		if w[3] != 0 {
			t.Errorf("rank %d waited in vain %d times: first in call %d, block %d, for rank %d's flag (it held %d; %d calls done)", i, w[3], w[4], w[6], w[7], w[5], w[8])
		}
	}
	if t.Failed() {
		return
	}
	for c, cl := range calls {
		n := cl.rows * cl.dim
		ref := rankSum(cu.BF16, cl.parts)
		for i, r := range rs {
			what := fmt.Sprintf("call %d (%d rows, in place %v, flag form %v, blocks %d), rank %d", c, cl.rows, cl.inPlace, cl.flags, cl.blocks, i)
			must(t, r.d.Sync())
			b := make([]byte, 2*n)
			must(t, r.d.Download(b, cl.dst[i]))
			compare(t, what+"'s sum", decode(cu.BF16, b), ref, 0)
		}
		if t.Failed() {
			return
		}
	}
}

// TestPeerGroupArgs (no GPU): what a call may move, which calls take two
// shots, the rows each rank samples after a scatter and what fits its
// staging, and the arguments the kernel takes after its operands (rank, ranks, capacity, the regions r0…r7,
// null past the group).
func TestPeerGroupArgs(t *testing.T) {
	// Which calls run the add and norm after them in two shots.
	bk := &Kernels{Act: cu.BF16}
	three := PeerGroup{Rank: 0, Regions: []cu.Ptr{0x1000, 0x2000, 0x3000}, CapBytes: 4 << 20}
	for _, c := range []struct {
		g         PeerGroup
		rows, dim int
		p         cu.Ptr
		want      bool
	}{
		{three, 256, 4096, 0x100, true},
		{three, 64, 4096, 0x100, false},   // 512 KiB: one shot
		{three, 1024, 4096, 0x100, false}, // past the capacity
		{three, 128, 8200, 0x100, false},  // 1,025 vectors a row
		{three, 256, 4096, 0x108, false},  // unaligned
		{PeerGroup{Rank: 0, Regions: three.Regions[:2], CapBytes: 4 << 20}, 256, 4096, 0x100, false}, // two ranks: one shot
		{PeerGroup{Rank: 0, Regions: three.Regions, CapBytes: 4 << 20, Apart: true}, 256, 4096, 0x100, false},
		{PeerGroup{Rank: 0, Regions: three.Regions, CapBytes: 4 << 20, Flags: true}, 256, 4096, 0x100, false},
	} {
		if got := bk.PeerAllReduceNormFits(c.g, c.rows, c.dim, c.p, 0x200); got != c.want {
			t.Errorf("norm fits(%d ranks, apart %v, flags %v, %d×%d at %#x) = %v, want %v", len(c.g.Regions), c.g.Apart, c.g.Flags, c.rows, c.dim, c.p, got, c.want)
		}
	}
	g := PeerGroup{Rank: 1, Regions: []cu.Ptr{0x1000, 0x2000, 0x3000}, CapBytes: 4096}
	for _, c := range []struct {
		dst, src cu.Ptr
		n        int
		dt       cu.DType
		want     bool
	}{
		{0x100, 0x200, 2048, cu.BF16, true},
		{0x100, 0x100, 1024, cu.F32, true},
		{0x100, 0x200, 2056, cu.BF16, false}, // past the capacity
		{0x108, 0x200, 64, cu.BF16, false},   // unaligned
		{0x100, 0x200, 4, cu.BF16, false},    // part of a vector
		{0x100, 0x200, 0, cu.F16, false},
		{0x100, 0x200, 64, cu.F8E4M3, false},
	} {
		if got := g.PeerAllReduceFits(c.dst, c.src, c.n, c.dt); got != c.want {
			t.Errorf("fits(%#x, %#x, %d %v) = %v, want %v", c.dst, c.src, c.n, c.dt, got, c.want)
		}
	}
	args := g.args()
	want := []any{int32(1), int32(3), int64(4096), cu.Ptr(0x1000), cu.Ptr(0x2000), cu.Ptr(0x3000), cu.Ptr(0), cu.Ptr(0), cu.Ptr(0), cu.Ptr(0), cu.Ptr(0)}
	if fmt.Sprint(args) != fmt.Sprint(want) || len(args) != 3+PeerMaxRanks {
		t.Errorf("args %v, want %v", args, want)
	}
	if err := g.check(); err != nil {
		t.Error(err)
	}
	for _, bad := range []PeerGroup{{Rank: 3, Regions: g.Regions, CapBytes: 4096}, {Regions: g.Regions, CapBytes: 100}, {Regions: make([]cu.Ptr, 9), CapBytes: 4096}} {
		if bad.check() == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	for _, c := range []struct {
		ranks, bytes int
		flags, want  bool
	}{
		{2, 4 << 20, false, false},
		{3, PeerOneShotBytes, false, false},
		{3, PeerOneShotBytes + 16, false, true},
		{8, 4 << 20, false, true},
		{4, 4 << 20, true, false}, // the flag form has one shot only
	} {
		g := PeerGroup{Regions: make([]cu.Ptr, c.ranks), Flags: c.flags}
		if got := g.TwoShot(c.bytes); got != c.want {
			t.Errorf("%d ranks (flag form %v): two shots for %d bytes %v, want %v", c.ranks, c.flags, c.bytes, got, c.want)
		}
	}
	for _, c := range []struct{ rows, ranks, rank, lo, hi int }{
		{512, 4, 0, 0, 128}, {512, 4, 3, 384, 512}, {5, 4, 1, 2, 4}, {5, 4, 2, 4, 5}, {5, 4, 3, 5, 5}, {1, 2, 1, 1, 1}, {1, 2, 0, 0, 1},
	} {
		if lo, hi := PeerRowShare(c.rows, c.rank, c.ranks); lo != c.lo || hi != c.hi {
			t.Errorf("PeerRowShare(%d, %d, %d) = [%d, %d), want [%d, %d)", c.rows, c.rank, c.ranks, lo, hi, c.lo, c.hi)
		}
	}
	sg := PeerGroup{Rank: 1, Regions: []cu.Ptr{0x100000, 0x200000}, CapBytes: 4096, StagingBytes: 8 * 2 * 100 * 4}
	for _, c := range []struct {
		src     cu.Ptr
		rows, n int
		want    bool
	}{
		{0x1000, 16, 100, true}, {0x1000, 15, 100, true}, {0x1000, 17, 100, false}, {0x1008, 4, 100, false}, {0x1000, 4, 98, false}, {0x1000, 0, 100, false},
	} {
		if got := sg.PeerScatterFits(c.src, c.rows, c.n); got != c.want {
			t.Errorf("scatter fits(%#x, %d rows, %d) = %v, want %v", c.src, c.rows, c.n, got, c.want)
		}
	}
	if got, want := sg.PeerStaging(), cu.Ptr(0x200000+PeerRegionBytes(2, 4096)); got != want {
		t.Errorf("staging at %#x, want %#x", got, want)
	}
	if got := PeerRegionBytes(2, 1<<20); got != 4096+8<<20 {
		t.Errorf("PeerRegionBytes(2, 1 MiB) = %d", got)
	}
}

// TestPeerAllReduceAdd: the one-shot Lamport all-reduce with a residual
// added (PeerAllReduceAdd), over groups of 2, 3 and 4 ranks as streams of
// the one test device (TestPeerAllReduce's way), each dtype: a decode row,
// 8 and 64 rows of 4096, 200 of 96, the sum apart, over r, over the
// partials, or over the partials shifted by 40 vectors (with sync), each on
// fresh random partials and residuals, taking turns with PeerAllReduce
// (the two share the epochs). Every rank must hold the partials summed in
// rank order in float32 plus r, rounded once, bit for bit. Calls the
// one-shot form does not take are refused.
func TestPeerAllReduceAdd(t *testing.T) {
	d := gpu(t)
	const capBytes = 64 * 4096 * 4
	for _, ranks := range []int{2, 3, 4} {
		for _, act := range allDTypes {
			k, rng, regions, streams := streamRanks(t, d, act, ranks, capBytes)
			group := func(i int) PeerGroup { return PeerGroup{Rank: i, Regions: regions, CapBytes: capBytes} }
			for ci, c := range []struct {
				rows, dim int
				over      string // where the sum goes: "apart", "r" or "src"
			}{
				{1, 4096, "apart"}, {8, 4096, "r"}, {64, 4096, "src"}, {1, 4096, "shifted"}, {200, 96, "apart"}, {8, 4096, "shifted"},
				{8, 4096, "src"},
			} {
				n := c.rows * c.dim
				sync := c.over == "shifted"
				if !group(0).PeerAddFits(1<<20, 1<<20, 1<<20, n, act, sync) {
					continue // two shots: refused below
				}
				what := fmt.Sprintf("%d ranks, %v, call %d (%d×%d, sum over %s)", ranks, act, ci, c.rows, c.dim, c.over)
				r := roundTo(act, randn(rng, n, 1))
				parts := make([][]float32, ranks)
				src, rp, dst := make([]cu.Ptr, ranks), make([]cu.Ptr, ranks), make([]cu.Ptr, ranks)
				for i := range ranks {
					parts[i] = withZeros(roundTo(act, randn(rng, n, 1)))
					src[i], rp[i] = up(t, act, parts[i]), up(t, act, r)
					switch c.over {
					case "apart":
						dst[i] = outBuf(t, act, n)
					case "r":
						dst[i] = rp[i]
					case "shifted":
						// The partials 40 vectors into a buffer, the sum at its start.
						shift := 40 * 16 / act.Size()
						buf := outBuf(t, act, n+shift)
						src[i] = buf.Add(shift * act.Size())
						must(t, d.CopyDtoD(src[i], up(t, act, parts[i]), n*act.Size(), nil))
						dst[i] = buf
					default:
						dst[i] = src[i]
					}
				}
				must(t, d.Sync())
				for i := range ranks {
					must(t, k.PeerAllReduceAdd(streams[i], group(i), dst[i], src[i], rp[i], n, act, sync))
				}
				for _, s := range streams {
					if err := s.Sync(); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				ref := rankSum(act, append(parts, r))
				for i := range ranks {
					compare(t, what+fmt.Sprintf(", rank %d's sum", i), down(t, act, dst[i], n), ref, 0)
				}
				// A plain call between.
				for i := range ranks {
					must(t, k.PeerAllReduce(streams[i], group(i), rp[i], rp[i], n, act))
				}
				for _, s := range streams {
					must(t, s.Sync())
				}
				if t.Failed() {
					return
				}
			}
		}
	}
	// Refused: the flag form, two shots, a misaligned residual.
	k := kern(t, cu.BF16)
	p := alloc(t, 1<<20)
	regions := []cu.Ptr{p, p, p}
	for _, c := range []struct {
		what string
		g    PeerGroup
		r    cu.Ptr
		n    int
	}{
		{"flags", PeerGroup{Regions: regions[:2], CapBytes: capBytes, Flags: true}, p, 4096},
		{"two shots", PeerGroup{Regions: regions, CapBytes: capBytes}, p, 128 * 4096},
		{"r misaligned", PeerGroup{Regions: regions[:2], CapBytes: capBytes}, p.Add(2), 4096},
	} {
		if err := k.PeerAllReduceAdd(nil, c.g, p, p, c.r, c.n, cu.BF16, false); err == nil {
			t.Errorf("%s: no error", c.what)
		}
	}
}
