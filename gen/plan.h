/* plan.h — from a validated spec to the plan, built once: the kernels of
 * each arch (the family table walked, family.h), their tiles and launch
 * shapes, the workspace layout, the mesh tables (mesh.h) and, when
 * mesh.ep > 1, the expert-parallel part (ep_plan.h).
 *
 * The plan is plain data: emission, the JIT runtime and the vendored host
 * code all read their kernel names, tile sizes, grids and buffer offsets
 * from it; nothing re-plans. The tuning table is an argument: there is no
 * process-wide table. */
#ifndef MOEGEN_PLAN_H
#define MOEGEN_PLAN_H

#include "ep_plan.h"
#include "family.h"
#include "mesh.h"
#include "spec.h"
#include "tuning.h"

#include <lua.h>

typedef enum {
    /* E' = moe_spec_slots (the routed experts, then the shared expert's
     * slots), k' = moe_spec_entries (top_k, then one entry per shared slot) */
    MOE_WS_COUNTS = 0,      /* int [E']     tokens routed to each slot, then int [MOE_ROUTE_SPLIT_BLOCKS]
                                            the route tickets (gen/launch_geom.h); all zeroed before route */
    MOE_WS_OFFSETS,         /* int [E' + 1] first row of each slot, aligned to bm */
    MOE_WS_CURSOR,          /* int [E']     scatter cursors */
    MOE_WS_NUM_TILES,       /* int [1]      valid entries in the tile table */
    MOE_WS_TILES,           /* int4 [max_tiles] {expert, row_start, rows, 0}; max_tiles, max_rows and T
                                            at the call's tokens (moe_fwd_ws_layout) */
    MOE_WS_TOPK_IDX,        /* int [T, k'] */
    MOE_WS_TOPK_W,          /* float [T, k'] */
    MOE_WS_ROW_OF,          /* int [T, k']  row of (t, k) in expert-major order */
    MOE_WS_XS,              /* half [max_rows, H]  gathered rows; reused for the down output. With fp8
                                           weights the gathered rows are e4m3 [max_rows, H] (its first half),
                                           and the down output (bf16) still fills all of it. With zero
                                           experts T more rows: x[t] at row offsets[E'] + t for a token
                                           that selects one (the zero entries' output) */
    MOE_WS_HBUF,            /* half [max_rows, F]  SwiGLU output; with fp8 weights e4m3 [max_rows, F] */
    MOE_WS_ROUTE_PART,      /* float        route's split partial logits (moe_route_scratch_bytes) */
    MOE_WS_XSC,             /* float [max_rows, H/128]  with fp8 weights, the gathered rows' scales (else 0 bytes) */
    MOE_WS_HSC,             /* float [max_rows, F/128]  with fp8 weights, the SwiGLU output's scales (else 0 bytes) */
    MOE_WS_SPLITK,          /* float        the split-K GEMMs' partial tiles (moe_gemm_splitk_space), the most any
                                            variant a call may run needs; 0 bytes without split-K. Their
                                            tickets extend MOE_WS_COUNTS (moe_splitk_tickets_at) */
    MOE_WS_SRC_OF,          /* int [max_rows]  the token of each row, for the gathered up GEMM (moe_spec_gather;
                                            else 0 bytes): written by the scatter in calls that gather */
    MOE_WS_COUNT
} moe_ws_region_id_t;

/* The region a training forward saves for the backward (caller-owned,
 * laid out per call at its token count: moe_saved_layout). The training
 * forward runs its route, permute and FFN on these regions in place of the
 * workspace's, so nothing is copied. R = moe_plan_max_rows at the call's
 * tokens, TK = tokens * k'. */
typedef enum {
    MOE_SV_COUNTS = 0,      /* int [E'] + route tickets, as MOE_WS_COUNTS */
    MOE_SV_OFFSETS,         /* int [E' + 1] */
    MOE_SV_NUM_TILES,       /* int [1] */
    MOE_SV_TILES,           /* int4 [max_tiles] */
    MOE_SV_TOPK_IDX,        /* int [TK] */
    MOE_SV_TOPK_W,          /* float [TK] */
    MOE_SV_ROW_OF,          /* int [TK] */
    MOE_SV_LOGITS,          /* float [T, E]  the router's logits (logit_bias included) */
    MOE_SV_XS,              /* half [R, H]   gathered rows */
    MOE_SV_HBUF,            /* half [R, F]   A = act(U) */
    MOE_SV_OUT,             /* half [R, H]   O, the down output before weighting */
    MOE_SV_U,               /* half [R, 2F]  U, the pre-activation (packed columns); 0 bytes when recomputed */
    MOE_SV_COUNT
} moe_saved_region_id_t;

/* The backward's workspace (moe_bwd_ws_layout), per call at its tokens. */
typedef enum {
    MOE_BW_DYS = 0,         /* half [R, H]   w . dy gathered per row */
    MOE_BW_DU,              /* half [R, 2F]  d(gate, up) */
    MOE_BW_DXS,             /* half [R, H]   dU . W1p */
    MOE_BW_U,               /* half [R, 2F]  U recomputed; 0 bytes when the forward saved it */
    MOE_BW_DW,              /* float [TK]    d w[t, k] */
    MOE_BW_DLOGITS,         /* float [T, EL]  EL = moe_spec_router_columns: a sigmoid shared gate's dz in column E */
    MOE_BW_DWR_PART,        /* float [splits, EL, H (+1)]  bwd_dwr's token splits' sums (moe_dwr_part_bytes) */
    MOE_BW_COUNT
} moe_bwd_region_id_t;

/* The most GEMM variants a plan holds (the buckets of a shape past this
 * many, the smallest first, are left out: their calls run the next). */
#define MOE_PLAN_MAX_VARIANTS 16

/* One GEMM configuration of a plan, for a token regime (docs/DESIGN.md,
 * "Variants per call size"): the kernels whose code depends on the GEMM
 * tile — permute_plan (its row block), gemm_up and gemm_down of each arch —
 * and, for the others, the plan's. A call of T tokens runs the variant with
 * the largest bucket <= T, or the first when T is below every bucket
 * (moe_plan_pick_variant). */
typedef struct {
    int bucket;                      /* the tuning table's token bucket it came from; 0: the heuristics */
    int align;                       /* its expert row block (= its GEMM bm): permute_plan's, the tile table's */
    const moe_tuning_entry_t *tuned; /* the entry of the table passed its sm_90a GEMMs use, or NULL */
    int pdl;                         /* 1: its calls launch as programmatic dependents on sm_90a unless MOEGEN_PDL
                                        says otherwise (its entry's "+pdl"; docs/DESIGN.md, "Launch overlap") */
    moe_kernel_desc_t kernels[MOE_FAMILY_ARCHES][MOE_K_COUNT]; /* the whole forward set per arch, as pd->kernels */
} moe_plan_variant_t;

typedef struct moe_plan_desc {
    moe_spec_t spec;
    int align;                       /* expert row blocks align to this (= GEMM bm) in the capacity's variant */
    long long max_rows, max_tiles;   /* at spec.tokens, covering every variant (moe_plan_max_rows) */
    int pair_granule;                /* gate/up rows interleave in blocks of this many */
    moe_kernel_desc_t kernels[MOE_FAMILY_ARCHES][MOE_K_COUNT];  /* the forward's kernels, per arch (moe_arch_t),
                                        of the capacity's variant (variants[nvariants - 1]) */
    moe_kernel_desc_t swiglu;        /* the cuDNN path's standalone activation (family swiglu), arch-neutral */
    moe_kernel_desc_t pack;          /* the device-side weight pack (family pack), arch-neutral */
    int has_bwd;                     /* spec.training: bwd holds the backward's own kernels */
    moe_kernel_desc_t bwd[MOE_BK_COUNT]; /* family MOE_K_BWD_FIRST + i, arch-neutral */
    moe_kernel_desc_t bgemm[MOE_FAMILY_ARCHES][MOE_BGEMM_COUNT]; /* the backward GEMMs per arch (family
                                        MOE_K_BGEMM_FIRST + i), when spec.training; else zeroed (name "") */
    moe_ws_region_t ws[MOE_WS_COUNT]; /* the workspace at spec.tokens (moe_fwd_ws_layout) */
    size_t ws_bytes;
    const moe_tuning_entry_t *tuned; /* the entry of the table passed that the capacity's sm_90a GEMMs use, or NULL */
    moe_mesh_plan_t mesh;            /* the mesh tables: ranks, groups, ownership, the routing table */
    moe_ep_desc_t ep;                /* the expert-parallel part; valid when moe_ep_wanted(&spec) */
    int nvariants;                   /* 1 .. MOE_PLAN_MAX_VARIANTS */
    moe_plan_variant_t variants[MOE_PLAN_MAX_VARIANTS]; /* by bucket, ascending, no two neighbours equal; the
                                        last is the capacity's (align, tuned, kernels as above) */
} moe_plan_desc_t;

/* Build the plan of a validated spec into pd (which need not be
 * initialized): the kernels, with the sm_90a GEMM tiles from `table`'s
 * entries for the spec's shape, a variant per bucket up to the spec's
 * tokens (NULL table or no entry: one variant, the heuristics'; callers
 * that want the embedded table pass moe_tuning_default()), the workspace,
 * the mesh tables and the EP part. pd->tuned and the variants' tuned then
 * point into table, which must outlive that use. Returns 0, and the caller frees with
 * moe_plan_desc_free; or non-zero with a reason in err and pd empty (freeing
 * it is safe). */
int moe_plan_desc_build(moe_plan_desc_t *pd, const moe_spec_t *spec, const moe_tuning_t *table, char *err,
                        size_t errlen);

/* The forward's workspace for a call of `tokens` tokens (0 .. the spec's
 * tokens) into ws (names "counts", ..., each on a 256-byte boundary);
 * returns its bytes. full_rows: xs and hbuf span the rows of the plan's
 * whole capacity (the cuDNN path's graphs read and write them all) and
 * the tile table holds the capacity's variant's tiles (which that path
 * runs at every size), the rest still by `tokens`. Every region grows
 * with tokens, so a workspace laid out for T holds any call of fewer, of
 * any variant (moe_plan_max_rows). The one home of the forward
 * workspace's layout: the runtime lays it out per call, the plan (pd->ws)
 * and the vendored launcher at the capacity. */
size_t moe_fwd_ws_layout(const moe_plan_desc_t *pd, int tokens, int full_rows, moe_ws_region_t ws[MOE_WS_COUNT]);

/* The workspace of a training forward (moe_forward_train) of `tokens`
 * tokens: the forward's regions in the same order, but only the cursors and
 * route's split scratch take bytes; everything else it writes lives in the
 * saved region (moe_saved_layout). */
size_t moe_train_ws_layout(const moe_plan_desc_t *pd, int tokens, moe_ws_region_t ws[MOE_WS_COUNT]);

/* The saved region of a training forward of `tokens` tokens (0 .. the
 * spec's tokens) into sv (names "counts", "offsets", ..., each on a
 * 256-byte boundary); U takes 0 bytes when recompute_u. Returns the total
 * bytes. The one home of the saved region's layout. */
size_t moe_saved_layout(const moe_plan_desc_t *pd, int tokens, int recompute_u, moe_ws_region_t sv[MOE_SV_COUNT]);

/* The bytes of the saved region each token adds (its k' rows and its
 * routing entries and logits; the alignment padding of each slot's rows and
 * the tables are the rest, at most moe_saved_layout at 0 tokens plus
 * E' * (align - 1) rows). */
size_t moe_saved_per_token(const moe_plan_desc_t *pd, int recompute_u);

/* The backward's workspace at `tokens` into bw; returns its bytes. */
size_t moe_bwd_ws_layout(const moe_plan_desc_t *pd, int tokens, int recompute_u, moe_ws_region_t bw[MOE_BW_COUNT]);

/* Free what the plan owns (the mesh tables). Safe on an empty plan. */
void moe_plan_desc_free(moe_plan_desc_t *pd);

/* What the family table reads to plan or push kernel parameters for pd on
 * arch (the EP fields stay 0: the EP plan sets them). */
moe_family_ctx_t moe_plan_family_ctx(const moe_plan_desc_t *pd, moe_arch_t arch);

/* The plan's expert-parallel part, or NULL when mesh.ep is 1. */
static inline const moe_ep_desc_t *moe_plan_ep_desc(const moe_plan_desc_t *pd) {
    return moe_ep_wanted(&pd->spec) ? &pd->ep : NULL;
}

/* The kernels of one arch. */
static inline const moe_kernel_desc_t *moe_plan_kernels(const moe_plan_desc_t *pd, moe_arch_t arch) {
    return pd->kernels[arch];
}

/* Rows and tiles a workspace holds for `tokens` tokens (tokens <=
 * spec.tokens): the most that any variant a call of at most `tokens` may
 * run needs (rows grow with the row block, tiles shrink with it): those up
 * to its pick, and with training = true the capacity's (a training forward
 * may run it); so a workspace laid out for T serves every call of T or
 * fewer, whichever variant it runs. Non-decreasing in tokens. (Where the
 * cuDNN path runs, the capacity's variant at every size,
 * moe_fwd_ws_layout's full_rows adds its tiles.) */
long long moe_plan_max_rows(const moe_plan_desc_t *pd, int tokens);
long long moe_plan_max_tiles(const moe_plan_desc_t *pd, int tokens);

/* The variant a call of `tokens` tokens runs: the one with the largest
 * bucket <= tokens, or the first (index 0 .. nvariants - 1). */
int moe_plan_pick_variant(const moe_plan_desc_t *pd, int tokens);

/* The tiles variant v's GEMMs walk at most for `tokens` tokens (its own
 * row block): their grid's M tiles. */
long long moe_plan_variant_tiles(const moe_plan_desc_t *pd, int v, int tokens);

/* Grid of kernel k of arch for `tokens` tokens (the family's grid,
 * family.h). For the sm_90a GEMMs (tile.consumers > 0) this is the tile
 * space (N tiles x M tiles); they run on a 1D grid of grid[0] * grid[1] CTAs
 * (one per tile), or of min(grid[0] * grid[1], SMs) when tile.persistent. */
void moe_plan_grid(const moe_plan_desc_t *pd, moe_arch_t arch, int k, int tokens, unsigned grid[3]);

/* Push the template parameter table `p` for kernel k of arch onto L
 * (k < 0: the parameters every template shares). */
void moe_plan_push_params(lua_State *L, const moe_plan_desc_t *pd, moe_arch_t arch, int k);

/* As moe_plan_push_params for kernel k of variant v's set of arch (p.align
 * the variant's row block). */
void moe_plan_push_variant(lua_State *L, const moe_plan_desc_t *pd, int v, moe_arch_t arch, int k);

/* As moe_plan_push_params, for planned kernel d of arch (a member of the
 * kernel set `set` its family's push reads). */
void moe_plan_push_kernel(lua_State *L, const moe_plan_desc_t *pd, moe_arch_t arch, const moe_kernel_desc_t *d,
                          const moe_kernel_desc_t *set);

/* The backward GEMMs of one arch ([MOE_BGEMM_COUNT]), or NULL when the
 * spec has no training = true. */
static inline const moe_kernel_desc_t *moe_plan_bgemm(const moe_plan_desc_t *pd, moe_arch_t arch) {
    return pd->spec.training ? pd->bgemm[arch] : NULL;
}

/* The shared expert's split (spec.h, moe_spec_shared_slots): plain W1 row r
 * (0 <= r < 2F: gate rows then up rows) of shared slot j is row
 * moe_plan_shared_w1_row(s, j, r) of the unsplit shared W1 [2F_s, H] (gate
 * row jF + r, or up row F_s + jF + r - F), and W2 column f of slot j is
 * column jF + f of the unsplit W2 [H, F_s]. */
static inline long long moe_plan_shared_w1_row(const moe_spec_t *s, long long j, long long r) {
    long long F = s->ffn;
    return r < F ? j * F + r : s->shared.ffn + j * F + (r - F);
}

#endif
