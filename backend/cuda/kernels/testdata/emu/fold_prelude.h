// For TestFoldKernelsEmulated and TestFP8WritersEmulated (emu_test.go):
// what kernels.cu's folded-norm, dequantization and FP8-form writing
// kernels use beyond prelude.h and the pieces of kernels.cu the tests take:
// the cache's element as the activation dtype (kernels.cu without KV_F8),
// and the unfused float operations (a host compiler without -ffast-math
// rounds each one as the device's _rn forms do).
typedef T KV;
static inline KV kv_of(float v) { return fromf<T>(v); }
static inline KV kv_from(T v) { return v; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
