// Device functions that kernels of different modules must compute alike:
// prepended to kernels.cu (SwiGLU, RoPE) and gemv.cu (its SwiGLU and RoPE
// epilogues), whose outputs must agree to the bit. Plain float math only.

// KILN_PART_IS(p): whether a module compiled in parts (kernels.build
// compiles the kernels module as several NVRTC programs at once, each
// with -DKILN_PART=p) holds part p's kernels: 0 the common kernels, 1 the
// tensor-core prefill attention, 2 the CUDA-core attention (decode and
// prefill), 3 the tensor-core decode attention. A source compiled whole
// (no KILN_PART) holds them all.
#ifdef KILN_PART
#define KILN_PART_IS(p) (KILN_PART == (p))
#else
#define KILN_PART_IS(p) 1
#endif

// silu_f is SiLU(v) = v / (1 + e^−v) from the hardware's approximate
// exponential and division (__expf: at most 2 + 1.17·|v| ulps, CUDA's
// bound, so at most about 1.3e-5 relative for |v| ≤ 88; __fdividef): far
// below a bf16 or f16 rounding. The accurate exponential and correctly
// rounded division took about 20 instructions, in kernels that kept their
// issue slots 53–63% busy (session 41). On the H200 the FP8 prefill's
// swiglu_packed_qr took 65 µs a layer with this form against 81 with that
// one (session 42, the same binary either way). For v below about −88,
// e^−v is infinite and SiLU gives −0.
__device__ __forceinline__ float silu_f(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// rot1, rot2: the rotated pair (x1·c − x2·s, x2·c + x1·s), with the
// multiply-adds written out so that every RoPE kernel rounds alike.
__device__ __forceinline__ float rot1(float x1, float x2, float c, float s) { return fmaf(x1, c, -(x2 * s)); }
__device__ __forceinline__ float rot2(float x1, float x2, float c, float s) { return fmaf(x2, c, x1 * s); }
