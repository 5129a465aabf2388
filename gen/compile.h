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

/* NVRTC's version, e.g. "13.0". */
void moe_nvrtc_version(char *out, size_t n);

/* The options every compile uses, space-separated (part of the cache key). */
const char *moe_nvrtc_options(void);

#endif
