/* ep_plan.c — the dispatch kernels' names, shapes and the EP workspace. */
#include "ep_plan.h"
#include "launch_geom.h"
#include "plan.h"

#include <stdio.h>
#include <string.h>

int moe_ep_wanted(const moe_spec_t *s) { return s->mesh.size[MOE_AXIS_EP] > 1; }

int moe_ep_desc_build(moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int nheld, char *err, size_t errlen) {
    const moe_spec_t *s = &pd->spec;
    memset(ed, 0, sizeof *ed);
    ed->ep = s->mesh.size[MOE_AXIS_EP];
    ed->nheld = nheld;
    ed->capacity = s->dispatch.mode == MOE_DISPATCH_CAPACITY ? s->dispatch.capacity : 0;
    long long P = ed->ep, S = nheld, C = ed->capacity;
    if (P * S > 4096) {
        snprintf(err, errlen, "mesh: the EP group has %lld (rank, slot) positions (ep %lld x %lld slots); the dispatch "
                 "kernels handle at most 4096", P * S, P, S);
        return 1;
    }
    ed->send_rows = moe_ep_send_rows(ed, s, s->tokens);
    /* exact: every peer may send all its tokens' rows here, a token at most
     * min(top_k, S) of them (its top_k experts are distinct, and one rank
     * holds S slots) */
    ed->stage_rows = C ? P * C : P * (long long)s->tokens * (s->top_k < S ? s->top_k : S);
    ed->recv_rows = ed->stage_rows + S * (pd->align - 1);
    ed->max_tiles = ed->recv_rows / pd->align;
    if (ed->max_tiles > 65535) {
        snprintf(err, errlen, "%s: a rank may receive %lld rows (%s), %lld row tiles of %d, more than a grid's "
                 "65535 rows; lower tokens%s", C ? "dispatch" : "tokens", ed->stage_rows,
                 C ? "ep x dispatch.capacity" : "ep x tokens x min(top_k, slots per rank)", ed->max_tiles, pd->align,
                 C ? " or dispatch.capacity" : " or use dispatch.mode = \"capacity\"");
        return 1;
    }

    moe_family_ctx_t ctx = moe_plan_family_ctx(pd, s->arch[0]);
    ctx.ep = ed->ep, ctx.nheld = nheld, ctx.capacity = ed->capacity;
    for (int i = 0; i < MOE_EK_COUNT; i++)
        if (moe_family_build(&ed->k[i], (moe_kfamily_t)(MOE_K_EP_FIRST + i), &ctx, err, errlen))
            return 1;

    ed->ws_bytes = moe_ep_ws_layout(ed, pd, s->tokens, ed->ws);
    return 0;
}

long long moe_ep_send_rows(const moe_ep_desc_t *ed, const moe_spec_t *s, int tokens) {
    return ed->capacity ? (long long)ed->ep * ed->capacity : (long long)tokens * s->top_k;
}

static void ep_ws_sizes(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens,
                        size_t sizes_out[MOE_EW_COUNT]) {
    const moe_spec_t *s = &pd->spec;
    long long P = ed->ep, S = ed->nheld, E = s->experts, PS = P * S, H = s->hidden, F = s->ffn;
    long long TK = (long long)tokens * s->top_k, send = moe_ep_send_rows(ed, s, tokens);
    /* fp8 weights: e4m3 rows with a scale per 128 columns in stage, xr and
     * hbuf (send, stage and xr keep 2 bytes an element for the bf16 results) */
    const int fp8 = moe_spec_fp8(s);
    const size_t hsc = fp8 ? 4 * (size_t)(H / MOE_FP8_BLOCK) : 0, fsc = fp8 ? 4 * (size_t)(F / MOE_FP8_BLOCK) : 0;
    size_t sizes[MOE_EW_COUNT] = {
        [MOE_EW_COUNTS] = 4 * (E + MOE_ROUTE_TICKETS), [MOE_EW_OFFSETS] = 4 * E, [MOE_EW_CURSOR] = 4 * E,
        [MOE_EW_SLOT_COUNTS] = 4 * PS, [MOE_EW_RECV_COUNTS] = 4 * PS, [MOE_EW_SEND_COUNTS] = 4 * P,
        [MOE_EW_SEND_OFF] = 4 * (P + 1), [MOE_EW_CHUNK_SRC] = 4 * PS, [MOE_EW_CHUNK_DST] = 4 * PS,
        [MOE_EW_CHUNK_ROWS] = 4 * PS, [MOE_EW_SRC_BASE] = 4 * (P + 1), [MOE_EW_SLOT_OFF] = 4 * (S + 1),
        [MOE_EW_OVERFLOW] = 4, [MOE_EW_NUM_TILES] = 4,
        [MOE_EW_ROUTE_PART] = (size_t)moe_route_scratch_bytes(pd->kernels[s->arch[0]][MOE_K_ROUTE].per_block,
                                                              moe_spec_route_mma_columns(s),
                                                              moe_spec_router_hidden(s)),
        [MOE_EW_TILES] = 16 * (size_t)ed->max_tiles, [MOE_EW_STAGE] = 2 * (size_t)ed->stage_rows * H,
        [MOE_EW_XR] = 2 * (size_t)ed->recv_rows * H, [MOE_EW_HBUF] = (fp8 ? 1 : 2) * (size_t)ed->recv_rows * F,
        [MOE_EW_STAGE_SC] = hsc * (size_t)ed->stage_rows, [MOE_EW_XSC] = hsc * (size_t)ed->recv_rows,
        [MOE_EW_HSC] = fsc * (size_t)ed->recv_rows, [MOE_EW_SEND_SC] = hsc * (size_t)send,
        [MOE_EW_TOPK_IDX] = 4 * TK, [MOE_EW_TOPK_W] = 4 * TK, [MOE_EW_ROW_OF] = 4 * TK,
        [MOE_EW_SEND] = 2 * (size_t)(send + 1) * H,
    };
    memcpy(sizes_out, sizes, sizeof sizes);
}

static const char *const ep_ws_names[MOE_EW_COUNT] = {
    "counts", "overflow", "offsets", "cursor", "slot_counts", "recv_counts", "send_counts", "send_off", "chunk_src",
    "chunk_dst", "chunk_rows", "src_base", "slot_off", "num_tiles", "route_part", "tiles", "stage",
    "xr", "hbuf", "stage_sc", "xsc", "hsc", "topk_idx", "topk_w", "row_of", "send", "send_sc"};

size_t moe_ep_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens,
                        moe_ws_region_t ws[MOE_EW_COUNT]) {
    size_t sizes[MOE_EW_COUNT];
    ep_ws_sizes(ed, pd, tokens, sizes);
    return moe_ws_layout(ws, ep_ws_names, sizes, MOE_EW_COUNT);
}

size_t moe_ep_train_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens,
                              moe_ws_region_t ws[MOE_EW_COUNT]) {
    size_t sizes[MOE_EW_COUNT];
    ep_ws_sizes(ed, pd, tokens, sizes);
    for (int i = 0; i < MOE_EW_COUNT; i++)
        if (moe_ep_saved_of(i) >= 0)
            sizes[i] = 0;
    return moe_ws_layout(ws, ep_ws_names, sizes, MOE_EW_COUNT);
}

int moe_ep_row_parts(const moe_spec_t *s, int home, moe_ep_row_part_t parts[MOE_EP_ROW_PARTS]) {
    const long long H = s->hidden;
    if (home || !moe_spec_fp8(s)) { /* bf16 rows (the results come home in bf16 with fp8 weights too) */
        parts[0] = home ? (moe_ep_row_part_t){MOE_EW_STAGE, MOE_EW_SEND, 2 * H}
                        : (moe_ep_row_part_t){MOE_EW_SEND, MOE_EW_STAGE, 2 * H};
        return 1;
    }
    parts[0] = (moe_ep_row_part_t){MOE_EW_SEND, MOE_EW_STAGE, H};                           /* e4m3 */
    parts[1] = (moe_ep_row_part_t){MOE_EW_SEND_SC, MOE_EW_STAGE_SC, 4 * (H / MOE_FP8_BLOCK)}; /* fp32 scales */
    return 2;
}

long long moe_ep_row_bytes(const moe_spec_t *s, int home) {
    moe_ep_row_part_t parts[MOE_EP_ROW_PARTS];
    long long b = 0;
    for (int i = 0, n = moe_ep_row_parts(s, home, parts); i < n; i++)
        b += parts[i].row_bytes;
    return b;
}

/* ---- training ------------------------------------------------------------ */

static const int saved_from_ws[MOE_ES_COUNT] = {
    [MOE_ES_SEND_COUNTS] = MOE_EW_SEND_COUNTS, [MOE_ES_RECV_COUNTS] = MOE_EW_RECV_COUNTS,
    [MOE_ES_CHUNK_SRC] = MOE_EW_CHUNK_SRC, [MOE_ES_CHUNK_DST] = MOE_EW_CHUNK_DST,
    [MOE_ES_CHUNK_ROWS] = MOE_EW_CHUNK_ROWS, [MOE_ES_SRC_BASE] = MOE_EW_SRC_BASE, [MOE_ES_SLOT_OFF] = MOE_EW_SLOT_OFF,
    [MOE_ES_NUM_TILES] = MOE_EW_NUM_TILES, [MOE_ES_TILES] = MOE_EW_TILES, [MOE_ES_XR] = MOE_EW_XR,
    [MOE_ES_HBUF] = MOE_EW_HBUF, [MOE_ES_U] = -1, [MOE_ES_OR] = -1, [MOE_ES_TOPK_IDX] = MOE_EW_TOPK_IDX,
    [MOE_ES_TOPK_W] = MOE_EW_TOPK_W, [MOE_ES_ROW_OF] = MOE_EW_ROW_OF, [MOE_ES_LOGITS] = -1,
    [MOE_ES_SEND] = MOE_EW_SEND,
};

int moe_ep_saved_of(int ew) {
    for (int i = 0; i < MOE_ES_COUNT; i++)
        if (saved_from_ws[i] == ew && ew >= 0)
            return i;
    return -1;
}

size_t moe_ep_saved_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens, int recompute_u,
                           moe_ws_region_t sv[MOE_ES_COUNT]) {
    static const char *const names[MOE_ES_COUNT] = {
        "send_counts", "recv_counts", "chunk_src", "chunk_dst", "chunk_rows", "src_base", "slot_off", "num_tiles",
        "tiles", "xr", "hbuf", "u", "out", "topk_idx", "topk_w", "row_of", "logits", "send"};
    const moe_spec_t *s = &pd->spec;
    moe_ws_region_t wr[MOE_EW_COUNT];
    moe_ep_ws_layout(ed, pd, tokens, wr);
    size_t sizes[MOE_ES_COUNT];
    for (int i = 0; i < MOE_ES_COUNT; i++)
        sizes[i] = saved_from_ws[i] >= 0 ? wr[saved_from_ws[i]].bytes : 0;
    sizes[MOE_ES_U] = recompute_u ? 0 : 2 * (size_t)ed->recv_rows * 2 * (size_t)s->ffn;
    sizes[MOE_ES_OR] = 2 * (size_t)ed->recv_rows * (size_t)s->hidden;
    sizes[MOE_ES_LOGITS] = 4 * (size_t)tokens * (size_t)s->experts;
    return moe_ws_layout(sv, names, sizes, MOE_ES_COUNT);
}

size_t moe_ep_saved_per_token(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int recompute_u) {
    moe_ws_region_t one[MOE_ES_COUNT], none[MOE_ES_COUNT];
    moe_ep_saved_layout(ed, pd, 1, recompute_u, one);
    moe_ep_saved_layout(ed, pd, 0, recompute_u, none);
    size_t n = 0;
    for (int i = 0; i < MOE_ES_COUNT; i++)
        n += one[i].bytes - none[i].bytes;
    return n;
}

size_t moe_ep_bwd_ws_layout(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int tokens, int recompute_u,
                            moe_ws_region_t bw[MOE_EB_COUNT]) {
    static const char *const names[MOE_EB_COUNT] = {"slot_rows", "stage", "dys", "du", "dxs", "u", "home", "dw",
                                                    "dlogits", "dwr_part"};
    const moe_spec_t *s = &pd->spec;
    const size_t R = (size_t)ed->recv_rows, H = (size_t)s->hidden, F = (size_t)s->ffn,
                 TK = (size_t)tokens * (size_t)s->top_k;
    size_t sizes[MOE_EB_COUNT] = {
        [MOE_EB_SLOT_ROWS] = 4 * (size_t)ed->nheld, [MOE_EB_STAGE] = 2 * (size_t)ed->stage_rows * H,
        [MOE_EB_DYS] = 2 * R * H, [MOE_EB_DU] = 4 * R * F, [MOE_EB_DXS] = 2 * R * H,
        [MOE_EB_U] = recompute_u ? 4 * R * F : 0,
        [MOE_EB_HOME] = 2 * (size_t)(moe_ep_send_rows(ed, s, tokens) + 1) * H, [MOE_EB_DW] = 4 * TK,
        [MOE_EB_DLOGITS] = 4 * (size_t)tokens * (size_t)s->experts,
        [MOE_EB_DWR_PART] = moe_dwr_part_bytes(tokens, moe_spec_router_columns(s), moe_spec_dwr_columns(s), s->hidden),
    };
    return moe_ws_layout(bw, names, sizes, MOE_EB_COUNT);
}

void moe_ep_grid(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int k, int tokens, long long rows,
                 unsigned grid[3]) {
    moe_family_grid(&ed->k[k], &pd->spec, tokens, rows, grid);
}

void moe_ep_push_params(lua_State *L, const moe_plan_desc_t *pd, const moe_ep_desc_t *ed) {
    moe_plan_push_params(L, pd, pd->spec.arch[0], -1);
    moe_family_ctx_t ctx = moe_plan_family_ctx(pd, pd->spec.arch[0]);
    ctx.ep = ed->ep, ctx.nheld = ed->nheld, ctx.capacity = ed->capacity;
    moe_family(MOE_K_EP_FIRST)->push(L, &ctx, &ed->k[0], ed->k);
}
