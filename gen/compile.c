/* compile.c — NVRTC compilation of emitted sources. NVRTC is loaded with
 * dlopen on first use (as the CUDA driver is), so a program that only
 * loads compiled folders starts without it. */
#define _POSIX_C_SOURCE 200809L
#include "compile.h"

#include <cuda.h> /* CUDA_VERSION: the toolkit this was built with, whose NVRTC is loaded */
#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVRTC_FIXED_OPTIONS "-std=c++17 --fmad=true"
/* libnvrtc.so.13 for CUDA 13.x: found through the program's run path
 * (the build's $(CUDA_HOME)/lib64) or the system's library search */
#define NVRTC_MAJOR_OF(v) ((v) / 1000)

/* The NVRTC entry points moegen calls. */
#define MOE_NVRTC_FUNCTIONS(X)                                                                          \
    X(nvrtcResult (*Version)(int *, int *), "nvrtcVersion")                                               \
    X(const char *(*GetErrorString)(nvrtcResult), "nvrtcGetErrorString")                                  \
    X(nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *, \
                                   const char *const *), "nvrtcCreateProgram")                           \
    X(nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *), "nvrtcCompileProgram")       \
    X(nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *), "nvrtcGetProgramLogSize")                 \
    X(nvrtcResult (*GetProgramLog)(nvrtcProgram, char *), "nvrtcGetProgramLog")                           \
    X(nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *), "nvrtcGetCUBINSize")                           \
    X(nvrtcResult (*GetCUBIN)(nvrtcProgram, char *), "nvrtcGetCUBIN")                                     \
    X(nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *), "nvrtcGetPTXSize")                               \
    X(nvrtcResult (*GetPTX)(nvrtcProgram, char *), "nvrtcGetPTX")                                         \
    X(nvrtcResult (*DestroyProgram)(nvrtcProgram *), "nvrtcDestroyProgram")

#define MOE_NVRTC_FIELD(decl, sym) decl;
static struct {
    MOE_NVRTC_FUNCTIONS(MOE_NVRTC_FIELD)
} nv;
#undef MOE_NVRTC_FIELD

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static char nv_error[600];

/* $MOEGEN_NVRTC_PATH (a file), else libnvrtc.so.MAJOR of the CUDA this was
 * built with. */
static void nv_load(void) {
    char soname[32];
    snprintf(soname, sizeof soname, "libnvrtc.so.%d", NVRTC_MAJOR_OF(CUDA_VERSION));
    const char *env = getenv("MOEGEN_NVRTC_PATH");
    const char *path = env && *env ? env : soname;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nv_error, sizeof nv_error, "NVRTC (%s%s) did not load: %s", path,
                 env && *env ? ", from MOEGEN_NVRTC_PATH" : "", dlerror());
        return;
    }
    void **slot = (void **)&nv;
    size_t i = 0;
#define MOE_NVRTC_RESOLVE(decl, sym)                                                                \
    if (!nv_error[0] && !(slot[i] = dlsym(h, sym)))                                                 \
        snprintf(nv_error, sizeof nv_error, "NVRTC (%s) has no symbol %s", path, sym);             \
    i++;
    MOE_NVRTC_FUNCTIONS(MOE_NVRTC_RESOLVE)
#undef MOE_NVRTC_RESOLVE
    if (nv_error[0]) {
        memset(&nv, 0, sizeof nv);
        dlclose(h);
    }
}

int moe_nvrtc_load(char *why, size_t n) {
    pthread_once(&nv_once, nv_load);
    if (nv_error[0]) {
        if (why)
            snprintf(why, n, "%s", nv_error);
        return -1;
    }
    return 0;
}

/* $MOEGEN_LINEINFO: "on" compiles with -lineinfo (line tables only, the
 * code is the same: a profiler's source view then maps each instruction
 * through the emitted #line directives to its template line); unset,
 * empty or "off": without. -1 for any other value (moe_nvrtc_compile
 * refuses it). */
static int lineinfo(void) {
    const char *v = getenv("MOEGEN_LINEINFO");
    if (!v || !*v || !strcmp(v, "off"))
        return 0;
    return strcmp(v, "on") ? -1 : 1;
}

int moe_nvrtc_env_check(char *why, size_t n) {
    if (lineinfo() >= 0)
        return 0;
    snprintf(why, n, "MOEGEN_LINEINFO=%.200s: expected on or off", getenv("MOEGEN_LINEINFO"));
    return 1;
}

const char *moe_nvrtc_options(void) { return lineinfo() == 1 ? NVRTC_FIXED_OPTIONS " -lineinfo" : NVRTC_FIXED_OPTIONS; }

void moe_nvrtc_version(char *out, size_t n) {
    int maj = 0, min = 0;
    if (moe_nvrtc_load(NULL, 0) == 0)
        nv.Version(&maj, &min);
    snprintf(out, n, "%d.%d", maj, min);
}

/* "file(42): error: x" -> "file:42: error: x", line by line. */
static void rewrite_log(const char *log, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = log; *p && o + 1 < n;) {
        const char *paren = NULL;
        const char *eol = strchr(p, '\n');
        if (!eol)
            eol = p + strlen(p);
        for (const char *q = p; q < eol; q++)
            if (*q == '(' && q > p) {
                const char *d = q + 1;
                while (d < eol && *d >= '0' && *d <= '9')
                    d++;
                if (d > q + 1 && d + 1 < eol && d[0] == ')' && d[1] == ':') {
                    paren = q;
                    break;
                }
            }
        if (paren) {
            const char *d = strchr(paren, ')');
            o += (size_t)snprintf(out + o, n - o, "%.*s:%.*s%.*s\n", (int)(paren - p), p, (int)(d - paren - 1),
                                  paren + 1, (int)(eol - d - 1), d + 1);
        } else {
            o += (size_t)snprintf(out + o, n - o, "%.*s\n", (int)(eol - p), p);
        }
        if (o >= n)
            break;
        p = *eol ? eol + 1 : eol;
    }
}

int moe_nvrtc_compile(const char *src, const char *name, moe_arch_t arch, moe_buf_t *cubin, moe_buf_t *ptx,
                      moe_buf_t *log, moe_diag_t *diag) {
    char why[600];
    if (moe_nvrtc_load(why, sizeof why)) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: %s; compiling needs NVRTC (the CUDA toolkit's "
                 "libnvrtc)", name, why);
        return 1;
    }
    const int li = lineinfo();
    if (li < 0) {
        moe_nvrtc_env_check(why, sizeof why);
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: %s", name, why);
        return 1;
    }
    nvrtcProgram prog;
    nvrtcResult r = nv.CreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: nvrtcCreateProgram: %s", name, nv.GetErrorString(r));
        return 1;
    }
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", moe_arch_name(arch));
    const char *opts[] = {archopt, "-std=c++17", "--fmad=true", "-lineinfo"}; /* = moe_nvrtc_options() */
    r = nv.CompileProgram(prog, 3 + li, opts);
    size_t loglen = 0;
    nv.GetProgramLogSize(prog, &loglen);
    moe_buf_t text = {0};
    if (loglen > 1) {
        char *dst = moe_buf_extend(&text, loglen);
        if (dst) {
            nv.GetProgramLog(prog, dst);
            text.len = strlen(text.data);
            if (log)
                moe_buf_append(log, text.data, text.len);
        }
    }
    int rc = 0;
    size_t n = 0;
    if (r != NVRTC_SUCCESS) {
        if (text.len)
            rewrite_log(text.data, diag->msg, sizeof diag->msg);
        else
            snprintf(diag->msg, sizeof diag->msg, "%s:1: error: NVRTC: %s", name, nv.GetErrorString(r));
        rc = 1;
    } else if (nv.GetCUBINSize(prog, &n) != NVRTC_SUCCESS || n == 0) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: NVRTC produced no cubin for %s", name,
                 moe_arch_name(arch));
        rc = 1;
    } else {
        char *dst = moe_buf_extend(cubin, n);
        if (!dst || nv.GetCUBIN(prog, dst) != NVRTC_SUCCESS) {
            snprintf(diag->msg, sizeof diag->msg, "%s:1: error: cannot read the cubin", name);
            rc = 1;
        }
        if (!rc && ptx && nv.GetPTXSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
            dst = moe_buf_extend(ptx, n);
            if (dst && nv.GetPTX(prog, dst) == NVRTC_SUCCESS)
                ptx->len -= 1; /* n counts the NUL */
        }
    }
    moe_buf_free(&text);
    nv.DestroyProgram(&prog);
    return rc;
}
