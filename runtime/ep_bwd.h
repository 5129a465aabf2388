/* ep_bwd.h — training on an expert-parallel rank (docs/DESIGN.md,
 * "Expert-parallel backward"): the training forward (ep.h's steps on the
 * EP saved region) and the backward as the forward's transfer lists
 * reversed, three steps:
 *
 *   0  home: dys = R(w·dy) and dw = <dy, O> per (t, k) at its send row;
 *      each held slot's rows (bwd_slot_rows); the dys rows go to the
 *      experts' owners (the dispatch's list: the send layout to the peers'
 *      staging buffers)
 *   1  expert side: the rows slot-major, the backward's grouped GEMMs and
 *      bias sums on the receive layout's tiles (U recomputed first when
 *      asked), dXs back to the staging layout; the dXs rows go home (the
 *      return's list)
 *   2  home: the router's gradient, dx (Σ_k of the returned rows + the
 *      router term), d router_w and d logit_bias
 *
 * In exact mode step 0 synchronizes the stream once to read the saved
 * counts, as the exact forward's step 1 does; in capacity mode every pair
 * moves C rows and nothing synchronizes. A (t, k) that capacity mode
 * dropped (its forward added nothing to y) gets no gradient. Internal. */
#ifndef MOEGEN_EP_BWD_H
#define MOEGEN_EP_BWD_H

#include "ep.h"

#define MOE_EP_BWD_STEPS 3

/* The identity slot table of a training EP plan's backward (ep->ident_dev;
 * nothing without training). Called by moe_ep_load. */
moe_status moe_ep_bwd_load(moe_ep_t *ep);

/* Step `step` (0 .. MOE_EP_BWD_STEPS-1) of the EP backward with the
 * arguments of moe_backward (checked by the caller): enqueue its kernels
 * on st through l (the plan's launcher) and list in c the transfers over
 * the EP group that must complete before the next step. c carries the
 * sizes read in step 0 to step 1. */
moe_status moe_ep_bwd_run_step(const moe_ep_t *ep, const moe_launcher_t *l, const moe_backward_args *a, CUstream st,
                               int step, moe_ep_call_t *c);

/* The home side's last steps of a backward, one device's or an EP rank's
 * (docs/DESIGN.md, "Backward", steps 6-7): with router.apply = "input" dw
 * from <x, dXs> (bwd_dys on x and the dXs rows); then d logits (bwd_router),
 * dx from the rows and the router term (bwd_dx), d router_w and d
 * logit_bias (bwd_dwr), as a's pointers and accumulate say. dxs: the dXs
 * rows that row_of indexes; the rest the saved routing, logits and the
 * backward's dw / d logits; scratch / scratch_bytes: the workspace's
 * dwr_part region, where bwd_dwr keeps its token splits' partial sums
 * (gen/launch_geom.h, moe_dwr_splits). */
moe_status moe_bwd_router_step(const moe_launcher_t *l, const moe_backward_args *a, int T, int input, CUdeviceptr dxs,
                               CUdeviceptr row_of, CUdeviceptr topk_w, CUdeviceptr topk_idx, CUdeviceptr logits,
                               CUdeviceptr dw, CUdeviceptr dlogits, CUdeviceptr scratch, size_t scratch_bytes,
                               CUstream st);

/* The training forward and the backward, the transfers done with NCCL on st. */
moe_status moe_ep_forward_train(const moe_ep_t *ep, const moe_launcher_t *l, const moe_train_forward_args *ta,
                                CUstream st);
moe_status moe_ep_backward(const moe_ep_t *ep, const moe_launcher_t *l, const moe_backward_args *a, CUstream st);

#endif
