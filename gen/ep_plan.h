/* ep_plan.h — the expert-parallel part of a plan: the dispatch kernels
 * (templates/ep.lua), their launch shapes, and the workspace layout of a
 * forward pass whose rows move between EP ranks (docs/expert-parallel.md,
 * docs/DESIGN.md "Expert-parallel forward"). Part of the plan (plan.h,
 * moe_plan_ep_desc), built with it when mesh.ep > 1; plain data, like it. */
#ifndef MOEGEN_EP_PLAN_H
#define MOEGEN_EP_PLAN_H

#include "family.h"

#include <lua.h>

typedef struct moe_plan_desc moe_plan_desc_t; /* plan.h */

/* The EP plan's kernel set, index i = family MOE_K_EP_FIRST + i (family.h,
 * family_ep.c). */
typedef enum {
    MOE_EK_SEND_PLAN = MOE_K_EP_SEND_PLAN - MOE_K_EP_FIRST,
    MOE_EK_SCATTER = MOE_K_EP_SCATTER - MOE_K_EP_FIRST,
    MOE_EK_RECV_PLAN = MOE_K_EP_RECV_PLAN - MOE_K_EP_FIRST,
    MOE_EK_ROWS = MOE_K_EP_ROWS - MOE_K_EP_FIRST,
    MOE_EK_COUNT
} moe_ep_kfamily_t;

typedef enum {
    /* first the regions of fixed size (their offsets the same for every call:
     * moe_plan_overflow reads MOE_EW_OVERFLOW without the call's tokens, and
     * second, after a region no training forward moves to its saved region,
     * at the same offset in moe_ep_train_ws_layout), then those that grow
     * with the call's tokens T (moe_ep_ws_layout) */
    MOE_EW_COUNTS = 0,      /* int [E]       routed rows per global expert, then the route tickets
                                             (MOE_ROUTE_SPLIT_BLOCKS ints); all zeroed before route */
    MOE_EW_OVERFLOW,        /* int [1]       capacity mode: rows past capacity, this call */
    MOE_EW_OFFSETS,         /* int [E]       first send row of each expert */
    MOE_EW_CURSOR,          /* int [E] */
    MOE_EW_SLOT_COUNTS,     /* int [P*S]     rows this rank sends to (peer, peer's slot) */
    MOE_EW_RECV_COUNTS,     /* int [P*S]     rows received from (source, my slot) */
    MOE_EW_SEND_COUNTS,     /* int [P] */
    MOE_EW_SEND_OFF,        /* int [P + 1] */
    MOE_EW_CHUNK_SRC,       /* int [P*S] */
    MOE_EW_CHUNK_DST,       /* int [P*S] */
    MOE_EW_CHUNK_ROWS,      /* int [P*S] */
    MOE_EW_SRC_BASE,        /* int [P + 1]   each source's first staging row */
    MOE_EW_SLOT_OFF,        /* int [S + 1]   each slot's first row (aligned) */
    MOE_EW_NUM_TILES,       /* int [1] */
    MOE_EW_ROUTE_PART,      /* float         route's split partial logits (moe_route_scratch_bytes) */
    /* the receive side: what the peers send, whatever this rank's T */
    MOE_EW_TILES,           /* int4 [max_tiles] */
    MOE_EW_STAGE,           /* half [stage_rows, H]     received rows as they arrive (source-major) */
    MOE_EW_XR,              /* half [recv_rows, H]      slot-major GEMM input; the down output reuses it */
    MOE_EW_HBUF,            /* half [recv_rows, F]; e4m3 with fp8 weights */
    /* fp8 weights (docs/DESIGN.md, "FP8"; 0 bytes otherwise): the rows in
     * stage, xr and hbuf are e4m3, and these their fp32 scales, one per 128
     * columns */
    MOE_EW_STAGE_SC,        /* float [stage_rows, H/128]  as received */
    MOE_EW_XSC,             /* float [recv_rows, H/128]   slot-major: the up GEMM's A scales */
    MOE_EW_HSC,             /* float [recv_rows, F/128]   the up GEMM's output's: the down GEMM's A scales */
    /* the send side, by T */
    MOE_EW_TOPK_IDX,        /* int [T, k] */
    MOE_EW_TOPK_W,          /* float [T, k] */
    MOE_EW_ROW_OF,          /* int [T, k]    send/return row of (t, k); the null row when dropped */
    MOE_EW_SEND,            /* half [send rows + 1, H]  send buffer, then the returned results; last row zero
                                             (moe_ep_send_rows); with fp8 weights the rows go out as e4m3
                                             [send rows, H] at its start and come home in bf16 */
    MOE_EW_SEND_SC,         /* float [send rows, H/128]  fp8: the scales of the e4m3 send rows */
    MOE_EW_COUNT
} moe_ep_ws_id_t;

typedef struct {
    int ep;                     /* P: EP group size */
    int nheld;                  /* S: expert slots per rank after the gather */
    int capacity;               /* C: rows per (source, destination) pair; 0 = exact mode */
    long long send_rows;        /* at spec.tokens (moe_ep_send_rows) */
    long long stage_rows;       /* exact: P*tokens*min(k, S) (every peer may send all its rows here); capacity: P*C */
    long long recv_rows;        /* stage_rows + S*(align - 1) */
    long long max_tiles;
    moe_kernel_desc_t k[MOE_EK_COUNT];
    moe_ws_region_t ws[MOE_EW_COUNT]; /* the workspace at spec.tokens (moe_ep_ws_layout) */
    size_t ws_bytes;
} moe_ep_desc_t;

/* Whether a spec's plan has an expert-parallel part (mesh.ep > 1). */
int moe_ep_wanted(const moe_spec_t *spec);

/* Build the EP part for a plan whose ranks hold nheld expert slots each
 * (moe_plan_desc_build calls it with the mesh plan's nheld). Reads pd's
 * spec, align and tiles. Returns 0, or non-zero with the reason in err. */
int moe_ep_desc_build(moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int nheld, char *err, size_t errlen);

/* Rows of the send buffer (the null row after them) for a call of `tokens`
 * tokens: tokens * top_k in exact mode, P * C in capacity mode (each peer's
 * block at a fixed place). */
long long moe_ep_send_rows(const moe_ep_desc_t *ed, const moe_spec_t *spec, int tokens);

/* The EP workspace for a call of `tokens` tokens (0 .. the spec's tokens)
 * into ws; returns its bytes. The send side grows with tokens; the receive
 * side (stage, xr, hbuf, the tile table) is what the peers may send, so it
 * stays at the plan's bound whatever this rank's tokens (in exact mode
 * every peer may send it all its spec.tokens * top_k rows: the counts are
 * known only after the exchange, when the workspace is already given, and a
 * rank that refused then would leave its peers waiting in NCCL). The
 * regions of fixed size come first, at the same offsets for every call.
 * The one home of the EP workspace's layout. */
size_t moe_ep_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens,
                        moe_ws_region_t ws[MOE_EW_COUNT]);

/* The workspace of an EP rank's training forward: moe_ep_ws_layout's
 * regions, but those that live in the saved region (moe_ep_saved_of) take
 * no bytes. */
size_t moe_ep_train_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens,
                              moe_ws_region_t ws[MOE_EW_COUNT]);

/* One part of the rows a dispatch step moves: rows of region `from` on the
 * sender land in region `to` on the receiver, `row_bytes` each, one
 * transfer per peer (runtime/ep.c lists them; docs/DESIGN.md,
 * "Expert-parallel forward"). */
typedef struct {
    int from, to;               /* moe_ep_ws_id_t */
    long long row_bytes;
} moe_ep_row_part_t;

#define MOE_EP_ROW_PARTS 2

/* The parts of a row on its way out (home = 0: send -> stage) or back
 * (home = 1: stage -> send), in the order they are listed; returns how
 * many. bf16 rows are one part of 2·H bytes each way. With fp8 weights a
 * row goes out as two: its e4m3 values (H bytes) and their fp32 scales
 * (4·H/128 bytes), as the home rank's scatter quantized it; it comes home
 * as the down GEMM's bf16 output (2·H). The one home of what a dispatched
 * row weighs. */
int moe_ep_row_parts(const moe_spec_t *spec, int home, moe_ep_row_part_t parts[MOE_EP_ROW_PARTS]);

/* Bytes one row moves on its way out (home = 0) or back (home = 1): the
 * sum of moe_ep_row_parts' parts. */
long long moe_ep_row_bytes(const moe_spec_t *spec, int home);

/* ---- training (docs/DESIGN.md, "Expert-parallel backward") ------------
 *
 * The saved region of an EP training forward: what the home side (the
 * tokens' owner) and the expert side keep for the backward. Each region
 * named after a workspace region (moe_ep_saved_of) is that region, moved
 * out of the workspace into the saved one: the forward writes it there. */
typedef enum {
    /* the expert side, at the receive bound whatever the rank's tokens */
    MOE_ES_SEND_COUNTS = 0,  /* int [P]        rows this rank sent to each peer (the exact backward's sizes) */
    MOE_ES_RECV_COUNTS,      /* int [P*S]      rows received from (source, my slot) */
    MOE_ES_CHUNK_SRC,        /* int [P*S]      the receive layout (ep.lua's recv_plan) */
    MOE_ES_CHUNK_DST,
    MOE_ES_CHUNK_ROWS,
    MOE_ES_SRC_BASE,         /* int [P + 1] */
    MOE_ES_SLOT_OFF,         /* int [S + 1] */
    MOE_ES_NUM_TILES,        /* int [1] */
    MOE_ES_TILES,            /* int4 [max_tiles] */
    MOE_ES_XR,               /* half [recv_rows, H]   received rows, slot-major (the up GEMM's input) */
    MOE_ES_HBUF,             /* half [recv_rows, F]   A */
    MOE_ES_U,                /* half [recv_rows, 2F]  U, packed columns; 0 bytes with recompute_u */
    MOE_ES_OR,               /* half [recv_rows, H]   the down output O, slot-major */
    /* the home side, by the rank's tokens T */
    MOE_ES_TOPK_IDX,         /* int [T, k] */
    MOE_ES_TOPK_W,           /* float [T, k] */
    MOE_ES_ROW_OF,           /* int [T, k]     send row of (t, k) */
    MOE_ES_LOGITS,           /* float [T, E]   the router's logits */
    MOE_ES_SEND,             /* half [send rows + 1, H]  the rows sent, then O as it came home */
    MOE_ES_COUNT
} moe_ep_saved_id_t;

/* The saved region kept for workspace region `ew` (MOE_EW_*), or -1 when
 * ew stays in the workspace. */
int moe_ep_saved_of(int ew);

/* The EP saved region of a training forward of `tokens` tokens into sv;
 * returns its bytes. The one home of its layout. */
size_t moe_ep_saved_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens, int recompute_u,
                           moe_ws_region_t sv[MOE_ES_COUNT]);

/* The bytes of the EP saved region each of the rank's tokens adds (the
 * home side's; the expert side's are at the receive bound, the layout at 0
 * tokens). */
size_t moe_ep_saved_per_token(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int recompute_u);

/* The EP backward's workspace. */
typedef enum {
    MOE_EB_SLOT_ROWS = 0,    /* int [S]        rows per slot (the wgrads' and bias sums' counts; from the host) */
    MOE_EB_STAGE,            /* half [stage_rows, H]  dys rows as they arrive, then dXs rows as they leave */
    MOE_EB_DYS,              /* half [recv_rows, H]   dys, slot-major */
    MOE_EB_DU,               /* half [recv_rows, 2F] */
    MOE_EB_DXS,              /* half [recv_rows, H]   dXs, slot-major */
    MOE_EB_U,                /* half [recv_rows, 2F]  the recomputed U (recompute_u; else 0 bytes) */
    MOE_EB_HOME,             /* half [send rows + 1, H]  home: dys in the send layout, then dXs as it came home */
    MOE_EB_DW,               /* float [T, k] */
    MOE_EB_DLOGITS,          /* float [T, E] */
    MOE_EB_DWR_PART,         /* float [splits, E, H (+1)]  bwd_dwr's token splits' sums (moe_dwr_part_bytes) */
    MOE_EB_COUNT
} moe_ep_bwd_id_t;

/* The EP backward's workspace at `tokens` into bw; returns its bytes. */
size_t moe_ep_bwd_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens, int recompute_u,
                            moe_ws_region_t bw[MOE_EB_COUNT]);

/* Grid of EP kernel k (rows: stage rows to walk, for MOE_EK_ROWS). */
void moe_ep_grid(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int k, int tokens, long long rows,
                 unsigned grid[3]);

/* Push the parameter table of templates/ep.lua onto L. */
void moe_ep_push_params(lua_State *L, const moe_plan_desc_t *pd, const moe_ep_desc_t *ed);

#endif
