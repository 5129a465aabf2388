/* nccl_dl.h — NCCL, loaded with dlopen("libnccl.so.2") when a plan
 * needs more than one device. Only the types come from <nccl.h>; nothing
 * links libnccl. Since dlopen by soname returns a library the process has
 * already loaded, the caller's communicator and these entry points come from
 * the same NCCL. Internal to libmoegen and its tests.
 *
 * <nccl.h> is optional, as cuDNN's headers are: the CUDA toolkit does not
 * ship it (Debian's libnccl-dev or NVIDIA's packages do). Without it (or
 * with MOE_NO_NCCL_HEADERS) the few types and entry points libmoegen uses
 * are declared below, as NCCL 2.x's ABI has them since 2.0 (the handle an
 * opaque pointer, ncclUniqueId 128 bytes, the enumerators' values); the
 * config of ncclCommSplit is only ever passed as NULL, so its struct stays
 * incomplete. test_nccl_abi holds these to <nccl.h> where that exists. */
#ifndef MOEGEN_NCCL_DL_H
#define MOEGEN_NCCL_DL_H

#include <stddef.h>

#if defined(__has_include) && !defined(MOE_NO_NCCL_HEADERS)
#if __has_include(<nccl.h>)
#include <nccl.h>
#define MOE_HAVE_NCCL_H 1
#endif
#endif
#ifndef MOE_HAVE_NCCL_H
#define MOE_HAVE_NCCL_H 0
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct ncclComm *ncclComm_t;
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
                                                         /* the ones libmoegen moves */
typedef enum { ncclSum = 0, ncclMaxRedOp = 0x7fffffff } ncclRedOp_t;        /* the one it reduces with; int-sized */
typedef struct moe_nccl_config ncclConfig_t;               /* passed as NULL only */
struct CUstream_st;
ncclResult_t ncclGetVersion(int *version);
const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId *unique_id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId comm_id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      struct CUstream_st *stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      struct CUstream_st *stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, struct CUstream_st *stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, struct CUstream_st *stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, struct CUstream_st *stream);
#endif

/* X(function, "exported symbol") */
#define MOE_NCCL_FUNCTIONS(X)                      \
    X(ncclGetVersion, "ncclGetVersion")            \
    X(ncclGetErrorString, "ncclGetErrorString")    \
    X(ncclGetUniqueId, "ncclGetUniqueId")          \
    X(ncclCommInitRank, "ncclCommInitRank")        \
    X(ncclCommSplit, "ncclCommSplit")              \
    X(ncclCommDestroy, "ncclCommDestroy")          \
    X(ncclCommCount, "ncclCommCount")              \
    X(ncclCommUserRank, "ncclCommUserRank")        \
    X(ncclCommCuDevice, "ncclCommCuDevice")        \
    X(ncclGroupStart, "ncclGroupStart")            \
    X(ncclGroupEnd, "ncclGroupEnd")                \
    X(ncclSend, "ncclSend")                        \
    X(ncclRecv, "ncclRecv")                        \
    X(ncclAllGather, "ncclAllGather")              \
    X(ncclReduceScatter, "ncclReduceScatter")      \
    X(ncclAllReduce, "ncclAllReduce")

typedef struct {
#define MOE_NCCL_FIELD(fn, sym) __typeof__(fn) *fn;
    MOE_NCCL_FUNCTIONS(MOE_NCCL_FIELD)
#undef MOE_NCCL_FIELD
    int version;    /* ncclGetVersion, e.g. 22809 */
} moe_nccl_api_t;

extern moe_nccl_api_t moe_nccl;

/* Load NCCL once (thread-safe). Returns 0, or -1 with the reason (dlopen's
 * message, a missing symbol, or a version without ncclCommSplit) in why. */
int moe_nccl_load(char *why, size_t n);

/* NCCL's message for r. */
const char *moe_nccl_error_string(ncclResult_t r);

#endif
