//go:build !unix

package tokenizer

// cpuSeconds is unavailable here; the benchmark then reports wall time only.
func cpuSeconds() float64 { return 0 }
