//go:build race

package engine_test

// raceEnabled: the race detector instruments the code, so timings and
// allocation counts are not the program's own.
const raceEnabled = true
