/* nccl_own.c — runtime/nccl_dl.h's own declarations of NCCL's types (built
 * with MOE_NO_NCCL_HEADERS, as on a machine without <nccl.h>), as numbers
 * for test_nccl_abi to hold against <nccl.h>. */
#include "nccl_dl.h"

#if MOE_HAVE_NCCL_H
#error "nccl_own.c is built with MOE_NO_NCCL_HEADERS: it checks the declarations used without <nccl.h>"
#endif

/* sizeof ncclUniqueId, sizeof ncclComm_t, ncclSuccess .. ncclInProgress,
 * ncclInt8, ncclUint8, ncclFloat32, ncclSum, sizeof ncclRedOp_t; returns the count written. */
int moe_nccl_own_abi(long v[16]) {
    int n = 0;
    v[n++] = (long)sizeof(ncclUniqueId);
    v[n++] = (long)sizeof(ncclComm_t);
    v[n++] = ncclSuccess;
    v[n++] = ncclUnhandledCudaError;
    v[n++] = ncclSystemError;
    v[n++] = ncclInternalError;
    v[n++] = ncclInvalidArgument;
    v[n++] = ncclInvalidUsage;
    v[n++] = ncclRemoteError;
    v[n++] = ncclInProgress;
    v[n++] = ncclInt8;
    v[n++] = ncclUint8;
    v[n++] = ncclFloat32;
    v[n++] = ncclSum;
    v[n++] = (long)sizeof(ncclRedOp_t);
    return n;
}
