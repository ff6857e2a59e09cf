package cpu

import "unsafe"

// bytesF32 views little-endian float32 bytes as float32s (amd64 and arm64
// are little-endian and allow unaligned access).
func bytesF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
