package cu

// SetPreferredSharedCarveout hints the share (percent, 0 to 100; -1: no
// preference) of the unified L1/shared memory that the kernel's
// multiprocessors give to shared memory
// (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT).
func (f *Function) SetPreferredSharedCarveout(percent int) error {
	return f.m.d.Do(func() error { return drvFuncSetAttr(f.h, f.Name, 9, percent) })
}

// Resources is what the compiled kernel takes a thread: its registers
// (CU_FUNC_ATTRIBUTE_NUM_REGS) and its local memory in bytes
// (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: spilled registers and arrays
// indexed by values the compiler cannot resolve).
func (f *Function) Resources() (regs, local int, err error) {
	err = f.m.d.Do(func() error {
		var e error
		if regs, e = drvFuncGetAttr(f.h, f.Name, 4); e != nil {
			return e
		}
		local, e = drvFuncGetAttr(f.h, f.Name, 3)
		return e
	})
	return
}
