/* moe_internal.h — runtime entry points for moegen's own tools (bench,
 * tests); not part of the public API. */
#ifndef MOEGEN_MOE_INTERNAL_H
#define MOEGEN_MOE_INTERNAL_H

#include "driver.h"
#include "moe.h"
#include "plan.h"

/* As moe_forward, recording events[i] before kernel i of the launch order
 * (route, permute_plan, permute_scatter, gemm_up, gemm_down, combine) and
 * events[6] after the last. */
moe_status moe_forward_timed(const moe_plan *plan, const moe_forward_args *args, void *stream, CUevent events[7]);

/* Replace the routing table's slots (slot_of[g]: where expert g's weights
 * sit in w1p/w2/b1p/b2) with a permutation of 0..E-1, so tests can prove
 * that the kernels read weights through the table. Synchronous. */
moe_status moe_plan_set_slot_table(moe_plan *plan, const int *slot_of);

/* The expert FFN stage over a tile table: gemm_up (+ SwiGLU) from xs into
 * hbuf, then gemm_down into out (which may alias xs). grid_tiles > 0 sets
 * the GEMMs' tile grid (at least the table's length); 0 = the plan's
 * max_tiles at `tokens`. offsets: each slot's first row (slot order), for
 * paths that take per-expert offsets instead of tiles. */
typedef struct {
    int tokens;
    long long grid_tiles;
    CUdeviceptr xs, tiles, num_tiles, offsets, hbuf, out;
    const void *w1p, *b1p, *w2, *b2;
    CUdeviceptr scratch;   /* the cuDNN path's workspace (moe_cudnn_workspace bytes); 0 = generated kernels only */
} moe_ffn_args_t;
moe_status moe_run_ffn(const moe_plan *plan, const moe_ffn_args_t *f, CUstream stream, CUevent *events);

/* Launch kernel family k of the plan with its planned grid for `tokens`. */
moe_status moe_launch_family(const moe_plan *plan, int k, int tokens, CUstream stream, void **args);

/* The plan's multi-device part (never NULL for a created plan) and its
 * device slot table (slot_of [E]). */
struct moe_ep *moe_plan_ep(const moe_plan *plan);
CUdeviceptr moe_plan_slot_table(const moe_plan *plan);

/* As moe_plan_create, for a mesh of several devices without a communicator:
 * the caller moves the data between the ranks' plans (moe_ep_step,
 * moe_gather_prepare), as the one-GPU tests of several ranks do. */
moe_status moe_plan_create_sim(moe_plan **plan, const char *spec_path, const moe_options *opts);

/* As moe_plan_create, from spec text (name: the file name errors cite). */
moe_status moe_plan_create_text(moe_plan **plan, const char *name, const char *text, const moe_options *opts);

/* The plan's tables. */
const moe_plan_desc_t *moe_plan_desc(const moe_plan *plan);

#endif
