// Declarations of the CUDA built-ins the kernel sources use, which NVRTC
// provides and clang (without the CUDA toolkit's headers) does not: for
// TestSourcesCompile only.
#define __align__(n) __attribute__((aligned(n)))
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __grid_constant__ // a const kernel parameter read in place (clang 14 knows no such attribute)
#include <__clang_cuda_builtin_vars.h>
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct int4 { int x, y, z, w; };
__device__ void __syncthreads();
__device__ void __syncwarp(unsigned mask = 0xffffffffu);
__device__ void __threadfence();
__device__ float __shfl_xor_sync(unsigned, float, int, int w = 32);
__device__ int __shfl_xor_sync(unsigned, int, int, int w = 32);
__device__ unsigned __shfl_xor_sync(unsigned, unsigned, int, int w = 32);
__device__ float __shfl_sync(unsigned, float, int, int w = 32);
__device__ int __shfl_sync(unsigned, int, int, int w = 32);
__device__ unsigned __shfl_sync(unsigned, unsigned, int, int w = 32);
__device__ int atomicAdd(int*, int);
__device__ unsigned atomicAdd(unsigned*, unsigned);
__device__ float atomicAdd(float*, float);
__device__ int atomicMin(int*, int);
__device__ int atomicMax(int*, int);
__device__ unsigned long long atomicAdd(unsigned long long*, unsigned long long);
__device__ float __uint_as_float(unsigned);
__device__ unsigned __float_as_uint(float);
__device__ float __int_as_float(int);
__device__ float exp2f(float);
__device__ float expf(float);
__device__ float __expf(float);
__device__ float __fdividef(float, float);
__device__ float tanhf(float);
__device__ float sqrtf(float);
__device__ float fmaxf(float, float);
__device__ float fabsf(float);
__device__ float rintf(float);
__device__ int __dp4a(int, int, int);
__device__ float fminf(float, float);
__device__ float fmaf(float, float, float);
__device__ int __popc(unsigned);
__device__ int __ffs(int);
__device__ unsigned __ballot_sync(unsigned, int);
__device__ int min(int, int);
__device__ int max(int, int);
__device__ long long __shfl_xor_sync(unsigned, long long, int, int w = 32);
__device__ unsigned long long __shfl_xor_sync(unsigned, unsigned long long, int, int w = 32);
__device__ double __shfl_xor_sync(unsigned, double, int, int w = 32);
__device__ long long __shfl_sync(unsigned, long long, int, int w = 32);
__device__ unsigned long long __shfl_sync(unsigned, unsigned long long, int, int w = 32);
__device__ double __shfl_sync(unsigned, double, int, int w = 32);
__device__ float __shfl_up_sync(unsigned, float, unsigned, int w = 32);
__device__ int __shfl_up_sync(unsigned, int, unsigned, int w = 32);
__device__ unsigned __shfl_up_sync(unsigned, unsigned, unsigned, int w = 32);
__device__ long long __shfl_up_sync(unsigned, long long, unsigned, int w = 32);
__device__ unsigned long long __shfl_up_sync(unsigned, unsigned long long, unsigned, int w = 32);
__device__ double __shfl_up_sync(unsigned, double, unsigned, int w = 32);
__device__ int __all_sync(unsigned, int);
__device__ unsigned atomicMin(unsigned*, unsigned);
__device__ unsigned long long atomicMin(unsigned long long*, unsigned long long);
__device__ long long atomicMin(long long*, long long);
__device__ unsigned atomicMax(unsigned*, unsigned);
__device__ unsigned long long atomicMax(unsigned long long*, unsigned long long);
__device__ long long atomicMax(long long*, long long);
__device__ float __fmul_rn(float, float);
__device__ float __fadd_rn(float, float);
__device__ float __fsub_rn(float, float);
__device__ float __fdiv_rn(float, float);
__device__ float __frcp_rn(float);
__device__ float __fmaf_rn(float, float, float);
__device__ double __ddiv_rn(double, double);
__device__ double exp(double);
__device__ double sqrt(double);
__device__ unsigned long long __float2ull_rz(float);
