// For TestPeerSourceClang (emu_test.go): the declarations allreduce.cu
// takes from NVRTC and from the rest of the kernels' source, for clang's
// CUDA front end without the CUDA headers (-nocudainc): enough to compile
// the file to PTX, not to link or run it.
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __shared__ __attribute__((shared))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#include "__clang_cuda_builtin_vars.h"
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };
typedef float f32;
__device__ unsigned atomicAdd(unsigned* p, unsigned v);
__device__ void __syncthreads();
__device__ void __threadfence();
__device__ float __uint_as_float(unsigned);
__device__ unsigned __float_as_uint(float);
__device__ void pdl_enter();
template <typename X> __device__ X fromf(float v);
__device__ void unpack16(uint4 v, float* f, const float*);
__device__ void unpack16(uint4 v, float* f, const bf16*);
__device__ void unpack16(uint4 v, float* f, const f16*);
#define KILN_PART_IS(n) ((n) == 0)
