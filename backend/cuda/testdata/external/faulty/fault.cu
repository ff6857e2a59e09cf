// An external decode product that faults, for kiln's tests of kiln tune's
// child process: it writes far outside y, which loses the CUDA context
// (CUDA_ERROR_ILLEGAL_ADDRESS). kiln tune must bar it and go on.
extern "C" __global__ void ext_fault(unsigned short* y, const unsigned short* x, const unsigned short* w, int t, int k, int n) {
	y[(long long)1 << 40] = x[0] + w[0];
}
