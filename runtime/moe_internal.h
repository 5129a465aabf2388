/* moe_internal.h — runtime entry points for moegen's own tools (bench,
 * tests); not part of the public API. */
#ifndef MOEGEN_MOE_INTERNAL_H
#define MOEGEN_MOE_INTERNAL_H

#include "driver.h"
#include "ep.h"
#include "moe.h"
#include "plan.h"
#include "tuning.h"

/* As moe_forward, recording events[i] before kernel i of the launch order
 * (route, permute_plan, permute_scatter, gemm_up, gemm_down, combine) and
 * events[6] after the last. */
moe_status moe_forward_timed(const moe_plan *plan, const moe_forward_args *args, void *stream, CUevent events[7]);

/* Whether moe_forward of args runs the gathered up GEMM (docs/DESIGN.md,
 * "The gathered up GEMM": the scatter writes the workspace's "src_of", not
 * the rows of "xs"), for tests that read the stages' outputs. */
int moe_forward_gathers(const moe_plan *plan, const moe_forward_args *args);
/* Whether moe_forward of args chains (docs/DESIGN.md, "The chain": its up
 * GEMM's grid runs the down GEMM and the combine; no down or combine launch,
 * the down output still in "xs"), for tests and benchmarks to say so. */
int moe_forward_chains(const moe_plan *plan, const moe_forward_args *args);

/* The backward's stages in launch order, for moe_backward_timed: U
 * recomputed (recompute_u), dys and dw, the four grouped GEMMs (dgrad down
 * with the activation's backward, dgrad up, wgrad up, wgrad down), the bias
 * gradients (ffn_bias), the router's step (d logits, dx, d router_w). A
 * stage the call does not run is empty. */
enum { MOE_BWD_STAGES = 8 };
extern const char *const moe_bwd_stage_names[MOE_BWD_STAGES];

/* As moe_backward (one device), recording events[i] before stage i and
 * events[MOE_BWD_STAGES] after the last. */
moe_status moe_backward_timed(const moe_plan *plan, const moe_backward_args *args, void *stream,
                              CUevent events[MOE_BWD_STAGES + 1]);

/* Replace the routing table's slots (slot_of[g]: where expert g's weights
 * sit in w1p/w2/b1p/b2) with a permutation of 0..E-1, so tests can prove
 * that the kernels read weights through the table. Synchronous. */
moe_status moe_plan_set_slot_table(moe_plan *plan, const int *slot_of);

/* The plan's multi-device part (never NULL for a created plan). */
struct moe_ep *moe_plan_ep(const moe_plan *plan);

/* The expert-parallel forward of a plan, step by step, and the gather's
 * local part, for tests that move the data between ranks themselves
 * (ep.h: moe_ep_run_step, moe_ep_send_recv, moe_ep_gather_local). */
moe_status moe_ep_step(const moe_plan *plan, const moe_forward_args *a, CUstream st, int step, moe_ep_call_t *c);
moe_status moe_ep_run_xfers(const moe_plan *plan, const moe_ep_call_t *c, CUstream st);
/* An EP training plan's training forward (MOE_EP_STEPS steps) and backward
 * (MOE_EP_BWD_STEPS, ep_bwd.h), step by step, likewise. */
moe_status moe_ep_train_step(const moe_plan *plan, const moe_train_forward_args *ta, CUstream st, int step,
                             moe_ep_call_t *c);
moe_status moe_ep_bwd_step(const moe_plan *plan, const moe_backward_args *a, CUstream st, int step, moe_ep_call_t *c);
moe_status moe_gather_prepare(const moe_plan *plan, const moe_gather_args *g, CUstream st, moe_ep_call_t *c);
/* moe_gather_weights_fp8's local part: the quantize into place, the biases'
 * copies, and in c the transfers that complete the gather. */
moe_status moe_gather_prepare_fp8(const moe_plan *plan, const moe_pack_args *w1, const moe_pack_args *w2,
                                  const moe_gather_args *g, CUstream st, moe_ep_call_t *c);

/* As moe_plan_create, for a mesh of several devices without a communicator:
 * the caller moves the data between the ranks' plans (moe_ep_step,
 * moe_gather_prepare), as the one-GPU tests of several ranks do. */
moe_status moe_plan_create_unconnected(moe_plan **plan, const char *spec_path, const moe_options *opts);

/* As moe_plan_create, from spec text (name: the file name errors cite). */
moe_status moe_plan_create_text(moe_plan **plan, const char *name, const char *text, const moe_options *opts);

/* As moe_plan_create(_text) (text NULL: read the file `name`), the sm_90a
 * GEMM tiles from `table` instead of opts->tuning_path, $MOEGEN_TUNING or
 * the embedded table (the tuner's candidates, moegen --tuning). table need
 * not outlive the call. */
moe_status moe_plan_create_tuned(moe_plan **plan, const char *name, const char *text, const moe_options *opts,
                                 const moe_tuning_t *table);

/* The packing behind moe_plan_pack_layout, moe_plan_pack and
 * moe_plan_pack_async, on a plan's tables without a device (the CPU tests):
 * slots is the bound on first + count. moe_pack_check checks the
 * arguments as those calls do (fn: the name errors cite). */
moe_status moe_pack_layout(const moe_plan_desc_t *pd, moe_layout layout, const void *src, const void *up, int first,
                           int count, moe_pack_args *args);
moe_status moe_pack_check(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *args, const void *dst,
                          const char *fn);
moe_status moe_pack_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *args, void *dst);
/* moe_pack_check for a packed tensor of R x C elements per slot (edst
 * bytes each) from sources of esrc-byte elements, R / 2 rows each for W1
 * and b1 (gate, up), R for W2 and b2: the fp8 packs' data and scales. */
moe_status moe_pack_check_dims(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *args, const void *dst,
                               const char *fn, long long R, long long C, int esrc, int edst);

/* The fp8 packs (runtime/pack_fp8.c; moe.h's moe_plan_pack_fp8 and
 * moe_plan_pack_quantize) on a plan's tables without a device. */
moe_status moe_pack_fp8_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *args,
                             const moe_pack_args *scales, void *dst, float *dst_scales);
moe_status moe_pack_quantize_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *args, void *dst,
                                  float *dst_scales);
/* ... and their device launches (moe_plan_pack_fp8_async, moe_plan_pack_quantize_async). */
moe_status moe_pack_fp8_device(const moe_plan *plan, long long slots, const moe_pack_args *args,
                               const moe_pack_args *scales, void *dst, float *dst_scales, void *stream);
moe_status moe_pack_quantize_device(const moe_plan *plan, long long slots, const moe_pack_args *args, void *dst,
                                    float *dst_scales, void *stream);

/* The plan's tables. */
const moe_plan_desc_t *moe_plan_desc(const moe_plan *plan);

#endif
