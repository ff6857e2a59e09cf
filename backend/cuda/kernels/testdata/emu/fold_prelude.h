// For TestFoldKernelsEmulated (emu_test.go): what kernels.cu's folded-norm
// and dequantization kernels use beyond prelude.h and the pieces of
// kernels.cu the test takes: the cache's element as the activation dtype
// (kernels.cu without KV_F8), and the unfused float operations (a host
// compiler without -ffast-math rounds each one as the device's _rn forms
// do).
typedef T KV;
static inline KV kv_of(float v) { return fromf<T>(v); }
static inline KV kv_from(T v) { return v; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
