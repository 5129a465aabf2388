/* ffn.h — the expert FFN stage (gemm_up + SwiGLU, gemm_down): each stage
 * through the generated kernels or, where the plan decided so, cuDNN.
 * Internal to libmoegen. */
#ifndef MOEGEN_FFN_H
#define MOEGEN_FFN_H

#include "cudnn.h"
#include "launch.h"

/* Whether stage takes cuDNN in a call of f: the plan decided so, the weights
 * sit at their experts' own slots (cuDNN reads first_token_offset in expert
 * order, where the generated kernels read slots from the tiles), bf16 or fp16
 * weights, and no U to store (cuDNN stores none). */
int moe_ffn_cudnn(const moe_launcher_t *l, const moe_cudnn_t *dn, int stage, const moe_ffn_args_t *f);

/* Enqueue both stages of f on st. dn: the plan's cuDNN part (NULL = the
 * generated kernels only). ev (may be NULL): events[k] recorded before each
 * stage's kernel k. *combined (may be NULL): 1 when f->y was given and the
 * down GEMM wrote y itself (the gemv grid's folded combine), else 0. */
moe_status moe_run_ffn(const moe_launcher_t *l, const moe_cudnn_t *dn, const moe_ffn_args_t *f, CUstream st,
                       CUevent *ev, int *combined);

#endif
