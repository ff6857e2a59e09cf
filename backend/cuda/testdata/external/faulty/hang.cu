// An external decode product that never ends, for kiln's tests of kiln
// tune's child process: kiln tune must kill the child after
// --trial-timeout, bar the kernel and go on. (The asm statement is a side
// effect the compiler keeps, so the loop stays.)
extern "C" __global__ void ext_hang(unsigned short* y, const unsigned short* x, const unsigned short* w, int t, int k, int n) {
	for (;;) {
		asm volatile("nanosleep.u32 1000;");
	}
}
