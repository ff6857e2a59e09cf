//go:build !unix

// Fallback for systems without mmap: the whole file is read into memory.

package model

import "os"

func mapFile(path string) ([]byte, func() error, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	return data, func() error { return nil }, nil
}

// dropPages does nothing: the file was read into memory.
func dropPages(b []byte) {}
