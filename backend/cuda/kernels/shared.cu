// Device functions that kernels of different modules must compute alike:
// prepended to kernels.cu (SwiGLU, RoPE) and gemv.cu (its SwiGLU and RoPE
// epilogues), whose outputs must agree to the bit. Plain float math only.

// silu_f is SiLU(v) = v / (1 + e^−v).
__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

// rot1, rot2: the rotated pair (x1·c − x2·s, x2·c + x1·s), with the
// multiply-adds written out so that every RoPE kernel rounds alike.
__device__ __forceinline__ float rot1(float x1, float x2, float c, float s) { return fmaf(x1, c, -(x2 * s)); }
__device__ __forceinline__ float rot2(float x1, float x2, float c, float s) { return fmaf(x2, c, x1 * s); }
