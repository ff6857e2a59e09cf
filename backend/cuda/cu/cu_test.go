package cu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAvailable runs everywhere: with no GPU the reason is one line.
func TestAvailable(t *testing.T) {
	err := Available()
	if err == nil {
		n, _ := DeviceCount()
		t.Logf("cuda available: %d device(s), driver %s (version %d)", n, Loaded().Driver, Loaded().DriverVersion)
		return
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "cuda unavailable: ") {
		t.Fatalf("reason is not one line starting 'cuda unavailable: ': %q", msg)
	}
	if _, err := Open(0); err == nil {
		t.Fatal("Open succeeded while unavailable")
	}
	if _, err := DeviceCount(); err == nil {
		t.Fatal("DeviceCount succeeded while unavailable")
	}
	t.Logf("reason: %s", msg)
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCandidates(t *testing.T) {
	root := t.TempDir()
	cudaHome := filepath.Join(root, "cuda")
	touch(t, filepath.Join(cudaHome, "lib64", "libnvrtc.so.12.8.93"))
	touch(t, filepath.Join(cudaHome, "lib64", "libnvrtc.so.13.0.48"))
	touch(t, filepath.Join(cudaHome, "lib64", "libnvrtc-builtins.so.13.0.48"))
	touch(t, filepath.Join(cudaHome, "targets", "x86_64-linux", "lib", "libcublasLt.so.13.1.0.3"))
	venv := filepath.Join(root, "venv")
	sp := filepath.Join(venv, "lib", "python3.12", "site-packages")
	touch(t, filepath.Join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"))
	touch(t, filepath.Join(sp, "nvidia", "cublas", "lib", "libcublasLt.so.12"))
	pp := filepath.Join(root, "pp")
	touch(t, filepath.Join(pp, "nvidia", "cu13", "lib", "libnvrtc.so.13"))
	t.Setenv("CUDA_HOME", cudaHome)
	t.Setenv("CUDA_PATH", "")
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("PYTHONPATH", pp)

	c := candidates(libNVRTC)
	if c[0] != "libnvrtc.so.13" {
		t.Errorf("first candidate %q, want the bare soname", c[0])
	}
	idx := func(p string) int {
		for i, x := range c {
			if x == p {
				return i
			}
		}
		t.Errorf("%s not among the candidates %v", p, c)
		return -1
	}
	i13 := idx(filepath.Join(cudaHome, "lib64", "libnvrtc.so.13.0.48"))
	i12 := idx(filepath.Join(cudaHome, "lib64", "libnvrtc.so.12.8.93"))
	iv := idx(filepath.Join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"))
	ip := idx(filepath.Join(pp, "nvidia", "cu13", "lib", "libnvrtc.so.13"))
	if !(i13 < i12 && i12 < iv && iv < ip) {
		t.Errorf("order: cuda13 %d, cuda12 %d, venv %d, pythonpath %d in %v", i13, i12, iv, ip, c)
	}
	for _, x := range c {
		if strings.Contains(x, "builtins") {
			t.Errorf("builtins library among the candidates: %s", x)
		}
	}
	lt := candidates(libLt)
	idxLt := func(p string) bool {
		for _, x := range lt {
			if x == p {
				return true
			}
		}
		return false
	}
	if !idxLt(filepath.Join(cudaHome, "targets", "x86_64-linux", "lib", "libcublasLt.so.13.1.0.3")) ||
		!idxLt(filepath.Join(sp, "nvidia", "cublas", "lib", "libcublasLt.so.12")) {
		t.Errorf("cublasLt candidates %v", lt)
	}
	if d := candidates(libCUDA); d[0] != "libcuda.so.1" {
		t.Errorf("driver candidates %v", d)
	}
}

func TestVersionLess(t *testing.T) {
	if !versionLess("libx.so.12.8.93", "libx.so.13.0.1") || versionLess("libx.so.13", "libx.so.12.9") ||
		!versionLess("libx.so.13", "libx.so.13.0") || !versionLess("libx.so.9.1", "libx.so.10") {
		t.Fatal("versionLess")
	}
}

func TestErrorText(t *testing.T) {
	e := &Error{Lib: "cuda", Call: `cuModuleGetFunction("nosuch")`, Code: 500, Name: "CUDA_ERROR_NOT_FOUND", Msg: "named symbol not found"}
	if got := e.Error(); got != `cuda: cuModuleGetFunction("nosuch"): CUDA_ERROR_NOT_FOUND (named symbol not found)` {
		t.Fatal(got)
	}
}

// TestReceive checks the polling receive of the worker hand-offs: a value
// sent before, during or after the polling arrives, in order, and a closed
// channel ends it.
func TestReceive(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 1
	if v, ok := receive(ch, time.Millisecond); v != 1 || !ok {
		t.Fatalf("ready value: %d %v", v, ok)
	}
	go func() {
		time.Sleep(200 * time.Microsecond) // during the polling
		ch <- 2
		time.Sleep(20 * time.Millisecond) // after it: a blocking receive
		ch <- 3
		close(ch)
	}()
	for want := 2; want <= 3; want++ {
		if v, ok := receive(ch, 5*time.Millisecond); v != want || !ok {
			t.Fatalf("got %d %v, want %d", v, ok, want)
		}
	}
	if _, ok := receive(ch, time.Millisecond); ok {
		t.Fatal("closed channel: ok")
	}
}

// TestContextLost: the driver's sticky errors (a kernel's fault) are told
// from the others, wrapped or not; another library's codes are not the
// driver's.
func TestContextLost(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{&Error{Lib: "cuda", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"}, true},
		{fmt.Errorf("step: %w", &Error{Lib: "cuda", Code: 719}), true},
		{&Error{Lib: "cuda", Code: 716}, true},
		{&Error{Lib: "cuda", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}, false},
		{&Error{Lib: "cuda", Code: 1}, false},
		{&Error{Lib: "cublasLt", Code: 700}, false},
		{errors.New("cuda: 700"), false},
		{nil, false},
	} {
		if got := ContextLost(c.err); got != c.lost {
			t.Errorf("ContextLost(%v) = %v", c.err, got)
		}
	}
}
