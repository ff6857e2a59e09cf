//go:build unix

// Memory mapping of model files on Unix: the file is mapped read-only and
// tensors slice the mapping, so loading costs no copy and pages come in on
// first touch.

package model

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps path read-only. The returned function unmaps it. An empty file
// yields an empty slice (mmap refuses zero lengths).
func mapFile(path string) ([]byte, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	if size != int64(int(size)) || size < 0 {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
