/* plan.c — tile choice, kernel names, launch shapes, workspace layout. */
#include "plan.h"
#include "tuning.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

#define WS_ALIGN 256

/* The tile heuristic. Expert row blocks are short when tokens*top_k/E is
 * small (Qwen3-style many-expert layers), so bm follows the mean rows per
 * expert; the rest is a configuration that keeps the mma.sync pipeline fed
 * on sm_80 and sm_90a alike. A tuning table entry's bm (force_bm > 0)
 * overrides the choice of bm, since both arches share one tile table. */
static moe_tile_cfg_t choose_tile(const moe_spec_t *s, int n_total, int force_bm) {
    double rows_per_expert = (double)s->tokens * s->top_k / s->experts;
    moe_tile_cfg_t t;
    if (force_bm ? force_bm == 128 : rows_per_expert >= 96) {
        t = (moe_tile_cfg_t){.bm = 128, .bn = 128, .bk = 32, .stages = 4, .warps_m = 2, .warps_n = 4, .group_m = 8};
    } else {
        t = (moe_tile_cfg_t){.bm = 64, .bn = 128, .bk = 32, .stages = 4, .warps_m = 2, .warps_n = 2, .group_m = 8};
    }
    (void)n_total;
    return t;
}

static int tile_smem(const moe_tile_cfg_t *t) {
    /* rows padded by 8 elements against bank conflicts */
    return t->stages * (t->bm + t->bn) * (t->bk + 8) * 2;
}

static void tile_suffix(char *out, size_t n, const moe_tile_cfg_t *t) {
    snprintf(out, n, "m%dn%dk%ds%dw%dx%dg%d", t->bm, t->bn, t->bk, t->stages, t->warps_m, t->warps_n, t->group_m);
}

int moe_plan_sm90_smem(const moe_tile_cfg_t *t, int out_cols) {
    int ring = t->stages * (t->bm + t->bn) * t->bk * 2;
    if (!t->persistent) /* the output tile, all columns in one pass, staged in the ring */
        return t->bm * (out_cols + 8) * 2 <= ring ? ring + 16 * t->stages : 0;
    int epi_cols = out_cols < 128 ? out_cols : 128;
    int staging = (t->bm * (epi_cols + 8) * 2 + 15) / 16 * 16;
    return ring + staging + 16 * t->stages;
}

long long moe_plan_max_rows(const moe_plan_desc_t *pd, int tokens) {
    const moe_spec_t *s = &pd->spec;
    return (long long)tokens * s->top_k + (long long)s->experts * (pd->align - 1);
}

long long moe_plan_max_tiles(const moe_plan_desc_t *pd, int tokens) {
    return moe_plan_max_rows(pd, tokens) / pd->align;
}

int moe_plan_desc_build(moe_plan_desc_t *pd, const moe_spec_t *s, char *err, size_t errlen) {
    return moe_plan_desc_build_with(pd, s, moe_tuning_active(), err, errlen);
}

int moe_plan_desc_build_with(moe_plan_desc_t *pd, const moe_spec_t *s, const moe_tuning_t *table, char *err,
                             size_t errlen) {
    memset(pd, 0, sizeof *pd);
    pd->spec = *s;
    pd->pair_granule = 8;
    const char *dt = moe_dtype_name(s->dtype);
    char suf[64];

    moe_kernel_desc_t *k = pd->k;
    k[MOE_K_ROUTE] = (moe_kernel_desc_t){.family = MOE_K_ROUTE, .tmpl = "route", .threads = 256, .per_block = 32};
    snprintf(k[MOE_K_ROUTE].name, sizeof k->name, "%s_route_%s_e%dk%d_t%d", s->name, dt, s->experts, s->top_k,
             k[MOE_K_ROUTE].per_block);
    if (s->experts > 1024) {
        snprintf(err, errlen, "experts (%d): the route kernel handles at most 1024 experts", s->experts);
        return 1;
    }
    if (s->experts > 256) /* logits of 32 tokens x E no longer fit 48 KB of static shared memory */
        k[MOE_K_ROUTE].smem = 20480 + 128 * ((s->experts + 255) / 256 * 256 + 8);

    const moe_tuning_entry_t *te = moe_tuning_find(table, s, MOE_ARCH_SM90A);
    pd->tuned = te;
    moe_tile_cfg_t up = choose_tile(s, 2 * s->ffn, te ? te->bm : 0), down = choose_tile(s, s->hidden, te ? te->bm : 0);
    down.bm = up.bm; /* one tile table serves both GEMMs */
    pd->align = up.bm;
    k[MOE_K_GEMM_UP] = (moe_kernel_desc_t){.family = MOE_K_GEMM_UP, .tmpl = "gemm_up_swiglu",
                                           .threads = 32 * up.warps_m * up.warps_n, .smem = tile_smem(&up),
                                           .tile = up};
    tile_suffix(suf, sizeof suf, &up);
    snprintf(k[MOE_K_GEMM_UP].name, sizeof k->name, "%s_gemm_up_swiglu_%s_%s", s->name, dt, suf);
    k[MOE_K_GEMM_DOWN] = (moe_kernel_desc_t){.family = MOE_K_GEMM_DOWN, .tmpl = "gemm_down",
                                             .threads = 32 * down.warps_m * down.warps_n, .smem = tile_smem(&down),
                                             .tile = down};
    tile_suffix(suf, sizeof suf, &down);
    snprintf(k[MOE_K_GEMM_DOWN].name, sizeof k->name, "%s_gemm_down_%s_%s", s->name, dt, suf);

    k[MOE_K_PERMUTE_PLAN] = (moe_kernel_desc_t){.family = MOE_K_PERMUTE_PLAN, .tmpl = "permute", .threads = 1024};
    snprintf(k[MOE_K_PERMUTE_PLAN].name, sizeof k->name, "%s_permute_plan_e%d_a%d", s->name, s->experts, pd->align);
    k[MOE_K_PERMUTE_SCATTER] = (moe_kernel_desc_t){.family = MOE_K_PERMUTE_SCATTER, .tmpl = "permute",
                                                   .threads = 256, .per_block = 8};
    snprintf(k[MOE_K_PERMUTE_SCATTER].name, sizeof k->name, "%s_permute_scatter_%s_h%d", s->name, dt, s->hidden);
    k[MOE_K_COMBINE] = (moe_kernel_desc_t){.family = MOE_K_COMBINE, .tmpl = "combine", .threads = 256,
                                           .per_block = 8};
    snprintf(k[MOE_K_COMBINE].name, sizeof k->name, "%s_combine_%s_h%dk%d", s->name, dt, s->hidden, s->top_k);

    /* sm_90a: the same kernels, but the GEMMs on wgmma with TMA operands
     * (templates/gemm_sm90.lua): one producer and bm/64 consumer warpgroups,
     * 128x256x64 tiles for bm 128, one CTA per tile, unless the tuning table
     * has an entry for this shape and token count (which may choose the
     * persistent grid) */
    memcpy(pd->k90, pd->k, sizeof pd->k);
    for (int i = MOE_K_GEMM_UP; i <= MOE_K_GEMM_DOWN; i++) {
        moe_kernel_desc_t *d = &pd->k90[i];
        d->tile = (moe_tile_cfg_t){.bm = pd->align, .bn = 256, .bk = 64, .stages = 4, .group_m = 8,
                                   .consumers = pd->align / 64};
        if (te)
            d->tile = (moe_tile_cfg_t){.bm = te->bm, .bn = te->bn, .bk = te->bk, .stages = te->stages,
                                       .group_m = te->group_m, .consumers = te->consumers,
                                       .persistent = te->persistent};
        d->threads = 128 * (d->tile.consumers + 1);
        d->smem = moe_plan_sm90_smem(&d->tile, i == MOE_K_GEMM_UP ? d->tile.bn / 2 : d->tile.bn);
        snprintf(suf, sizeof suf, "sm90a_tma_%sm%dn%dk%ds%dc%dg%d", d->tile.persistent ? "persist_" : "",
                 d->tile.bm, d->tile.bn, d->tile.bk, d->tile.stages, d->tile.consumers, d->tile.group_m);
        snprintf(d->name, sizeof d->name, "%s_%s_%s_%s", s->name, i == MOE_K_GEMM_UP ? "gemm_up_swiglu" : "gemm_down",
                 dt, suf);
    }
    pd->max_rows = moe_plan_max_rows(pd, s->tokens);
    pd->max_tiles = moe_plan_max_tiles(pd, s->tokens);
    if (pd->max_tiles > 65535) {
        snprintf(err, errlen, "the plan needs %lld row tiles of %d at %d tokens, more than a grid's 65535 rows; "
                 "lower tokens", pd->max_tiles, pd->align, s->tokens);
        return 1;
    }
    if (pd->max_rows > (1LL << 30)) {
        snprintf(err, errlen, "the plan needs %lld expert rows, more than 2^30", pd->max_rows);
        return 1;
    }
    long long E = s->experts, TK = (long long)s->tokens * s->top_k, R = pd->max_rows;
    size_t sizes[MOE_WS_COUNT] = {
        [MOE_WS_COUNTS] = 4 * E, [MOE_WS_OFFSETS] = 4 * (E + 1), [MOE_WS_CURSOR] = 4 * E,
        [MOE_WS_NUM_TILES] = 4, [MOE_WS_TILES] = 16 * (size_t)pd->max_tiles, [MOE_WS_TOPK_IDX] = 4 * TK,
        [MOE_WS_TOPK_W] = 4 * TK, [MOE_WS_ROW_OF] = 4 * TK, [MOE_WS_XS] = 2 * R * s->hidden,
        [MOE_WS_HBUF] = 2 * R * s->ffn,
    };
    static const char *const names[MOE_WS_COUNT] = {"counts", "offsets", "cursor", "num_tiles", "tiles",
                                                    "topk_idx", "topk_w", "row_of", "xs", "hbuf"};
    size_t off = 0;
    for (int i = 0; i < MOE_WS_COUNT; i++) {
        pd->ws[i] = (moe_ws_region_t){names[i], off, sizes[i]};
        off += (sizes[i] + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
    }
    pd->ws_bytes = off;
    return 0;
}

void moe_plan_grid(const moe_plan_desc_t *pd, moe_arch_t arch, int k, int tokens, unsigned grid[3]) {
    const moe_kernel_desc_t *d = &moe_plan_kernels(pd, arch)[k];
    const moe_spec_t *s = &pd->spec;
    unsigned tiles = (unsigned)moe_plan_max_tiles(pd, tokens);
    grid[0] = grid[1] = grid[2] = 1;
    switch ((moe_kfamily_t)k) {
    case MOE_K_ROUTE:
    case MOE_K_COMBINE:
        grid[0] = (unsigned)((tokens + d->per_block - 1) / d->per_block);
        break;
    case MOE_K_PERMUTE_PLAN:
        break;
    case MOE_K_PERMUTE_SCATTER:
        grid[0] = (unsigned)(((long long)tokens * s->top_k + d->per_block - 1) / d->per_block);
        break;
    case MOE_K_GEMM_UP:
        grid[0] = (unsigned)((2 * s->ffn + d->tile.bn - 1) / d->tile.bn);
        grid[1] = tiles;
        break;
    case MOE_K_GEMM_DOWN:
        grid[0] = (unsigned)((s->hidden + d->tile.bn - 1) / d->tile.bn);
        grid[1] = tiles;
        break;
    case MOE_K_COUNT:
        break;
    }
    if (grid[0] == 0)
        grid[0] = 1;
}

static void set_int(lua_State *L, const char *k, long long v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}
static void set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}
static void set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}
static void set_bool(lua_State *L, const char *k, int v) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

void moe_plan_push_params(lua_State *L, const moe_plan_desc_t *pd, moe_arch_t arch, int k) {
    const moe_kernel_desc_t *ks = moe_plan_kernels(pd, arch);
    const moe_spec_t *s = &pd->spec;
    lua_newtable(L);
    set_str(L, "name", s->name);
    set_str(L, "hash", s->hash);
    set_str(L, "dtype", moe_dtype_name(s->dtype));
    set_int(L, "E", s->experts);
    set_int(L, "K", s->top_k);
    set_int(L, "H", s->hidden);
    set_int(L, "F", s->ffn);
    set_int(L, "tokens", s->tokens);
    set_str(L, "score", s->router.score == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax");
    set_bool(L, "renormalize", s->router.renormalize);
    set_int(L, "groups", s->router.groups);
    set_int(L, "topk_groups", s->router.topk_groups);
    set_bool(L, "bias", s->router.bias);
    set_bool(L, "logit_bias", s->router.logit_bias);
    set_num(L, "scale", s->router.scale);
    set_num(L, "alpha", s->activation.alpha);
    if (s->activation.limit > 0)
        set_num(L, "limit", s->activation.limit);
    set_num(L, "up_offset", s->activation.up_offset);
    set_bool(L, "ffn_bias", s->ffn_bias);
    set_int(L, "align", pd->align);
    set_int(L, "pair_granule", pd->pair_granule);
    if (k >= 0) {
        const moe_kernel_desc_t *d = &ks[k];
        set_str(L, "arch", moe_arch_name(arch));
        set_str(L, "kernel", d->name);
        set_int(L, "threads", d->threads);
        set_int(L, "smem", d->smem);
        set_int(L, "per_block", d->per_block);
        if (k == MOE_K_PERMUTE_PLAN || k == MOE_K_PERMUTE_SCATTER) {
            /* the permute template emits both kernels */
            set_str(L, "plan_kernel", ks[MOE_K_PERMUTE_PLAN].name);
            set_int(L, "plan_threads", ks[MOE_K_PERMUTE_PLAN].threads);
            set_str(L, "scatter_kernel", ks[MOE_K_PERMUTE_SCATTER].name);
            set_int(L, "scatter_threads", ks[MOE_K_PERMUTE_SCATTER].threads);
            set_int(L, "scatter_rows", ks[MOE_K_PERMUTE_SCATTER].per_block);
        }
        if (k == MOE_K_GEMM_UP || k == MOE_K_GEMM_DOWN) {
            lua_newtable(L);
            set_int(L, "bm", d->tile.bm);
            set_int(L, "bn", d->tile.bn);
            set_int(L, "bk", d->tile.bk);
            set_int(L, "stages", d->tile.stages);
            set_int(L, "warps_m", d->tile.warps_m);
            set_int(L, "warps_n", d->tile.warps_n);
            set_int(L, "group_m", d->tile.group_m);
            set_int(L, "consumers", d->tile.consumers);
            set_int(L, "persistent", d->tile.persistent);
            lua_setfield(L, -2, "tile");
        }
    }
}
