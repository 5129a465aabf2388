/* nccl_dl.c — dlopen of NCCL. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

moe_nccl_api_t moe_nccl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

static void load_nccl(void) {
    const char *path = "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(load_error, sizeof load_error, "dlopen(%s): %s (put NCCL's lib folder on LD_LIBRARY_PATH)", path,
                 dlerror());
        return;
    }
#define MOE_NCCL_RESOLVE(fn, sym)                                                             \
    if (!load_error[0] && !(*(void **)&moe_nccl.fn = dlsym(h, sym)))                          \
        snprintf(load_error, sizeof load_error, "%s has no symbol %s (NCCL 2.18 or later is needed)", path, sym);
    MOE_NCCL_FUNCTIONS(MOE_NCCL_RESOLVE)
#undef MOE_NCCL_RESOLVE
    if (!load_error[0] && moe_nccl.ncclGetVersion(&moe_nccl.version) != ncclSuccess)
        snprintf(load_error, sizeof load_error, "ncclGetVersion failed");
    if (load_error[0]) {
        memset(&moe_nccl, 0, sizeof moe_nccl);
        dlclose(h);
    }
}

int moe_nccl_load(char *why, size_t n) {
    pthread_once(&load_once, load_nccl);
    if (load_error[0]) {
        if (why)
            snprintf(why, n, "%s", load_error);
        return -1;
    }
    return 0;
}

const char *moe_nccl_error_string(ncclResult_t r) {
    const char *s = moe_nccl.ncclGetErrorString ? moe_nccl.ncclGetErrorString(r) : NULL;
    return s ? s : "unknown NCCL error";
}
