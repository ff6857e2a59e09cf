//go:build race

package loadgen

// raceEnabled: the race detector instruments the code, so timings and
// allocation counts are not the program's own.
const raceEnabled = true
