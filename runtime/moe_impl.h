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
    int ptx_jit;            /* MOEGEN_ARCH=sm_80 on a newer GPU: the sm_80 kernels, loaded as PTX the driver compiles */
    CUcontext ctx;
    CUmodule module;
    int *slot_host;         /* [E] the routing table's slot of each expert's weights */
    struct moe_ep *ep;           /* the mesh: this rank, its groups, the dispatch path */
    struct moe_cudnn *cudnn;     /* the cuDNN path's decisions, graphs and kernels (never NULL once created) */
    moe_tuning_entry_t vtuned[MOE_PLAN_MAX_VARIANTS]; /* copies of the entries pd.variants[v].tuned (and
                                                          pd.tuned, the last's) point at: their table is freed */
    CUfunction vfn[MOE_PLAN_MAX_VARIANTS][MOE_K_COUNT]; /* pd.variants[v]'s kernels of the device's arch */
    int route_fuse;         /* calls of few tokens fold the permute plan (and scatter) into route: not with
                               MOEGEN_ROUTE_FUSE=off (read at creation) or expert parallelism (moe_plan_route_fuse) */
    int combine_fuse;       /* calls of few tokens on a gemv-grid down GEMM fold the combine into it: not with
                               MOEGEN_COMBINE_FUSE=off (read at creation) or expert parallelism (launch_geom.h) */
    int pdl;                /* launch overlap (docs/DESIGN.md, "Launch overlap"), MOEGEN_PDL read at creation: 0 off,
                               1 on (every call), 2 auto (the default: the calls whose variant's tuning entry says
                               +pdl); 0 on a device other than sm_90a. launcher.pdl is the capacity variant's */
    int gather;             /* the gathered up GEMM (docs/DESIGN.md), MOEGEN_GATHER read at creation: 0 off, 1 on
                               (every call its kernels allow), 2 auto (the default: launch_geom.h's
                               moe_gather_tokens too) */
};

/* The launcher a forward of `tokens` tokens runs (docs/DESIGN.md,
 * "Variants per call size"): the plan's, with the kernels, functions and
 * row block of the variant for `tokens` (moe_plan_pick_variant). The plan's
 * own (the capacity's variant) where the cuDNN path may run a stage (its
 * graphs are built for the capacity's rows) or with expert parallelism (one variant);
 * with train, unless the variant's row block is the plan's (the backward
 * reads the training forward's tile table with the plan's). */
void moe_plan_launcher_for(const moe_plan *p, int tokens, int train, moe_launcher_t *l);

/* The forward's argument checks (moe_forward's, the training forward's),
 * the messages prefixed with fn. */
moe_status moe_forward_check(const moe_plan *p, const moe_forward_args *a, const char *fn);

/* Launch the route kernel of a's tokens into the given regions; logits:
 * a training plan's logits output (0 = none), ignored by other plans;
 * fuse: its fused tail (NULL: none). */
moe_status moe_route_launch(const moe_plan *p, const moe_forward_args *a, CUdeviceptr topk_idx, CUdeviceptr topk_w,
                            CUdeviceptr counts, CUdeviceptr route_part, CUdeviceptr logits,
                            const moe_route_fuse_args_t *fuse, CUstream st, CUevent *ev);

/* Whether slot is the identity permutation of 0..n-1. */
int moe_slots_identity(const int *slot, int n);

/* Growable public structs (moe.h, "Growable structs"; runtime/abi.c).
 * moe_struct_in: the caller's struct at src (its struct_size first) into
 * dst, this library's struct of `ours` bytes: zeroed, then the caller's
 * bytes that both know copied; 0 reads as `v1` bytes (the first layout);
 * a longer struct whose unknown bytes are not 0 is MOE_ERR_INVALID_ARG.
 * moe_struct_out: this library's struct at src into the caller's at dst,
 * writing only its struct_size bytes (v1 for 0; bytes past ours zeroed);
 * dst's struct_size is left as the caller set it. `what` names the struct
 * in messages. */
moe_status moe_struct_in(void *dst, size_t ours, size_t v1, const void *src, const char *what);
moe_status moe_struct_out(void *dst, const void *src, size_t ours, size_t v1, const char *what);
/* The first layouts with struct_size (moe.h 0.1.0); never change these. */
#define MOE_OPTIONS_V1_SIZE (offsetof(moe_options, tuning_path) + sizeof(const char *))
#define MOE_PLAN_INFO_V1_SIZE (offsetof(moe_plan_info, cudnn_version) + sizeof(int))

#endif
