/* nccl_dl.h — NCCL, loaded with dlopen("libnccl.so.2") when a plan
 * needs more than one device. Only the types come from <nccl.h>; nothing
 * links libnccl. Since dlopen by soname returns a library the process has
 * already loaded, the caller's communicator and these entry points come from
 * the same NCCL. Internal to libmoegen and its tests. */
#ifndef MOEGEN_NCCL_DL_H
#define MOEGEN_NCCL_DL_H

#include <nccl.h>
#include <stddef.h>

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
    X(ncclAllGather, "ncclAllGather")

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
