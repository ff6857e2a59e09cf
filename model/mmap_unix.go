//go:build unix

// Memory mapping of model files on Unix: the file is mapped read-only and
// tensors slice the mapping, so loading costs no copy and pages come in on
// first touch.

package model

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
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

// dropPages gives back the whole pages of b, a slice of a file mapping
// (mapFile's, read-only and shared): they are read from the file again if
// touched.
func dropPages(b []byte) {
	if len(b) == 0 {
		return
	}
	ps := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + ps - 1) &^ (ps - 1)
	hi := (start + uintptr(len(b))) &^ (ps - 1)
	if hi <= lo {
		return
	}
	_ = syscall.Madvise(b[lo-start:hi-start], syscall.MADV_DONTNEED)
}
