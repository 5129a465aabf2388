/* moe_impl.h — the plan as the runtime's own files see it: its struct and
 * the functions they share (plan creation in moe_plan.c, launches in
 * moe_launch.c, the forward in moe_forward.c). Internal to libmoegen; the
 * tools use moe_internal.h. */
#ifndef MOEGEN_MOE_IMPL_H
#define MOEGEN_MOE_IMPL_H

#include "driver.h"
#include "moe.h"
#include "moe_internal.h"
#include "plan.h"
#include "tuning.h"

struct moe_cudnn;
struct moe_ep;

struct moe_plan {
    moe_plan_desc_t pd;
    moe_arch_t arch;
    int device;
    int cache_hit;
    CUcontext ctx;
    CUmodule module;
    CUfunction fn[MOE_K_COUNT];
    int *slot_host;         /* [E] the routing table's slot of each expert's weights */
    CUdeviceptr slot_dev;   /* the same, on the device, read by permute_plan */
    struct moe_ep *ep;           /* the mesh: this rank, its groups, the dispatch path */
    int slot_identity;      /* the routing table is the identity (expert g's weights at slot g) */
    struct moe_cudnn *cudnn;     /* the cuDNN path's decisions, graphs and kernels (never NULL once created) */
    moe_tuning_entry_t tuned; /* a copy of the tuning entry pd.tuned points at (its table is freed) */
    int sms;                /* the device's multiprocessors: a persistent grid's size */
};

/* Whether slot is the identity permutation of 0..n-1. */
int moe_slots_identity(const int *slot, int n);

/* Launch kernel k of the plan; rows_y > 0 replaces the GEMMs' tile grid
 * (the expert-parallel path sizes it from the receive side). GEMM args are
 * always (A, B, bias, tiles, num_tiles, out) with A and B device pointers;
 * the sm_90a GEMMs get A and B as TMA tensor maps instead, made here, and
 * run on a 1D grid over that tile space: one CTA per tile, or at most one
 * CTA per SM when the tile is persistent. */
moe_status moe_launch_grid(const moe_plan *p, int k, int tokens, long long rows_y, CUstream st, void **args,
                           CUevent *ev);

#endif
