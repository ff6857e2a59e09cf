package kernels

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSourcesCompile checks every CUDA C source with clang's CUDA front end
// (device side: syntax, types, every template the kernels instantiate), for
// each activation dtype, on an Ampere target (cp.async) and a Turing one
// (the fallbacks), so that a compile error shows here, without a GPU,
// rather than when NVRTC meets it on a GPU machine. clang knows neither the
// NVRTC built-ins nor Hopper's instructions (they are PTX strings, checked
// by the GPU tests); testdata/nvrtc_prelude.h declares the built-ins.
// Skipped when clang is not installed (.ci/run installs it).
func TestSourcesCompile(t *testing.T) {
	clang, prelude := clangAndPrelude(t)
	dir := t.TempDir()
	for _, act := range []string{"bf16", "f16", "f32"} {
		for _, arch := range []string{"sm_86", "sm_75"} {
			for _, m := range []struct {
				name, src string
				defs      []string
			}{
				{"kernels", Source(), []string{"-DACT_MMA=1"}},
				// The module of an FP8 KV cache (NewFP8KV).
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DKV_F8=1"}},
				// The modules of one head dim (NewHeadDim): the CUDA-core
				// kernels alone at 8, every kind at 128.
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DKILN_HD=8"}},
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DKILN_HD=128", "-DKV_F8=1"}},
				// The modules of one KV-cache block size (NewFor): a power
				// of two (kv_row's shift and mask) and another.
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DKILN_HD=128", "-DKILN_BS=16"}},
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DKILN_BS=24", "-DKV_F8=1"}},
				// The Hopper build with the wgmma prefill's TMA kernels
				// (WG_TMA; clang 14 knows no sm_90a: the PTX strings are
				// the GPU tests' to check).
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DACT_WGMMA=1", "-DKILN_HD=128", "-DKILN_BS=16", "-DWG_TMA=1"}},
				// RoPE's vector kernel loading all four of its units at a
				// time (kernels.cu's ROPE_U; two by default).
				{"kernels", Source(), []string{"-DACT_MMA=1", "-DROPE_U=4"}},
				{"gemv", gemvSource, []string{"-DGEMV_MMA=1"}},
				// The Hopper build (clang 14 knows no sm_90a; the
				// wgmma PTX strings are the GPU tests' to check).
				{"gemv", gemvSource, []string{"-DGEMV_MMA=1", "-DGEMV_WGMMA=1"}},
				{"sample", sampleSource, nil},
			} {
				f := filepath.Join(dir, m.name+".cu")
				if err := os.WriteFile(f, append(append(prelude, '\n'), m.src...), 0o644); err != nil {
					t.Fatal(err)
				}
				args := []string{"-x", "cuda", "--cuda-gpu-arch=" + arch, "--cuda-device-only", "-nocudainc", "-nocudalib",
					"-std=c++17", "-fsyntax-only", "-Wno-unknown-cuda-version", "-DACT=" + act, "-DGEMV_SWEEP=1"}
				if act != "f32" {
					args = append(args, m.defs...)
				}
				if out, err := exec.Command(clang, append(args, f)...).CombinedOutput(); err != nil {
					t.Errorf("%s.cu %v, ACT=%s, %s: %v\n%s", m.name, m.defs, act, arch, err, out)
				}
			}
		}
	}
}

// TestKernelParts: the kernels and GEMV modules' parts (KILN_PART,
// compiled at once by compileParts) hold every kernel of the whole source
// once: each kernel of the preprocessed source is in exactly one part,
// the parts define no other, and the parts build leaves out hold none.
func TestKernelParts(t *testing.T) {
	clang, prelude := clangAndPrelude(t)
	// A kernel after the preprocessor (the prelude's __global__ and
	// __launch_bounds__ are attributes).
	kernel := regexp.MustCompile(`extern "C" __attribute__\(\(global\)\) void (?:__attribute__\(\(launch_bounds\([^)]*\)\)\) )?(\w+)\(`)
	names := func(src string, defs ...string) []string {
		f := filepath.Join(t.TempDir(), "m.cu")
		if err := os.WriteFile(f, append(append(prelude, '\n'), src...), 0o644); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"-x", "cuda", "--cuda-gpu-arch=sm_86", "--cuda-device-only", "-nocudainc", "-nocudalib",
			"-std=c++17", "-E", "-Wno-unknown-cuda-version"}, defs...)
		out, err := exec.Command(clang, append(args, f)...).Output()
		if err != nil {
			t.Fatalf("clang -E %v: %v", defs, err)
		}
		var ns []string
		for _, m := range kernel.FindAllStringSubmatch(string(out), -1) {
			ns = append(ns, m[1])
		}
		slices.Sort(ns)
		return ns
	}
	for _, tc := range []struct {
		src   string
		defs  []string
		parts []int // the parts build compiles (of 0 to 7)
	}{
		{Source(), []string{"-DACT=bf16", "-DACT_MMA=1", "-DKILN_HD=128"}, []int{0, 1, 2, 3, 4, 5}},
		{Source(), []string{"-DACT=bf16", "-DACT_MMA=1", "-DKILN_HD=128", "-DKV_F8=1"}, []int{0, 1, 3}},
		{Source(), []string{"-DACT=f32", "-DKILN_HD=8"}, []int{0, 2, 4, 5}},
		{Source(), []string{"-DACT=f16", "-DACT_MMA=1"}, []int{0, 1, 2, 3, 4, 5}},
		{gemvSource, []string{"-DACT=bf16", "-DGEMV_MMA=1", "-DGEMV_SWEEP=1"}, []int{0, 1, 2}},
		{gemvSource, []string{"-DACT=f32"}, []int{0, 1}},
	} {
		whole := names(tc.src, tc.defs...)
		for _, d := range tc.defs {
			// One head dim's build names its attention kernels by it.
			if hd, ok := strings.CutPrefix(d, "-DKILN_HD="); ok && !slices.Contains(tc.defs, "-DKV_F8=1") {
				for _, k := range []string{"prefill_attn_", "decode_attn_", "decode_attn_cl_"} {
					if !slices.Contains(whole, k+hd) {
						t.Errorf("%v: no kernel %s%s in %v", tc.defs, k, hd, whole)
					}
				}
			}
		}
		var parts []string
		for p := range 8 {
			ns := names(tc.src, append(slices.Clone(tc.defs), fmt.Sprintf("-DKILN_PART=%d", p))...)
			if built := slices.Contains(tc.parts, p); (len(ns) > 0) != built {
				t.Errorf("%v: part %d holds %d kernels (built: %v)", tc.defs, p, len(ns), built)
			}
			parts = append(parts, ns...)
		}
		slices.Sort(parts)
		if len(whole) < 10 || !slices.Equal(parts, whole) {
			t.Errorf("%v: the parts hold %d kernels, the whole source %d (each once in the parts: %v)", tc.defs, len(parts), len(whole), slices.Equal(slices.Compact(slices.Clone(parts)), parts))
		}
	}
}

// noLocalDepot are kernels checked here only: the one-shot all-reduce with
// the residual added, whose kept partials were indexed by a loop count
// (128 bytes, session 42; NVRTC gave it 96 bytes in session 43).
// TestKernelResources logs its NVRTC figures.
var noLocalDepot = []string{"peer_lamport_add_f32", "peer_lamport_add_f16", "peer_lamport_add_bf16"}

// TestWritersNoLocalDepot compiles the kernels module to PTX with clang
// (-O3, sm_86, bf16 and f16) and fails where a kernel of noLocalMemory
// (resources_test.go) or of noLocalDepot has a local depot: an array
// indexed by a value the compiler cannot resolve, or a conditional
// between two arrays' elements, which NVRTC too puts in local memory
// (rope_qkv_write_v's 320 bytes a
// thread in session 40, found by Nsight Compute on the GPU; the GPU's
// TestKernelResources reads NVRTC's own figures, spills included). clang's
// other depots (the attention kernels', in loops it leaves rolled) are
// not NVRTC's and are not checked. Skipped without clang.
func TestWritersNoLocalDepot(t *testing.T) {
	checked := append(slices.Clone(noLocalMemory), noLocalDepot...)
	clang, prelude := clangAndPrelude(t)
	f := filepath.Join(t.TempDir(), "kernels.cu")
	if err := os.WriteFile(f, append(append(prelude, '\n'), Source()...), 0o644); err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`\.entry (\w+)\(`)
	for _, act := range []string{"bf16", "f16"} {
		ptx := filepath.Join(t.TempDir(), act+".ptx")
		args := []string{"-x", "cuda", "--cuda-gpu-arch=sm_86", "--cuda-device-only", "-nocudainc", "-nocudalib", "-std=c++17",
			"-O3", "-S", "-w", "-DACT=" + act, "-DACT_MMA=1", "-DKILN_HD=128", f, "-o", ptx}
		if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
			t.Fatalf("clang -S ACT=%s: %v\n%s", act, err, out)
		}
		b, err := os.ReadFile(ptx)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		found := map[string]bool{}
		locs := entry.FindAllStringSubmatchIndex(src, -1)
		for i, m := range locs {
			name := src[m[2]:m[3]]
			if !slices.Contains(checked, name) {
				continue
			}
			end := len(src)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			found[name] = true
			if strings.Contains(src[m[1]:end], "__local_depot") {
				t.Errorf("ACT=%s: %s has a local depot in clang's PTX (an array indexed at run time?)", act, name)
			}
		}
		for _, name := range checked {
			if !found[name] {
				t.Errorf("ACT=%s: no entry %s in the PTX", act, name)
			}
		}
	}
}

// clangAndPrelude is clang's path and testdata/nvrtc_prelude.h; the test
// is skipped when clang is not installed (.ci/run installs it).
func clangAndPrelude(t *testing.T) (string, []byte) {
	t.Helper()
	clang, err := exec.LookPath("clang")
	if err != nil {
		t.Skip("clang is not installed")
	}
	prelude, err := os.ReadFile("testdata/nvrtc_prelude.h")
	if err != nil {
		t.Fatal(err)
	}
	return clang, prelude
}
