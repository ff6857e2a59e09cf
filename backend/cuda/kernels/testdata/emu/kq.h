// Host versions of gemv_kq.cu's PTX helpers, for TestGEMVKQEmulated
// (emu_test.go): after prelude.h, before the kernels' frame.
#define VEC (16 / (int)sizeof(T))
static inline float half_f(unsigned short h) { return h2f(h); }
static inline unsigned shf_r(unsigned lo, unsigned hi, unsigned s) {
	return (unsigned)((((unsigned long long)hi << 32) | lo) >> s);
}
static inline void ld8(const T* p, uint4 (&r)[8 / VEC]) { memcpy(r, p, sizeof r); }
static inline void unpack8(const uint4 (&r)[8 / VEC], float (&v)[8]) {
	T e[8];
	memcpy(e, r, sizeof e);
	for (int k = 0; k < 8; k++) v[k] = tof(e[k]);
}
static inline int dp4a(int a, int b, int c) {
	for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
	return c;
}
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline int __shfl_xor_sync(unsigned, int v, int m) { return shfl_xor(v, m); }
