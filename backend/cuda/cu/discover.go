package cu

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Library describes one shared library that the package loads at run time.
type Library struct {
	Name     string   // e.g. "nvrtc"
	Sonames  []string // tried through the loader's own search path first
	Glob     string   // file pattern tried in each directory, newest version first
	WheelDir string   // the pip wheel's directory under site-packages/nvidia
}

var (
	libCUDA  = Library{Name: "cuda driver", Sonames: []string{"libcuda.so.1", "libcuda.so"}, Glob: "libcuda.so.*"}
	libNVRTC = Library{Name: "nvrtc",
		Sonames: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
		Glob:    "libnvrtc.so.*", WheelDir: "cuda_nvrtc"}
	libLt = Library{Name: "cublasLt",
		Sonames: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		Glob:    "libcublasLt.so.*", WheelDir: "cublas"}
)

// searchDirs lists the directories searched after the loader's own path, in
// order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (lib64 and
// targets/x86_64-linux/lib), the driver's usual homes, then the lib folder of
// the pip nvidia-* wheel in every likely site-packages directory
// ($VIRTUAL_ENV, $PYTHONPATH entries, /usr/lib/python3*, /usr/local/lib/python3*,
// /opt/*/.venv, ~/.local).
func searchDirs(lib Library) []string {
	var dirs []string
	add := func(d ...string) {
		for _, x := range d {
			if x != "" {
				dirs = append(dirs, x)
			}
		}
	}
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if root := os.Getenv(env); root != "" {
			add(filepath.Join(root, "lib64"), filepath.Join(root, "lib"), filepath.Join(root, "targets", "x86_64-linux", "lib"))
		}
	}
	add("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	if lib.WheelDir == "" {
		add("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib")
		return dirs
	}
	for _, sp := range sitePackages() {
		add(filepath.Join(sp, "nvidia", lib.WheelDir, "lib"))
		// CUDA 13 wheels put every library under nvidia/cu13/lib.
		add(filepath.Join(sp, "nvidia", "cu13", "lib"), filepath.Join(sp, "nvidia", "cu12", "lib"))
	}
	return dirs
}

// sitePackages lists existing site-packages/dist-packages directories in the
// likely places, without running Python.
func sitePackages() []string {
	var pats []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		pats = append(pats, filepath.Join(v, "lib", "python3*", "site-packages"))
	}
	for _, p := range filepath.SplitList(os.Getenv("PYTHONPATH")) {
		if p != "" {
			pats = append(pats, p)
		}
	}
	home, _ := os.UserHomeDir()
	pats = append(pats,
		"/usr/lib/python3*/site-packages", "/usr/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages",
		"/opt/*/.venv/lib/python3*/site-packages", "/opt/*/venv/lib/python3*/site-packages",
		"/opt/conda/lib/python3*/site-packages",
	)
	if home != "" {
		pats = append(pats, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range pats {
		m, _ := filepath.Glob(p)
		sort.Sort(sort.Reverse(sort.StringSlice(m)))
		for _, d := range m {
			if st, err := os.Stat(d); err == nil && st.IsDir() && !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// candidates lists what to dlopen, in order: the bare sonames (the loader's
// path), then every matching file in the search directories, newest first.
func candidates(lib Library) []string {
	out := append([]string{}, lib.Sonames...)
	seen := map[string]bool{}
	for _, d := range searchDirs(lib) {
		m, _ := filepath.Glob(filepath.Join(d, lib.Glob))
		sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) })
		for _, p := range m {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// versionLess orders libfoo.so.12.8.93 < libfoo.so.13.0.1 numerically.
func versionLess(a, b string) bool {
	va, vb := soVersion(a), soVersion(b)
	for i := 0; i < len(va) && i < len(vb); i++ {
		if va[i] != vb[i] {
			return va[i] < vb[i]
		}
	}
	return len(va) < len(vb)
}

func soVersion(path string) []int {
	base := filepath.Base(path)
	i := strings.Index(base, ".so.")
	if i < 0 {
		return nil
	}
	var v []int
	for _, f := range strings.Split(base[i+4:], ".") {
		n, err := strconv.Atoi(f)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}
