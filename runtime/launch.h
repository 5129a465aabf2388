/* launch.h — the narrow interface through which the runtime's parts (the
 * forward, the expert-parallel steps, the cuDNN path's self-check) launch
 * the plan's kernels: the loaded functions, the kernel descriptors and what
 * their grids and TMA maps need, never the whole plan. moe_launch_kernel is
 * the one function that launches them, each with its family's grid
 * (gen/family.h). Internal to libmoegen. */
#ifndef MOEGEN_LAUNCH_H
#define MOEGEN_LAUNCH_H

#include "driver.h"
#include "moe.h"
#include "plan.h"

typedef struct moe_launcher {
    const moe_plan_desc_t *pd;        /* the plan's tables: grids, the spec's shape */
    moe_arch_t arch;                  /* the device's arch: which kernel set runs */
    const moe_kernel_desc_t *kernels; /* a variant's set of arch, [MOE_K_COUNT]: moe_plan_kernels(pd, arch),
                                         the capacity's, in the plan's own launcher */
    CUfunction fn[MOE_K_COUNT];       /* kernel k in the plan's loaded module */
    const moe_kernel_desc_t *ep_kernels; /* the EP dispatch kernels (moe_plan_ep_desc(pd)->k, [MOE_EK_COUNT],
                                            family MOE_K_EP_FIRST + i); NULL when the plan has no EP part */
    CUfunction ep_fn[MOE_EK_COUNT];   /* ep_kernels[i] in the module */
    int sms;                          /* the device's multiprocessors: a persistent grid's size */
    int clusters;                     /* CTA pairs of the plan's "+mc" GEMMs resident at once (the fewest over
                                         them, the driver's occupancy answer): their grid's size; 0 = none */
    long long slots;                  /* weight slots the GEMMs' B operand spans (the mesh's held experts, then the shared expert's) */
    CUdeviceptr slot_table;           /* [slots] the slot of expert g's weights (then the shared expert's own), on the device */
    int slot_identity;                /* the slot table is the identity (expert g's weights at slot g) */
    const moe_kernel_desc_t *swiglu;  /* &pd->swiglu: the cuDNN path's standalone activation */
    CUfunction swiglu_fn;             /* it in the module; NULL when the module has none (a folder
                                         compiled before moegen emitted it) */
    const moe_kernel_desc_t *pack;    /* &pd->pack: the device-side weight pack */
    CUfunction pack8_fn, scales_fn, quantize_fn; /* with fp8 weights, the pack's NAME_e4m3, NAME_scales and
                                         NAME_quantize (templates/pack.lua); NULL otherwise */
    CUfunction pack_fn;               /* it in the module; NULL when the module has none (a folder
                                         compiled before moegen emitted it) */
    const moe_kernel_desc_t *bwd;     /* pd->bwd: the backward's own kernels (family MOE_K_BWD_FIRST + i);
                                         NULL when the plan has none (spec.training unset) */
    CUfunction bwd_fn[MOE_BK_COUNT];  /* bwd[i] in the module */
    const moe_kernel_desc_t *bgemm;   /* the backward GEMMs (moe_plan_bgemm(pd, arch), [MOE_BGEMM_COUNT], family
                                         MOE_K_BGEMM_FIRST + i); NULL when the spec has no training = true */
    CUfunction bgemm_fn[MOE_BGEMM_COUNT]; /* bgemm[i] in the module; NULL when the module lacks it */
    int align;                        /* the row block of kernels' tile table: their variant's (gen/plan.h,
                                         moe_plan_variant_t); the capacity's in the plan's own launcher */
    int pdl;                          /* 1: every launch is a programmatic dependent of the stream's previous
                                         kernel (MOEGEN_PDL=on on sm_90a; docs/DESIGN.md, "Launch overlap") */
} moe_launcher_t;

/* The M tiles l's GEMMs walk at most for `tokens` tokens (its row block). */
long long moe_launcher_tiles(const moe_launcher_t *l, int tokens);

/* The expert FFN stage's buffers over a tile table: gemm_up (+ SwiGLU) from
 * xs into hbuf, then gemm_down into out (which may alias xs: with fp8
 * weights out is bf16 [rows, H] over the e4m3 xs, which the down GEMM no
 * longer reads). grid_tiles > 0
 * sets the GEMMs' tile grid (at least the table's length); 0 = the plan's
 * max_tiles at `tokens`. offsets: each slot's first row (slot order), for
 * paths that take per-expert offsets instead of tiles. */
typedef struct {
    int tokens;
    long long grid_tiles;
    CUdeviceptr xs, tiles, num_tiles, offsets, hbuf, out;
    const void *w1p, *b1p, *w2, *b2;
    CUdeviceptr scratch;   /* the cuDNN path's workspace (moe_cudnn_workspace bytes); 0 = generated kernels only */
    CUdeviceptr ubuf;      /* a training plan's up GEMM also stores U [rows, 2F] here; 0 = not */
    /* fp8 weights (docs/DESIGN.md, "FP8"): xs and hbuf hold e4m3 rows, xsc
     * [rows, H/128] and hsc [rows, F/128] their scales (hsc written by the up
     * GEMM); w1p and w2 are e4m3, w1s and w2s their scales. Unread otherwise. */
    CUdeviceptr xsc, hsc;
    const float *w1s, *w2s;
    /* the split-K GEMMs' (tile.splitk > 0) partial tiles (MOE_WS_SPLITK) and zeroed tickets
     * (moe_splitk_tickets_at in the counts region); unread by the other grids */
    CUdeviceptr splitk, splitk_tickets;
    /* the combine folded into a gemv-grid down GEMM (gen/launch_geom.h, moe_combine_fuse_tokens): y non-0 asks
     * for it, with the routing's row_of and topk_w and the column slices' zeroed tickets (the counts region's
     * last moe_combine_tickets ints); the other grids ignore them */
    CUdeviceptr row_of, topk_w, y, combine_tickets;
    /* the chain (gen/family.h, moe_gemm_chains: an up GEMM on the "chain" grid): with y non-0 its one grid runs
     * the down GEMM and the combine too, chain_done its zeroed per-tile counters (moe_chain_done_at); with y 0
     * it is the stream grid's up GEMM */
    CUdeviceptr chain_done;
    /* the gathered up GEMM (gen/family.h, moe_gemm_gathers): x and the row tokens the scatter wrote instead of
     * xs (src_of 0: the call's scatter copied the rows, the kernel reads xs) */
    CUdeviceptr x, src_of;
} moe_ffn_args_t;

/* Launch the plan's kernel of family k on st with its family's grid
 * (moe_family_grid) for `tokens` tokens and n: a forward kernel
 * (MOE_K_ROUTE .. MOE_K_COMBINE, l->kernels), an EP dispatch kernel
 * (MOE_K_EP_SEND_PLAN .. MOE_K_EP_ROWS, l->ep_kernels), the cuDNN path's
 * activation (MOE_K_SWIGLU, l->swiglu), the weight pack (MOE_K_PACK,
 * l->pack), a backward kernel (MOE_K_BWD_DYS .. MOE_K_BWD_SLOT_ROWS,
 * l->bwd) or a backward GEMM (MOE_K_DGRAD_DOWN .. MOE_K_WGRAD_DOWN,
 * l->bgemm; runtime/bgemm.h). n is what the family walks besides tokens: the GEMMs' row
 * tiles (0: the plan's max tiles at `tokens`, for the forward's; the
 * expert-parallel path
 * sizes them from the receive side), ep_rows' staging rows, swiglu's rows
 * (0 is 0 rows: one block), pack's, bwd_unpack's and bwd_accum's elements,
 * bwd_colsum's columns; the other families ignore
 * it. The grid-stride grids (swiglu, pack, bwd_unpack, bwd_accum) are capped at 32
 * blocks per SM.
 * With tokens = 0 the kernels over the caller's tokens (route,
 * permute_scatter, ep_scatter, combine) are not launched (MOE_OK). ev (may be NULL; forward kernels only): events[k] is
 * recorded first. GEMM args are always (A, B, bias, tiles, num_tiles, out)
 * with A and B device pointers, and a training plan's up GEMM takes a
 * seventh, ubuf (NULL: U is not stored); the sm_90a GEMMs get A and B as TMA tensor
 * maps instead, made here, and run on a 1D grid over that tile space: one
 * CTA per tile, or at most one CTA per SM when the tile is persistent. */
moe_status moe_launch_kernel(const moe_launcher_t *l, int k, int tokens, long long n, CUstream st, void **args,
                             CUevent *ev);
/* moe_launch_kernel as a cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE: every CTA of the grid resident
 * at once, or the launch fails): the chained up GEMM, whose CTAs wait for each other's items. */
moe_status moe_launch_kernel_coop(const moe_launcher_t *l, int k, int tokens, long long n, CUstream st, void **args,
                                  CUevent *ev);

/* The route kernel's fused tail (templates/route.lua, "Fused"), as the
 * kernel takes it by value (the prelude's moe_route_fuse_t): mode
 * MOE_ROUTE_FUSE_* (gen/launch_geom.h); the permute plan's outputs and,
 * with mode 2, the scatter's. All zero: the kernel routes only. */
typedef struct {
    int mode, align;
    CUdeviceptr slot_of, offsets, cursor, tiles, num_tiles, xs, row_of, xsc; /* xsc: fp8's row scales */
} moe_route_fuse_args_t;

/* The route kernel's parameters after its ten fixed ones, in its order
 * (templates/route.lua): a sigmoid-gated shared expert's shared_gate, a
 * training plan's logits_out (*logits), given routing's topk_ids and, with
 * router.score = "given", topk_weights; router.input = "separate"'s
 * router_x; router.expert_scale's router_expert_scale. Appends them to args
 * from n on (room for 6: args holds 16) and returns the new count; the driver reads no more
 * than the kernel takes. */
static inline int moe_route_tail_args(const moe_spec_t *s, const moe_forward_args *a, const CUdeviceptr *logits,
                                      void **args, int n) {
    if (s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID)
        args[n++] = (void *)&a->shared_gate;
    if (s->training)
        args[n++] = (void *)logits;
    if (s->router.select == MOE_SELECT_GIVEN)
        args[n++] = (void *)&a->topk_ids;
    if (s->router.score == MOE_SCORE_GIVEN)
        args[n++] = (void *)&a->topk_weights;
    if (s->router.input == MOE_ROUTER_INPUT_SEPARATE)
        args[n++] = (void *)&a->router_x;
    if (s->router.expert_scale)
        args[n++] = (void *)&a->router_expert_scale;
    return n;
}

#endif
