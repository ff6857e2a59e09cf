package kernels

import (
	"os"
	"os/exec"
	"path/filepath"
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
	clang, err := exec.LookPath("clang")
	if err != nil {
		t.Skip("clang is not installed")
	}
	prelude, err := os.ReadFile("testdata/nvrtc_prelude.h")
	if err != nil {
		t.Fatal(err)
	}
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
