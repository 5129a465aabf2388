/* plan.c — the kernel plan: the family table walked per arch, the
 * workspace layout. */
#include "plan.h"

#include "launch_geom.h"
#include "pack_geom.h"
#include "tuning.h"

#include <stdio.h>
#include <string.h>

moe_family_ctx_t moe_plan_family_ctx(const moe_plan_desc_t *pd, moe_arch_t arch) {
    return (moe_family_ctx_t){.spec = &pd->spec, .arch = arch, .align = pd->align, .tuned = pd->tuned};
}

int moe_plan_pick_variant(const moe_plan_desc_t *pd, int tokens) {
    int v = 0;
    for (int i = 1; i < pd->nvariants; i++)
        if (pd->variants[i].bucket <= tokens)
            v = i;
    return v;
}

/* the row block of variant v (the plan's while the variants are planned) */
static int variant_align(const moe_plan_desc_t *pd, int v) {
    return pd->nvariants ? pd->variants[v].align : pd->align;
}

/* Whether a call of `tokens` tokens may run variant v: those up to its
 * pick (a call below the first bucket runs the first), and with
 * training = true the capacity's, which a training forward runs where the
 * pick's row block is not the backward's (runtime/moe_plan.c,
 * moe_plan_launcher_for). */
static int may_run(const moe_plan_desc_t *pd, int v, int tokens) {
    return v <= moe_plan_pick_variant(pd, tokens) || (pd->spec.training && v == pd->nvariants - 1);
}

/* The most rows (tiles = 0) or tiles any variant a call of `tokens` may run needs. */
static long long max_over_variants(const moe_plan_desc_t *pd, int tokens, int tiles) {
    long long m = 0;
    for (int v = 0; v < (pd->nvariants ? pd->nvariants : 1); v++)
        if (may_run(pd, v, tokens)) {
            long long n = (tiles ? moe_max_tiles : moe_max_rows)(tokens, moe_spec_entries(&pd->spec),
                                                                 moe_spec_slots(&pd->spec), variant_align(pd, v));
            m = n > m ? n : m;
        }
    return m;
}

long long moe_plan_max_rows(const moe_plan_desc_t *pd, int tokens) { return max_over_variants(pd, tokens, 0); }

long long moe_plan_max_tiles(const moe_plan_desc_t *pd, int tokens) { return max_over_variants(pd, tokens, 1); }

/* The split-K scratch a call of `tokens` tokens may need: the most partial
 * floats and tickets over the GEMMs of every variant it may run (cap: the
 * capacity's too, as the cuDNN path runs it), at that variant's tiles
 * (moe_gemm_splitk_space; the tickets' place: moe_splitk_tickets_at). */
static void splitk_space(const moe_plan_desc_t *pd, int tokens, int cap, long long *partials, long long *tickets) {
    static const int gemms[2] = {MOE_K_GEMM_UP, MOE_K_GEMM_DOWN};
    *partials = *tickets = 0;
    for (int v = 0; v < pd->nvariants; v++)
        for (int a = 0; a < MOE_FAMILY_ARCHES && (may_run(pd, v, tokens) || (cap && v == pd->nvariants - 1)); a++)
            for (int i = 0; i < 2; i++) {
                long long p, t;
                moe_gemm_splitk_space(&pd->variants[v].kernels[a][gemms[i]], &pd->spec,
                                      moe_plan_variant_tiles(pd, v, tokens), &p, &t);
                *partials = p > *partials ? p : *partials;
                *tickets = t > *tickets ? t : *tickets;
            }
}

long long moe_plan_variant_tiles(const moe_plan_desc_t *pd, int v, int tokens) {
    return moe_max_tiles(tokens, moe_spec_entries(&pd->spec), moe_spec_slots(&pd->spec), variant_align(pd, v));
}

/* Whether two variants run the same kernels the same way (then the later
 * one is dropped: its calls run the earlier, the same code). */
static int same_variant(const moe_plan_variant_t *a, const moe_plan_variant_t *b) {
    if (a->align != b->align || a->pdl != b->pdl)
        return 0;
    for (int ar = 0; ar < MOE_FAMILY_ARCHES; ar++)
        for (int k = 0; k < MOE_K_COUNT; k++)
            if (strcmp(a->kernels[ar][k].name, b->kernels[ar][k].name) != 0)
                return 0;
    return 1;
}

/* The GEMM variants (docs/DESIGN.md, "Variants per call size"): one per
 * bucket of the spec's shape in table up to its tokens, neighbours that
 * plan the same kernels merged; one from the heuristics when the table has
 * none. Then the capacity's (the last) becomes pd->align, tuned, kernels. */
static int plan_variants(moe_plan_desc_t *pd, const moe_tuning_t *table, char *err, size_t errlen) {
    const moe_spec_t *s = &pd->spec;
    int buckets[MOE_PLAN_MAX_VARIANTS];
    int nb = moe_tuning_buckets(table, s, MOE_ARCH_SM90A, buckets, MOE_PLAN_MAX_VARIANTS);
    if (nb == 0)
        buckets[nb++] = 0;
    if (moe_ep_wanted(s) && nb > 1) /* expert parallelism runs the capacity's variant alone (ep_plan.c reads
                                       pd->align) */
        buckets[0] = buckets[nb - 1], nb = 1;
    pd->nvariants = 0;
    for (int b = 0; b < nb; b++) {
        moe_plan_variant_t *v = &pd->variants[pd->nvariants];
        memset(v, 0, sizeof *v);
        v->bucket = buckets[b];
        /* an fp8 spec takes the entries of dtype e4m3 alone, its bf16 twin's never (gen/tuning.c) */
        v->tuned = buckets[b] ? moe_tuning_find_tokens(table, s, MOE_ARCH_SM90A, buckets[b]) : NULL;
        v->align = moe_gemm_row_block(s, v->tuned); /* one tile table serves both GEMMs and both arches */
        v->pdl = v->tuned ? v->tuned->pdl : 0;
        /* every arch gets every forward family, in its variant for that arch */
        for (int a = 0; a < MOE_FAMILY_ARCHES; a++) {
            moe_family_ctx_t ctx = {.spec = s, .arch = (moe_arch_t)a, .align = v->align, .tuned = v->tuned};
            for (int k = 0; k < MOE_K_COUNT; k++)
                if (moe_family_build(&v->kernels[a][k], (moe_kfamily_t)k, &ctx, err, errlen))
                    return 1;
        }
        if (pd->nvariants == 0 || !same_variant(&pd->variants[pd->nvariants - 1], v))
            pd->nvariants++;
    }
    const moe_plan_variant_t *cap = &pd->variants[pd->nvariants - 1];
    pd->tuned = cap->tuned;
    pd->align = cap->align;
    memcpy(pd->kernels, cap->kernels, sizeof pd->kernels);
    return 0;
}

static int build(moe_plan_desc_t *pd, const moe_spec_t *s, const moe_tuning_t *table, char *err, size_t errlen) {
    memset(pd, 0, sizeof *pd);
    pd->spec = *s;
    pd->pair_granule = MOE_PAIR_GRANULE;
    if (plan_variants(pd, table, err, errlen))
        return 1;
    /* the backward GEMMs: the capacity's row block, and the table's backward entries completing the entry of
     * the spec's tokens (the capacity variant's, or one it merged with: the same tiles) */
    const moe_tuning_entry_t *cap_entry = moe_tuning_find(table, s, MOE_ARCH_SM90A);
    for (int a = 0; a < MOE_FAMILY_ARCHES; a++) {
        moe_family_ctx_t ctx = moe_plan_family_ctx(pd, (moe_arch_t)a);
        for (int i = 0; s->training && i < MOE_BGEMM_COUNT; i++) {
            ctx.btuned = moe_tuning_find_bgemm(table, cap_entry, MOE_K_BGEMM_FIRST + i);
            if (moe_family_build(&pd->bgemm[a][i], (moe_kfamily_t)(MOE_K_BGEMM_FIRST + i), &ctx, err, errlen))
                return 1;
        }
    }
    moe_family_ctx_t neutral = moe_plan_family_ctx(pd, s->arch[0]);
    if (moe_family_build(&pd->swiglu, MOE_K_SWIGLU, &neutral, err, errlen) ||
        moe_family_build(&pd->pack, MOE_K_PACK, &neutral, err, errlen))
        return 1;
    for (int i = 0; s->training && i < MOE_BK_COUNT; i++) /* the backward's own kernels */
        if (moe_family_build(&pd->bwd[i], (moe_kfamily_t)(MOE_K_BWD_FIRST + i), &neutral, err, errlen))
            return 1;
    pd->has_bwd = s->training;
    pd->max_rows = moe_plan_max_rows(pd, s->tokens);
    pd->max_tiles = moe_plan_max_tiles(pd, s->tokens);
    if (pd->max_tiles > 65535) {
        snprintf(err, errlen, "tokens (%d): the plan needs %lld row tiles of %d, more than a grid's 65535 rows; "
                 "lower tokens", s->tokens, pd->max_tiles, pd->align);
        return 1;
    }
    if (pd->max_rows > (1LL << 30)) {
        snprintf(err, errlen, "tokens (%d): the plan needs %lld expert rows, more than 2^30", s->tokens, pd->max_rows);
        return 1;
    }
    pd->ws_bytes = moe_fwd_ws_layout(pd, s->tokens, 0, pd->ws); /* at the capacity: the vendored launcher's */
    if (moe_mesh_plan_build(&pd->mesh, &pd->spec, err, errlen))
        return 1;
    return moe_ep_wanted(s) && moe_ep_desc_build(&pd->ep, pd, pd->mesh.nheld, err, errlen);
}

int moe_plan_desc_build(moe_plan_desc_t *pd, const moe_spec_t *s, const moe_tuning_t *table, char *err,
                        size_t errlen) {
    int rc = build(pd, s, table, err, errlen);
    if (rc)
        moe_plan_desc_free(pd);
    return rc;
}

static const char *const fwd_ws_names[MOE_WS_COUNT] = {"counts", "offsets", "cursor", "num_tiles", "tiles",
                                                       "topk_idx", "topk_w", "row_of", "xs", "hbuf",
                                                       "route_part", "xsc", "hsc", "splitk", "src_of"};

/* Whether some variant's down GEMM runs on the gemv grid (its combine's
 * tickets then end the counts region: moe_combine_tickets). */
static int has_gemv_down(const moe_plan_desc_t *pd) {
    for (int v = 0; v < pd->nvariants; v++)
        for (int a = 0; a < MOE_FAMILY_ARCHES; a++)
            if (pd->variants[v].kernels[a][MOE_K_GEMM_DOWN].tile.gemv)
                return 1;
    return 0;
}

static void fwd_ws_sizes(const moe_plan_desc_t *pd, int tokens, int full_rows, size_t sizes_out[MOE_WS_COUNT]) {
    /* counts, offsets and cursors per weight slot, and top_k + m entries per
     * token (the shared expert's m slots included: spec.h) */
    const moe_spec_t *s = &pd->spec;
    long long E = moe_spec_slots(s), TK = (long long)tokens * moe_spec_entries(s);
    long long R = moe_plan_max_rows(pd, full_rows ? s->tokens : tokens);
    /* the cuDNN path runs the capacity's variant at every size (moe_plan_launcher_for): its tiles too */
    long long tiles = moe_plan_max_tiles(pd, tokens), cap_tiles = moe_plan_variant_tiles(pd, pd->nvariants - 1, tokens);
    if (full_rows && pd->nvariants && cap_tiles > tiles)
        tiles = cap_tiles;
    /* fp8 weights (docs/DESIGN.md, "FP8"): the rows into the up GEMM and the
     * activation into the down GEMM are e4m3 (one byte) with an fp32 scale
     * per 128 columns; xs keeps two bytes per element, since the down GEMM
     * writes its bf16 output there */
    const int fp8 = moe_spec_fp8(s);
    /* zero experts (docs/DESIGN.md, "Zero experts"): the scatter copies x[t] of a token that selects one into
     * row offsets[E'] + t of xs, past the routed rows, where combine reads it as that entry's output */
    const long long zero_rows = s->zero_experts ? tokens : 0;
    long long sk_partials, sk_tickets;
    splitk_space(pd, tokens, full_rows, &sk_partials, &sk_tickets);
    size_t sizes[MOE_WS_COUNT] = {
        [MOE_WS_COUNTS] = 4 * (size_t)(moe_splitk_tickets_at((int)E) + sk_tickets +
                                       (has_gemv_down(pd) ? moe_combine_tickets(s->hidden) : 0)),
        [MOE_WS_OFFSETS] = 4 * (E + 1), [MOE_WS_CURSOR] = 4 * E,
        [MOE_WS_NUM_TILES] = 4, [MOE_WS_TILES] = 16 * (size_t)tiles,
        [MOE_WS_TOPK_IDX] = 4 * TK, [MOE_WS_TOPK_W] = 4 * TK, [MOE_WS_ROW_OF] = 4 * TK,
        [MOE_WS_XS] = 2 * (R + zero_rows) * s->hidden, [MOE_WS_HBUF] = (fp8 ? 1 : 2) * R * s->ffn,
        [MOE_WS_ROUTE_PART] = (size_t)moe_route_scratch_bytes(pd->kernels[s->arch[0]][MOE_K_ROUTE].per_block,
                                                              moe_spec_route_mma_columns(s),
                                                              moe_spec_router_hidden(s)),
        [MOE_WS_XSC] = fp8 ? 4 * (size_t)R * (s->hidden / MOE_FP8_BLOCK) : 0,
        [MOE_WS_HSC] = fp8 ? 4 * (size_t)R * (s->ffn / MOE_FP8_BLOCK) : 0,
        [MOE_WS_SPLITK] = 4 * (size_t)sk_partials,
        [MOE_WS_SRC_OF] = moe_spec_gather(s) ? 4 * (size_t)R : 0,
    };
    memcpy(sizes_out, sizes, sizeof sizes);
}

size_t moe_fwd_ws_layout(const moe_plan_desc_t *pd, int tokens, int full_rows, moe_ws_region_t ws[MOE_WS_COUNT]) {
    size_t sizes[MOE_WS_COUNT];
    fwd_ws_sizes(pd, tokens, full_rows, sizes);
    return moe_ws_layout(ws, fwd_ws_names, sizes, MOE_WS_COUNT);
}

size_t moe_train_ws_layout(const moe_plan_desc_t *pd, int tokens, moe_ws_region_t ws[MOE_WS_COUNT]) {
    size_t sizes[MOE_WS_COUNT];
    fwd_ws_sizes(pd, tokens, 0, sizes);
    for (int i = 0; i < MOE_WS_COUNT; i++)
        if (i != MOE_WS_CURSOR && i != MOE_WS_ROUTE_PART)
            sizes[i] = 0;
    return moe_ws_layout(ws, fwd_ws_names, sizes, MOE_WS_COUNT);
}

/* the saved region's sizes for T tokens, R rows and nt tiles */
static void saved_sizes(const moe_plan_desc_t *pd, long long T, long long R, long long nt, int recompute_u,
                        size_t sizes[MOE_SV_COUNT]) {
    const moe_spec_t *s = &pd->spec;
    long long E = moe_spec_slots(s), TK = T * moe_spec_entries(s);
    size_t z[MOE_SV_COUNT] = {
        [MOE_SV_COUNTS] = 4 * (E + MOE_ROUTE_TICKETS), /* the given ids' dropped count too */
        [MOE_SV_OFFSETS] = 4 * (E + 1), [MOE_SV_NUM_TILES] = 4,
        [MOE_SV_TILES] = 16 * (size_t)nt, [MOE_SV_TOPK_IDX] = 4 * TK, [MOE_SV_TOPK_W] = 4 * TK,
        [MOE_SV_ROW_OF] = 4 * TK, [MOE_SV_LOGITS] = 4 * (size_t)T * s->experts, [MOE_SV_XS] = 2 * R * s->hidden,
        [MOE_SV_HBUF] = 2 * R * s->ffn, [MOE_SV_OUT] = 2 * R * s->hidden,
        [MOE_SV_U] = recompute_u ? 0 : 4 * R * s->ffn,
    };
    memcpy(sizes, z, sizeof z);
}

size_t moe_saved_layout(const moe_plan_desc_t *pd, int tokens, int recompute_u, moe_ws_region_t sv[MOE_SV_COUNT]) {
    static const char *const names[MOE_SV_COUNT] = {"counts", "offsets", "num_tiles", "tiles", "topk_idx", "topk_w",
                                                    "row_of", "logits", "xs", "hbuf", "out", "u"};
    size_t sizes[MOE_SV_COUNT];
    saved_sizes(pd, tokens, moe_plan_max_rows(pd, tokens), moe_plan_max_tiles(pd, tokens), recompute_u, sizes);
    return moe_ws_layout(sv, names, sizes, MOE_SV_COUNT);
}

size_t moe_saved_per_token(const moe_plan_desc_t *pd, int recompute_u) {
    size_t one[MOE_SV_COUNT], none[MOE_SV_COUNT], n = 0;
    saved_sizes(pd, 1, moe_spec_entries(&pd->spec), 0, recompute_u, one);
    saved_sizes(pd, 0, 0, 0, recompute_u, none);
    for (int i = 0; i < MOE_SV_COUNT; i++)
        n += one[i] - none[i];
    return n;
}

size_t moe_bwd_ws_layout(const moe_plan_desc_t *pd, int tokens, int recompute_u, moe_ws_region_t bw[MOE_BW_COUNT]) {
    static const char *const names[MOE_BW_COUNT] = {"dys", "du", "dxs", "u", "dw", "dlogits", "dwr_part"};
    const moe_spec_t *s = &pd->spec;
    long long R = moe_plan_max_rows(pd, tokens), TK = (long long)tokens * moe_spec_entries(s);
    size_t sizes[MOE_BW_COUNT] = {
        [MOE_BW_DYS] = 2 * R * s->hidden, [MOE_BW_DU] = 4 * R * s->ffn, [MOE_BW_DXS] = 2 * R * s->hidden,
        [MOE_BW_U] = recompute_u ? 4 * R * s->ffn : 0, [MOE_BW_DW] = 4 * TK,
        [MOE_BW_DLOGITS] = 4 * (size_t)tokens * moe_spec_router_columns(s), /* the shared gate's column too */
        [MOE_BW_DWR_PART] = moe_dwr_part_bytes(tokens, moe_spec_router_columns(s), moe_spec_dwr_columns(s), s->hidden),
    };
    return moe_ws_layout(bw, names, sizes, MOE_BW_COUNT);
}

void moe_plan_desc_free(moe_plan_desc_t *pd) {
    moe_mesh_plan_free(&pd->mesh);
}

void moe_plan_grid(const moe_plan_desc_t *pd, moe_arch_t arch, int k, int tokens, unsigned grid[3]) {
    moe_family_grid(&moe_plan_kernels(pd, arch)[k], &pd->spec, tokens, moe_plan_max_tiles(pd, tokens), grid);
}

/* Kernel d's fields of the template parameter table on top of L; ctx:
 * what its family planned it for (its variant's row block and entry). */
static void push_kernel_fields(lua_State *L, const moe_family_ctx_t *ctx, const moe_kernel_desc_t *d,
                               const moe_kernel_desc_t *set);

/* The parameters every template shares, with `align` as the row block. */
static void push_shared(lua_State *L, const moe_plan_desc_t *pd, int align) {
    const moe_spec_t *s = &pd->spec;
    lua_newtable(L);
    moe_spec_push_lua(L, s); /* every key, as the schema has it: p.spec.activation.kind */
    lua_setfield(L, -2, "spec");
    moe_lua_set_str(L, "name", s->name);
    moe_lua_set_str(L, "hash", s->hash);
    moe_lua_set_str(L, "dtype", moe_dtype_name(s->dtype));
    /* the backward's weight gradients dw1p, dw2 (spec weight_grads): "fp32" or the dtype */
    moe_lua_set_str(L, "grad_dtype", moe_wgrad_elem_bytes(s) == 2 ? moe_dtype_name(s->dtype) : "fp32");
    moe_lua_set_int(L, "E", s->experts);
    moe_lua_set_int(L, "K", s->top_k);
    moe_lua_set_int(L, "shared_slots", moe_spec_shared_slots(s)); /* the shared expert's slots E .. slots - 1 */
    moe_lua_set_int(L, "slots", moe_spec_slots(s));                /* weight slots the kernels after route see */
    moe_lua_set_int(L, "entries", moe_spec_entries(s));            /* (token, slot) entries per token */
    moe_lua_set_int(L, "router_columns", moe_spec_router_columns(s)); /* logit columns: experts, shared gate */
    moe_lua_set_bool(L, "shared_gate", s->shared.ffn > 0 && s->shared.gate == MOE_SHARED_GATE_SIGMOID);
    moe_lua_set_int(L, "H", s->hidden);
    moe_lua_set_int(L, "router_hidden", moe_spec_router_hidden(s)); /* the logits' k: router_x's width */
    moe_lua_set_int(L, "F", s->ffn);
    moe_lua_set_int(L, "tokens", s->tokens);
    static const char *const score_name[] = {[MOE_SCORE_SOFTMAX] = "softmax", [MOE_SCORE_SIGMOID] = "sigmoid",
                                             [MOE_SCORE_SQRTSOFTPLUS] = "sqrtsoftplus",
                                             [MOE_SCORE_SPARSEMIXER] = "sparsemixer", [MOE_SCORE_GIVEN] = "given"};
    moe_lua_set_str(L, "score", score_name[s->router.score]);
    moe_lua_set_bool(L, "given", s->router.select == MOE_SELECT_GIVEN); /* the caller's ids pick the experts */
    moe_lua_set_bool(L, "renormalize", s->router.renormalize);
    moe_lua_set_int(L, "groups", s->router.groups);
    moe_lua_set_int(L, "topk_groups", s->router.topk_groups);
    moe_lua_set_int(L, "group_topk", s->router.group_topk);
    moe_lua_set_bool(L, "bias", s->router.bias);
    moe_lua_set_bool(L, "logit_bias", s->router.logit_bias);
    moe_lua_set_num(L, "scale", s->router.scale);
    moe_lua_set_num(L, "jitter_eps", s->router.jitter_eps); /* score "sparsemixer" */
    if (s->router.logit_softcap > 0)
        moe_lua_set_num(L, "softcap", s->router.logit_softcap);
    moe_lua_set_num(L, "alpha", s->activation.alpha);
    if (s->activation.limit > 0)
        moe_lua_set_num(L, "limit", s->activation.limit);
    if (moe_spec_shared_act_differs(s)) { /* slots E .. slots - 1 run the shared expert's (templates/activation.lua) */
        const double shared_limit = moe_spec_shared_activation(s).limit;
        moe_lua_set_bool(L, "shared_act", true);
        if (shared_limit > 0)
            moe_lua_set_num(L, "shared_limit", shared_limit);
    }
    moe_lua_set_num(L, "up_offset", s->activation.up_offset);
    moe_lua_set_bool(L, "ffn_bias", s->ffn_bias);
    moe_lua_set_int(L, "align", align);
    moe_lua_set_int(L, "pair_granule", pd->pair_granule);
}

void moe_plan_push_params(lua_State *L, const moe_plan_desc_t *pd, moe_arch_t arch, int k) {
    push_shared(L, pd, pd->align);
    if (k < 0)
        return;
    const moe_kernel_desc_t *set = moe_plan_kernels(pd, arch);
    const moe_family_ctx_t ctx = moe_plan_family_ctx(pd, arch);
    push_kernel_fields(L, &ctx, &set[k], set);
}

void moe_plan_push_variant(lua_State *L, const moe_plan_desc_t *pd, int v, moe_arch_t arch, int k) {
    const moe_plan_variant_t *pv = &pd->variants[v];
    push_shared(L, pd, pv->align);
    const moe_family_ctx_t ctx = {.spec = &pd->spec, .arch = arch, .align = pv->align, .tuned = pv->tuned};
    push_kernel_fields(L, &ctx, &pv->kernels[arch][k], pv->kernels[arch]);
}

void moe_plan_push_kernel(lua_State *L, const moe_plan_desc_t *pd, moe_arch_t arch, const moe_kernel_desc_t *d,
                          const moe_kernel_desc_t *set) {
    moe_plan_push_params(L, pd, arch, -1);
    const moe_family_ctx_t ctx = moe_plan_family_ctx(pd, arch);
    push_kernel_fields(L, &ctx, d, set);
}

static void push_kernel_fields(lua_State *L, const moe_family_ctx_t *ctx, const moe_kernel_desc_t *d,
                               const moe_kernel_desc_t *set) {
    moe_lua_set_str(L, "arch", moe_arch_name(ctx->arch));
    moe_lua_set_str(L, "kernel", d->name);
    moe_lua_set_int(L, "threads", d->threads);
    moe_lua_set_int(L, "smem", d->smem);
    moe_lua_set_int(L, "per_block", d->per_block);
    const moe_family_t *f = moe_family(d->family);
    if (f->push)
        f->push(L, ctx, d, set);
}
