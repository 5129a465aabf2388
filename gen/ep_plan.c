/* ep_plan.c — the dispatch kernels' names, shapes and the EP workspace. */
#include "ep_plan.h"

#include <stdio.h>
#include <string.h>

#define WS_ALIGN 256

int moe_ep_wanted(const moe_spec_t *s) { return s->mesh.size[MOE_AXIS_EP] > 1; }

int moe_ep_desc_build(moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int nheld, char *err, size_t errlen) {
    const moe_spec_t *s = &pd->spec;
    memset(ed, 0, sizeof *ed);
    ed->ep = s->mesh.size[MOE_AXIS_EP];
    ed->nheld = nheld;
    ed->capacity = s->dispatch.mode == MOE_DISPATCH_CAPACITY ? s->dispatch.capacity : 0;
    long long P = ed->ep, S = nheld, TK = (long long)s->tokens * s->top_k, C = ed->capacity;
    if (P * S > 4096) {
        snprintf(err, errlen, "the EP group has %lld (rank, slot) positions (ep %lld x %lld slots); the dispatch "
                 "kernels handle at most 4096", P * S, P, S);
        return 1;
    }
    ed->send_rows = C ? P * C : TK;
    ed->stage_rows = C ? P * C : P * TK;
    ed->recv_rows = ed->stage_rows + S * (pd->align - 1);
    ed->max_tiles = ed->recv_rows / pd->align;
    if (ed->max_tiles > 65535) {
        snprintf(err, errlen, "a rank may receive %lld rows (%s), %lld row tiles of %d, more than a grid's 65535 "
                 "rows; lower tokens%s", ed->stage_rows, C ? "ep x dispatch.capacity" : "ep x tokens x top_k",
                 ed->max_tiles, pd->align, C ? " or dispatch.capacity" : " or use dispatch.mode = \"capacity\"");
        return 1;
    }

    const char *n = s->name;
    moe_kernel_desc_t *k = ed->k;
    k[MOE_EK_SEND_PLAN] = (moe_kernel_desc_t){.family = MOE_K_COUNT, .tmpl = "ep", .threads = 1024};
    snprintf(k[MOE_EK_SEND_PLAN].name, sizeof k->name, "%s_ep_send_plan_e%dp%llds%lldc%lld", n, s->experts, P, S, C);
    k[MOE_EK_SCATTER] = (moe_kernel_desc_t){.family = MOE_K_COUNT, .tmpl = "ep", .threads = 256, .per_block = 8};
    snprintf(k[MOE_EK_SCATTER].name, sizeof k->name, "%s_ep_scatter_%s_h%dk%dc%lld", n, moe_dtype_name(s->dtype),
             s->hidden, s->top_k, C);
    k[MOE_EK_RECV_PLAN] = (moe_kernel_desc_t){.family = MOE_K_COUNT, .tmpl = "ep", .threads = 1024};
    snprintf(k[MOE_EK_RECV_PLAN].name, sizeof k->name, "%s_ep_recv_plan_p%llds%lldc%lld_a%d", n, P, S, C, pd->align);
    k[MOE_EK_ROWS] = (moe_kernel_desc_t){.family = MOE_K_COUNT, .tmpl = "ep", .threads = 256, .per_block = 8};
    snprintf(k[MOE_EK_ROWS].name, sizeof k->name, "%s_ep_rows_h%dp%llds%lld", n, s->hidden, P, S);

    long long E = s->experts, PS = P * S, H = s->hidden, F = s->ffn;
    size_t sizes[MOE_EW_COUNT] = {
        [MOE_EW_COUNTS] = 4 * E, [MOE_EW_OFFSETS] = 4 * E, [MOE_EW_CURSOR] = 4 * E, [MOE_EW_TOPK_IDX] = 4 * TK,
        [MOE_EW_TOPK_W] = 4 * TK, [MOE_EW_ROW_OF] = 4 * TK, [MOE_EW_SLOT_COUNTS] = 4 * PS,
        [MOE_EW_RECV_COUNTS] = 4 * PS, [MOE_EW_SEND_COUNTS] = 4 * P, [MOE_EW_SEND_OFF] = 4 * (P + 1),
        [MOE_EW_CHUNK_SRC] = 4 * PS, [MOE_EW_CHUNK_DST] = 4 * PS, [MOE_EW_CHUNK_ROWS] = 4 * PS,
        [MOE_EW_SRC_BASE] = 4 * (P + 1), [MOE_EW_SLOT_OFF] = 4 * (S + 1), [MOE_EW_OVERFLOW] = 4,
        [MOE_EW_NUM_TILES] = 4, [MOE_EW_TILES] = 16 * (size_t)ed->max_tiles,
        [MOE_EW_SEND] = 2 * (size_t)(ed->send_rows + 1) * H, [MOE_EW_STAGE] = 2 * (size_t)ed->stage_rows * H,
        [MOE_EW_XR] = 2 * (size_t)ed->recv_rows * H, [MOE_EW_HBUF] = 2 * (size_t)ed->recv_rows * F,
    };
    static const char *const names[MOE_EW_COUNT] = {
        "counts", "offsets", "cursor", "topk_idx", "topk_w", "row_of", "slot_counts", "recv_counts",
        "send_counts", "send_off", "chunk_src", "chunk_dst", "chunk_rows", "src_base", "slot_off", "overflow",
        "num_tiles", "tiles", "send", "stage", "xr", "hbuf"};
    size_t off = 0;
    for (int i = 0; i < MOE_EW_COUNT; i++) {
        ed->ws[i] = (moe_ws_region_t){names[i], off, sizes[i]};
        off += (sizes[i] + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
    }
    ed->ws_bytes = off;
    return 0;
}

void moe_ep_grid(const moe_ep_desc_t *ed, const moe_plan_desc_t *pd, int k, int tokens, long long rows,
                 unsigned grid[3]) {
    const moe_kernel_desc_t *d = &ed->k[k];
    grid[0] = grid[1] = grid[2] = 1;
    if (k == MOE_EK_SCATTER)
        grid[0] = (unsigned)(((long long)tokens * pd->spec.top_k + d->per_block - 1) / d->per_block);
    else if (k == MOE_EK_ROWS)
        grid[0] = (unsigned)((rows + d->per_block - 1) / d->per_block);
    if (grid[0] == 0)
        grid[0] = 1;
}

static void set_int(lua_State *L, const char *k, long long v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}
static void set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

void moe_ep_push_params(lua_State *L, const moe_plan_desc_t *pd, const moe_ep_desc_t *ed) {
    moe_plan_push_params(L, pd, pd->spec.arch[0], -1);
    set_int(L, "P", ed->ep);
    set_int(L, "S", ed->nheld);
    set_int(L, "C", ed->capacity);
    set_int(L, "threads", ed->k[MOE_EK_SEND_PLAN].threads);
    set_int(L, "scatter_threads", ed->k[MOE_EK_SCATTER].threads);
    set_int(L, "rows_threads", ed->k[MOE_EK_ROWS].threads);
    set_int(L, "rows_per_block", ed->k[MOE_EK_SCATTER].per_block);
    set_str(L, "send_plan", ed->k[MOE_EK_SEND_PLAN].name);
    set_str(L, "scatter", ed->k[MOE_EK_SCATTER].name);
    set_str(L, "recv_plan", ed->k[MOE_EK_RECV_PLAN].name);
    set_str(L, "rows", ed->k[MOE_EK_ROWS].name);
}
