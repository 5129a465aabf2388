/* test_nccl_abi.c — <nccl.h> is optional (runtime/nccl_dl.h declares what
 * libmoegen uses when it is absent): those declarations, built without the
 * header (tests/support/nccl_own.c, MOE_NO_NCCL_HEADERS; the Makefile also
 * compiles runtime/ep.c and runtime/nccl_dl.c that way), must be NCCL's own
 * ABI: the sizes and enumerator values are held to <nccl.h> where this
 * machine has it. No GPU, no libnccl. */
#include "check.h"
#include "nccl_dl.h"

int moe_nccl_own_abi(long v[16]);

int main(void) {
    long own[16];
    int n = moe_nccl_own_abi(own);
    CASE("nccl: the declarations without <nccl.h> build and give the ABI's sizes");
    CHECKF(n == 15 && own[0] == 128 && own[1] == (long)sizeof(void *), "%d values, id %ld, handle %ld", n, own[0],
           own[1]);
#if MOE_HAVE_NCCL_H
    CASE("nccl: the declarations without <nccl.h> are <nccl.h>'s");
    const long want[15] = {(long)sizeof(ncclUniqueId), (long)sizeof(ncclComm_t), ncclSuccess, ncclUnhandledCudaError,
                           ncclSystemError, ncclInternalError, ncclInvalidArgument, ncclInvalidUsage,
                           ncclRemoteError, ncclInProgress, ncclInt8, ncclUint8, ncclFloat32, ncclSum,
                           (long)sizeof(ncclRedOp_t)};
    for (int i = 0; i < 15 && i < n; i++)
        CHECKF(own[i] == want[i], "value %d: %ld, <nccl.h> says %ld", i, own[i], want[i]);
#else
    SKIP("nccl: no <nccl.h> on this machine to compare the declarations with");
#endif
    return check_report("test_nccl_abi");
}
