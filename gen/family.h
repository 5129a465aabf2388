/* family.h — the kernel families: one descriptor per family, one table.
 *
 * A kernel family is one kind of kernel (route, the up GEMM, an EP dispatch
 * step, ...). Its descriptor is the one home of what C knows about it: the
 * canonical name (spelled from the parameters, as CUTLASS's
 * procedural_name), the template, the geometry (threads, dynamic shared
 * memory, rows per block, the GEMM tile), the grid for a token count and the
 * template parameters beyond the shared ones. A family's arch variants
 * (sm_80 mma.sync, sm_90a wgmma + TMA) are rows of its variant list, not
 * fields: planning picks the row that serves the arch.
 *
 * Homes: family.c (the table, the builder, the Lua setters),
 * family_route.c, family_permute.c, family_gemm.c (both GEMMs and the
 * sm_90a shared-memory formula), family_combine.c, family_ep.c (the four
 * dispatch kernels), family_swiglu.c (the cuDNN path's SwiGLU),
 * family_pack.c (the device-side weight pack), family_bwd.c (the
 * backward's kernels other than its grouped GEMMs), family_bgemm.c (the
 * four backward GEMMs). The planner
 * (plan.c, ep_plan.c) walks the table; emission, the manifest, the cache key
 * and the runtime read the kernel descriptors it fills. */
#ifndef MOEGEN_FAMILY_H
#define MOEGEN_FAMILY_H

#include "spec.h"

#include <lua.h>

/* Family ids. The forward's kernels come first, in launch order: a plan's
 * kernel set of an arch is indexed by these (moe_plan_kernels). */
typedef enum {
    MOE_K_ROUTE = 0,        /* logits, scores, top-k, weights, counts */
    MOE_K_PERMUTE_PLAN,     /* counts -> aligned offsets, tile table */
    MOE_K_PERMUTE_SCATTER,  /* token rows -> expert-major rows, row map */
    MOE_K_GEMM_UP,          /* [rows, H] x [H, 2F] + SwiGLU -> [rows, F] */
    MOE_K_GEMM_DOWN,        /* [rows, F] x [F, H] -> [rows, H] */
    MOE_K_COMBINE,          /* y[t] = sum_k w * out[row(t, k)] */
    /* the expert-parallel dispatch kernels (templates/ep.lua), in the order
     * of the EP plan's set (ep_plan.h, MOE_EK_*) */
    MOE_K_EP_SEND_PLAN,     /* counts -> send layout, per-peer counts */
    MOE_K_EP_SCATTER,       /* token rows -> send buffer, row map */
    MOE_K_EP_RECV_PLAN,     /* received counts -> chunk tables, tile table */
    MOE_K_EP_ROWS,          /* staging <-> slot-major rows */
    /* the cuDNN path's standalone activation: h = SwiGLU(u) over the packed
     * [rows, 2F] matmul output (reserved: not yet planned or emitted) */
    MOE_K_SWIGLU,
    /* the device-side weight pack: a checkpoint tensor (strided sources)
     * into slots of w1p, b1p, w2 or b2 (moe_plan_pack_async) */
    MOE_K_PACK,
    /* the backward's own kernels (templates/bwd.lua; planned only when
     * spec.training; the backward's grouped GEMMs are bgemm's, and U, when
     * it is recomputed, the forward's up GEMM's), in the order of the plan's
     * backward set (moe_plan_desc_t.bwd) */
    MOE_K_BWD_DYS,          /* dys[row] = w . dy[t], dw[t, k] = <dy[t], O[row]> */
    MOE_K_BWD_ROUTER,       /* dw -> dlogits [T, E] (renormalize, scale, softmax / sigmoid) */
    MOE_K_BWD_DX,           /* dx[t] = sum_k dXs[row(t, k)] + dlogits[t] . Wr */
    MOE_K_BWD_DWR,          /* d router_w = dlogits^T . x, d logit_bias = sum_t dlogits */
    MOE_K_BWD_COLSUM,       /* bias gradients: per-slot column sums of [rows, N] */
    MOE_K_BWD_UNPACK,       /* an fp32 packed W1 / b1 gradient -> the plain layout */
    MOE_K_BWD_ACCUM,        /* dst += src, fp32 (moe_reduce_scatter_grads' accumulate) */
    MOE_K_BWD_SLOT_ROWS,    /* an EP rank's rows per held slot from its receive layout's chunk rows */
    MOE_K_BWD_ESCALE,       /* d expert_scale[e] = sum of dw . w' over e's entries (router.expert_scale) */
    /* the backward GEMMs (family_bgemm.c, templates/gemm_grad.lua), planned
     * when the spec has training = true, in the order of the plan's
     * backward GEMM set (moe_plan_desc_t.bgemm, MOE_K_BGEMM_FIRST + i) and
     * of runtime/bgemm.h's kinds */
    MOE_K_DGRAD_DOWN,       /* dU = act'(Ur) . (dys [rows, H] x W2 [H, F]) -> [rows, 2F] */
    MOE_K_DGRAD_UP,         /* dXs = dU [rows, 2F] x W1p [2F, H] -> [rows, H] */
    MOE_K_WGRAD_UP,         /* dW1p[e] (+)= dU_e^T x xs_e, fp32 [2F, H] */
    MOE_K_WGRAD_DOWN,       /* dW2[e] (+)= dys_e^T x A_e, fp32 [H, F] */
    MOE_FAMILY_COUNT
} moe_kfamily_t;

/* The forward's kernels: a plan's per-arch set has this many. */
#define MOE_K_COUNT (MOE_K_COMBINE + 1)
/* The first EP family: EP set index i is family MOE_K_EP_FIRST + i. */
#define MOE_K_EP_FIRST MOE_K_EP_SEND_PLAN
/* The backward's own kernels: backward set index i is family MOE_K_BWD_FIRST + i. */
#define MOE_K_BWD_FIRST MOE_K_BWD_DYS
#define MOE_BK_COUNT (MOE_K_BWD_ESCALE - MOE_K_BWD_FIRST + 1)
/* The d router_w kernel's block tile (templates/bwd.lua reads them as
 * p.dwr_cols, p.dwr_experts): hidden columns x experts. */
#define MOE_BWD_DWR_COLS 256
#define MOE_BWD_DWR_EXPERTS 32
/* The backward's two router products (dx's Σ_e dlogits·Wr, d router_w's
 * dlogitsᵀ·x) run on tensor cores for bf16 specs (mma.sync on the three
 * bf16 parts of each fp32 d logit), on CUDA cores for fp16 ones
 * (templates/bwd.lua, p.router_mma). The dx kernel's block is then
 * MOE_BWD_DX_MMA_TOKENS tokens x MOE_BWD_DX_MMA_COLS columns; on CUDA cores
 * per_block tokens x 8 columns a thread (moe_bwd_dx_cols). */
#define MOE_BWD_DX_MMA_TOKENS 32
#define MOE_BWD_DX_MMA_COLS 256
static inline int moe_bwd_router_mma(const moe_spec_t *s) { return s->dtype == MOE_DTYPE_BF16; }
/* The backward GEMMs: set index i is family MOE_K_BGEMM_FIRST + i. */
#define MOE_K_BGEMM_FIRST MOE_K_DGRAD_DOWN
#define MOE_BGEMM_COUNT 4
/* moe_arch_t values (spec.h): a plan holds a kernel set for each. */
#define MOE_FAMILY_ARCHES 2

typedef struct {
    int bm, bn, bk;         /* CTA tile; for GEMM_UP, bn counts packed (gate+up) columns */
    int stages;             /* pipeline depth (cp.async on sm_80, the TMA ring on sm_90a) */
    int warps_m, warps_n;   /* sm_80: warp grid; warp tile = (bm/warps_m) x (bn/warps_n) */
    int group_m;            /* M tiles rastered together so they share weight tiles in L2 */
    int consumers;          /* sm_90a wgmma kernel: consumer warpgroups (0 = the mma.sync kernel) */
    int persistent;         /* sm_90a: 1 = about one CTA per SM walking the tiles, 0 = one CTA per tile */
    int pingpong;           /* sm_90a, persistent: the 2 consumer warpgroups take alternate whole bm x bn
                             * tiles, one's epilogue under the other's main loop (the "pingpong" grid) */
    int splitk;             /* sm_90a, one CTA per tile: 2..16 CTAs per tile, each over its share of the k
                             * tiles, the last to finish summing the fp32 partials (the "splitkS" grid);
                             * 0 = none */
    int gemv;               /* sm_90a: 1 = the "gemv" grid (templates/gemm_gemv.lua): a CTA per (bn weight
                             * rows, M tile), its rows in chunks of <= 8, two CTAs an SM, no tensor cores;
                             * consumers 0 (it launches as the sm_80 kernels do), stages = the K loop's
                             * unroll; 3 = "gemv3": rows in chunks of <= 2, three CTAs an SM (bf16 and fp16,
                             * bn >= 32, unroll <= 2); 6 = "gemv4": rows one at a time, four CTAs an SM
                             * (bf16 and fp16, bn >= 32, unroll <= 2); 4 = "stream": a persistent grid (a CTA an SM, or a few:
                             * moe_gemv_stream_ctas) whose CTAs split the (tile, 16-row block) items evenly,
                             * the weights streamed by bulk copies through a ring of `stages` stages (bf16
                             * and fp16, bn 16); 5 = "chain": stream, its up kernel running the down GEMM and
                             * the combine in the same grid (moe_gemm_chains) */
    int evict;              /* sm_90a TMA grids, the up GEMM only: its weight (B) boxes loaded with an L2
                             * evict_first policy (its tuning entry's "+ef"; templates/gemm_sm90.lua) */
    int cluster;            /* sm_90a persistent grids (bf16/fp16): the CTAs run in pairs (2-CTA clusters) over
                             * pairs of M tiles, a pair of one expert loading each weight tile once, multicast
                             * to both (its tuning entry's "+mc"; templates/gemm_sm90.lua); never gathers */
} moe_tile_cfg_t;

/* One planned kernel: what its family built for one spec and arch. */
typedef struct {
    moe_kfamily_t family;
    const char *tmpl;       /* template emission expands: "route" = templates/route.lua */
    char name[128];         /* the kernel symbol; spells its parameters */
    int threads;            /* block size */
    int smem;               /* dynamic shared memory, bytes */
    int per_block;          /* route/combine: tokens per block; scatters and ep_rows: rows per block */
    moe_tile_cfg_t tile;    /* GEMMs only */
} moe_kernel_desc_t;

/* Does planned kernel k, an up GEMM, gather its A rows from x through the
 * scatter's src map (moe_spec_gather; the sm_90a TMA grids only: tile,
 * persist, pingpong, splitk; not in CTA pairs, tile.cluster)? It then takes x and src_of after its other
 * arguments (templates/gemm_sm90.lua). */
static inline int moe_gemm_gathers(const moe_spec_t *s, const moe_kernel_desc_t *k) {
    return k->family == MOE_K_GEMM_UP && k->tile.consumers > 0 && !k->tile.gemv && !k->tile.cluster &&
           moe_spec_gather(s);
}

/* The gemv-family kernel's rows a chunk by tile.gemv (templates/gemm_gemv.lua, c.rows): gemv 8, gemv3 2, gemv4 1. */
static inline int moe_gemm_gemv_rows(int gemv) { return gemv == 3 ? 2 : gemv == 6 ? 1 : 8; }
/* Is tile t on a stream grid: "stream" (tile.gemv 4), or "chain" (5: stream, whose up kernel can run the
 * down GEMM and the combine after it in the same grid, moe_gemm_chains)? */
static inline int moe_tile_stream(const moe_tile_cfg_t *t) { return t->gemv == 4 || t->gemv == 5; }

/* Does planned kernel k, an up GEMM on the "chain" grid, carry the down
 * GEMM and the combine (templates/gemm_gemv.lua, "The chain")? Not in a
 * training plan (whose forward keeps U and combines apart). It then takes
 * w2, b2, obuf, row_of, topk_w, tokens, y, combine_tickets and chain_done
 * after its own arguments, and chains a call whose y is non-NULL. */
static inline int moe_gemm_chains(const moe_spec_t *s, const moe_kernel_desc_t *k) {
    return k->family == MOE_K_GEMM_UP && k->tile.gemv == 5 && !s->training;
}

/* The hidden columns a bwd_dx block owns (k: the planned dx kernel). */
static inline int moe_bwd_dx_cols(const moe_spec_t *s, const moe_kernel_desc_t *k) {
    return moe_bwd_router_mma(s) ? MOE_BWD_DX_MMA_COLS : 8 * k->threads;
}

/* A named region of a workspace. */
typedef struct {
    const char *name;
    size_t offset, bytes;
} moe_ws_region_t;

/* Lay out n regions (names[i], bytes[i]) one after another, each starting
 * on a 256-byte boundary, into ws; returns the workspace's total bytes. The
 * one home of the workspace alignment (the plan's and the EP plan's). */
size_t moe_ws_layout(moe_ws_region_t *ws, const char *const *names, const size_t *bytes, int n);

struct moe_tuning_entry;

/* What a family reads to plan a kernel: the spec, the arch, the plan's
 * choices so far. */
typedef struct {
    const moe_spec_t *spec;
    moe_arch_t arch;
    int align;                              /* expert row blocks align to this (= GEMM bm) */
    const struct moe_tuning_entry *tuned;   /* the sm_90a GEMM tiles the tuning table chose, or NULL */
    const struct moe_tuning_entry *btuned;  /* a backward GEMM's own entry (its stage, tuned's key), or NULL */
    int ep, nheld, capacity;                /* EP families: group size P, slots S, capacity C (0 = exact) */
} moe_family_ctx_t;

/* One arch variant of a family. */
typedef struct {
    unsigned archs;         /* bit 1u << arch for each arch it serves */
    const char *tmpl;       /* template emission expands (templates/<tmpl>.lua) */
    const char *code;       /* template holding the kernel code: the manifest's "template" */
    const char *engine;     /* how it computes ("mma.sync + cp.async", "wgmma + TMA"); NULL: arch-neutral */
    /* Fill k's threads, smem, per_block and tile for c. Returns 0, or
     * non-zero with the reason in err. */
    int (*geometry)(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen);
} moe_family_variant_t;

#define MOE_ALL_ARCHES ((1u << MOE_FAMILY_ARCHES) - 1)

typedef struct {
    moe_kfamily_t id;
    const char *name;       /* "route", "gemm_up_swiglu": the manifest's family, moegen plan's rows */
    const moe_family_variant_t *variants;
    int nvariants;
    /* The canonical kernel name of k (geometry filled), at most n bytes. */
    void (*spell)(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k);
    /* Grid of k for `tokens` tokens; n is what the family walks besides
     * tokens: the row tiles (GEMMs), the rows (ep_rows, swiglu), the packed
     * elements (pack). grid comes
     * in as {1, 1, 1}. */
    void (*grid)(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned grid[3]);
    /* Add the family's template parameters to the table on top of L (NULL:
     * none beyond the shared ones). set: the kernel set k belongs to (a
     * plan's set of k's arch, or the EP plan's set). */
    void (*push)(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set);
} moe_family_t;

/* The family table, indexed by id. */
const moe_family_t *moe_family(moe_kfamily_t id);

/* The variant of f that serves arch, or NULL. */
const moe_family_variant_t *moe_family_variant(const moe_family_t *f, moe_arch_t arch);

/* Plan kernel `id` for c into k: its variant for c->arch, the geometry, the
 * name. Returns 0, or non-zero with the reason in err. */
int moe_family_build(moe_kernel_desc_t *k, moe_kfamily_t id, const moe_family_ctx_t *c, char *err, size_t errlen);

/* Grid of planned kernel k (see moe_family_t.grid); never 0 blocks. */
void moe_family_grid(const moe_kernel_desc_t *k, const moe_spec_t *s, int tokens, long long n, unsigned grid[3]);

/* ---- the GEMM family's facts that the tuning table checks --------------- */

/* The sm_80 (mma.sync) GEMM geometry for c's row block: the tile, the
 * block, the cp.async pipeline's shared memory. The forward's GEMMs and
 * the backward's U GEMM (family_bwd.c) share it. */
int moe_gemm_sm80_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen);
/* The sm_80 mma.sync tile of a bm-row block (64: 2 x 2 warps; 128, 192, 256: bm / 64 x 4 warps of 64 x 32),
 * 128 x 32 x 4 stages; the forward GEMMs' and the backward GEMMs' alike. */
moe_tile_cfg_t moe_gemm_sm80_tile(int bm);

/* Dynamic shared memory of an sm_90a GEMM (templates/gemm_sm90.lua) with
 * tile t and out_cols output columns per tile (bn / 2 for the up
 * projection, bn for the down): the stage ring, the epilogue's staging
 * tile (its own only on a persistent grid, one per consumer warpgroup on
 * the pingpong grid; one CTA per tile stages the output in the ring) and
 * the mbarriers. 0 when the output tile does not fit in the ring. */
int moe_gemm_sm90_smem(const moe_tile_cfg_t *t, int out_cols);

/* Non-zero (with the reason in err) when the sm_90a wgmma template cannot
 * run tile t (bm, bn, bk, stages, consumers, group_m, persistent,
 * pingpong, splitk), or (tile.gemv) the gemv kernels the tile t. */
int moe_gemm_sm90_tile_check(const moe_tile_cfg_t *t, char *err, size_t errlen);
/* The same for an fp8 spec's tile (a tuning entry of dtype e4m3): bk 128 (one
 * scale block), bn 256 (the up GEMM's 128 output columns are one quantization
 * block), one or two consumer warpgroups of 64 rows (bm = 64 x consumers),
 * one CTA per tile, stages >= 2 within 227 KB. */
int moe_gemm_sm90_fp8_tile_check(const moe_tile_cfg_t *t, char *err, size_t errlen);

/* The sm_90a grid of tile t as the tuning table spells it ("tile",
 * "persist", "pingpong", "splitkS" or "gemv"), written into buf; returns buf. */
const char *moe_gemm_sm90_grid_name(const moe_tile_cfg_t *t, char buf[16]);
/* tile.gemv of a gemv-family grid's name ("gemv" 1, "gemv3" 3, "stream" 4, "chain" 5), 0 for any other name. */
int moe_gemm_gemv_grid(const char *name);

/* The gemv kernels' staged activation columns for reduction length K:
 * min(K, MOE_GEMV_KC) (8 rows x KC halves of shared memory, 64 KB at
 * most: three CTAs fit an SM; a longer K is staged in KC passes); with
 * fp8 weights (e4m3 rows, one byte an element) min(K, 2 MOE_GEMV_KC). */
#define MOE_GEMV_KC 4096
int moe_gemm_gemv_kc(long long K, int fp8);
/* The stream grid's K chunk (templates/gemm_gemv.lua, stream_code): a ring
 * stage is 16 weight rows x min(K, MOE_STREAM_KC) halves. */
#define MOE_STREAM_KC 1024
int moe_gemm_stream_kc(long long K);

/* The split-K scratch of GEMM k over mtiles M tiles (tile.splitk > 0; 0
 * and 0 otherwise): *partials fp32 values (a bm x bn partial tile per
 * tile and split) and *tickets ints (an arrival counter per tile). */
void moe_gemm_splitk_space(const moe_kernel_desc_t *k, const moe_spec_t *s, long long mtiles, long long *partials,
                           long long *tickets);

/* The expert row block (the GEMM bm, the plan's align) for spec s: the
 * tuning entry's bm when there is one, else the heuristic. */
int moe_gemm_row_block(const moe_spec_t *s, const struct moe_tuning_entry *tuned);

/* ---- the backward GEMMs' facts (family_bgemm.c) ------------------------ */

/* Dynamic shared memory of a backward GEMM (templates/gemm_grad.lua) with
 * tile t: stages x (the A tile, K-major [bm][bk + 8] for the dgrads or
 * M-major [bk][bm + 8] for the wgrads, + the N-major B tile [bk][bn + 8])
 * halves. */
int moe_bgemm_smem(const moe_tile_cfg_t *t, int wgrad);

/* The output shape of backward GEMM family f: rows M (0 for the dgrads,
 * whose rows are the tile table's) and columns N. */
void moe_bgemm_mn(moe_kfamily_t f, long long hidden, long long ffn, long long *M, long long *N);

/* Bytes of one element of the weight gradients dw1p and dw2 (spec
 * weight_grads): 4 (fp32) or 2 (the dtype). */
int moe_wgrad_elem_bytes(const moe_spec_t *s);

/* Non-zero (the reason in why) when t cannot be backward GEMM f's sm_90a
 * tile (a tuning table's backward entry, gen/tuning.h): the dgrads take
 * the forward GEMM's rules (moe_gemm_sm90_tile_check: tile, persist or
 * pingpong grids); the wgrads the persistent grid, bn 128 or 256 (two
 * staging passes of whole 128-byte boxes of fp32 or 2-byte gradients),
 * their accumulators in the register cap and their shared memory, counted
 * with fp32 gradients, in 227 KB. */
int moe_bgemm_sm90_tile_check(moe_kfamily_t f, const moe_tile_cfg_t *t, char *why, size_t n);

/* The backward GEMM family named `name` ("dgrad_down", "dgrad_up",
 * "wgrad_up", "wgrad_down"), or -1. */
int moe_bgemm_family(const char *name);

/* ---- Lua table setters: t[k] = v on the table on top of L --------------- */
void moe_lua_set_int(lua_State *L, const char *k, long long v);
void moe_lua_set_num(lua_State *L, const char *k, double v);
void moe_lua_set_str(lua_State *L, const char *k, const char *v);
void moe_lua_set_bool(lua_State *L, const char *k, int v);

#endif
