/* family_ep.c — the expert-parallel dispatch kernels, all in
 * templates/ep.lua (docs/expert-parallel.md): send_plan (counts -> the
 * send layout and per-peer counts), scatter (token rows -> the send buffer),
 * recv_plan (received counts -> chunk tables and the tile table) and rows
 * (staging <-> slot-major rows). Their names spell the EP group: P ranks, S
 * slots per rank, capacity C (0: exact mode). */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int one_block(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 1024;
    return 0;
}

static int row_blocks(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    k->per_block = 8;
    return 0;
}

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    long long P = c->ep, S = c->nheld, C = c->capacity;
    switch (k->family) {
    case MOE_K_EP_SEND_PLAN:
        snprintf(out, n, "%s_ep_send_plan_e%dp%llds%lldc%lld", s->name, s->experts, P, S, C);
        break;
    case MOE_K_EP_SCATTER:
        /* with fp8 weights the rows go out quantized (e4m3 + a scale per 128 columns) */
        snprintf(out, n, "%s_ep_scatter_%s_h%dk%dc%lld", s->name, moe_spec_fp8(s) ? "e4m3" : moe_dtype_name(s->dtype),
                 s->hidden, s->top_k, C);
        break;
    case MOE_K_EP_RECV_PLAN:
        snprintf(out, n, "%s_ep_recv_plan_p%llds%lldc%lld_a%d", s->name, P, S, C, c->align);
        break;
    default:
        snprintf(out, n, "%s_ep_rows_%sh%dp%llds%lld", s->name, moe_spec_fp8(s) ? "e4m3_" : "", s->hidden, P, S);
        break;
    }
}

/* scatter: the routed (token, k) rows; rows: n staging rows */
static void scatter_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(moe_routed_rows(tokens, s->top_k), k->per_block);
}

static void rows_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)s, (void)tokens;
    g[0] = moe_blocks(n, k->per_block);
}

/* one expansion of templates/ep.lua emits the four kernels: set is the EP
 * plan's set, indexed from MOE_K_EP_FIRST */
static void push(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set) {
    (void)k;
    const moe_kernel_desc_t *sp = &set[MOE_K_EP_SEND_PLAN - MOE_K_EP_FIRST],
                            *sc = &set[MOE_K_EP_SCATTER - MOE_K_EP_FIRST],
                            *rp = &set[MOE_K_EP_RECV_PLAN - MOE_K_EP_FIRST], *rw = &set[MOE_K_EP_ROWS - MOE_K_EP_FIRST];
    moe_lua_set_int(L, "P", c->ep);
    moe_lua_set_int(L, "S", c->nheld);
    moe_lua_set_int(L, "C", c->capacity);
    moe_lua_set_int(L, "threads", sp->threads);
    moe_lua_set_int(L, "scatter_threads", sc->threads);
    moe_lua_set_int(L, "rows_threads", rw->threads);
    moe_lua_set_int(L, "rows_per_block", sc->per_block);
    moe_lua_set_str(L, "send_plan", sp->name);
    moe_lua_set_str(L, "scatter", sc->name);
    moe_lua_set_str(L, "recv_plan", rp->name);
    moe_lua_set_str(L, "rows", rw->name);
}

static const moe_family_variant_t one_block_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "ep", .code = "ep", .geometry = one_block},
};
static const moe_family_variant_t row_block_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "ep", .code = "ep", .geometry = row_blocks},
};

const moe_family_t moe_family_ep_send_plan = {.id = MOE_K_EP_SEND_PLAN, .name = "ep_send_plan",
                                              .variants = one_block_variants, .nvariants = 1, .spell = spell,
                                              .push = push};
const moe_family_t moe_family_ep_scatter = {.id = MOE_K_EP_SCATTER, .name = "ep_scatter",
                                            .variants = row_block_variants, .nvariants = 1, .spell = spell,
                                            .grid = scatter_grid, .push = push};
const moe_family_t moe_family_ep_recv_plan = {.id = MOE_K_EP_RECV_PLAN, .name = "ep_recv_plan",
                                              .variants = one_block_variants, .nvariants = 1, .spell = spell,
                                              .push = push};
const moe_family_t moe_family_ep_rows = {.id = MOE_K_EP_ROWS, .name = "ep_rows", .variants = row_block_variants,
                                         .nvariants = 1, .spell = spell, .grid = rows_grid, .push = push};
