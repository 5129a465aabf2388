/* compile.h — compile emitted CUDA C to a cubin (and PTX) with NVRTC. */
#ifndef MOEGEN_COMPILE_H
#define MOEGEN_COMPILE_H

#include "spec.h"
#include "util.h"

/* Compile src (named `name` in messages) for arch. On success fills cubin
 * and, when ptx != NULL, ptx; log receives NVRTC's log (warnings), which
 * is empty for a clean compile. On failure returns non-zero and diag holds
 * the log with positions rewritten as "FILE:LINE: error: ...". */
int moe_nvrtc_compile(const char *src, const char *name, moe_arch_t arch, moe_buf_t *cubin, moe_buf_t *ptx,
                      moe_buf_t *log, moe_diag_t *diag);

/* Load NVRTC (dlopen, once per process): $MOEGEN_NVRTC_PATH if set, else
 * libnvrtc.so.MAJOR of the CUDA toolkit moegen was built with. 0, or -1
 * with the reason ("NVRTC (libnvrtc.so.13) did not load: ...") in why.
 * moe_nvrtc_compile loads it itself; nothing else in moegen needs it. */
int moe_nvrtc_load(char *why, size_t n);

/* NVRTC's version, e.g. "13.0"; "0.0" when NVRTC does not load. */
void moe_nvrtc_version(char *out, size_t n);

/* 0 when the environment's compile options are valid (MOEGEN_LINEINFO: on,
 * off, empty or unset), else 1 and why (moe_nvrtc_compile refuses them). */
int moe_nvrtc_env_check(char *why, size_t n);

/* The options every compile uses, space-separated (part of the cache key):
 * with MOEGEN_LINEINFO=on, -lineinfo too. */
const char *moe_nvrtc_options(void);

#endif
