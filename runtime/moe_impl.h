/* moe_impl.h — the plan as the runtime's own files see it: its struct and
 * the functions they share (plan creation and queries in moe_plan.c, the
 * forward in moe_forward.c). The parts below the plan (launch.h, ffn.h,
 * cudnn.h, ep.h) get its launcher, never the plan. Internal to libmoegen; the
 * tools use moe_internal.h. */
#ifndef MOEGEN_MOE_IMPL_H
#define MOEGEN_MOE_IMPL_H

#include "driver.h"
#include "launch.h"
#include "moe.h"
#include "moe_internal.h"
#include "plan.h"
#include "tuning.h"

struct moe_cudnn;
struct moe_ep;

struct moe_plan {
    moe_plan_desc_t pd;
    moe_launcher_t launcher; /* the kernels as launch.h launches them: arch, functions, SMs, slot table */
    int device;
    int cache_hit;
    CUcontext ctx;
    CUmodule module;
    int *slot_host;         /* [E] the routing table's slot of each expert's weights */
    struct moe_ep *ep;           /* the mesh: this rank, its groups, the dispatch path */
    struct moe_cudnn *cudnn;     /* the cuDNN path's decisions, graphs and kernels (never NULL once created) */
    moe_tuning_entry_t tuned; /* a copy of the tuning entry pd.tuned points at (its table is freed) */
};

/* The forward's argument checks (moe_forward's, the training forward's),
 * the messages prefixed with fn. */
moe_status moe_forward_check(const moe_plan *p, const moe_forward_args *a, const char *fn);

/* Launch the route kernel of a's tokens into the given regions; logits:
 * a training plan's logits output (0 = none), ignored by other plans. */
moe_status moe_route_launch(const moe_plan *p, const moe_forward_args *a, CUdeviceptr topk_idx, CUdeviceptr topk_w,
                            CUdeviceptr counts, CUdeviceptr route_part, CUdeviceptr logits, CUstream st, CUevent *ev);

/* Whether slot is the identity permutation of 0..n-1. */
int moe_slots_identity(const int *slot, int n);

#endif
