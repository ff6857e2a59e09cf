package cpu

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"kiln/backend"
)

// FreeMemory implements backend.MemoryReporter: the kernel's estimate of the
// memory available without swapping (MemAvailable in /proc/meminfo).
func (l *loaded) FreeMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("cpu: free memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu: free memory: %q", sc.Text())
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("cpu: free memory: no MemAvailable in /proc/meminfo")
}

// KVBytes implements backend.MemoryReporter: keys and values in float32.
func (l *loaded) KVBytes(spec backend.KVSpec) int64 { return spec.Bytes() }

// SharesHostMemory implements backend.SharedMemory: the CPU's is the host's.
func (l *loaded) SharesHostMemory() bool { return true }
