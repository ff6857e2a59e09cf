package cu

// SetPreferredSharedCarveout hints the share (percent, 0 to 100; -1: no
// preference) of the unified L1/shared memory that the kernel's
// multiprocessors give to shared memory
// (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT).
func (f *Function) SetPreferredSharedCarveout(percent int) error {
	return f.m.d.Do(func() error { return drvFuncSetAttr(f.h, f.Name, 9, percent) })
}
