/* error.h — the runtime's error reporting: a status with a detailed
 * message kept per thread for moe_last_error(). Internal to libmoegen. */
#ifndef MOEGEN_ERROR_H
#define MOEGEN_ERROR_H

#include "driver.h"
#include "moe.h"

/* Record a detailed error for moe_last_error() and return s. */
moe_status moe_fail(moe_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the detailed error (a call that succeeded). */
void moe_clear_error(void);

/* A driver call's failure as MOE_ERR_CUDA, with the call and its message. */
#define CU_CHECK(call)                                                                          \
    do {                                                                                       \
        CUresult cu_rc_ = (call);                                                              \
        if (cu_rc_ != CUDA_SUCCESS)                                                            \
            return moe_fail(MOE_ERR_CUDA, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,   \
                            moe_cu_error_string(cu_rc_));                                      \
    } while (0)

#endif
