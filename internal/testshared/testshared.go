// Package testshared locates the project's shared test data (../shared beside
// the repository root) for tests.
//
// Tests that need it call Dir: without the folder they skip with a clear
// message, unless CI=true, where the data must be present and its absence
// fails the test.
package testshared

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the absolute path of the shared folder, skipping or failing
// the test when it is absent.
func Dir(t testing.TB) string {
	t.Helper()
	if d, ok := find(); ok {
		return d
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("../shared is missing beside the repository root, and CI=true requires it")
	}
	t.Skip("skipping: ../shared (test data) is not beside the repository root; set it up or run in CI")
	return ""
}

// Path joins elements onto Dir and checks that the result exists.
func Path(t testing.TB, elem ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{Dir(t)}, elem...)...)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shared test data: %v", err)
	}
	return p
}

// find walks up from the working directory to the module root (the folder
// holding go.mod) and looks for ../shared beside it.
func find() (string, bool) {
	if env := os.Getenv("KILN_SHARED_DIR"); env != "" {
		return env, true
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			d := filepath.Join(filepath.Dir(dir), "shared")
			if st, err := os.Stat(d); err == nil && st.IsDir() {
				return d, true
			}
			return "", false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}
