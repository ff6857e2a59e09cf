//go:build cgo && linux

package cu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

// The few CUDA types this package needs, declared here so that building
// needs no CUDA headers. Values are checked against cuda.h, nvrtc.h and
// cublasLt.h (CUDA 12/13).
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUgraph;
typedef void* CUgraphExec;
typedef int nvrtcResult;
typedef void* nvrtcProgram;
typedef int cublasStatus_t;
typedef void* cublasLtHandle_t;
typedef void* cublasLtMatmulDesc_t;
typedef void* cublasLtMatrixLayout_t;
typedef void* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// cublasLt.h enum values used below.
enum {
	CUBLASLT_MATMUL_DESC_TRANSA = 3,
	CUBLASLT_MATMUL_DESC_TRANSB = 4,
	CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
	CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
	CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
	CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
	CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,
	CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
	CUBLASLT_ALGO_CONFIG_ID = 0,
	CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
	CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
	CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,
	CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,
	CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,
	CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,
	CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID = 7,
	CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID = 8,
	CUBLASLT_EPILOGUE_DEFAULT = 1,
	CUBLASLT_EPILOGUE_BIAS = 4,
	CUBLAS_OP_N = 0,
	CUBLAS_OP_T = 1,
	CUBLAS_COMPUTE_32F = 68,
	CUDA_R_32F = 0,
};

// ---- function pointers, filled by dlsym ----
#define FN(ret, name, args) static ret (*p_##name) args;
FN(CUresult, cuInit, (unsigned int))
FN(CUresult, cuDriverGetVersion, (int*))
FN(CUresult, cuGetErrorName, (CUresult, const char**))
FN(CUresult, cuGetErrorString, (CUresult, const char**))
FN(CUresult, cuDeviceGetCount, (int*))
FN(CUresult, cuDeviceGet, (CUdevice*, int))
FN(CUresult, cuDeviceGetName, (char*, int, CUdevice))
FN(CUresult, cuDeviceGetAttribute, (int*, int, CUdevice))
FN(CUresult, cuDeviceTotalMem_v2, (size_t*, CUdevice))
FN(CUresult, cuDevicePrimaryCtxRetain, (CUcontext*, CUdevice))
FN(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice))
FN(CUresult, cuCtxSetCurrent, (CUcontext))
FN(CUresult, cuCtxSynchronize, (void))
FN(CUresult, cuDeviceCanAccessPeer, (int*, CUdevice, CUdevice))
FN(CUresult, cuCtxEnablePeerAccess, (CUcontext, unsigned int))
FN(CUresult, cuMemGetInfo_v2, (size_t*, size_t*))
FN(CUresult, cuMemAlloc_v2, (CUdeviceptr*, size_t))
FN(CUresult, cuMemFree_v2, (CUdeviceptr))
FN(CUresult, cuMemHostAlloc, (void**, size_t, unsigned int))
FN(CUresult, cuMemFreeHost, (void*))
FN(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr, const void*, size_t))
FN(CUresult, cuMemcpyDtoH_v2, (void*, CUdeviceptr, size_t))
FN(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void*, size_t, CUstream))
FN(CUresult, cuMemcpyDtoHAsync_v2, (void*, CUdeviceptr, size_t, CUstream))
FN(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))
FN(CUresult, cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))
FN(CUresult, cuMemsetD32Async, (CUdeviceptr, unsigned int, size_t, CUstream))
FN(CUresult, cuStreamCreate, (CUstream*, unsigned int))
FN(CUresult, cuStreamDestroy_v2, (CUstream))
FN(CUresult, cuStreamSynchronize, (CUstream))
FN(CUresult, cuStreamWaitEvent, (CUstream, CUevent, unsigned int))
FN(CUresult, cuEventCreate, (CUevent*, unsigned int))
FN(CUresult, cuEventDestroy_v2, (CUevent))
FN(CUresult, cuEventRecord, (CUevent, CUstream))
FN(CUresult, cuEventSynchronize, (CUevent))
FN(CUresult, cuEventElapsedTime, (float*, CUevent, CUevent))
FN(CUresult, cuModuleLoadData, (CUmodule*, const void*))
FN(CUresult, cuModuleUnload, (CUmodule))
FN(CUresult, cuModuleGetFunction, (CUfunction*, CUmodule, const char*))
FN(CUresult, cuModuleGetGlobal_v2, (CUdeviceptr*, size_t*, CUmodule, const char*))
FN(CUresult, cuFuncSetAttribute, (CUfunction, int, int))
FN(CUresult, cuFuncGetAttribute, (int*, int, CUfunction))
FN(CUresult, cuOccupancyMaxActiveBlocksPerMultiprocessor, (int*, CUfunction, int, size_t))
FN(CUresult, cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**))
// cuLaunchKernelEx (CUDA 11.8+, optional): CUlaunchConfig and
// CUlaunchAttribute as laid out in cuda.h (the attribute's value is a
// 64-byte union at offset 8).
typedef struct { int id; char pad[4]; union { char pad[64]; int i; void* align; } value; } k_launchAttr;
typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	k_launchAttr* attrs;
	unsigned numAttrs;
} k_launchConfig;
FN(CUresult, cuLaunchKernelEx, (const k_launchConfig*, CUfunction, void**, void**))
// cuTensorMapEncodeTiled (CUDA 12+, optional): the map is 128 bytes aligned
// to 64; the enums (data type, interleave, swizzle, L2 promotion, OOB fill)
// are int-sized.
FN(CUresult, cuTensorMapEncodeTiled, (void*, int, unsigned, void*, const unsigned long long*, const unsigned long long*, const unsigned*, const unsigned*, int, int, int, int))
// Stream capture and graphs. The mode and status arguments are the enums
// CUstreamCaptureMode and CUstreamCaptureStatus (int-sized).
FN(CUresult, cuStreamBeginCapture_v2, (CUstream, int))
FN(CUresult, cuStreamEndCapture, (CUstream, CUgraph*))
FN(CUresult, cuStreamIsCapturing, (CUstream, int*))
FN(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec*, CUgraph, unsigned long long))
FN(CUresult, cuGraphLaunch, (CUgraphExec, CUstream))
FN(CUresult, cuGraphExecDestroy, (CUgraphExec))
FN(CUresult, cuGraphDestroy, (CUgraph))

FN(nvrtcResult, nvrtcVersion, (int*, int*))
FN(const char*, nvrtcGetErrorString, (nvrtcResult))
FN(nvrtcResult, nvrtcGetNumSupportedArchs, (int*))
FN(nvrtcResult, nvrtcGetSupportedArchs, (int*))
FN(nvrtcResult, nvrtcCreateProgram, (nvrtcProgram*, const char*, const char*, int, const char**, const char**))
FN(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram*))
FN(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram, int, const char**))
FN(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram, size_t*))
FN(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram, char*))
FN(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram, size_t*))
FN(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram, char*))
FN(nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram, size_t*))
FN(nvrtcResult, nvrtcGetPTX, (nvrtcProgram, char*))

FN(size_t, cublasLtGetVersion, (void))
FN(const char*, cublasLtGetStatusString, (cublasStatus_t))
FN(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t*))
FN(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t))
FN(cublasStatus_t, cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t*, int, int))
FN(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t))
FN(cublasStatus_t, cublasLtMatmulDescSetAttribute, (cublasLtMatmulDesc_t, int, const void*, size_t))
FN(cublasStatus_t, cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t))
FN(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t))
FN(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t*))
FN(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t))
FN(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, (cublasLtMatmulPreference_t, int, const void*, size_t))
FN(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t*, int*))
FN(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute, (const cublasLtMatmulAlgo_t*, int, void*, size_t, size_t*))
FN(cublasStatus_t, cublasLtMatmul, (cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t, CUstream))

// NCCL (nccl.h): communicators are opaque, results and data types ints.
typedef void* ncclComm_t;
typedef int ncclResult_t;
FN(ncclResult_t, ncclGetVersion, (int*))
FN(const char*, ncclGetErrorString, (ncclResult_t))
FN(ncclResult_t, ncclCommInitAll, (ncclComm_t*, int, const int*))
FN(ncclResult_t, ncclCommDestroy, (ncclComm_t))
FN(ncclResult_t, ncclCommAbort, (ncclComm_t))
FN(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t*))
FN(ncclResult_t, ncclAllReduce, (const void*, void*, size_t, int, int, ncclComm_t, CUstream))
FN(ncclResult_t, ncclAllGather, (const void*, void*, size_t, int, ncclComm_t, CUstream))

typedef struct { const char* name; void** slot; } sym;
#define S(name) { #name, (void**)&p_##name }
#define S2(name, alt) { alt, (void**)&p_##name }

static sym cudaSyms[] = {
	S(cuInit), S(cuDriverGetVersion), S(cuGetErrorName), S(cuGetErrorString),
	S(cuDeviceGetCount), S(cuDeviceGet), S(cuDeviceGetName), S(cuDeviceGetAttribute),
	S(cuDeviceTotalMem_v2), S(cuDevicePrimaryCtxRetain), S(cuDevicePrimaryCtxRelease_v2),
	S(cuCtxSetCurrent), S(cuCtxSynchronize), S(cuDeviceCanAccessPeer), S(cuCtxEnablePeerAccess), S(cuMemGetInfo_v2), S(cuMemAlloc_v2), S(cuMemFree_v2),
	S(cuMemHostAlloc), S(cuMemFreeHost), S(cuMemcpyHtoD_v2), S(cuMemcpyDtoH_v2),
	S(cuMemcpyHtoDAsync_v2), S(cuMemcpyDtoHAsync_v2), S(cuMemcpyDtoDAsync_v2),
	S(cuMemsetD8Async), S(cuMemsetD32Async),
	S(cuStreamCreate), S(cuStreamDestroy_v2), S(cuStreamSynchronize), S(cuStreamWaitEvent),
	S(cuEventCreate), S(cuEventDestroy_v2), S(cuEventRecord), S(cuEventSynchronize),
	S(cuModuleLoadData), S(cuModuleUnload), S(cuModuleGetFunction), S(cuModuleGetGlobal_v2),
	S(cuFuncSetAttribute), S(cuFuncGetAttribute), S(cuOccupancyMaxActiveBlocksPerMultiprocessor), S(cuLaunchKernel),
	S(cuStreamBeginCapture_v2), S(cuStreamEndCapture), S(cuStreamIsCapturing),
	S(cuGraphInstantiateWithFlags), S(cuGraphLaunch), S(cuGraphExecDestroy), S(cuGraphDestroy),
	{0, 0},
};
static sym nvrtcSyms[] = {
	S(nvrtcVersion), S(nvrtcGetErrorString), S(nvrtcGetNumSupportedArchs), S(nvrtcGetSupportedArchs),
	S(nvrtcCreateProgram), S(nvrtcDestroyProgram), S(nvrtcCompileProgram),
	S(nvrtcGetProgramLogSize), S(nvrtcGetProgramLog), S(nvrtcGetCUBINSize), S(nvrtcGetCUBIN),
	S(nvrtcGetPTXSize), S(nvrtcGetPTX),
	{0, 0},
};
static sym ltSyms[] = {
	S(cublasLtGetVersion), S(cublasLtGetStatusString), S(cublasLtCreate), S(cublasLtDestroy),
	S(cublasLtMatmulDescCreate), S(cublasLtMatmulDescDestroy), S(cublasLtMatmulDescSetAttribute),
	S(cublasLtMatrixLayoutCreate), S(cublasLtMatrixLayoutDestroy),
	S(cublasLtMatmulPreferenceCreate), S(cublasLtMatmulPreferenceDestroy), S(cublasLtMatmulPreferenceSetAttribute),
	S(cublasLtMatmulAlgoGetHeuristic), S(cublasLtMatmulAlgoConfigGetAttribute), S(cublasLtMatmul),
	{0, 0},
};

static sym ncclSyms[] = {
	S(ncclGetVersion), S(ncclGetErrorString), S(ncclCommInitAll), S(ncclCommDestroy), S(ncclCommAbort),
	S(ncclCommGetAsyncError), S(ncclAllReduce), S(ncclAllGather),
	{0, 0},
};

static void* k_dlopen(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char* k_dlerror(void) { const char* e = dlerror(); return e ? e : "unknown dlopen error"; }
static void k_dlclose(void* h) { dlclose(h); }

// k_bind resolves a table; it returns the first missing symbol, or NULL.
static const char* k_bind(void* h, sym* t) {
	for (; t->name; t++) {
		*t->slot = dlsym(h, t->name);
		if (!*t->slot) return t->name;
	}
	return 0;
}
static const char* k_bindCUDA(void* h) {
	const char* miss = k_bind(h, cudaSyms);
	if (miss) return miss;
	// CUDA 12.8+ exports cuEventElapsedTime_v2 (same signature); prefer it.
	p_cuLaunchKernelEx = dlsym(h, "cuLaunchKernelEx"); // optional: programmatic dependent launches
	p_cuTensorMapEncodeTiled = dlsym(h, "cuTensorMapEncodeTiled"); // optional: TMA (compute capability 9.0)
	p_cuEventElapsedTime = dlsym(h, "cuEventElapsedTime_v2");
	if (!p_cuEventElapsedTime) p_cuEventElapsedTime = dlsym(h, "cuEventElapsedTime");
	return p_cuEventElapsedTime ? 0 : "cuEventElapsedTime";
}
static const char* k_bindNVRTC(void* h) { return k_bind(h, nvrtcSyms); }
static const char* k_bindLt(void* h) { return k_bind(h, ltSyms); }
static const char* k_bindNCCL(void* h) { return k_bind(h, ncclSyms); }

// ---- driver wrappers: values come back in structs, so no Go pointer is
// handed to C ----
typedef struct { int rc; unsigned long long v; } kr;
typedef struct { int rc; void* p; } kp;
typedef struct { int rc; unsigned long long a, b; } kr2;
typedef struct { int rc; float f; } krf;

static const char* k_errName(int rc) { const char* s = 0; if (!p_cuGetErrorName || p_cuGetErrorName(rc, &s) != 0 || !s) return "CUDA_ERROR_UNKNOWN_CODE"; return s; }
static const char* k_errString(int rc) { const char* s = 0; if (!p_cuGetErrorString || p_cuGetErrorString(rc, &s) != 0 || !s) return "unrecognized error code"; return s; }

static int k_cuInit(void) { return p_cuInit(0); }
static kr k_cuDriverGetVersion(void) { int v = 0; kr r; r.rc = p_cuDriverGetVersion(&v); r.v = v; return r; }
static kr k_cuDeviceGetCount(void) { int v = 0; kr r; r.rc = p_cuDeviceGetCount(&v); r.v = v; return r; }
static kr k_cuDeviceGet(int ord) { CUdevice d = 0; kr r; r.rc = p_cuDeviceGet(&d, ord); r.v = d; return r; }
static kr k_cuDeviceGetAttribute(int attr, int dev) { int v = 0; kr r; r.rc = p_cuDeviceGetAttribute(&v, attr, dev); r.v = (unsigned long long)(long long)v; return r; }
static int k_cuDeviceGetName(char* buf, int n, int dev) { return p_cuDeviceGetName(buf, n, dev); }
static kr k_cuDeviceTotalMem(int dev) { size_t v = 0; kr r; r.rc = p_cuDeviceTotalMem_v2(&v, dev); r.v = v; return r; }
static kp k_cuDevicePrimaryCtxRetain(int dev) { CUcontext c = 0; kp r; r.rc = p_cuDevicePrimaryCtxRetain(&c, dev); r.p = c; return r; }
static int k_cuDevicePrimaryCtxRelease(int dev) { return p_cuDevicePrimaryCtxRelease_v2(dev); }
static int k_cuCtxSetCurrent(void* c) { return p_cuCtxSetCurrent(c); }
static int k_cuCtxSynchronize(void) { return p_cuCtxSynchronize(); }
static kr k_cuDeviceCanAccessPeer(int dev, int peer) { int v = 0; kr r; r.rc = p_cuDeviceCanAccessPeer(&v, dev, peer); r.v = v; return r; }
static int k_cuCtxEnablePeerAccess(void* peer) { return p_cuCtxEnablePeerAccess(peer, 0); }
static kr2 k_cuMemGetInfo(void) { size_t f = 0, t = 0; kr2 r; r.rc = p_cuMemGetInfo_v2(&f, &t); r.a = f; r.b = t; return r; }
static kr k_cuMemAlloc(size_t n) { CUdeviceptr p = 0; kr r; r.rc = p_cuMemAlloc_v2(&p, n); r.v = p; return r; }
static int k_cuMemFree(CUdeviceptr p) { return p_cuMemFree_v2(p); }
static kp k_cuMemHostAlloc(size_t n, unsigned flags) { void* p = 0; kp r; r.rc = p_cuMemHostAlloc(&p, n, flags); r.p = p; return r; }
static int k_cuMemFreeHost(void* p) { return p_cuMemFreeHost(p); }
static int k_cuMemcpyHtoD(CUdeviceptr d, void* s, size_t n) { return p_cuMemcpyHtoD_v2(d, s, n); }
static int k_cuMemcpyDtoH(void* d, CUdeviceptr s, size_t n) { return p_cuMemcpyDtoH_v2(d, s, n); }
static int k_cuMemcpyHtoDAsync(CUdeviceptr d, void* s, size_t n, void* st) { return p_cuMemcpyHtoDAsync_v2(d, s, n, st); }
static int k_cuMemcpyDtoHAsync(void* d, CUdeviceptr s, size_t n, void* st) { return p_cuMemcpyDtoHAsync_v2(d, s, n, st); }
static int k_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void* st) { return p_cuMemcpyDtoDAsync_v2(d, s, n, st); }
static int k_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void* st) { return p_cuMemsetD8Async(d, v, n, st); }
static int k_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void* st) { return p_cuMemsetD32Async(d, v, n, st); }
static kp k_cuStreamCreate(unsigned flags) { CUstream s = 0; kp r; r.rc = p_cuStreamCreate(&s, flags); r.p = s; return r; }
static int k_cuStreamDestroy(void* s) { return p_cuStreamDestroy_v2(s); }
static int k_cuStreamSynchronize(void* s) { return p_cuStreamSynchronize(s); }
static int k_cuStreamWaitEvent(void* s, void* e) { return p_cuStreamWaitEvent(s, e, 0); }
static kp k_cuEventCreate(unsigned flags) { CUevent e = 0; kp r; r.rc = p_cuEventCreate(&e, flags); r.p = e; return r; }
static int k_cuEventDestroy(void* e) { return p_cuEventDestroy_v2(e); }
static int k_cuEventRecord(void* e, void* s) { return p_cuEventRecord(e, s); }
static int k_cuEventSynchronize(void* e) { return p_cuEventSynchronize(e); }
static krf k_cuEventElapsedTime(void* a, void* b) { float f = 0; krf r; r.rc = p_cuEventElapsedTime(&f, a, b); r.f = f; return r; }
static kp k_cuModuleLoadData(void* img) { CUmodule m = 0; kp r; r.rc = p_cuModuleLoadData(&m, img); r.p = m; return r; }
static int k_cuModuleUnload(void* m) { return p_cuModuleUnload(m); }
static kp k_cuModuleGetFunction(void* m, const char* name) { CUfunction f = 0; kp r; r.rc = p_cuModuleGetFunction(&f, m, name); r.p = f; return r; }
static kr2 k_cuModuleGetGlobal(void* m, const char* name) { CUdeviceptr p = 0; size_t n = 0; kr2 r; r.rc = p_cuModuleGetGlobal_v2(&p, &n, m, name); r.a = p; r.b = n; return r; }
static int k_cuFuncSetAttribute(void* f, int attr, int v) { return p_cuFuncSetAttribute(f, attr, v); }
static kr k_cuFuncGetAttribute(void* f, int attr) { int v = 0; kr r; r.rc = p_cuFuncGetAttribute(&v, attr, f); r.v = (unsigned long long)v; return r; }
static kr k_cuOccupancy(void* f, int threads, size_t shmem) {
	int v = 0; kr r; r.rc = p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&v, f, threads, shmem); r.v = (unsigned long long)v; return r;
}
static int k_cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shmem, void* st, void** params) {
	return p_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, st, params, 0);
}
// k_cuLaunchEx launches through cuLaunchKernelEx with programmatic stream
// serialization (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6)
// when dependent is set (the grid may start before the previous kernel in
// the stream ends, and must wait for it itself with griddepcontrol.wait
// before touching what that kernel touches), and in thread-block clusters
// of cluster blocks along x (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4, its
// value three unsigned ints) when cluster > 0.
static int k_hasLaunchEx(void) { return p_cuLaunchKernelEx != 0; }
static int k_cuLaunchEx(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shmem, void* st, void** params, int dependent, unsigned cluster) {
	k_launchAttr attrs[2];
	memset(attrs, 0, sizeof attrs);
	unsigned n = 0;
	if (dependent) {
		attrs[n].id = 6;
		attrs[n].value.i = 1;
		n++;
	}
	if (cluster > 0) {
		unsigned dims[3] = {cluster, 1, 1};
		attrs[n].id = 4;
		memcpy(attrs[n].value.pad, dims, sizeof dims);
		n++;
	}
	k_launchConfig c;
	memset(&c, 0, sizeof c);
	c.gridDimX = gx; c.gridDimY = gy; c.gridDimZ = gz;
	c.blockDimX = bx; c.blockDimY = by; c.blockDimZ = bz;
	c.sharedMemBytes = shmem;
	c.hStream = st;
	c.attrs = attrs;
	c.numAttrs = n;
	return p_cuLaunchKernelEx(&c, f, params, 0);
}
// k_cuTensorMapEncodeTiled encodes a tiled tensor map into out (128 bytes)
// through a 64-byte aligned buffer: no interleave, L2 promotion of 128
// bytes (CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2), elements out of bounds
// read as zeros (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0). -1: the driver
// has no cuTensorMapEncodeTiled.
static int k_cuTensorMapEncodeTiled(void* out, int dtype, unsigned rank, unsigned long long base, const unsigned long long* dims,
		const unsigned long long* strides, const unsigned* box, const unsigned* estrides, int swizzle) {
	if (!p_cuTensorMapEncodeTiled) return -1;
	_Alignas(64) unsigned char m[128];
	memset(m, 0, sizeof m);
	int rc = p_cuTensorMapEncodeTiled(m, dtype, rank, (void*)base, dims, strides, box, estrides, 0, swizzle, 2, 0);
	memcpy(out, m, sizeof m);
	return rc;
}
static int k_cuStreamBeginCapture(void* s, int mode) { return p_cuStreamBeginCapture_v2(s, mode); }
static kp k_cuStreamEndCapture(void* s) { CUgraph g = 0; kp r; r.rc = p_cuStreamEndCapture(s, &g); r.p = g; return r; }
static kr k_cuStreamIsCapturing(void* s) { int st = 0; kr r; r.rc = p_cuStreamIsCapturing(s, &st); r.v = st; return r; }
static kp k_cuGraphInstantiate(void* g) { CUgraphExec e = 0; kp r; r.rc = p_cuGraphInstantiateWithFlags(&e, g, 0); r.p = e; return r; }
static int k_cuGraphLaunch(void* e, void* s) { return p_cuGraphLaunch(e, s); }
static int k_cuGraphExecDestroy(void* e) { return p_cuGraphExecDestroy(e); }
static int k_cuGraphDestroy(void* g) { return p_cuGraphDestroy(g); }

// ---- NCCL ----
static const char* k_ncclErr(int rc) { const char* s = p_ncclGetErrorString ? p_ncclGetErrorString(rc) : 0; return s ? s : "unknown NCCL result"; }
static kr k_ncclVersion(void) { int v = 0; kr r; r.rc = p_ncclGetVersion(&v); r.v = v; return r; }
// k_ncclInitAll fills comms (C memory, n slots) with one communicator a device.
static int k_ncclInitAll(void** comms, int n, const int* devs) { return p_ncclCommInitAll((ncclComm_t*)comms, n, devs); }
static int k_ncclDestroy(void* c) { return p_ncclCommDestroy(c); }
static int k_ncclAbort(void* c) { return p_ncclCommAbort(c); }
static kr k_ncclAsyncError(void* c) { ncclResult_t e = 0; kr r; r.rc = p_ncclCommGetAsyncError(c, &e); r.v = e; return r; }
static int k_ncclAllReduce(CUdeviceptr src, CUdeviceptr dst, size_t n, int dt, void* c, void* st) {
	return p_ncclAllReduce((const void*)src, (void*)dst, n, dt, 0, c, st); // ncclSum
}
static int k_ncclAllGather(CUdeviceptr src, CUdeviceptr dst, size_t n, int dt, void* c, void* st) {
	return p_ncclAllGather((const void*)src, (void*)dst, n, dt, c, st);
}

// ---- NVRTC ----
static kr2 k_nvrtcVersion(void) { int a = 0, b = 0; kr2 r; r.rc = p_nvrtcVersion(&a, &b); r.a = a; r.b = b; return r; }
static const char* k_nvrtcErr(int rc) { const char* s = p_nvrtcGetErrorString ? p_nvrtcGetErrorString(rc) : 0; return s ? s : "NVRTC_ERROR_UNKNOWN"; }
// k_nvrtcArchs writes up to max supported architectures into buf (C memory).
static kr k_nvrtcArchs(int* buf, int max) {
	int n = 0; kr r;
	r.rc = p_nvrtcGetNumSupportedArchs(&n);
	if (r.rc) { r.v = 0; return r; }
	if (n > max) { r.rc = -1; r.v = n; return r; }
	r.rc = p_nvrtcGetSupportedArchs(buf);
	r.v = n;
	return r;
}

typedef struct {
	int rc;
	const char* call;
	char* log; size_t logSize;
	char* img; size_t imgSize;
	int cubin;
} nvrtcOut;

// k_nvrtcCompile compiles src; on success img holds a CUBIN (cubin=1) when
// one was produced, else PTX. log and img are malloc'd; the caller frees them.
static nvrtcOut k_nvrtcCompile(const char* src, const char* name, int nopt, const char** opts, int wantCubin) {
	nvrtcOut o; memset(&o, 0, sizeof o);
	nvrtcProgram prog = 0;
	o.call = "nvrtcCreateProgram";
	o.rc = p_nvrtcCreateProgram(&prog, src, name, 0, 0, 0);
	if (o.rc) return o;
	int crc = p_nvrtcCompileProgram(prog, nopt, opts);
	size_t ls = 0;
	if (p_nvrtcGetProgramLogSize(prog, &ls) == 0 && ls > 0) {
		o.log = malloc(ls + 1);
		if (o.log && p_nvrtcGetProgramLog(prog, o.log) == 0) { o.log[ls] = 0; o.logSize = strlen(o.log); }
		else if (o.log) { o.log[0] = 0; }
	}
	if (crc) { o.rc = crc; o.call = "nvrtcCompileProgram"; p_nvrtcDestroyProgram(&prog); return o; }
	size_t n = 0;
	if (wantCubin && p_nvrtcGetCUBINSize(prog, &n) == 0 && n > 0) {
		o.img = malloc(n);
		o.call = "nvrtcGetCUBIN";
		o.rc = p_nvrtcGetCUBIN(prog, o.img);
		o.imgSize = n; o.cubin = 1;
	} else {
		o.call = "nvrtcGetPTXSize";
		o.rc = p_nvrtcGetPTXSize(prog, &n);
		if (o.rc == 0) {
			o.img = malloc(n + 1);
			o.call = "nvrtcGetPTX";
			o.rc = p_nvrtcGetPTX(prog, o.img);
			o.img[n] = 0;
			o.imgSize = n;
		}
	}
	p_nvrtcDestroyProgram(&prog);
	return o;
}

// ---- cuBLASLt ----
static const char* k_ltErr(int rc) { const char* s = p_cublasLtGetStatusString ? p_cublasLtGetStatusString(rc) : 0; return s ? s : "CUBLAS_STATUS_UNKNOWN"; }
static size_t k_ltVersion(void) { return p_cublasLtGetVersion(); }
static kp k_ltCreate(void) { cublasLtHandle_t h = 0; kp r; r.rc = p_cublasLtCreate(&h); r.p = h; return r; }
static int k_ltDestroy(void* h) { return p_cublasLtDestroy(h); }

#define LT_ALGOS 8 // asked of the heuristic at each workspace limit
#define LT_CANDS 16 // kept, over the limits

typedef struct {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c;
	// The heuristic's candidates: its best first at the full workspace,
	// then those it offers within smaller workspaces that are not already
	// listed.
	cublasLtMatmulHeuristicResult_t heur[LT_CANDS];
	int nheur;
	int bias;
	int scaled; // FP8: the scale pointers are set at each run
} ltPlan;

typedef struct { int rc; const char* call; ltPlan* plan; } ltPlanOut;

static void k_ltPlanFree(ltPlan* p) {
	if (!p) return;
	if (p->desc) p_cublasLtMatmulDescDestroy(p->desc);
	if (p->a) p_cublasLtMatrixLayoutDestroy(p->a);
	if (p->b) p_cublasLtMatrixLayoutDestroy(p->b);
	if (p->c) p_cublasLtMatrixLayoutDestroy(p->c);
	free(p);
}

// k_ltConfigOf reads heuristic result r's algorithm id, tile, stages,
// split of K, reduction scheme, CTA swizzling, custom option, inner shape
// and cluster shape into out[0..8] (-1 where cuBLASLt does not say), and
// the workspace it needs into out[9] (KiB, rounded up).
static void k_ltConfigOf(const cublasLtMatmulHeuristicResult_t* r, int32_t* out) {
	static const int attrs[9] = {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
		CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
		CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
	for (int j = 0; j < 9; j++) {
		size_t got = 0;
		if (attrs[j] == CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID || attrs[j] == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) {
			uint16_t v = 0; // these two are 16-bit
			out[j] = p_cublasLtMatmulAlgoConfigGetAttribute(&r->algo, attrs[j], &v, sizeof v, &got) ? -1 : (int32_t)v;
		} else {
			uint32_t v = 0;
			out[j] = p_cublasLtMatmulAlgoConfigGetAttribute(&r->algo, attrs[j], &v, sizeof v, &got) ? -1 : (int32_t)v;
		}
	}
	out[9] = (int32_t)((r->workspaceSize + 1023) / 1024);
}

#define LT(name, expr) do { o.call = name; o.rc = (expr); if (o.rc) goto fail; } while (0)

// k_ltPlan builds the descriptors of D[m,n] = op(A)[m,k]·op(B)[k,n] (+ bias[m])
// in column-major terms and asks the heuristic for up to LT_ALGOS algorithms.
static ltPlanOut k_ltPlan(void* h, int abType, int cdType, int transa, int transb,
		uint64_t m, uint64_t n, uint64_t k, int64_t lda, int64_t ldb, int64_t ldc,
		int bias, uint64_t wsSize, uint32_t alA, uint32_t alB, uint32_t alC, int scaled) {
	ltPlanOut o; memset(&o, 0, sizeof o);
	ltPlan* p = calloc(1, sizeof *p);
	cublasLtMatmulPreference_t pref = 0;
	int32_t ta = transa, tb = transb;
	uint32_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	p->bias = bias;
	LT("cublasLtMatmulDescCreate", p_cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT("cublasLtMatmulDescSetAttribute(TRANSA)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
	LT("cublasLtMatmulDescSetAttribute(TRANSB)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
	LT("cublasLtMatmulDescSetAttribute(EPILOGUE)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
	p->scaled = scaled;
	if (scaled) {
		int8_t fast = 1;
		LT("cublasLtMatmulDescSetAttribute(FAST_ACCUM)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
	}
	LT("cublasLtMatrixLayoutCreate(A)", p_cublasLtMatrixLayoutCreate(&p->a, abType, transa ? k : m, transa ? m : k, lda));
	LT("cublasLtMatrixLayoutCreate(B)", p_cublasLtMatrixLayoutCreate(&p->b, abType, transb ? n : k, transb ? k : n, ldb));
	LT("cublasLtMatrixLayoutCreate(C)", p_cublasLtMatrixLayoutCreate(&p->c, cdType, m, n, ldc));
	LT("cublasLtMatmulPreferenceCreate", p_cublasLtMatmulPreferenceCreate(&pref));
	LT("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)", p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA, sizeof alA));
	LT("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)", p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB, sizeof alB));
	LT("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)", p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alC, sizeof alC));
	LT("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)", p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alC, sizeof alC));
	// The workspace limits searched: the full workspace, then 1 MiB and
	// none, under which the heuristic offers other splits of K and
	// reductions.
	uint64_t limits[3] = {wsSize, 1 << 20, 0};
	for (int l = 0; l < 3 && p->nheur < LT_CANDS; l++) {
		if (l > 0 && limits[l] >= wsSize) continue;
		cublasLtMatmulHeuristicResult_t got[LT_ALGOS];
		int n = 0;
		LT("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limits[l], sizeof limits[l]));
		int rc = p_cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->a, p->b, p->c, p->c, pref, LT_ALGOS, got, &n);
		if (rc) {
			if (l == 0) { o.call = "cublasLtMatmulAlgoGetHeuristic"; o.rc = rc; goto fail; }
			continue; // a smaller limit may have nothing to offer
		}
		for (int i = 0; i < n && p->nheur < LT_CANDS; i++) {
			if (got[i].state != 0) continue;
			// A candidate already listed has the same configuration.
			int32_t ci[10], cj[10], dup = 0;
			k_ltConfigOf(&got[i], ci);
			for (int j = 0; j < p->nheur && !dup; j++) {
				k_ltConfigOf(&p->heur[j], cj);
				dup = !memcmp(ci, cj, 9 * sizeof ci[0]);
			}
			if (!dup) p->heur[p->nheur++] = got[i];
		}
	}
	if (p->nheur < 1) { o.call = "cublasLtMatmulAlgoGetHeuristic (no algorithm found)"; o.rc = 15; goto fail; }
	p_cublasLtMatmulPreferenceDestroy(pref);
	o.plan = p;
	return o;
fail:
	if (pref) p_cublasLtMatmulPreferenceDestroy(pref);
	k_ltPlanFree(p);
	return o;
}

typedef struct { int rc; const char* call; } ltOut;

static int k_ltAlgos(ltPlan* p) { return p->nheur; }

// k_ltAlgoConfig is k_ltConfigOf of candidate i (all -1 past the
// candidates).
static void k_ltAlgoConfig(ltPlan* p, int i, int32_t* out) {
	if (i < 0 || i >= p->nheur) {
		for (int j = 0; j < 10; j++) out[j] = -1;
		return;
	}
	k_ltConfigOf(&p->heur[i], out);
}

// k_ltRun runs the plan with its algorithm algo (an index into the
// heuristic's candidates).
static ltOut k_ltRun(void* h, ltPlan* p, int algo, CUdeviceptr A, CUdeviceptr B, CUdeviceptr C, CUdeviceptr D, CUdeviceptr bias,
		CUdeviceptr aScale, CUdeviceptr bScale, float alpha, float beta, CUdeviceptr ws, size_t wsSize, void* stream) {
	ltOut o; memset(&o, 0, sizeof o);
	if (p->scaled) {
		void* as = (void*)(uintptr_t)aScale;
		void* bs = (void*)(uintptr_t)bScale;
		LT("cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as));
		LT("cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs));
	}
	if (p->bias) {
		void* bp = (void*)(uintptr_t)bias;
		LT("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
	}
	if (algo < 0 || algo >= p->nheur) { o.call = "cublasLtMatmul (no such algorithm)"; o.rc = 7; return o; }
	if (p->heur[algo].workspaceSize > wsSize) { o.call = "cublasLtMatmul (workspace too small)"; o.rc = 7; return o; }
	LT("cublasLtMatmul", p_cublasLtMatmul(h, p->desc, &alpha, (void*)(uintptr_t)A, p->a, (void*)(uintptr_t)B, p->b,
		&beta, (void*)(uintptr_t)C, p->c, (void*)(uintptr_t)D, p->c, &p->heur[algo].algo, (void*)(uintptr_t)ws, wsSize, stream));
fail:
	return o;
}
*/
import "C"

import (
	"fmt"
	"strings"
	"syscall"
	"unsafe"
)

const cgoEnabled = true

// Libraries are bound once; handles stay open for the process's life.
var libHandles [4]unsafe.Pointer

// loadLib dlopens the first candidate that loads and binds every symbol of
// library which (0 driver, 1 NVRTC, 2 cuBLASLt, 3 NCCL). It returns the path loaded.
func loadLib(which int, lib Library) (string, error) {
	cands := candidates(lib)
	var firstErr string
	for _, path := range cands {
		cp := C.CString(path)
		h := C.k_dlopen(cp)
		C.free(unsafe.Pointer(cp))
		if h == nil {
			if firstErr == "" {
				firstErr = C.GoString(C.k_dlerror())
			}
			continue
		}
		var miss *C.char
		switch which {
		case 0:
			miss = C.k_bindCUDA(h)
		case 1:
			miss = C.k_bindNVRTC(h)
		case 2:
			miss = C.k_bindLt(h)
		case 3:
			miss = C.k_bindNCCL(h)
		}
		if miss != nil {
			if firstErr == "" || strings.Contains(firstErr, "No such file") {
				firstErr = fmt.Sprintf("%s lacks %s", path, C.GoString(miss))
			}
			C.k_dlclose(h)
			continue
		}
		libHandles[which] = h
		return path, nil
	}
	return "", fmt.Errorf("%s library not found (%d candidates tried; first error: %s)", lib.Name, len(cands), firstErr)
}

func cuErr(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Lib: "cuda", Call: call, Code: int(rc), Name: C.GoString(C.k_errName(rc)), Msg: C.GoString(C.k_errString(rc))}
}

func nvrtcErr(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Lib: "nvrtc", Call: call, Code: int(rc), Name: C.GoString(C.k_nvrtcErr(rc))}
}

func ltErr(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Lib: "cublasLt", Call: call, Code: int(rc), Name: C.GoString(C.k_ltErr(rc))}
}

func ncclErr(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &Error{Lib: "nccl", Call: call, Code: int(rc), Name: C.GoString(C.k_ncclErr(rc))}
}

func ncclVersion() (int, error) {
	r := C.k_ncclVersion()
	return int(r.v), ncclErr("ncclGetVersion", C.int(r.rc))
}

func ncclInitAll(devs []int) ([]unsafe.Pointer, error) {
	n := len(devs)
	comms := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(uintptr(0))))
	ords := (*C.int)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.int(0)))))
	defer C.free(comms)
	defer C.free(unsafe.Pointer(ords))
	for i, d := range devs {
		unsafe.Slice(ords, n)[i] = C.int(d)
	}
	if err := ncclErr("ncclCommInitAll", C.k_ncclInitAll((*unsafe.Pointer)(comms), C.int(n), ords)); err != nil {
		return nil, err
	}
	return append([]unsafe.Pointer(nil), unsafe.Slice((*unsafe.Pointer)(comms), n)...), nil
}

func ncclDestroy(c unsafe.Pointer) error { return ncclErr("ncclCommDestroy", C.k_ncclDestroy(c)) }
func ncclAbort(c unsafe.Pointer) error   { return ncclErr("ncclCommAbort", C.k_ncclAbort(c)) }
func ncclAsyncError(c unsafe.Pointer) error {
	r := C.k_ncclAsyncError(c)
	if err := ncclErr("ncclCommGetAsyncError", C.int(r.rc)); err != nil {
		return err
	}
	return ncclErr("nccl (asynchronous)", C.int(r.v))
}
func ncclAllReduce(src, dst Ptr, n int, dt int, c, s unsafe.Pointer) error {
	return ncclErr("ncclAllReduce", C.k_ncclAllReduce(C.CUdeviceptr(src), C.CUdeviceptr(dst), C.size_t(n), C.int(dt), c, s))
}
func ncclAllGather(src, dst Ptr, n int, dt int, c, s unsafe.Pointer) error {
	return ncclErr("ncclAllGather", C.k_ncclAllGather(C.CUdeviceptr(src), C.CUdeviceptr(dst), C.size_t(n), C.int(dt), c, s))
}

func cMalloc(n int) unsafe.Pointer { return C.calloc(C.size_t(n), 1) }
func cFree(p unsafe.Pointer)       { C.free(p) }

func drvInit() error { return cuErr("cuInit", C.k_cuInit()) }
func drvVersion() (int, error) {
	r := C.k_cuDriverGetVersion()
	return int(r.v), cuErr("cuDriverGetVersion", r.rc)
}
func drvDeviceCount() (int, error) {
	r := C.k_cuDeviceGetCount()
	return int(r.v), cuErr("cuDeviceGetCount", r.rc)
}
func drvDeviceGet(ord int) (int, error) {
	r := C.k_cuDeviceGet(C.int(ord))
	return int(r.v), cuErr(fmt.Sprintf("cuDeviceGet(%d)", ord), r.rc)
}
func drvDeviceName(dev int) (string, error) {
	buf := C.malloc(256)
	defer C.free(buf)
	if err := cuErr("cuDeviceGetName", C.k_cuDeviceGetName((*C.char)(buf), 256, C.int(dev))); err != nil {
		return "", err
	}
	return C.GoString((*C.char)(buf)), nil
}
func drvDeviceAttr(dev, attr int) (int, error) {
	r := C.k_cuDeviceGetAttribute(C.int(attr), C.int(dev))
	return int(int64(r.v)), cuErr(fmt.Sprintf("cuDeviceGetAttribute(%d)", attr), r.rc)
}
func drvTotalMem(dev int) (uint64, error) {
	r := C.k_cuDeviceTotalMem(C.int(dev))
	return uint64(r.v), cuErr("cuDeviceTotalMem_v2", r.rc)
}
func drvPrimaryCtxRetain(dev int) (unsafe.Pointer, error) {
	r := C.k_cuDevicePrimaryCtxRetain(C.int(dev))
	return r.p, cuErr("cuDevicePrimaryCtxRetain", r.rc)
}
func drvPrimaryCtxRelease(dev int) error {
	return cuErr("cuDevicePrimaryCtxRelease_v2", C.k_cuDevicePrimaryCtxRelease(C.int(dev)))
}
func drvCtxSetCurrent(ctx unsafe.Pointer) error {
	return cuErr("cuCtxSetCurrent", C.k_cuCtxSetCurrent(ctx))
}
func drvCtxSync() error { return cuErr("cuCtxSynchronize", C.k_cuCtxSynchronize()) }
func drvCanAccessPeer(dev, peer int) (bool, error) {
	r := C.k_cuDeviceCanAccessPeer(C.int(dev), C.int(peer))
	return r.v != 0, cuErr("cuDeviceCanAccessPeer", r.rc)
}

// drvEnablePeerAccess lets the current context reach peer's memory; it is
// not an error when it already may (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED).
func drvEnablePeerAccess(peer unsafe.Pointer) error {
	rc := C.k_cuCtxEnablePeerAccess(peer)
	if rc == 704 {
		return nil
	}
	return cuErr("cuCtxEnablePeerAccess", rc)
}
func drvMemInfo() (free, total uint64, err error) {
	r := C.k_cuMemGetInfo()
	return uint64(r.a), uint64(r.b), cuErr("cuMemGetInfo_v2", r.rc)
}
func drvMemAlloc(n int) (Ptr, error) {
	r := C.k_cuMemAlloc(C.size_t(n))
	return Ptr(r.v), cuErr(fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n), r.rc)
}
func drvMemFree(p Ptr) error { return cuErr("cuMemFree_v2", C.k_cuMemFree(C.CUdeviceptr(p))) }
func drvHostAlloc(n int) (unsafe.Pointer, error) {
	r := C.k_cuMemHostAlloc(C.size_t(n), 0)
	return r.p, cuErr(fmt.Sprintf("cuMemHostAlloc(%d bytes)", n), r.rc)
}
func drvHostFree(p unsafe.Pointer) error { return cuErr("cuMemFreeHost", C.k_cuMemFreeHost(p)) }
func drvHtoD(dst Ptr, src unsafe.Pointer, n int, s unsafe.Pointer) error {
	return cuErr("cuMemcpyHtoDAsync_v2", C.k_cuMemcpyHtoDAsync(C.CUdeviceptr(dst), src, C.size_t(n), s))
}
func drvDtoH(dst unsafe.Pointer, src Ptr, n int, s unsafe.Pointer) error {
	return cuErr("cuMemcpyDtoHAsync_v2", C.k_cuMemcpyDtoHAsync(dst, C.CUdeviceptr(src), C.size_t(n), s))
}
func drvDtoD(dst, src Ptr, n int, s unsafe.Pointer) error {
	return cuErr("cuMemcpyDtoDAsync_v2", C.k_cuMemcpyDtoDAsync(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s))
}
func drvMemset8(p Ptr, v byte, n int, s unsafe.Pointer) error {
	return cuErr("cuMemsetD8Async", C.k_cuMemsetD8Async(C.CUdeviceptr(p), C.uchar(v), C.size_t(n), s))
}
func drvMemset32(p Ptr, v uint32, n int, s unsafe.Pointer) error {
	return cuErr("cuMemsetD32Async", C.k_cuMemsetD32Async(C.CUdeviceptr(p), C.uint(v), C.size_t(n), s))
}
func drvStreamCreate() (unsafe.Pointer, error) {
	r := C.k_cuStreamCreate(1) // CU_STREAM_NON_BLOCKING
	return r.p, cuErr("cuStreamCreate", r.rc)
}
func drvStreamDestroy(s unsafe.Pointer) error {
	return cuErr("cuStreamDestroy_v2", C.k_cuStreamDestroy(s))
}
func drvStreamSync(s unsafe.Pointer) error {
	return cuErr("cuStreamSynchronize", C.k_cuStreamSynchronize(s))
}
func drvStreamWaitEvent(s, e unsafe.Pointer) error {
	return cuErr("cuStreamWaitEvent", C.k_cuStreamWaitEvent(s, e))
}
func drvEventCreate(timing bool) (unsafe.Pointer, error) {
	flags := C.uint(2) // CU_EVENT_DISABLE_TIMING
	if timing {
		flags = 0
	}
	r := C.k_cuEventCreate(flags)
	return r.p, cuErr("cuEventCreate", r.rc)
}
func drvEventDestroy(e unsafe.Pointer) error {
	return cuErr("cuEventDestroy_v2", C.k_cuEventDestroy(e))
}
func drvEventRecord(e, s unsafe.Pointer) error {
	return cuErr("cuEventRecord", C.k_cuEventRecord(e, s))
}
func drvEventSync(e unsafe.Pointer) error {
	return cuErr("cuEventSynchronize", C.k_cuEventSynchronize(e))
}
func drvEventElapsed(a, b unsafe.Pointer) (float32, error) {
	r := C.k_cuEventElapsedTime(a, b)
	return float32(r.f), cuErr("cuEventElapsedTime", r.rc)
}
func drvModuleLoad(img []byte) (unsafe.Pointer, error) {
	// The image is copied into C memory (PTX needs a terminating NUL).
	buf := C.calloc(C.size_t(len(img)+1), 1)
	defer C.free(buf)
	copy(unsafe.Slice((*byte)(buf), len(img)), img)
	r := C.k_cuModuleLoadData(buf)
	return r.p, cuErr("cuModuleLoadData", r.rc)
}
func drvModuleUnload(m unsafe.Pointer) error { return cuErr("cuModuleUnload", C.k_cuModuleUnload(m)) }
func drvModuleFunction(m unsafe.Pointer, name string) (unsafe.Pointer, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	r := C.k_cuModuleGetFunction(m, cn)
	return r.p, cuErr(fmt.Sprintf("cuModuleGetFunction(%q)", name), r.rc)
}
func drvModuleGlobal(m unsafe.Pointer, name string) (Ptr, int, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	r := C.k_cuModuleGetGlobal(m, cn)
	return Ptr(r.a), int(r.b), cuErr(fmt.Sprintf("cuModuleGetGlobal_v2(%q)", name), r.rc)
}
func drvFuncSetAttr(f unsafe.Pointer, name string, attr, v int) error {
	return cuErr(fmt.Sprintf("cuFuncSetAttribute(%s, %d)", name, attr), C.k_cuFuncSetAttribute(f, C.int(attr), C.int(v)))
}
func drvFuncGetAttr(f unsafe.Pointer, name string, attr int) (int, error) {
	r := C.k_cuFuncGetAttribute(f, C.int(attr))
	return int(r.v), cuErr(fmt.Sprintf("cuFuncGetAttribute(%s, %d)", name, attr), r.rc)
}
func drvOccupancy(f unsafe.Pointer, name string, threads, shmem int) (int, error) {
	r := C.k_cuOccupancy(f, C.int(threads), C.size_t(shmem))
	return int(r.v), cuErr(fmt.Sprintf("cuOccupancyMaxActiveBlocksPerMultiprocessor(%s)", name), r.rc)
}
func drvLaunch(f unsafe.Pointer, name string, grid, block Dim3, shmem int, s unsafe.Pointer, params unsafe.Pointer) error {
	rc := C.k_cuLaunchKernel(f, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z), C.uint(block.X), C.uint(block.Y), C.uint(block.Z),
		C.uint(shmem), s, (*unsafe.Pointer)(params))
	if rc != 0 {
		return cuErr(fmt.Sprintf("cuLaunchKernel(%s, grid %v, block %v, shared %d)", name, grid, block, shmem), rc)
	}
	return nil
}

func drvHasLaunchEx() bool { return C.k_hasLaunchEx() != 0 }

// drvLaunchEx launches through cuLaunchKernelEx (k_cuLaunchEx).
func drvLaunchEx(f unsafe.Pointer, name string, grid, block Dim3, shmem int, s unsafe.Pointer, params unsafe.Pointer, dependent bool, cluster int) error {
	dep := C.int(0)
	if dependent {
		dep = 1
	}
	rc := C.k_cuLaunchEx(f, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z), C.uint(block.X), C.uint(block.Y), C.uint(block.Z),
		C.uint(shmem), s, (*unsafe.Pointer)(params), dep, C.uint(cluster))
	if rc != 0 {
		return cuErr(fmt.Sprintf("cuLaunchKernelEx(%s, grid %v, block %v, shared %d, programmatic serialization %v, cluster %d)", name, grid, block, shmem, dependent, cluster), rc)
	}
	return nil
}

// drvTensorMapEncodeTiled encodes m (checked) into out (k_cuTensorMapEncodeTiled).
func drvTensorMapEncodeTiled(out *TensorMap, dtype int, m TiledMap, estrides []uint32, swizzle int) error {
	var sp *C.ulonglong
	if len(m.Strides) > 0 {
		sp = (*C.ulonglong)(unsafe.Pointer(&m.Strides[0]))
	}
	rc := C.k_cuTensorMapEncodeTiled(unsafe.Pointer(&out.b[0]), C.int(dtype), C.uint(len(m.Dims)), C.ulonglong(m.Base),
		(*C.ulonglong)(unsafe.Pointer(&m.Dims[0])), sp, (*C.uint)(unsafe.Pointer(&m.Box[0])), (*C.uint)(unsafe.Pointer(&estrides[0])), C.int(swizzle))
	if rc == -1 {
		return fmt.Errorf("cuda: cuTensorMapEncodeTiled: not in this driver (CUDA 12 or later)")
	}
	return cuErr(fmt.Sprintf("cuTensorMapEncodeTiled(dims %v, strides %v, box %v, swizzle %d)", m.Dims, m.Strides, m.Box, m.Swizzle), rc)
}

func drvStreamBeginCapture(s unsafe.Pointer, mode int) error {
	return cuErr(fmt.Sprintf("cuStreamBeginCapture_v2(mode %d)", mode), C.k_cuStreamBeginCapture(s, C.int(mode)))
}
func drvStreamEndCapture(s unsafe.Pointer) (unsafe.Pointer, error) {
	r := C.k_cuStreamEndCapture(s)
	return r.p, cuErr("cuStreamEndCapture", r.rc)
}
func drvStreamIsCapturing(s unsafe.Pointer) (int, error) {
	r := C.k_cuStreamIsCapturing(s)
	return int(r.v), cuErr("cuStreamIsCapturing", r.rc)
}
func drvGraphInstantiate(g unsafe.Pointer) (unsafe.Pointer, error) {
	r := C.k_cuGraphInstantiate(g)
	return r.p, cuErr("cuGraphInstantiateWithFlags", r.rc)
}
func drvGraphLaunch(e, s unsafe.Pointer) error {
	return cuErr("cuGraphLaunch", C.k_cuGraphLaunch(e, s))
}
func drvGraphExecDestroy(e unsafe.Pointer) error {
	return cuErr("cuGraphExecDestroy", C.k_cuGraphExecDestroy(e))
}
func drvGraphDestroy(g unsafe.Pointer) error {
	return cuErr("cuGraphDestroy", C.k_cuGraphDestroy(g))
}

func nvrtcVersionGet() (int, int, error) {
	r := C.k_nvrtcVersion()
	return int(r.a), int(r.b), nvrtcErr("nvrtcVersion", r.rc)
}
func nvrtcArchs() ([]int, error) {
	const max = 128
	buf := C.calloc(max, C.size_t(unsafe.Sizeof(C.int(0))))
	defer C.free(buf)
	r := C.k_nvrtcArchs((*C.int)(buf), max)
	if r.rc != 0 {
		return nil, nvrtcErr("nvrtcGetSupportedArchs", r.rc)
	}
	out := make([]int, int(r.v))
	for i, v := range unsafe.Slice((*C.int)(buf), int(r.v)) {
		out[i] = int(v)
	}
	return out, nil
}

// nvrtcCompile compiles src for the options given; it returns the image (a
// CUBIN when one is produced and wanted, else PTX) and the compile log.
func nvrtcCompile(name, src string, opts []string, wantCubin bool) (img []byte, cubin bool, log string, err error) {
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	copts := (*[1 << 20]*C.char)(C.calloc(C.size_t(len(opts)+1), C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(copts))
	for i, o := range opts {
		copts[i] = C.CString(o)
		defer C.free(unsafe.Pointer(copts[i]))
	}
	want := C.int(0)
	if wantCubin {
		want = 1
	}
	o := C.k_nvrtcCompile(csrc, cname, C.int(len(opts)), &copts[0], want)
	if o.log != nil {
		log = C.GoStringN(o.log, C.int(o.logSize))
		C.free(unsafe.Pointer(o.log))
	}
	if o.img != nil {
		img = C.GoBytes(unsafe.Pointer(o.img), C.int(o.imgSize))
		C.free(unsafe.Pointer(o.img))
	}
	if o.rc != 0 {
		return nil, false, log, nvrtcErr(fmt.Sprintf("%s(%s)", C.GoString(o.call), name), o.rc)
	}
	return img, o.cubin != 0, log, nil
}

func ltVersion() int { return int(C.k_ltVersion()) }
func ltCreate() (unsafe.Pointer, error) {
	r := C.k_ltCreate()
	return r.p, ltErr("cublasLtCreate", r.rc)
}
func ltDestroy(h unsafe.Pointer) error { return ltErr("cublasLtDestroy", C.k_ltDestroy(h)) }

func ltPlanCreate(h unsafe.Pointer, a ltPlanArgs) (unsafe.Pointer, error) {
	o := C.k_ltPlan(h, C.int(a.abType), C.int(a.cdType), C.int(a.transa), C.int(a.transb),
		C.uint64_t(a.m), C.uint64_t(a.n), C.uint64_t(a.k), C.int64_t(a.lda), C.int64_t(a.ldb), C.int64_t(a.ldc),
		b2c(a.bias), C.uint64_t(a.ws), C.uint32_t(a.alA), C.uint32_t(a.alB), C.uint32_t(a.alC), b2c(a.scaled))
	if o.rc != 0 {
		return nil, ltErr(C.GoString(o.call), o.rc)
	}
	return unsafe.Pointer(o.plan), nil
}
func ltPlanFree(p unsafe.Pointer)  { C.k_ltPlanFree((*C.ltPlan)(p)) }
func ltAlgos(p unsafe.Pointer) int { return int(C.k_ltAlgos((*C.ltPlan)(p))) }
func ltAlgoConfig(p unsafe.Pointer, i int) AlgoConfig {
	var v [10]C.int32_t
	C.k_ltAlgoConfig((*C.ltPlan)(p), C.int(i), &v[0])
	return AlgoConfig{ID: int(v[0]), Tile: int(v[1]), Stages: int(v[2]), SplitK: int(v[3]), Reduction: int(v[4]), Swizzle: int(v[5]),
		Custom: int(v[6]), Inner: int(v[7]), Cluster: int(v[8]), WorkspaceKiB: int(v[9])}
}
func ltRun(h, plan unsafe.Pointer, algo int, a, b, c, d, bias, aScale, bScale Ptr, alpha, beta float32, ws Ptr, wsSize int, s unsafe.Pointer) error {
	o := C.k_ltRun(h, (*C.ltPlan)(plan), C.int(algo), C.CUdeviceptr(a), C.CUdeviceptr(b), C.CUdeviceptr(c), C.CUdeviceptr(d), C.CUdeviceptr(bias),
		C.CUdeviceptr(aScale), C.CUdeviceptr(bScale), C.float(alpha), C.float(beta), C.CUdeviceptr(ws), C.size_t(wsSize), s)
	return ltErr(C.GoString(o.call), o.rc)
}

func gettid() int { return syscall.Gettid() }

func b2c(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// tryOpen reports whether path dlopens (then closes it again).
func tryOpen(path string) error {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	h := C.k_dlopen(cp)
	if h == nil {
		return fmt.Errorf("%s", C.GoString(C.k_dlerror()))
	}
	C.k_dlclose(h)
	return nil
}
