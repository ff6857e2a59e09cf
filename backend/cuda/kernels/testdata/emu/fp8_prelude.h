// For TestFP8WritersEmulated (emu_test.go): what kernels.cu's FP8-form
// writers use beyond prelude.h, fold_prelude.h and the pieces of kernels.cu
// the test takes: __fdiv_rn (unfused, as fold_prelude.h's), __frcp_rn,
// __fmaf_rn (one rounding, as the device's), and e4m3x2,
// whose device form is PTX (cvt.rn.satfinite.e4m3x2.f32): here E4M3
// rounded to nearest even, saturated at ±448, NaN as 0x7f.
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline unsigned char e4m3_host(float f) {
	const unsigned char sign = std::signbit(f) ? 0x80 : 0;
	if (std::isnan(f)) return sign | 0x7f;
	const float a = fabsf(f);
	if (a >= 448.f) return sign | 0x7e;
	if (a < 0.015625f) { // subnormal: steps of 2^-9
		const int q = (int)std::nearbyint(a * 512.f);
		return sign | (unsigned char)q; // q == 8 is the smallest normal's code
	}
	int e;
	const float m = std::frexp(a, &e); // a = m·2^e, m in [0.5, 1)
	int q = (int)std::nearbyint((m * 2.f - 1.f) * 8.f);
	int ex = e - 1 + 7;
	if (q == 8) q = 0, ex++;
	const int code = ex << 3 | q;
	return sign | (unsigned char)(code > 0x7e ? 0x7e : code);
}
static inline unsigned short e4m3x2(float lo, float hi) { return (unsigned short)(e4m3_host(lo) | e4m3_host(hi) << 8); }
