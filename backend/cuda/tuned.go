package cuda

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/tune"
)

// The ways a backend treats the persistent cache of tuned choices
// (Backend.Tune): the choices timed at first use (GEMV or cuBLASLt and the
// tile kernels' split of K, cuBLASLt's algorithm, decode attention's plan)
// are kept in a tune.Cache filed under the device, so that a later start
// on the same kind of device takes them without timing again.
const (
	// TuneCached takes the choices the cache holds and times (and keeps)
	// the others: the default.
	TuneCached = "cached"
	// TuneOff neither reads nor writes the cache: every choice is timed at
	// first use and forgotten at exit.
	TuneOff = "off"
	// TuneFull times every choice again and keeps what it finds.
	TuneFull = "full"
)

// ParseTune checks a --tune value ("" is TuneCached).
func ParseTune(s string) (string, error) {
	switch s {
	case "", TuneCached:
		return TuneCached, nil
	case TuneOff, TuneFull:
		return s, nil
	}
	return "", fmt.Errorf("tune mode %q: want %s, %s or %s", s, TuneOff, TuneCached, TuneFull)
}

// TuneDevice identifies d for the cache: its name and compute capability,
// the driver API's version, and the NVRTC and cuBLASLt versions whose
// kernels and algorithms the choices name.
func TuneDevice(d *cu.Device) tune.Device {
	libs := cu.Loaded()
	return tune.Device{
		Name:    d.Name,
		Arch:    fmt.Sprintf("%d.%d", d.Major, d.Minor),
		Driver:  strconv.Itoa(libs.DriverVersion),
		Runtime: fmt.Sprintf("nvrtc %d.%d, cublasLt %d", libs.NVRTCVersion[0], libs.NVRTCVersion[1], libs.BlasLtVersion),
		Kiln:    tune.KilnVersion(),
	}
}

// tuneCache opens b's cache once (nil under TuneOff, or when it cannot be
// opened: the choices are then timed as without a cache); what it skipped
// and why are added to Stats.Choices.
func (b *Backend) tuneCache() *tune.Cache {
	b.tuneOnce.Do(func() {
		mode, err := ParseTune(b.Tune)
		if err != nil || mode == TuneOff {
			return
		}
		dir := b.TuneDir
		if dir == "" {
			dir = tune.DefaultDir()
		}
		c, err := tune.Open(dir, TuneDevice(b.Device))
		if err != nil {
			b.stats.Choices = append(b.stats.Choices, fmt.Sprintf("tune cache not used: %v", err))
			return
		}
		for _, w := range c.Warnings {
			b.stats.Choices = append(b.stats.Choices, w)
		}
		b.tuned = c
	})
	return b.tuned
}

// cachedChoice returns the cache's choice for k when b takes cached
// choices (TuneCached).
func (l *loaded) cachedChoice(k tune.Key) (string, bool) {
	c := l.b.tuneCache()
	if c == nil || l.b.Tune == TuneFull {
		return "", false
	}
	e, ok := c.Get(k)
	return e.Choice, ok
}

// keep files a choice timed at first use (times in ms of 5 runs); a failed
// write is noted in Stats.Choices.
func (l *loaded) keep(k tune.Key, choice, def string, choiceMs, defMs float32) {
	c := l.b.tuneCache()
	if c == nil {
		return
	}
	e := tune.Entry{Key: k, Choice: choice, Default: def, ChoiceUs: float64(choiceMs) * 1e3 / 5, DefaultUs: float64(defMs) * 1e3 / 5,
		Tuned: time.Now().UTC()}
	if err := c.Put(e); err != nil {
		l.b.stats.Choices = append(l.b.stats.Choices, fmt.Sprintf("tune cache: %v", err))
	}
}

// noteCached records in Stats.Choices a choice taken from the cache.
func (l *loaded) noteCached(k tune.Key, choice string) {
	l.b.stats.Choices = append(l.b.stats.Choices, fmt.Sprintf("%s: %s (tune cache)", k.Shape, choice))
}

// The cache's keys and choices for the three decisions.

func gemvKey(act cu.DType, key mmKey, epi string) tune.Key {
	out := act.String()
	if key.outF32 {
		out = "f32"
	}
	shape := fmt.Sprintf("T≤%d K=%d N=%d out %s", key.t, key.k, key.n, out)
	if epi != "" {
		shape += " with " + epi
	}
	return tune.Key{Family: "decode product", DType: act.String(), Shape: shape}
}

// gemvChoiceName names a GEMV-or-cuBLASLt choice: "cublaslt", "gemv", or
// "gemv, K split S" for the tile kernels.
func gemvChoiceName(use bool, splits int) string {
	switch {
	case !use:
		return "cublaslt"
	case splits > 0:
		return fmt.Sprintf("gemv, K split %d", splits)
	}
	return "gemv"
}

// parseGEMVChoice reads gemvChoiceName's form back.
func parseGEMVChoice(s string) (use bool, splits int, ok bool) {
	switch {
	case s == "cublaslt":
		return false, 0, true
	case s == "gemv":
		return true, 0, true
	case strings.HasPrefix(s, "gemv, K split "):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "gemv, K split "))
		return true, n, err == nil && n > 0
	}
	return false, 0, false
}

func algoTuneKey(key algoKey) tune.Key {
	return tune.Key{Family: "cublaslt algorithm", DType: key.in.String(),
		Shape: fmt.Sprintf("T≤%d K=%d N=%d out %s bias %v ldd %d", key.rows, key.k, key.n, key.out, key.bias, key.ldd)}
}

func decodeTuneKey(act cu.DType, key decodeKey) tune.Key {
	return tune.Key{Family: "decode attention", DType: act.String(),
		Shape: fmt.Sprintf("T≤%d ctx≤%d heads %d/%d ×%d window %d fp8 cache %v", key.t, key.ctx, key.heads, key.kvHeads, key.headDim, key.window, key.fp8)}
}

// planName names a decode plan for the cache (its fields but the
// workspace, which each batch sizes).
func planName(p kernels.DecodePlan) string {
	return fmt.Sprintf("chunk %d, splits %d, cluster %v, mma %v, stages %d", p.Chunk, p.MaxSplits, p.Cluster, p.MMA, p.Stages)
}

// cachedPlan is the candidate named name, if one is.
func cachedPlan(cands []kernels.DecodePlan, name string) (kernels.DecodePlan, bool) {
	for _, p := range cands {
		if planName(p) == name {
			return p, true
		}
	}
	return kernels.DecodePlan{}, false
}
