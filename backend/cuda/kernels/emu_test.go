package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln/backend/cuda/cu"
	"kiln/tensor"
)

// TestDecodeMMAEmulated runs the tensor-core decode kernel's own source
// (decode_mma.cu, with kv_row and decode_merge from attention.cu) on the
// host, without a GPU: testdata/emu/prelude.h emulates the CUDA built-ins
// and the PTX it uses (ldmatrix, mma.sync m16n8k16, shfl.sync by their
// per-lane definitions in the PTX ISA, cp.async held back until the
// wait_group that must complete it, a block's threads taking turns on one
// OS thread), and
// testdata/emu/driver.cpp compares its outputs with a float64 reference
// for bf16 and f16 over GQA groups 1 to 32, head dims 16 to 128, windows,
// several tokens a sequence, one and many splits. It checks the kernel's
// indexing, fragment layouts, masks, ring order, split merge and PDL order
// of reads; what it cannot check (timing, the memory model, NVRTC's code
// generation) the GPU test does. Skipped without a C++ compiler (clang++
// or g++) or with -short.
//
// It runs four times: with caches of the activation dtype, built for any
// block size and for the emulation's 16 tokens a block (KILN_BS: NewFor's
// build, the engine's) and for blocks of 8 (EMU_BS: a stage's keys over
// more pages), and with FP8 caches (KV_F8: E4M3 codes, widened by each
// warp in shared memory), whose reference reads the codes' values, and
// kv_page's division (KV_ROW_DIV) in place of its shift.
func TestDecodeMMAEmulated(t *testing.T) {
	for _, build := range []struct {
		name, defines string
	}{
		{"act", ""}, {"act-bs16", "#define KILN_BS 16\n"}, {"act-bs8", "#define KILN_BS 8\n#define EMU_BS 8\n"},
		{"fp8", "#define KV_F8 1\n#define KV_ROW_DIV 1\n"},
	} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			runEmulated(t, emuSource(t, build.defines))
		})
	}
}

// TestPrefillMMAEmulated runs the tensor-core prefill's own source
// (prefill_fa of prefill_mma.cu, with kv_row from attention.cu) on the host
// as TestDecodeMMAEmulated runs the decode: every build prefill.go
// launches (four heads a block of 8 warps, two, one; on Hopper's wgmma,
// prefill_wg.cu, two heads a block of two warpgroups at 64 and 128 keys a
// stage, its descriptors read as the hardware does) for bf16 and f16,
// head dims 16 to 128, windows, chunked prefill over earlier context,
// several sequences and tiles, over caches of the activation dtype and of
// FP8 codes (the widening's portable path: the GPU test checks the
// device's; with kv_page's division, KV_ROW_DIV, in place of its shift),
// and the activation dtype's again as built for 16 tokens a block
// (KILN_BS, NewFor's build) and for 24 (EMU_BS: a block size no power of
// two, kv_row's division by a constant). Skipped as TestDecodeMMAEmulated.
func TestPrefillMMAEmulated(t *testing.T) {
	for _, build := range []struct {
		name, defines string
	}{
		{"act", "#define ACT_WGMMA 1\n"}, {"act-bs16", "#define ACT_WGMMA 1\n#define KILN_BS 16\n#define WG_TMA 1\n"},
		{"act-bs24", "#define ACT_WGMMA 1\n#define KILN_BS 24\n#define EMU_BS 24\n"}, {"fp8", "#define KV_F8 1\n#define KV_ROW_DIV 1\n"},
		{"act-bs16-vn0", "#define ACT_WGMMA 1\n#define KILN_BS 16\n#define WG_TMA 1\n#define WGP_VN 0\n"}, // an experiment (prefill_wg.cu)
	} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			runEmulated(t, prefillEmuSource(t, build.defines))
		})
	}
}

// TestGEMVTileEmulated runs the GEMV's tile kernels' own source
// (gemv_tile.cu, with gemv.cu's epilogues and shared.cu) on the host with
// the same emulation, thread-block clusters included (each block its own
// shared memory, the cluster barrier over all their threads), and
// testdata/emu/gemv_driver.cpp compares the plain product and the SwiGLU
// and RoPE epilogues with a float64 reference for bf16 and f16: row counts
// 3 to 64 on the three tile widths, K of 1 to 7 stages, partial tiles, K
// split over clusters of 1 to 5 blocks. It runs twice: as built for
// mma.sync, and as built for Hopper (GEMV_WGMMA), where the kernels of 64
// columns a stage multiply through wgmma, whose descriptors the emulator
// decodes as the PTX ISA defines them (start address, stride byte offset,
// 128-byte swizzle). Skipped as TestDecodeMMAEmulated.
func TestGEMVTileEmulated(t *testing.T) {
	for _, build := range []struct {
		name, defines string
	}{{"mma.sync", ""}, {"wgmma", "#define GEMV_WGMMA 1\n"}} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			runEmulated(t, gemvEmuSource(t, build.defines))
		})
	}
}

// TestMoEEmulated runs moe.cu's kernels (a mixture of experts: routing,
// the expert lists, the grouped gate/up and down products, the shared
// expert and the weighted sum) on the host with the same emulation, and
// testdata/emu/moe_driver.cpp compares them with a float64 reference:
// both routings, a shared expert with and without its gate, up to 256
// experts, lists longer than a warp's group of rows. The GPU test
// (TestMoE) checks the same on the device. Skipped as
// TestDecodeMMAEmulated.
func TestMoEEmulated(t *testing.T) {
	var s strings.Builder
	kernelsEmuHead(t, &s)
	s.WriteString(moe)
	s.WriteString(readEmu(t, "moe_driver.cpp"))
	runEmulated(t, s.String())
}

// TestFoldKernelsEmulated runs the kernels of a norm folded into the
// products around it (kernels.cu's swiglu_packed_n, rope_qkv_write_n with
// row_inv_rms, and fold_gain_impl; backend/cuda/normfold.go), the plain
// readers that share their code (swiglu_packed_v, rope_qkv_write,
// rope_qkv_write_r, and rope_qkv_write_v against rope_qkv_write_r; the
// RoPE readers also with an FP8 product's scales)
// and the
// dequantization of a table of experts' matrices (dequant_run with srcs,
// as Q8_0 and Q4_K) on the host with the same emulation, and
// testdata/emu/fold_driver.cpp compares them with a float64 reference (the
// dequantization with the same kernels run matrix by matrix, bit for bit).
// The GPU tests (TestRowRMSReaders, TestFoldGain, TestDequantizeExperts)
// check the same on the device. Skipped as TestDecodeMMAEmulated.
func TestFoldKernelsEmulated(t *testing.T) {
	var s strings.Builder
	kernelsEmuRows(t, &s)
	s.WriteString(readEmu(t, "fold_prelude.h"))
	// kernels.cu's definitions the kernels use, in its order.
	s.WriteString(cPieces(t, common,
		"__device__ __forceinline__ float scale_round(",
		"__device__ __forceinline__ float scaled_of(",
		"__device__ __forceinline__ void col_scales16(",
		"__device__ __forceinline__ void scale16(",
		"__device__ __forceinline__ void load_scaled16(",
		"__device__ float row_inv_rms(",
		"template <typename W>\n__device__ void fold_gain_impl(",
		"template <class L>\n__device__ __forceinline__ void swiglu_vec(",
		`extern "C" __global__ void swiglu_packed_v(`,
		`extern "C" __global__ void swiglu_packed_n(`,
		"__device__ __forceinline__ void rope_pair(",
		"template <class X, class V>\n__device__ __forceinline__ void rope_qkv_pair(",
		`extern "C" __global__ void rope_qkv_write(`,
		"#define ROPE_P",
		`extern "C" __global__ void rope_qkv_write_r(`,
		"__device__ __forceinline__ void store_kv16("))
	s.WriteString(cBetween(t, common, "struct rope_unit {", "};"))
	s.WriteString(cPieces(t, common, "__device__ __forceinline__ rope_unit rope_unit_of("))
	s.WriteString(cBetween(t, common, "struct rope_row {", "};"))
	s.WriteString(cPieces(t, common,
		"__device__ __forceinline__ rope_row rope_row_of(",
		"__device__ __forceinline__ void rope_unit_load(",
		"__device__ __forceinline__ void rope_unit_store(",
		"#define ROPE_UNITS"))
	s.WriteString(cBetween(t, common, "#ifndef ROPE_U\n", "#endif\n"))
	s.WriteString(cLines(t, common, "static_assert(ROPE_UNITS % ROPE_U"))
	s.WriteString(cPieces(t, common,
		`extern "C" __global__ void rope_qkv_write_v(`,
		`extern "C" __global__ void rope_qkv_write_n(`,
		"__device__ __forceinline__ float f16_at(",
		"__device__ __forceinline__ void dq_store(",
		"#define DQ_PARAMS",
		"#define DQ_ARGS",
		"template <int BYTES, int GPB, class F>\n__device__ __forceinline__ void dequant_run(",
		`extern "C" __global__ void dequant_q8_0(`,
		"__device__ __forceinline__ void k_scale_min(",
		"template <bool Q5>\n__device__ __forceinline__ void dequant_k45(",
		`extern "C" __global__ void dequant_q4_k(`))
	s.WriteString(readEmu(t, "fold_driver.cpp"))
	// rope_qkv_write_v as built (two units loaded at a time), all four at
	// a time, and one.
	for _, build := range []struct{ name, defines string }{{"rope-units-2", ""}, {"rope-units-4", "#define ROPE_U 4\n"}, {"rope-units-1", "#define ROPE_U 1\n"}} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			runEmulated(t, build.defines+s.String())
		})
	}
}

// TestFP8WritersEmulated runs the FP8-form writers that take several rows
// a block (kernels.cu's add_norm_rows_q and swiglu_packed_qr, the path
// AddRMSNormE4M3 and SwiGLUPackedE4M3 take from prefillRowsQ rows) and the
// one-row-a-block kernels they stand in for (norm_vec_impl's FP8 form,
// swiglu_packed_q) on the host with the same emulation (their dynamic
// shared memory mapped to the running block's, e4m3x2 by
// testdata/emu/fp8_prelude.h), and testdata/emu/fp8_driver.cpp compares
// their outputs byte for byte. The GPU test (TestE4M3Writers) checks the
// same on the device. Skipped as TestDecodeMMAEmulated.
func TestFP8WritersEmulated(t *testing.T) {
	var s strings.Builder
	kernelsEmuRows(t, &s)
	s.WriteString(readEmu(t, "fold_prelude.h"))
	s.WriteString(readEmu(t, "fp8_prelude.h"))
	s.WriteString(cPieces(t, common,
		"__device__ __forceinline__ float scale_round(",
		"__device__ __forceinline__ float e4m3_scale(",
		"__device__ __forceinline__ float e4m3_div(",
		"__device__ __forceinline__ void store_codes(",
		"__device__ __forceinline__ void store_e4m3(",
		"template <int R>\n__device__ __forceinline__ void block_rows(",
		"template <int R>\n__device__ __forceinline__ void store_held_e4m3(",
		"__device__ __forceinline__ void col_scales16(",
		"__device__ __forceinline__ void scale16(",
		"__device__ __forceinline__ void load_scaled16(",
		"#define NORM_MAXV",
		"template <typename W, bool PREW, bool Q = false>\n__device__ void norm_vec_impl(",
		"template <typename W> __device__ __forceinline__ void load_wvec(",
		"#define ROWS_N"))
	s.WriteString(cBetween(t, common, "#ifndef ROWS_NU\n", "#endif\n"))
	s.WriteString(cBetween(t, common, "#ifndef ROWS_NB\n", "#endif\n"))
	s.WriteString(cPieces(t, common,
		"template <typename W>\n__device__ void add_norm_rows_q(",
		`extern "C" __global__ void swiglu_packed_q(`,
		"#define ROWS_Q"))
	s.WriteString(cBetween(t, common, "#ifndef ROWS_QU\n", "#endif\n"))
	s.WriteString(cBetween(t, common, "#ifndef ROWS_QB\n", "#endif\n"))
	s.WriteString(cPieces(t, common,
		`extern "C" __global__ void __launch_bounds__(256, ROWS_QB) swiglu_packed_qr(`))
	const ext = "extern __shared__ uint4 held[];"
	src := s.String()
	if strings.Count(src, ext) != 2 {
		t.Fatalf("kernels.cu: not two %q", ext)
	}
	src = strings.ReplaceAll(src, ext, "uint4* const held = (uint4*)cur_smem();") + readEmu(t, "fp8_driver.cpp")
	// As built (a thread's vectors of a row loaded one at a time), and two
	// and three at a time.
	for _, build := range []struct{ name, defines string }{{"units-1", ""},
		{"units-2", "#define ROWS_NU 2\n#define ROWS_QU 2\n"}, {"units-3", "#define ROWS_NU 3\n#define ROWS_QU 3\n"}} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			runEmulated(t, build.defines+src)
		})
	}
}

// TestPeerKernelsEmulated runs allreduce.cu's kernels (the one-shot and
// two-shot Lamport forms, the flag form, the logits' exchange by rows) on
// the host: testdata/emu/peer_prelude.h stands in for the file's PTX
// helpers, every rank's call runs at once (prelude.h's threads, each
// rank's blocks in one cluster with the others'), and
// testdata/emu/peer_driver.cpp checks the sums, that every Lamport buffer
// is empty again after each call, and the scatter's staging, for groups of
// 2 to 8 ranks and a sequence of calls taking turns between the forms. It
// checks the kernels' indexing, chunks, epochs and parities; the memory
// model over NVLink is the GPU tests' (TestPeerAllReduce*,
// TestPeerScatterRows). Skipped as TestDecodeMMAEmulated.
func TestPeerKernelsEmulated(t *testing.T) {
	var s strings.Builder
	kernelsEmuRows(t, &s)
	s.WriteString(readEmu(t, "peer_prelude.h"))
	const start, end = "#if KILN_PART_IS(0)\n", "#endif // KILN_PART_IS(0)"
	body := cBetween(t, allReduce, start, end)
	body = strings.TrimSuffix(strings.TrimPrefix(body, start), end+"\n")
	body = strings.Replace(body, cBetween(t, body, "// ---- The PTX", "// ---- end of the PTX"), "", 1)
	const sh = "__shared__ unsigned sh;"
	if strings.Count(body, sh) != 1 {
		t.Fatalf("allreduce.cu: not one %q", sh)
	}
	body = strings.Replace(body, sh, "unsigned& sh = *(unsigned*)cur_smem();", 1)
	const pnSh = "__shared__ float pn_sh[32];"
	if strings.Count(body, pnSh) != 1 {
		t.Fatalf("allreduce.cu: not one %q", pnSh)
	}
	s.WriteString(strings.Replace(body, pnSh, "float* const pn_sh = (float*)(cur_smem() + 16);", 1))
	runEmulated(t, s.String()+readEmu(t, "peer_driver.cpp"))
}

// kernelsEmuHead writes what the emulated kernels of kernels.cu start
// from: the prelude, shared.cu, the 16-byte loads, warp_sum and
// GRID_STRIDE.
func kernelsEmuHead(t *testing.T, s *strings.Builder) {
	t.Helper()
	s.WriteString(readEmu(t, "prelude.h"))
	s.WriteString(shared)
	s.WriteString(cBetween(t, common, "__device__ __forceinline__ void unpack16(uint4 v, float* f, const float*) {", "#define VEC (16 / (int)sizeof(T))\n"))
	s.WriteString(cBlock(t, common, "__device__ __forceinline__ float warp_sum("))
	s.WriteString(cLines(t, common, "#define GRID_STRIDE"))
}

// kernelsEmuRows writes kernelsEmuHead and what the kernels of a row at a
// time add: warp_max, the 16-byte stores, round_t and the block
// reductions (one value, and several at once).
func kernelsEmuRows(t *testing.T, s *strings.Builder) {
	t.Helper()
	kernelsEmuHead(t, s)
	s.WriteString(cBlock(t, common, "__device__ __forceinline__ float warp_max("))
	s.WriteString(cBetween(t, common, "template <typename H> __device__ __forceinline__ unsigned pack_h2(",
		"__device__ __forceinline__ float round_t(float v) { return tof(fromf<T>(v)); }\n"))
	s.WriteString(cBetween(t, common, "template <bool MAX> __device__ __forceinline__ float warp_reduce(",
		"__device__ float block_max(float v, float* sh) { return block_reduce<true>(v, sh); }\n"))
	s.WriteString(cBlock(t, common, "template <bool MAX, int R> __device__ __forceinline__ void block_reduce_rows("))
}

// TestMoETileEmulated runs moe_tile.cu's kernels (a mixture of experts'
// gate/up and down products on gemv_tile.cu's tensor-core tiles, rows
// gathered from the expert lists) on the host with the same emulation, and
// testdata/emu/moe_tile_driver.cpp compares them with a float64 reference:
// experts with no entries, one and several tiles of entries, the shared
// expert's every row; as built for mma.sync and for Hopper's wgmma. The
// GPU test (TestMoE's tiled cases) checks the same on the device. Skipped
// as TestDecodeMMAEmulated.
func TestMoETileEmulated(t *testing.T) {
	for _, build := range []struct {
		name, defines string
	}{{"mma.sync", ""}, {"wgmma", "#define GEMV_WGMMA 1\n"}} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			var s strings.Builder
			s.WriteString(readEmu(t, "prelude.h"))
			s.WriteString("\n#define GEMV_MMA 1\n" + build.defines)
			s.WriteString(shared)
			s.WriteString(wgDescs(t))
			s.WriteString(gemvEpilogues(t))
			const ext = "extern __shared__ __align__(128) unsigned char gt_smem[];"
			s.WriteString(strings.Replace(gemvTile, ext, "unsigned char* const gt_smem = cur_smem();", 1))
			s.WriteString(moeTile)
			s.WriteString(readEmu(t, "moe_tile_driver.cpp"))
			runEmulated(t, s.String())
		})
	}
}

// TestGEMVKQEmulated runs the K-quant GEMV's own source (gemv_kq.cu's
// frame and formats, with gemv.cu's OutStore) on the host with the same
// emulation, and testdata/emu/kq_driver.cpp compares it with the float64
// reference this test writes for it: Q4_K and Q6_K weights from
// tensor.Quantize decoded by tensor.ToF32, x rounded to the activation
// dtype and then to int8 per 32 values as the kernel does (q8x), 1 to 8
// rows, rows of whole and partial units of super-blocks (Q6_K rows and
// units off the 16-byte grid), grids of fewer warps than rows, and the
// folded forms (x times a norm's gain before it is rounded; a residual
// added by AddStore). It checks the ring's order (each copy lands only at the
// cp.async.wait_group that must complete it), the shared-memory layout of
// x, the lanes' shares of a super-block and the stores; the GPU test
// (TestGEMVBlocks) checks the same on the device. Skipped as
// TestDecodeMMAEmulated.
func TestGEMVKQEmulated(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	rng := newRNG(t)
	type kqCase struct {
		dt         tensor.DType
		k, n, grid int
	}
	// Q6_K rows of 3 and 9 super-blocks start off the 16-byte grid.
	cases := []kqCase{{tensor.Q4_K, 2304, 37, 2}, {tensor.Q4_K, 768, 19, 1}, {tensor.Q6_K, 4096, 29, 2}, {tensor.Q6_K, 2048, 9, 1},
		{tensor.Q6_K, 768, 21, 2}, {tensor.Q6_K, 2304, 13, 1}}
	for _, act := range []cu.DType{cu.BF16, cu.F16} {
		var b bytes.Buffer
		put := func(v any) {
			if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
				t.Fatal(err)
			}
		}
		put(int32(len(cases)))
		for _, c := range cases {
			x := roundTo(act, randn(rng, GEMVVectorMaxT*c.k, 1/math.Sqrt(float64(c.k))))
			q, err := tensor.Quantize(c.dt, randn(rng, c.n*c.k, 1))
			must(t, err)
			wf := make([]float32, c.n*c.k)
			must(t, tensor.ToF32(c.dt, q, wf))
			format := int32(0)
			if c.dt == tensor.Q6_K {
				format = 1
			}
			put([]int32{format, int32(c.k), int32(c.n), int32(c.grid), int32(len(q))})
			put(q)
			put(x)
			ref := weightOnlyRef(q8x(x), f64(wf), c.k, c.n)
			put(ref)
			// The folded forms: x times a norm's gain before it is rounded
			// (in float, as kq_quantize multiplies), and a residual added.
			gain := roundTo(act, randn(rng, c.k, 0.5))
			xg := make([]float32, len(x))
			for i := range x {
				xg[i] = x[i] * gain[i%c.k]
			}
			add := roundTo(act, randn(rng, GEMVVectorMaxT*c.n, 1))
			put(gain)
			put(weightOnlyRef(q8x(xg), f64(wf), c.k, c.n))
			put(add)
		}
		must(t, os.WriteFile(filepath.Join(dir, "kq_"+cname(act)+".bin"), b.Bytes(), 0o644))
	}
	var s strings.Builder
	s.WriteString(readEmu(t, "prelude.h"))
	fmt.Fprintf(&s, "\n#define KQ_DATA %q\n", dir)
	s.WriteString(cBlock(t, gemvFile, "struct OutStore {") + ";\n")
	s.WriteString(cBlock(t, gemvFile, "struct AddStore {") + ";\n")
	s.WriteString(readEmu(t, "kq.h"))
	s.WriteString(cBetween(t, gemvKQ, "#define KQ_WARPS", "// ---- PTX helpers"))
	const ext = "extern __shared__ __align__(16) unsigned char kq_smem[];"
	frame := cBetween(t, gemvKQ, "// ---- KQ_BEGIN", "// ---- KQ_END")
	if strings.Count(frame, ext) != 1 {
		t.Fatalf("gemv_kq.cu: no single %q", ext)
	}
	s.WriteString(strings.Replace(frame, ext, "unsigned char* const kq_smem = cur_smem();", 1))
	s.WriteString(readEmu(t, "kq_driver.cpp"))
	runEmulated(t, s.String())
}

// runEmulated compiles the emulated program src for bf16 and f16 with a
// host C++ compiler and runs it; it fails when the program does. Skipped
// without a C++ compiler (clang++ or g++) or with -short.
func runEmulated(t *testing.T, src string) {
	if testing.Short() {
		t.Skip("-short")
	}
	cxx := ""
	for _, c := range []string{"clang++", "g++"} {
		if p, err := exec.LookPath(c); err == nil {
			cxx = p
			break
		}
	}
	if cxx == "" {
		t.Skip("no C++ compiler (clang++ or g++)")
	}
	dir := t.TempDir()
	for _, act := range []string{"bf16", "f16"} {
		t.Run(act, func(t *testing.T) {
			t.Parallel()
			f := filepath.Join(dir, "emu_"+act+".cpp")
			bin := filepath.Join(dir, "emu_"+act)
			if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(cxx, "-std=c++17", "-O1", "-w", "-DACT="+act, f, "-o", bin).CombinedOutput(); err != nil {
				t.Fatalf("compile: %v\n%s", err, out)
			}
			out, err := exec.Command(bin).CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("%s: %v", act, err)
			}
		})
	}
}

// gemvEpilogues is gemv.cu's epilogues the tile kernels take.
func gemvEpilogues(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, st := range []string{"struct OutStore {", "struct AddStore {", "struct SwiGLUOut {", "struct RoPEOut {"} {
		b.WriteString(cBlock(t, gemvFile, st) + ";\n")
	}
	return b.String()
}

// gemvEmuSource assembles the emulated tile kernels: the prelude, the
// defines, shared.cu, gemv.cu's epilogues, gemv_tile.cu with its dynamic
// shared memory mapped to the running block's, and the driver.
func gemvEmuSource(t *testing.T, defines string) string {
	t.Helper()
	var s strings.Builder
	s.WriteString(readEmu(t, "prelude.h"))
	s.WriteString("\n#define GEMV_MMA 1\n#define GEMV_TILE_SWEEP 1\n" + defines)
	s.WriteString(shared)
	s.WriteString(wgDescs(t))
	s.WriteString(gemvEpilogues(t))
	const ext = "extern __shared__ __align__(128) unsigned char gt_smem[];"
	if strings.Count(gemvTile, ext) != 1 {
		t.Fatalf("gemv_tile.cu: no single %q", ext)
	}
	s.WriteString(strings.Replace(gemvTile, ext, "unsigned char* const gt_smem = cur_smem();", 1))
	s.WriteString(readEmu(t, "gemv_driver.cpp"))
	return s.String()
}

// wgDescs is wgmma.cu's descriptors (wg_desc, wg_desc_mn), which the
// emulator reads as the hardware does (the prelude's wg_elem, wg_elem_mn).
func wgDescs(t *testing.T) string {
	t.Helper()
	return cPieces(t, wgmmaHelpers, "__device__ __forceinline__ unsigned long long wg_desc(",
		"__device__ __forceinline__ unsigned long long wg_desc_mn(")
}

// emuSource assembles the emulated decode: the prelude, the pieces of
// attention.cu the kernel uses, decode_mma.cu with its dynamic shared
// memory mapped to the prelude's array, and the driver.
func emuSource(t *testing.T, defines string) string {
	t.Helper()
	var b strings.Builder
	emuPreamble(t, &b, defines)
	b.WriteString(cBetween(t, prefillMMA, "__device__ __forceinline__ float e4m3_float(", "#define KV_CE (16 / (int)sizeof(KV))\n"))
	b.WriteString(cLines(t, attention, "#define DC_THREADS"))
	b.WriteString(cBlock(t, attention, "template <int HD>\n__device__ __forceinline__ void decode_merge("))
	b.WriteString(cLines(t, attention, "#define DC_PARAMS"))
	b.WriteString(cLines(t, attention, "#define DC_ARGS"))
	const ext = "extern __shared__ __align__(16) unsigned short dm_smem[];"
	if strings.Count(decodeMMA, ext) != 1 {
		t.Fatalf("decode_mma.cu: no single %q", ext)
	}
	b.WriteString(strings.Replace(decodeMMA, ext, "static unsigned short* const dm_smem = (unsigned short*)g_smem;", 1))
	b.WriteString(readEmu(t, "attn.h"))
	b.WriteString(readEmu(t, "driver.cpp"))
	return b.String()
}

// prefillEmuSource assembles the emulated prefill: the prelude, the pieces
// of attention.cu it uses, prefill_mma.cu with its dynamic shared memory
// mapped to the prelude's array, and the driver.
func prefillEmuSource(t *testing.T, defines string) string {
	t.Helper()
	var b strings.Builder
	emuPreamble(t, &b, defines)
	b.WriteString(cLines(t, attention, "#define PF_BQ"))
	const ext = "extern __shared__ __align__(16) unsigned short pf_smem[];"
	if strings.Count(prefillMMA, ext) != 1 {
		t.Fatalf("prefill_mma.cu: no single %q", ext)
	}
	b.WriteString(strings.Replace(prefillMMA, ext, "static unsigned short* const pf_smem = (unsigned short*)g_smem;", 1))
	b.WriteString(wgDescs(t))
	b.WriteString(prefillWG)
	b.WriteString(readEmu(t, "attn.h"))
	b.WriteString(readEmu(t, "prefill_driver.cpp"))
	return b.String()
}

// emuPreamble writes what both emulated attention kernels start from: the
// prelude, the defines, the cache's element type (kernels.cu's KV, with
// e4m3x2), kv_bs, kv_page, kv_slot, kv_row, softcap_l2 and SoftcapRaw.
func emuPreamble(t *testing.T, b *strings.Builder, defines string) {
	t.Helper()
	b.WriteString(readEmu(t, "prelude.h"))
	b.WriteString("\n#define ACT_MMA 1\n#define KILN_PART_IS(p) 1\n" + defines) // shared.cu's, for the whole source
	b.WriteString(cBlock(t, common, "__device__ __forceinline__ unsigned short e4m3x2("))
	b.WriteString(cBetween(t, common, "#ifdef KV_F8\nstruct e4m3", "#endif\n"))
	b.WriteString(cBlock(t, attention, "__device__ __forceinline__ int kv_bs("))
	b.WriteString(cBlock(t, attention, "__device__ __forceinline__ int kv_page("))
	b.WriteString(cBlock(t, attention, "__device__ __forceinline__ int kv_slot("))
	b.WriteString(cBlock(t, attention, "__device__ __forceinline__ long long kv_row("))
	b.WriteString(cBlock(t, attention, "__device__ __forceinline__ float softcap_l2("))
	b.WriteString(cBlock(t, attention, "struct SoftcapRaw {") + ";\n")
}

func readEmu(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/emu", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cBlock is the definition starting at marker in src, through the brace
// that closes its first one, and a newline.
func cBlock(t *testing.T, src, marker string) string {
	t.Helper()
	i := strings.Index(src, marker)
	if i < 0 {
		t.Fatalf("no %q in the source", marker)
	}
	depth := 0
	for j := i + strings.Index(src[i:], "{"); j < len(src); j++ {
		switch src[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[i:j+1] + "\n"
			}
		}
	}
	t.Fatalf("%q: no closing brace", marker)
	return ""
}

// cPieces is the pieces of src that markers start, in order: a #define's
// lines (cLines), else a definition's block (cBlock).
func cPieces(t *testing.T, src string, markers ...string) string {
	t.Helper()
	var b strings.Builder
	for _, m := range markers {
		if strings.HasPrefix(m, "#define") {
			b.WriteString(cLines(t, src, m))
		} else {
			b.WriteString(cBlock(t, src, m))
		}
	}
	return b.String()
}

// cBetween is src from marker start through the first end after it.
func cBetween(t *testing.T, src, start, end string) string {
	t.Helper()
	i := strings.Index(src, start)
	if i < 0 {
		t.Fatalf("no %q in the source", start)
	}
	j := strings.Index(src[i:], end)
	if j < 0 {
		t.Fatalf("no %q after %q", end, start)
	}
	return src[i:i+j+len(end)] + "\n"
}

// cLines is the line starting with marker in src and the lines it
// continues with a backslash.
func cLines(t *testing.T, src, marker string) string {
	t.Helper()
	i := strings.Index(src, marker)
	if i < 0 {
		t.Fatalf("no %q in the source", marker)
	}
	j := i
	for {
		k := strings.IndexByte(src[j:], '\n')
		if k < 0 {
			return src[i:] + "\n"
		}
		line := strings.TrimRight(src[j:j+k], " \t")
		j += k + 1
		if !strings.HasSuffix(line, "\\") {
			return src[i:j]
		}
	}
}

// TestRowsConstantsMatch: the rows a block and units a thread that the
// launches assume (kernels.go) are those kernels.cu's kernels take, so
// that a change on one side alone fails here rather than leaving rows
// unwritten on the GPU.
func TestRowsConstantsMatch(t *testing.T) {
	for _, c := range []struct {
		define string
		goSide int
	}{{"ROWS_N", normRowsQ}, {"ROWS_Q", swigluRowsQ}, {"ROPE_UNITS", ropeUnits}} {
		line := strings.TrimSpace(cLines(t, common, "#define "+c.define+" "))
		var v int
		if _, err := fmt.Sscanf(line, "#define "+c.define+" %d", &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if v != c.goSide {
			t.Errorf("kernels.cu's %s is %d, kernels.go's %d", c.define, v, c.goSide)
		}
	}
}
