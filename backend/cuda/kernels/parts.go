package kernels

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"kiln/backend/cuda/cu"
)

// moduleParts is one source compiled as several NVRTC programs at once,
// each with -DKILN_PART=p (shared.cu's KILN_PART_IS), so that a cold start
// waits for the longest part rather than for the whole source: NVRTC
// compiles a program on few host threads even with --split-compile.
type moduleParts struct {
	mods   []*cu.Module
	mu     sync.Mutex
	holder map[string]*cu.Module // the part holding each kernel looked up
}

// compileParts compiles src with opts once for each of parts, at once, as
// modules named name_p<part>.
func compileParts(d *cu.Device, name, src string, opts []string, parts []int) (*moduleParts, error) {
	mods := make([]*cu.Module, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Go(func() {
			mods[i], errs[i] = d.Compile(fmt.Sprintf("%s_p%d", name, p), src, append(slices.Clone(opts), fmt.Sprintf("-DKILN_PART=%d", p))...)
		})
	}
	wg.Wait()
	mp := &moduleParts{mods: mods, holder: map[string]*cu.Module{}}
	if err := errors.Join(errs...); err != nil {
		mp.close()
		return nil, err
	}
	return mp, nil
}

// holding is the part that holds kernel name.
func (mp *moduleParts) holding(name string) (*cu.Module, error) {
	mp.mu.Lock()
	m := mp.holder[name]
	mp.mu.Unlock()
	if m != nil {
		return m, nil
	}
	var err error
	for _, m := range mp.mods {
		if _, err = m.Function(name); err == nil {
			mp.mu.Lock()
			mp.holder[name] = m
			mp.mu.Unlock()
			return m, nil
		}
	}
	return nil, err
}

// close unloads the parts.
func (mp *moduleParts) close() error {
	var errs []error
	for _, m := range mp.mods {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
