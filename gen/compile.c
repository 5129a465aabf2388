/* compile.c — NVRTC compilation of emitted sources. */
#include "compile.h"

#include <nvrtc.h>
#include <stdio.h>
#include <string.h>

#define NVRTC_FIXED_OPTIONS "-std=c++17 --fmad=true"

const char *moe_nvrtc_options(void) { return NVRTC_FIXED_OPTIONS; }

void moe_nvrtc_version(char *out, size_t n) {
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
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
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: nvrtcCreateProgram: %s", name, nvrtcGetErrorString(r));
        return 1;
    }
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", moe_arch_name(arch));
    const char *opts[] = {archopt, "-std=c++17", "--fmad=true"}; /* = NVRTC_FIXED_OPTIONS */
    r = nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof *opts), opts);
    size_t loglen = 0;
    nvrtcGetProgramLogSize(prog, &loglen);
    moe_buf_t text = {0};
    if (loglen > 1) {
        char *dst = moe_buf_extend(&text, loglen);
        if (dst) {
            nvrtcGetProgramLog(prog, dst);
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
            snprintf(diag->msg, sizeof diag->msg, "%s:1: error: NVRTC: %s", name, nvrtcGetErrorString(r));
        rc = 1;
    } else if (nvrtcGetCUBINSize(prog, &n) != NVRTC_SUCCESS || n == 0) {
        snprintf(diag->msg, sizeof diag->msg, "%s:1: error: NVRTC produced no cubin for %s", name,
                 moe_arch_name(arch));
        rc = 1;
    } else {
        char *dst = moe_buf_extend(cubin, n);
        if (!dst || nvrtcGetCUBIN(prog, dst) != NVRTC_SUCCESS) {
            snprintf(diag->msg, sizeof diag->msg, "%s:1: error: cannot read the cubin", name);
            rc = 1;
        }
        if (!rc && ptx && nvrtcGetPTXSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
            dst = moe_buf_extend(ptx, n);
            if (dst && nvrtcGetPTX(prog, dst) == NVRTC_SUCCESS)
                ptx->len -= 1; /* n counts the NUL */
        }
    }
    moe_buf_free(&text);
    nvrtcDestroyProgram(&prog);
    return rc;
}
