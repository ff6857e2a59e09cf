package tune

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A tuner's trials run in a child process, so that a candidate that
// faults (a kernel that reads out of bounds and loses the CUDA context, a
// crash, a hang) cannot take the tuner down with it. The child journals
// each trial of a candidate (its check against the default and its
// timings) before it starts and after it ends; Supervise, in the parent,
// reads the journal when the child dies: a trial begun and not ended is
// the candidate that killed it, barred from then on (the child's race
// rejects it without running it, and the tune cache files it under the
// entry's Rejected), and the child starts again. The two files travel to
// the child in its environment.
const (
	// EnvJournal names the file the child journals its trials in.
	EnvJournal = "KILN_TUNE_JOURNAL"
	// EnvBarred names the file of the trials barred, one a line.
	EnvBarred = "KILN_TUNE_BARRED"
	// EnvFault is a test hook: a trial whose id ends with this text (a
	// candidate's name) kills its process when it begins, as a faulting
	// kernel would.
	EnvFault = "KILN_TUNE_FAULT"
)

// Trials is a child's side: its journal and the trials barred. A nil
// *Trials journals nothing and bars nothing (a tuner in the process that
// asked for it).
type Trials struct {
	journal *os.File
	barred  map[string]bool
	fault   string
}

// OpenTrials opens the journal and reads the barred trials that the
// environment names (EnvJournal, EnvBarred); nil when it names none (and
// sets no EnvFault: the hook acts without a journal too).
func OpenTrials() (*Trials, error) {
	path, fault := os.Getenv(EnvJournal), os.Getenv(EnvFault)
	if path == "" && fault == "" {
		return nil, nil
	}
	t := &Trials{barred: map[string]bool{}, fault: fault}
	if path == "" {
		return t, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tune: trial journal: %w", err)
	}
	t.journal = f
	if b := os.Getenv(EnvBarred); b != "" {
		ids, err := readLines(b)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			f.Close()
			return nil, fmt.Errorf("tune: barred trials: %w", err)
		}
		for _, id := range ids {
			t.barred[id] = true
		}
	}
	return t, nil
}

// Close closes the journal.
func (t *Trials) Close() error {
	if t == nil || t.journal == nil {
		return nil
	}
	return t.journal.Close()
}

// TrialID names candidate cand of the choice under k for the journal.
func TrialID(k Key, cand string) string {
	id := fmt.Sprintf("%s | %s | %s | %s", k.Family, k.DType, k.Shape, cand)
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(id)
}

// Barred reports whether trial id killed an earlier child.
func (t *Trials) Barred(id string) bool {
	return t != nil && t.barred[id]
}

// ErrBarred is a barred candidate's rejection.
var ErrBarred = errors.New("killed the tuner in an earlier trial (a fault, a crash or a hang): not run again")

// Begin journals that trial id starts; the function it returns journals
// that it ended (after the work it ran is known to be done: the device
// synchronized), or, when the trial lost the device (a CUDA context a
// fault left unusable: every later call fails too), ends the process with
// the trial left open, for Supervise to bar it and start a new child.
// The journal is written straight to the file, not buffered, so that what
// was written before a crash is there after it.
func (t *Trials) Begin(id string) (end func(lost error)) {
	if t == nil || id == "" {
		return func(error) {}
	}
	t.write("begin " + id)
	if t.fault != "" && strings.HasSuffix(id, t.fault) {
		// The test hook: die as a faulting kernel takes a process down.
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			p.Kill()
		}
		select {}
	}
	return func(lost error) {
		if lost != nil {
			fmt.Fprintf(os.Stderr, "tune: the trial of %s lost the device: %v\n", id, lost)
			os.Exit(3)
		}
		t.write("end")
	}
}

// write journals line.
func (t *Trials) write(line string) {
	if t.journal != nil {
		t.journal.WriteString(line + "\n")
	}
}

// Supervision is what Supervise did: the trials it barred and the
// children it started.
type Supervision struct {
	Barred   []string
	Children int
}

// MaxRestarts bounds the children Supervise starts after the first.
const MaxRestarts = 16

// Supervise runs the tuner that mk makes (a fresh command each time,
// whose output goes where mk sends it) in a child process with a journal
// and a file of barred trials in dir, until it exits. When it dies (or
// exits with an error) while a trial is open, that trial is barred and
// the tuner runs again; when a trial stays open longer than hang, the
// child is killed and the trial barred. note is told of each. A child
// that fails outside any trial ends it with that failure.
func Supervise(mk func() *exec.Cmd, dir string, hang time.Duration, note func(string)) (Supervision, error) {
	var s Supervision
	if hang <= 0 {
		return s, fmt.Errorf("tune: a trial's time limit of %v", hang)
	}
	journal := filepath.Join(dir, "trials.journal")
	barred := filepath.Join(dir, "trials.barred")
	for {
		if err := os.WriteFile(journal, nil, 0o644); err != nil {
			return s, err
		}
		cmd := mk()
		cmd.Env = append(cmd.Environ(), EnvJournal+"="+journal, EnvBarred+"="+barred)
		if err := cmd.Start(); err != nil {
			return s, err
		}
		s.Children++
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		hung := ""
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case <-time.After(hang / 4):
				if id, since, ok := openTrial(journal); ok && since > hang {
					hung = id
					cmd.Process.Kill()
				}
			}
		}
		if err == nil && hung == "" {
			return s, nil
		}
		id, _, open := openTrial(journal)
		if hung != "" {
			id, open = hung, true
		}
		if !open {
			return s, fmt.Errorf("tune: the tuner failed outside any trial: %w", err)
		}
		why := fmt.Sprintf("died (%v)", err)
		if hung != "" {
			why = fmt.Sprintf("hung for more than %v: killed", hang)
		}
		note(fmt.Sprintf("the tuner %s in the trial of %s: barred, starting again", why, id))
		s.Barred = append(s.Barred, id)
		if err := appendLine(barred, id); err != nil {
			return s, err
		}
		if s.Children > MaxRestarts {
			return s, fmt.Errorf("tune: the tuner died %d times; giving up", s.Children)
		}
	}
}

// openTrial reads the journal at path: the trial begun and not ended, and
// how long ago the journal was last written.
func openTrial(path string) (id string, since time.Duration, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", 0, false
	}
	// The last line says: "begin ID" while a trial is open.
	const tail = 64 << 10
	off := max(st.Size()-tail, 0)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return "", 0, false
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "begin ") {
		return "", 0, false
	}
	return strings.TrimPrefix(last, "begin "), time.Since(st.ModTime()), true
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
