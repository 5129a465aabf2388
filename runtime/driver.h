/* driver.h — the CUDA driver API, loaded with dlopen("libcuda.so.1").
 *
 * Only the types and enums come from cuda.h; nothing links libcuda, so a
 * binary starts on a machine without a driver and moe_cu_load() says why
 * it cannot run kernels there. Internal to libmoegen and its tests. */
#ifndef MOEGEN_DRIVER_H
#define MOEGEN_DRIVER_H

#include <cuda.h>
#include <stddef.h>

/* X(function, "exported symbol") */
#define MOE_CU_FUNCTIONS(X)                                   \
    X(cuInit, "cuInit")                                       \
    X(cuGetErrorString, "cuGetErrorString")                   \
    X(cuDriverGetVersion, "cuDriverGetVersion")               \
    X(cuDeviceGetCount, "cuDeviceGetCount")                   \
    X(cuDeviceGet, "cuDeviceGet")                             \
    X(cuDeviceGetName, "cuDeviceGetName")                     \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute")           \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")   \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                     \
    X(cuCtxSynchronize, "cuCtxSynchronize")                   \
    X(cuModuleLoadData, "cuModuleLoadData")                   \
    X(cuModuleUnload, "cuModuleUnload")                       \
    X(cuModuleGetFunction, "cuModuleGetFunction")             \
    X(cuFuncSetAttribute, "cuFuncSetAttribute")               \
    X(cuLaunchKernel, "cuLaunchKernel")                       \
    X(cuLaunchKernelEx, "cuLaunchKernelEx")                   \
    X(cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters") \
    X(cuMemAlloc, "cuMemAlloc_v2")                            \
    X(cuMemFree, "cuMemFree_v2")                              \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                        \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                        \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")              \
    X(cuMemsetD8, "cuMemsetD8_v2")                            \
    X(cuMemsetD8Async, "cuMemsetD8Async")                     \
    X(cuMemsetD32Async, "cuMemsetD32Async")                   \
    X(cuStreamCreate, "cuStreamCreate")                       \
    X(cuStreamDestroy, "cuStreamDestroy_v2")                  \
    X(cuStreamSynchronize, "cuStreamSynchronize")             \
    X(cuEventCreate, "cuEventCreate")                         \
    X(cuEventDestroy, "cuEventDestroy_v2")                    \
    X(cuEventRecord, "cuEventRecord")                         \
    X(cuEventSynchronize, "cuEventSynchronize")               \
    X(cuEventElapsedTime, "cuEventElapsedTime_v2")             \
    X(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")         \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2")        \
    X(cuStreamEndCapture, "cuStreamEndCapture")               \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags") \
    X(cuGraphLaunch, "cuGraphLaunch")                         \
    X(cuGraphExecDestroy, "cuGraphExecDestroy")               \
    X(cuGraphDestroy, "cuGraphDestroy")

typedef struct {
#define MOE_CU_FIELD(fn, sym) __typeof__(fn) *fn;
    MOE_CU_FUNCTIONS(MOE_CU_FIELD)
#undef MOE_CU_FIELD
} moe_cu_api_t;

extern moe_cu_api_t moe_cu;

/* Load the driver once (thread-safe). Returns 0, or -1 with the reason
 * (dlopen's message, or the missing symbol) in why. */
int moe_cu_load(char *why, size_t n);

/* The driver's message for r ("unknown error" when there is none). */
const char *moe_cu_error_string(CUresult r);

#endif
