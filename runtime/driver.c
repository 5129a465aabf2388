/* driver.c — dlopen of the CUDA driver. */
#define _POSIX_C_SOURCE 200809L
#include "driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

moe_cu_api_t moe_cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

static void load_driver(void) {
    const char *path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof load_error, "dlopen(%s): %s", path, dlerror());
        return;
    }
#define MOE_CU_RESOLVE(fn, sym)                                                               \
    if (!load_error[0] && !(*(void **)&moe_cu.fn = dlsym(h, sym)))                            \
        snprintf(load_error, sizeof load_error, "%s has no symbol %s", path, sym);
    MOE_CU_FUNCTIONS(MOE_CU_RESOLVE)
#undef MOE_CU_RESOLVE
    if (load_error[0]) {
        memset(&moe_cu, 0, sizeof moe_cu);
        dlclose(h);
    }
}

int moe_cu_load(char *why, size_t n) {
    pthread_once(&load_once, load_driver);
    if (load_error[0]) {
        if (why)
            snprintf(why, n, "%s", load_error);
        return -1;
    }
    return 0;
}

const char *moe_cu_error_string(CUresult r) {
    const char *s = NULL;
    if (moe_cu.cuGetErrorString && moe_cu.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "unknown error";
}
