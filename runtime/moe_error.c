/* moe_error.c — statuses as sentences and the per-thread detailed error. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[4096];

const char *moe_last_error(void) { return last_error; }

void moe_clear_error(void) { last_error[0] = '\0'; }

moe_status moe_fail(moe_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *moe_status_string(moe_status s) {
    switch (s) {
    case MOE_OK: return "ok";
    case MOE_ERR_INVALID_ARG: return "invalid argument";
    case MOE_ERR_SPEC: return "bad spec";
    case MOE_ERR_NO_DRIVER: return "no CUDA driver";
    case MOE_ERR_NO_GPU: return "no GPU";
    case MOE_ERR_ARCH: return "unsupported GPU architecture";
    case MOE_ERR_COMPILE: return "kernel generation or compilation failed";
    case MOE_ERR_CUDA: return "CUDA driver error";
    case MOE_ERR_CAPACITY: return "more tokens than the plan's capacity";
    case MOE_ERR_IO: return "I/O error";
    case MOE_ERR_NO_MEMORY: return "out of memory";
    case MOE_ERR_UNSUPPORTED: return "unsupported";
    case MOE_ERR_NCCL: return "NCCL error";
    case MOE_ERR_OVERFLOW: return "dispatch capacity exceeded";
    }
    return "unknown status";
}
