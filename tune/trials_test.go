package tune

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// The helper tuner's candidates and trial ids.
var helperCands = []string{"a", "b", "c", "d"}

func helperID(c string) string {
	return TrialID(Key{Family: "family", DType: "bf16", Shape: "T≤1 K=8 N=8"}, c)
}

// TestTrialsHelper is the tuner TestSupervise runs in child processes: it
// tries each candidate not barred, in a trial; the candidate that HELPER_HANG
// names hangs, the one HELPER_LOSE names loses the device, and
// HELPER_FAIL fails before any trial. It prints what it ran.
func TestTrialsHelper(t *testing.T) {
	if os.Getenv("HELPER_TUNER") == "" {
		t.Skip("the tuner TestSupervise runs")
	}
	if os.Getenv("HELPER_FAIL") != "" {
		os.Exit(1)
	}
	tr, err := OpenTrials()
	if err != nil || tr == nil {
		fmt.Println("no trials:", err)
		os.Exit(1)
	}
	defer tr.Close()
	for _, c := range helperCands {
		id := helperID(c)
		if tr.Barred(id) {
			fmt.Println("barred", c)
			continue
		}
		end := tr.Begin(id)
		if c == os.Getenv("HELPER_HANG") {
			time.Sleep(time.Hour)
		}
		var lost error
		if c == os.Getenv("HELPER_LOSE") {
			lost = errors.New("the device is lost")
		}
		end(lost)
		fmt.Println("ran", c)
	}
}

// TestSupervise: a tuner that dies in a trial (killed, as by a faulting
// kernel; exiting on a lost device; hanging past the limit) is started
// again with that candidate barred, and the others run; several such
// candidates are barred one after another; a tuner that fails outside
// any trial is a failure; without a journal nothing is journaled or
// barred.
func TestSupervise(t *testing.T) {
	cases := []struct {
		name   string
		env    []string
		barred []string
		fail   bool
	}{
		{"none", nil, nil, false},
		{"killed", []string{EnvFault + "=| b"}, []string{"b"}, false},
		{"lost", []string{"HELPER_LOSE=c"}, []string{"c"}, false},
		{"hung", []string{"HELPER_HANG=d"}, []string{"d"}, false},
		{"several", []string{EnvFault + "=| a", "HELPER_LOSE=c", "HELPER_HANG=d"}, []string{"a", "c", "d"}, false},
		{"outside", []string{"HELPER_FAIL=1"}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out strings.Builder
			mk := func() *exec.Cmd {
				cmd := exec.Command(os.Args[0], "-test.run=^TestTrialsHelper$", "-test.v")
				cmd.Env = append(os.Environ(), append([]string{"HELPER_TUNER=1"}, c.env...)...)
				cmd.Stdout, cmd.Stderr = &out, &out
				return cmd
			}
			var notes []string
			s, err := Supervise(mk, t.TempDir(), time.Second, func(n string) { notes = append(notes, n) })
			if c.fail {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("%v; output:\n%s", err, out.String())
			}
			var want []string
			for _, b := range c.barred {
				want = append(want, helperID(b))
			}
			if !slices.Equal(s.Barred, want) {
				t.Fatalf("barred %q, want %q; notes %q", s.Barred, want, notes)
			}
			if s.Children != len(c.barred)+1 || len(notes) != len(c.barred) {
				t.Fatalf("%d children and notes %q for %d barred", s.Children, notes, len(c.barred))
			}
			// The last child ran every candidate not barred.
			last := out.String()[strings.LastIndex(out.String(), "=== RUN"):]
			for _, cand := range helperCands {
				want := "ran " + cand
				if slices.Contains(c.barred, cand) {
					want = "barred " + cand
				}
				if !strings.Contains(last, want+"\n") {
					t.Errorf("the last child's output lacks %q:\n%s", want, last)
				}
			}
		})
	}
}

// TestTrialsOff: without a journal in the environment there are no
// trials, and a nil *Trials journals and bars nothing.
func TestTrialsOff(t *testing.T) {
	t.Setenv(EnvJournal, "")
	t.Setenv(EnvFault, "")
	tr, err := OpenTrials()
	if err != nil || tr != nil {
		t.Fatalf("OpenTrials without a journal: %v, %v", tr, err)
	}
	if tr.Barred(helperID("a")) {
		t.Fatal("a nil Trials bars")
	}
	tr.Begin(helperID("a"))(nil)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTrialID: an id is one line, whatever the key holds.
func TestTrialID(t *testing.T) {
	id := TrialID(Key{Family: "f", DType: "d", Shape: "a\nb"}, "c\r")
	if strings.ContainsAny(id, "\r\n") || id != "f | d | a b | c " {
		t.Fatalf("TrialID = %q", id)
	}
}
