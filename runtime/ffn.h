/* ffn.h — the expert FFN stage (gemm_up + SwiGLU, gemm_down): each stage
 * through the generated kernels or, where the plan decided so, cuDNN.
 * Internal to libmoegen. */
#ifndef MOEGEN_FFN_H
#define MOEGEN_FFN_H

#include "cudnn.h"
#include "launch.h"

/* Enqueue both stages of f on st. dn: the plan's cuDNN part (NULL = the
 * generated kernels only). ev (may be NULL): events[k] recorded before each
 * stage's kernel k. *combined (may be NULL): 1 when f->y was given and the
 * down GEMM wrote y itself (the gemv grid's folded combine), else 0. */
moe_status moe_run_ffn(const moe_launcher_t *l, const moe_cudnn_t *dn, const moe_ffn_args_t *f, CUstream st,
                       CUevent *ev, int *combined);

#endif
