package tensor

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// ggmlTypes are the GGML block types ToF32 decodes: their ggml type ids,
// the suffix of their dequantize_row_ function, and the byte offsets of
// their f16 fields in a block.
var ggmlTypes = []struct {
	d     DType
	id    int
	name  string
	f16At []int
}{
	{Q4_0, 2, "q4_0", []int{0}},
	{Q4_1, 3, "q4_1", []int{0, 2}},
	{Q5_0, 6, "q5_0", []int{0}},
	{Q5_1, 7, "q5_1", []int{0, 2}},
	{Q8_0, 8, "q8_0", []int{0}},
	{Q2_K, 10, "q2_K", []int{80, 82}},
	{Q3_K, 11, "q3_K", []int{108}},
	{Q4_K, 12, "q4_K", []int{0, 2}},
	{Q5_K, 13, "q5_K", []int{0, 2}},
	{Q6_K, 14, "q6_K", []int{208}},
	{IQ4_NL, 20, "iq4_nl", []int{0}},
}

// ggmlRef is what testdata/ggmlref.c wrote for one type: blocks (the
// first half ggml's quantization of src, the rest random bytes), ggml's
// decoding of them, and src.
type ggmlRef struct {
	blocks []byte
	values []float32
	src    []float32
}

// ggmlRefs runs testdata/ggmlref.c (compiled with cc) against llama.cpp's
// libggml-base.so (KILN_GGML_LIB; .ci/run fetches it from node-llama-cpp's
// prebuilt package) for every type of ggmlTypes, on fresh random values.
// Skipped without the library, except under CI=true.
func ggmlRefs(t *testing.T, blocks int) map[DType]ggmlRef {
	lib := os.Getenv("KILN_GGML_LIB")
	if lib == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KILN_GGML_LIB is not set (.ci/run fetches llama.cpp's libggml-base.so)")
		}
		t.Skip("KILN_GGML_LIB (llama.cpp's libggml-base.so) is not set")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	ref := filepath.Join(dir, "ggmlref")
	if out, err := exec.Command(cc, "-O1", "-o", ref, "testdata/ggmlref.c", "-ldl", "-lm").CombinedOutput(); err != nil {
		t.Fatalf("compile ggmlref.c: %v\n%s", err, out)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	refs := map[DType]ggmlRef{}
	for i, g := range ggmlTypes {
		out := filepath.Join(dir, g.name+".bin")
		args := []string{lib, strconv.Itoa(g.id), g.name, strconv.FormatUint(seed+uint64(i), 10), strconv.Itoa(blocks), out}
		for _, o := range g.f16At {
			args = append(args, strconv.Itoa(o))
		}
		if msg, err := exec.Command(ref, args...).CombinedOutput(); err != nil {
			t.Fatalf("ggmlref %v: %v\n%s", args, err, msg)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		bs, size := g.d.BlockSize(), blocks*g.d.BlockBytes()
		if want := size + 4*blocks*bs + 4*(blocks/2)*bs; len(data) != want {
			t.Fatalf("%v: ggmlref wrote %d bytes, want %d", g.d, len(data), want)
		}
		floats := func(b []byte) []float32 {
			f := make([]float32, len(b)/4)
			for j := range f {
				f[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
			}
			return f
		}
		refs[g.d] = ggmlRef{blocks: data[:size], values: floats(data[size : size+4*blocks*bs]), src: floats(data[size+4*blocks*bs:])}
	}
	return refs
}

// TestGGMLDequantize decodes fresh blocks of every GGML type ToF32 reads and
// compares them, bit for bit, with llama.cpp's own dequantize_row_*: half
// the blocks are ggml's quantization of random values, half random bytes
// with random finite scales.
func TestGGMLDequantize(t *testing.T) {
	for d, r := range ggmlRefs(t, 64) {
		got := make([]float32, len(r.values))
		if err := ToF32(d, r.blocks, got); err != nil {
			t.Fatal(err)
		}
		bad := 0
		for j, want := range r.values {
			if got[j] != want && !(math.IsNaN(float64(got[j])) && math.IsNaN(float64(want))) {
				if bad++; bad <= 5 {
					t.Errorf("%v: element %d (block %d): %g, ggml %g", d, j, j/d.BlockSize(), got[j], want)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%v: %d of %d elements differ from ggml", d, bad, len(got))
		}
	}
}

// TestGGMLQuantize quantizes fresh random values with every quantizer
// Quantize has and compares the blocks, byte for byte, with ggml's
// (ggml_quantize_chunk without an importance matrix, as llama-quantize).
func TestGGMLQuantize(t *testing.T) {
	for _, d := range []DType{Q8_0, Q4_0, Q4_K, Q5_K, Q6_K} {
		t.Run(d.String(), func(t *testing.T) {
			r := ggmlRefs(t, 64)[d]
			got, err := Quantize(d, r.src)
			if err != nil {
				t.Fatal(err)
			}
			want := r.blocks[:len(got)]
			if len(got) != len(r.src)/d.BlockSize()*d.BlockBytes() {
				t.Fatalf("%d bytes for %d values", len(got), len(r.src))
			}
			bb := d.BlockBytes()
			for b := 0; b < len(got)/bb; b++ {
				if !bytes.Equal(got[b*bb:(b+1)*bb], want[b*bb:(b+1)*bb]) {
					t.Fatalf("block %d differs from ggml's:\n got  %x\n want %x", b, got[b*bb:(b+1)*bb], want[b*bb:(b+1)*bb])
				}
			}
		})
	}
}

// TestGGMLBlockSizes checks each type's block against ggml's
// (ggml_blck_size, ggml_type_size) and that a partial block is refused.
func TestGGMLBlockSizes(t *testing.T) {
	want := map[DType][2]int{Q4_0: {32, 18}, Q4_1: {32, 20}, Q5_0: {32, 22}, Q5_1: {32, 24}, Q8_0: {32, 34},
		Q2_K: {256, 84}, Q3_K: {256, 110}, Q4_K: {256, 144}, Q5_K: {256, 176}, Q6_K: {256, 210}, IQ4_NL: {32, 18}}
	for _, g := range ggmlTypes {
		w := want[g.d]
		if g.d.BlockSize() != w[0] || g.d.BlockBytes() != w[1] || !g.d.Quantized() {
			t.Errorf("%v: blocks of %d in %d bytes (quantized %v), want %d in %d", g.d, g.d.BlockSize(), g.d.BlockBytes(), g.d.Quantized(), w[0], w[1])
		}
		if _, err := g.d.Bytes(int64(w[0] + 1)); err == nil {
			t.Errorf("%v: %d elements accepted", g.d, w[0]+1)
		}
		short := make([]byte, w[1]-1)
		if err := ToF32(g.d, short, make([]float32, w[0])); err == nil {
			t.Errorf("%v: a block of %d bytes decoded", g.d, len(short))
		}
	}
	if F32.Quantized() || BF16.Quantized() {
		t.Error("plain types reported quantized")
	}
}
