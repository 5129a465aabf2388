/* test_plan.c — the family table and the plan built once: one descriptor
 * per family, with a variant for every arch whose templates exist; the
 * kernels, grids, mesh tables and EP part a plan holds; a plan that cannot
 * be built is left empty. No GPU. (Tiles and the tuning table:
 * test_tuning.c.) */
#include "check.h"
#include "family.h"
#include "launch_geom.h"
#include "plan.h"
#include "spec.h"
#include "template.h"
#include "tuning.h"

#include <stdio.h>
#include <string.h>

static const char *const mixtral = "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\n"
                                   "tokens = 4096\n";
static const char *const ep4 = "name = 'e' experts = 64 top_k = 4 hidden = 128 ffn = 64 tokens = 1000 "
                               "mesh = { ep = 4 }\n";

/* Rebuild *pd (empty or built before) for spec under the embedded table. */
static int plan_of(moe_plan_desc_t *pd, const char *spec) {
    moe_spec_t s;
    moe_diag_t d;
    char err[256];
    moe_plan_desc_free(pd);
    if (moe_spec_load(&s, "t.moe", spec, NULL, 0, &d))
        return fprintf(stderr, "%s\n", d.msg), 1;
    return moe_plan_desc_build(pd, &s, moe_tuning_default(), err, sizeof err) ? (fprintf(stderr, "%s\n", err), 1)
                                                                               : 0;
}

/* Whether templates/NAME.lua is one of the embedded templates. */
static int has_template(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "templates/%s.lua", name);
    for (size_t i = 0; i < moe_embedded_templates_count; i++)
        if (strcmp(moe_embedded_templates[i].path, path) == 0)
            return 1;
    return 0;
}

/* The fused route's choice by call size (launch_geom.h,
 * moe_route_fuse_mode), on the example shapes; the counts region holds its
 * ticket after the split tickets. */
static void test_route_fuse(void) {
    CASE("route fusion by call size: plan up to 64 tokens, scatter within one block's warps and 128 KB");
    /* Qwen3-30B-A3B: top-8, H 2048, route's 8 warps: 32 KB of rows a token */
    CHECK(moe_route_fuse_mode(0, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_OFF);
    CHECK(moe_route_fuse_mode(1, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_SCATTER);
    CHECK(moe_route_fuse_mode(4, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_SCATTER); /* 128 KB */
    CHECK(moe_route_fuse_mode(5, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_PLAN);
    CHECK(moe_route_fuse_mode(64, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_PLAN);
    CHECK(moe_route_fuse_mode(65, 8, 2048, 8, 1) == MOE_ROUTE_FUSE_OFF);
    /* Mixtral 8x7B: top-2, H 4096: 16 KB a token; the warps bound it at 8 tokens */
    CHECK(moe_route_fuse_mode(8, 2, 4096, 8, 1) == MOE_ROUTE_FUSE_SCATTER);
    CHECK(moe_route_fuse_mode(9, 2, 4096, 8, 1) == MOE_ROUTE_FUSE_PLAN);
    /* DeepSeek-V3 EP8 rank: top-8, H 7168: 112 KB a token */
    CHECK(moe_route_fuse_mode(1, 8, 7168, 8, 1) == MOE_ROUTE_FUSE_SCATTER);
    CHECK(moe_route_fuse_mode(2, 8, 7168, 8, 1) == MOE_ROUTE_FUSE_PLAN);
    /* scatter 0 (fp8 with router.apply = input or given ids): the plan only; 2 (fp8): one token alone */
    CHECK(moe_route_fuse_mode(1, 8, 2048, 8, 0) == MOE_ROUTE_FUSE_PLAN);
    CHECK(moe_route_fuse_mode(1, 8, 2048, 8, 2) == MOE_ROUTE_FUSE_SCATTER);
    CHECK(moe_route_fuse_mode(2, 8, 2048, 8, 2) == MOE_ROUTE_FUSE_PLAN);
    CHECK(moe_route_fuse_mode(1, 8, 7168, 8, 2) == MOE_ROUTE_FUSE_SCATTER);
    CHECK(moe_route_fuse_scatter(0, 1, 1) == 1 && moe_route_fuse_scatter(1, 0, 0) == 2 &&
          moe_route_fuse_scatter(1, 1, 0) == 0 && moe_route_fuse_scatter(1, 0, 1) == 0);
    /* route's kernels have the warps the rule assumes, and the counts hold every ticket */
    moe_plan_desc_t pd = {0};
    if (plan_of(&pd, mixtral)) {
        CHECK(0);
        return;
    }
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_ROUTE].threads == 256);
    CHECK(MOE_ROUTE_FUSE_TICKET == MOE_ROUTE_SPLIT_BLOCKS && MOE_ROUTE_BAD_IDS == MOE_ROUTE_SPLIT_BLOCKS + 1 &&
          MOE_ROUTE_TICKETS == MOE_ROUTE_SPLIT_BLOCKS + 2);
    CHECK(pd.ws[MOE_WS_COUNTS].bytes == 4 * (size_t)(8 + MOE_ROUTE_TICKETS));
    moe_plan_desc_free(&pd);
}

/* A training spec's plan: the backward's own kernels, arch-neutral, named
 * by their families; the saved region and the backward's workspace laid out
 * per call at its token count, U present only when saved, and the bytes per
 * token as the regions' formula says. */
static void test_training(void) {
    moe_plan_desc_t pd = {0};
    CASE("training: the backward set, one kernel per family");
    /* E = 12, k = 2, H = 264, F = 136, logit_bias: the gpt-oss-like parts */
    const char *spec = "name = 'tr' experts = 12 top_k = 2 hidden = 264 ffn = 136 tokens = 1000 training = true "
                       "router = { logit_bias = true }";
    if (plan_of(&pd, spec) != 0) {
        CHECK(!"the training spec plans");
        return;
    }
    CHECK(pd.has_bwd == 1);
    for (int i = 0; i < MOE_BK_COUNT; i++) {
        const moe_kernel_desc_t *d = &pd.bwd[i];
        char name[128];
        moe_family_ctx_t ctx = moe_plan_family_ctx(&pd, pd.spec.arch[0]);
        moe_family((moe_kfamily_t)(MOE_K_BWD_FIRST + i))->spell(name, sizeof name, &ctx, d);
        CHECKF((int)d->family == MOE_K_BWD_FIRST + i && d->threads > 0 && strcmp(d->name, name) == 0 &&
                   strncmp(d->name, "tr_bwd_", 7) == 0, "%s", d->name);
    }

    CASE("training: the backward kernels' grids");
    unsigned g[3];
    moe_family_grid(&pd.bwd[MOE_K_BWD_DYS - MOE_K_BWD_FIRST], &pd.spec, 5, 0, g); /* 10 rows, a warp each */
    CHECK(g[0] == 2 && g[1] == 1);
    /* bf16: the router products on tensor cores, 32 tokens x 256 columns a block */
    CHECK(moe_bwd_router_mma(&pd.spec) && pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST].per_block == MOE_BWD_DX_MMA_TOKENS);
    moe_family_grid(&pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST], &pd.spec, 17, 0, g); /* 264 columns: two blocks */
    CHECK(g[0] == 1 && g[1] == 2);
    moe_family_grid(&pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST], &pd.spec, 65, 0, g);
    CHECK(g[0] == 3 && g[1] == 2);
    pd.spec.hidden = 2056; /* 2056 columns: a ninth block column */
    moe_family_grid(&pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST], &pd.spec, 17, 0, g);
    CHECK(g[0] == 1 && g[1] == 9);
    pd.spec.dtype = MOE_DTYPE_FP16; /* fp16: CUDA cores, 8 tokens x 256 8-column vectors (per_block as fp16 plans it) */
    pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST].per_block = 8;
    moe_family_grid(&pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST], &pd.spec, 17, 0, g);
    CHECK(g[0] == 3 && g[1] == 2);
    pd.spec.dtype = MOE_DTYPE_BF16;
    pd.spec.hidden = 264;
    moe_family_grid(&pd.bwd[MOE_K_BWD_DWR - MOE_K_BWD_FIRST], &pd.spec, 17, 0, g); /* 264 + the ones column */
    CHECK(g[0] == (264 + 1 + MOE_BWD_DWR_COLS - 1) / MOE_BWD_DWR_COLS && g[1] == 1);
    moe_family_grid(&pd.bwd[MOE_K_BWD_COLSUM - MOE_K_BWD_FIRST], &pd.spec, 17, 272, g);
    CHECK(g[0] == 9 && g[1] == 12);

    CASE("training: the saved region at a token count, U only when saved");
    moe_ws_region_t sv[MOE_SV_COUNT], sr[MOE_SV_COUNT];
    const int T = 333;
    const long long R = moe_plan_max_rows(&pd, T), TK = 2LL * T;
    size_t save = moe_saved_layout(&pd, T, 0, sv), rec = moe_saved_layout(&pd, T, 1, sr);
    for (int i = 1; i < MOE_SV_COUNT; i++)
        CHECK(sv[i].offset >= sv[i - 1].offset + sv[i - 1].bytes && sv[i].offset % 256 == 0);
    CHECK_STREQ(sv[MOE_SV_U].name, "u");
    CHECK(sv[MOE_SV_U].bytes == (size_t)(R * 2 * 136 * 2) && sr[MOE_SV_U].bytes == 0);
    CHECK(sv[MOE_SV_XS].bytes == (size_t)(R * 264 * 2) && sv[MOE_SV_OUT].bytes == sv[MOE_SV_XS].bytes);
    CHECK(sv[MOE_SV_HBUF].bytes == (size_t)(R * 136 * 2) && sv[MOE_SV_LOGITS].bytes == (size_t)(4 * T * 12));
    CHECK(sv[MOE_SV_ROW_OF].bytes == (size_t)(4 * TK) && sv[MOE_SV_TILES].bytes ==
          (size_t)(16 * moe_plan_max_tiles(&pd, T)));
    CHECKF(save - rec >= (size_t)(R * 2 * 136 * 2) && save - rec < (size_t)(R * 2 * 136 * 2) + 256,
           "save %zu, recompute %zu", save, rec);
    CHECK(save == sv[MOE_SV_U].offset + (sv[MOE_SV_U].bytes + 255) / 256 * 256);
    CHECK(moe_saved_layout(&pd, 1000, 0, sv) > save && moe_saved_layout(&pd, 0, 0, sv) < save);

    CASE("training: the saved bytes per token, both choices");
    /* per token: k' rows of xs, O (2H each), A (2F) and U (4F), its k'
     * indices, weights and rows (12 bytes each), its E fp32 logits */
    size_t pt = moe_saved_per_token(&pd, 0), pr = moe_saved_per_token(&pd, 1);
    CHECKF(pt == (size_t)(2 * (2 * 2 * 264 + 2 * 136 + 2 * 2 * 136 + 12) + 4 * 12), "%zu", pt);
    CHECKF(pr == (size_t)(2 * (2 * 2 * 264 + 2 * 136 + 12) + 4 * 12), "%zu", pr);
    /* the figure holds the layout within its padding: the tables, each slot's
     * rows rounded to the row block, each region's 256-byte rounding */
    size_t zero = moe_saved_layout(&pd, 0, 0, sv);
    size_t pad = (size_t)12 * (pd.align - 1) * (2 * 2 * 264 + 2 * 136 + 2 * 2 * 136) + 16 * moe_plan_max_tiles(&pd, T) +
                 MOE_SV_COUNT * 256;
    CHECKF(save >= pt * T && save <= zero + pt * T + pad, "save %zu, %zu per token, zero %zu, pad %zu", save, pt,
           zero, pad);

    CASE("training: the backward's workspace");
    moe_ws_region_t bw[MOE_BW_COUNT];
    size_t wb = moe_bwd_ws_layout(&pd, T, 0, bw);
    CHECK(bw[MOE_BW_U].bytes == 0 && bw[MOE_BW_DU].bytes == (size_t)(R * 2 * 136 * 2));
    CHECK(bw[MOE_BW_DLOGITS].bytes == (size_t)(4 * T * 12) && bw[MOE_BW_DW].bytes == (size_t)(4 * TK));
    CHECK(moe_bwd_ws_layout(&pd, T, 1, bw) > wb && bw[MOE_BW_U].bytes == (size_t)(R * 2 * 136 * 2));
    /* bwd_dwr's token splits: one per 256 tokens, at most 16, within 4 * T * H bytes; none below 257 tokens
     * (H + 1 columns: logit_bias's ones column) */
    moe_bwd_ws_layout(&pd, 256, 0, bw);
    CHECK(bw[MOE_BW_DWR_PART].bytes == 0 && moe_dwr_splits(256, 12, 264, 1u << 30) == 1);
    moe_bwd_ws_layout(&pd, 700, 0, bw);
    CHECK(bw[MOE_BW_DWR_PART].bytes == (size_t)(4 * 3 * 12 * 265) && moe_dwr_splits(700, 12, 264, 1u << 30) == 3);
    moe_bwd_ws_layout(&pd, 8192, 0, bw);
    CHECK(bw[MOE_BW_DWR_PART].bytes == (size_t)(4 * 16 * 12 * 265));
    CHECK(moe_dwr_splits(8192, 12, 264, 4 * 5 * 12 * 264 + 7) == 5 && moe_dwr_splits(8192, 12, 264, 100) == 1);
    moe_plan_desc_free(&pd);
}

/* Whether every region of ws[n] lies inside `total` bytes, in order, on a
 * 256-byte boundary. */
static int layout_ok(const moe_ws_region_t *ws, int n, size_t total) {
    for (int i = 0; i < n; i++)
        if (ws[i].offset % 256 || (i && ws[i].offset < ws[i - 1].offset + ws[i - 1].bytes) ||
            ws[i].offset + ws[i].bytes > total)
            return 0;
    return 1;
}

/* The forward's workspace laid out per call (moe_fwd_ws_layout): each
 * region what the kernels of a call of T tokens reach, the sizes
 * non-decreasing in T (a workspace for T serves any call of fewer), the
 * capacity's layout the plan's, and small calls far below it. */
static void test_workspace(void) {
    static const char *const specs[] = {
        mixtral,
        "name = 'sh' experts = 12 top_k = 3 hidden = 264 ffn = 136 tokens = 700 shared = { ffn = 136, gate = "
        "'sigmoid' }\n",
        "name = 'ds' experts = 256 top_k = 8 hidden = 7168 ffn = 2048 tokens = 4096\n",
        /* zero experts: xs has T rows more, x[t] of a token that selects one (docs/DESIGN.md, "Zero experts") */
        "name = 'z' experts = 48 zero_experts = 24 top_k = 6 hidden = 264 ffn = 96 tokens = 700 "
        "router = { bias = true, renormalize = false, scale = 6 }\n",
    };
    moe_plan_desc_t pd = {0};
    for (size_t c = 0; c < sizeof specs / sizeof *specs; c++) {
        CASE("the workspace per call: regions at T, sizes growing with T, the capacity's the plan's");
        if (plan_of(&pd, specs[c])) {
            CHECKF(0, "spec %zu", c);
            continue;
        }
        const moe_spec_t *s = &pd.spec;
        const int cap = s->tokens, KE = moe_spec_entries(s);
        const int Ts[] = {0, 1, 2, 3, 5, 17, 64, 100, cap / 3, cap - 1, cap};
        moe_ws_region_t ws[MOE_WS_COUNT], full[MOE_WS_COUNT];
        size_t prev = 0, prev_full = 0;
        for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
            const int T = Ts[i];
            const size_t n = moe_fwd_ws_layout(&pd, T, 0, ws), nf = moe_fwd_ws_layout(&pd, T, 1, full);
            const long long R = moe_plan_max_rows(&pd, T), Rc = moe_plan_max_rows(&pd, cap);
            const long long Z = s->zero_experts ? T : 0; /* the zero experts' x rows, one per token */
            CHECKF(layout_ok(ws, MOE_WS_COUNT, n) && layout_ok(full, MOE_WS_COUNT, nf) && n % 256 == 0,
                   "%s at %d", s->name, T);
            CHECKF(ws[MOE_WS_XS].bytes == (size_t)(2 * (R + Z) * s->hidden) &&
                   ws[MOE_WS_HBUF].bytes == (size_t)(2 * R * s->ffn) &&
                   ws[MOE_WS_TILES].bytes == (size_t)(16 * moe_plan_max_tiles(&pd, T)) &&
                   ws[MOE_WS_TOPK_IDX].bytes == (size_t)(4LL * T * KE) &&
                   ws[MOE_WS_ROW_OF].bytes == (size_t)(4LL * T * KE), "%s at %d", s->name, T);
            /* full rows: xs and hbuf span the capacity's rows, the rest by T */
            CHECKF(full[MOE_WS_XS].bytes == (size_t)(2 * (Rc + Z) * s->hidden) &&
                   full[MOE_WS_HBUF].bytes == (size_t)(2 * Rc * s->ffn) &&
                   full[MOE_WS_TOPK_W].bytes == ws[MOE_WS_TOPK_W].bytes && nf >= n, "%s at %d", s->name, T);
            CHECKF(n >= prev && nf >= prev_full, "%s: %zu bytes at %d tokens, fewer than %zu before", s->name, n, T,
                   prev);
            prev = n, prev_full = nf;
        }
        CHECK(moe_fwd_ws_layout(&pd, cap, 0, ws) == pd.ws_bytes && ws[MOE_WS_XS].offset == pd.ws[MOE_WS_XS].offset);
        if (s->zero_experts) { /* the names spell them: route scores E + Z, the scatter knows where they start */
            const moe_kernel_desc_t *k = moe_plan_kernels(&pd, MOE_ARCH_SM90A);
            CHECKF(strstr(k[MOE_K_ROUTE].name, "_e48z24k6_") && strstr(k[MOE_K_PERMUTE_SCATTER].name, "_e48z24"),
                   "%s, %s", k[MOE_K_ROUTE].name, k[MOE_K_PERMUTE_SCATTER].name);
        }
        /* one token: its k' rows and each slot's row padding, not the capacity's rows */
        const size_t one = moe_fwd_ws_layout(&pd, 1, 0, ws);
        CHECKF(one * 8 < pd.ws_bytes, "%s: %zu bytes at 1 token, %zu at %d", s->name, one, pd.ws_bytes, cap);
        fprintf(stderr, "  %s: workspace %zu bytes at 1 token, %zu at 64, %zu at %d\n", s->name, one,
                moe_fwd_ws_layout(&pd, 64, 0, ws), pd.ws_bytes, cap);
    }

    static const char *const eps[] = {
        ep4,
        "name = 'c' experts = 64 top_k = 4 hidden = 128 ffn = 64 tokens = 1000 mesh = { ep = 4 } "
        "dispatch = { mode = 'capacity', capacity = 300 }\n",
        "name = 'f' experts = 8 top_k = 4 hidden = 128 ffn = 64 tokens = 1000 mesh = { ep = 8 }\n",
        /* fp8 weights: the e4m3 rows' scales beside them (test_quant checks their sizes) */
        "name = 'q' experts = 16 top_k = 4 hidden = 256 ffn = 128 tokens = 1000 arch = { 'sm_90a' } mesh = { ep = 4 } "
        "quant = { weights = 'fp8_e4m3' }\n",
    };
    for (size_t c = 0; c < sizeof eps / sizeof *eps; c++) {
        CASE("the EP workspace per call: the send side by T, the receive side and the fixed regions fixed");
        if (plan_of(&pd, eps[c])) {
            CHECKF(0, "EP spec %zu", c);
            continue;
        }
        const moe_ep_desc_t *ed = moe_plan_ep_desc(&pd);
        const moe_spec_t *s = &pd.spec;
        if (!ed)
            continue;
        moe_ws_region_t ws[MOE_EW_COUNT];
        size_t prev = 0;
        for (int T = 0; T <= s->tokens; T += T < 8 ? 1 : 97) {
            const size_t n = moe_ep_ws_layout(ed, &pd, T, ws);
            const long long send = ed->capacity ? (long long)ed->ep * ed->capacity : (long long)T * s->top_k;
            CHECKF(layout_ok(ws, MOE_EW_COUNT, n) && n >= prev, "%s at %d", s->name, T);
            CHECKF(ws[MOE_EW_SEND].bytes == (size_t)(2 * (send + 1) * s->hidden) &&
                   ws[MOE_EW_TOPK_IDX].bytes == (size_t)(4LL * T * s->top_k), "%s at %d", s->name, T);
            /* what moe_plan_overflow reads, and what the peers send, in the same place for every call */
            CHECKF(ws[MOE_EW_OVERFLOW].offset == ed->ws[MOE_EW_OVERFLOW].offset &&
                   ws[MOE_EW_STAGE].offset == ed->ws[MOE_EW_STAGE].offset &&
                   ws[MOE_EW_HBUF].bytes == ed->ws[MOE_EW_HBUF].bytes, "%s at %d", s->name, T);
            prev = n;
        }
        CHECK(moe_ep_ws_layout(ed, &pd, s->tokens, ws) == ed->ws_bytes);
        /* exact mode: a token sends a rank at most min(top_k, S) rows */
        const long long per = ed->capacity ? 0 : s->top_k < ed->nheld ? s->top_k : ed->nheld;
        CHECKF(ed->capacity ? ed->stage_rows == (long long)ed->ep * ed->capacity
                            : ed->stage_rows == (long long)ed->ep * s->tokens * per,
               "%s: %lld stage rows", s->name, ed->stage_rows);
    }
    moe_plan_desc_free(&pd);
}

/* The EP training layouts (moe_ep_saved_layout, moe_ep_bwd_ws_layout): each
 * saved region that moves out of the forward's workspace has that region's
 * size; U only when saved; the home side grows with the rank's tokens, the
 * expert side stays at the receive bound. */
static void test_ep_training(void) {
    moe_plan_desc_t pd = {0};
    CASE("training on an EP rank: the saved region and the backward's workspace");
    const char *spec = "name = 'et' experts = 16 top_k = 4 hidden = 256 ffn = 136 tokens = 300 training = true "
                       "mesh = { ep = 4 }";
    if (plan_of(&pd, spec) != 0) {
        CHECK(!"the EP training spec plans");
        return;
    }
    const moe_ep_desc_t *ed = moe_plan_ep_desc(&pd);
    CHECK(ed != NULL && pd.has_bwd == 1);
    if (!ed) {
        moe_plan_desc_free(&pd);
        return;
    }
    const long long R = ed->recv_rows, H = 256, F = 136, E = 16, K = 4;
    moe_ws_region_t ws[MOE_EW_COUNT], sv[MOE_ES_COUNT], sr[MOE_ES_COUNT], bw[MOE_EB_COUNT];
    size_t prev = 0;
    for (int T = 0; T <= 300; T += T < 4 ? 1 : 37) {
        moe_ep_ws_layout(ed, &pd, T, ws);
        const size_t n = moe_ep_saved_layout(ed, &pd, T, 0, sv), nr = moe_ep_saved_layout(ed, &pd, T, 1, sr);
        int same = 1;
        for (int w = 0; w < MOE_EW_COUNT; w++) {
            const int k = moe_ep_saved_of(w);
            same &= k < 0 || sv[k].bytes == ws[w].bytes;
        }
        CHECKF(same && layout_ok(sv, MOE_ES_COUNT, n) && n >= prev, "T = %d", T);
        CHECKF(sv[MOE_ES_U].bytes == (size_t)(R * 2 * F * 2) && sr[MOE_ES_U].bytes == 0 && n > nr, "T = %d", T);
        CHECKF(sv[MOE_ES_OR].bytes == (size_t)(R * H * 2) && sv[MOE_ES_XR].bytes == (size_t)(R * H * 2) &&
               sv[MOE_ES_LOGITS].bytes == (size_t)(4 * T * E) && sv[MOE_ES_SEND].bytes ==
               (size_t)(2 * (T * K + 1) * H), "T = %d", T);
        const size_t b = moe_ep_bwd_ws_layout(ed, &pd, T, 0, bw);
        CHECKF(layout_ok(bw, MOE_EB_COUNT, b) && bw[MOE_EB_U].bytes == 0 &&
               bw[MOE_EB_STAGE].bytes == (size_t)(2 * ed->stage_rows * H) &&
               bw[MOE_EB_HOME].bytes == sv[MOE_ES_SEND].bytes && bw[MOE_EB_DW].bytes == (size_t)(4 * T * K) &&
               bw[MOE_EB_SLOT_ROWS].bytes == (size_t)(4 * ed->nheld), "T = %d", T);
        CHECKF(moe_ep_bwd_ws_layout(ed, &pd, T, 1, bw) > b && bw[MOE_EB_U].bytes == (size_t)(R * 2 * F * 2), "T = %d",
               T);
        prev = n;
    }
    CHECK(moe_ep_saved_of(MOE_EW_STAGE) == -1 && moe_ep_saved_of(MOE_EW_CURSOR) == -1 &&
          moe_ep_saved_of(MOE_EW_XR) == MOE_ES_XR && moe_ep_saved_of(MOE_EW_SEND) == MOE_ES_SEND);
    moe_plan_desc_free(&pd);
}

int main(void) {
    CASE("the family table: one descriptor per id, a variant for every arch, its templates embedded");
    for (int id = 0; id < MOE_FAMILY_COUNT; id++) {
        const moe_family_t *f = moe_family((moe_kfamily_t)id);
        CHECKF(f && (int)f->id == id && f->name && f->spell, "family %d", id);
        for (int a = 0; f && a < MOE_FAMILY_ARCHES; a++) {
            const moe_family_variant_t *v = moe_family_variant(f, (moe_arch_t)a);
            CHECKF(v && v->geometry, "family %s arch %d", f->name, a);
            if (v)
                CHECKF(has_template(v->tmpl) && has_template(v->code), "family %s: templates/%s.lua, templates/%s.lua",
                       f->name, v->tmpl, v->code);
        }
        for (int j = 0; f && j < id; j++)
            CHECKF(strcmp(moe_family((moe_kfamily_t)j)->name, f->name) != 0, "two families named %s", f->name);
    }
    CHECK(moe_family(MOE_FAMILY_COUNT) == NULL);
    CHECK_STREQ(moe_family_variant(moe_family(MOE_K_GEMM_UP), MOE_ARCH_SM90A)->code, "gemm_sm90");
    CHECK(moe_family_variant(moe_family(MOE_K_GEMM_DOWN), MOE_ARCH_SM80)->engine != NULL);
    CHECK(moe_family_variant(moe_family(MOE_K_ROUTE), MOE_ARCH_SM80) ==
          moe_family_variant(moe_family(MOE_K_ROUTE), MOE_ARCH_SM90A));

    CASE("a plan's kernels: every forward family on every arch, named by its family");
    moe_plan_desc_t pd = {0};
    CHECK(plan_of(&pd, mixtral) == 0);
    for (int a = 0; a < MOE_FAMILY_ARCHES; a++)
        for (int k = 0; k < MOE_K_COUNT; k++) {
            const moe_kernel_desc_t *d = &moe_plan_kernels(&pd, (moe_arch_t)a)[k];
            char name[128];
            moe_family_ctx_t ctx = moe_plan_family_ctx(&pd, (moe_arch_t)a);
            moe_family((moe_kfamily_t)k)->spell(name, sizeof name, &ctx, d);
            CHECKF((int)d->family == k && d->threads > 0 && strcmp(d->name, name) == 0, "%s", d->name);
            CHECKF(strncmp(d->name, "mx_", 3) == 0, "%s", d->name);
        }
    /* arch-neutral families are one kernel on every arch */
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_ROUTE].name,
                moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_ROUTE].name);
    CHECK(strcmp(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].name,
                 moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name) != 0);
    CHECK(pd.swiglu.family == MOE_K_SWIGLU);
    CHECK_STREQ(pd.swiglu.name, "mx_swiglu_bf16_f12288");
    CHECK(pd.pack.family == MOE_K_PACK && pd.pack.threads == 256);
    CHECK_STREQ(pd.pack.name, "mx_pack_bf16_f12288_h4096");

    CASE("grids: the family's, for a token count");
    unsigned g[3];
    moe_family_grid(&pd.swiglu, &pd.spec, 0, 100, g);
    CHECK(g[0] == (100 * 12288 / 8 + 255) / 256 && g[1] == 1 && g[2] == 1);
    moe_family_grid(&pd.pack, &pd.spec, 0, 1000, g); /* pack: n elements, one per thread */
    CHECK(g[0] == (1000 + 255) / 256 && g[1] == 1 && g[2] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM90A, MOE_K_GEMM_DOWN, 4096, g);
    CHECK(g[0] == 4096 / 256 && g[1] == (unsigned)moe_plan_max_tiles(&pd, 4096) && g[2] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_GEMM_UP, 4096, g);
    CHECK(g[0] == 2 * 12288 / 128 && g[1] == (unsigned)moe_plan_max_tiles(&pd, 4096));
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_ROUTE, 33, g);
    CHECK(g[0] == 2 && g[1] == 16); /* few tokens: H = 4096 split in 16 shares of 256 */
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_ROUTE, 4096, g);
    CHECK(g[0] == 128 && g[1] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_COMBINE, 1, g);
    CHECK(g[0] == 1 && g[1] == 16);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_COMBINE, 4096, g);
    CHECK(g[0] == 4096 / 8 && g[1] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_PERMUTE_SCATTER, 5, g);
    CHECK(g[0] == 1); /* 5 tokens, a warp each, 8 per block */
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_PERMUTE_SCATTER, 17, g);
    CHECK(g[0] == 3);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_PERMUTE_PLAN, 4096, g);
    CHECK(g[0] == 1 && g[1] == 1 && g[2] == 1);

    CASE("the backward GEMMs: planned only with training = true, named, sized and gridded by their family");
    CHECK(moe_plan_bgemm(&pd, MOE_ARCH_SM80) == NULL && pd.bgemm[MOE_ARCH_SM90A][0].name[0] == '\0');
    {
        moe_plan_desc_t tp = {0};
        CHECK(plan_of(&tp, "name = 'tr' experts = 8 top_k = 2 hidden = 264 ffn = 136 tokens = 4096 "
                           "training = true\n") == 0);
        static const char *const names[MOE_BGEMM_COUNT] = {"tr_dgrad_down_bf16_", "tr_dgrad_up_bf16_",
                                                          "tr_wgrad_up_bf16_", "tr_wgrad_down_bf16_"};
        for (int a = 0; a < MOE_FAMILY_ARCHES; a++)
            for (int i = 0; moe_plan_bgemm(&tp, (moe_arch_t)a) && i < MOE_BGEMM_COUNT; i++) {
                const moe_kernel_desc_t *d = &moe_plan_bgemm(&tp, (moe_arch_t)a)[i];
                const int wgrad = i >= 2, tma = a == MOE_ARCH_SM90A; /* sm_90a: TMA + wgmma */
                CHECKF((int)d->family == MOE_K_BGEMM_FIRST + i && strncmp(d->name, names[i], strlen(names[i])) == 0 &&
                       strstr(d->name, "_m128n"), "%s", d->name);
                CHECKF(!tma == !strstr(d->name, wgrad ? "_sm90a_tma_persist_m128n256k64s3c2g8" : "_sm90a_tma_m128n256k64s4c2g8"),
                       "%s", d->name);
                if (tma && wgrad) { /* persistent, 3 stages, half the fp32 output tile staged for TMA's stores */
                    CHECK(d->threads == 128 * 3 && d->tile.bm == 128 && d->tile.consumers == 2 && d->tile.bn == 256 &&
                          d->tile.persistent && !d->tile.pingpong && d->tile.stages == 3);
                    CHECK(d->smem == 3 * (128 + 256) * 64 * 2 + 128 * 128 * 4 + 16 * 3);
                    continue;
                }
                if (tma) { /* a 128-row block: one CTA per tile (dgrad_down's ping-pong needs 64-row blocks) */
                    CHECK(d->threads == 128 * 3 && d->tile.bm == 128 && d->tile.consumers == 2 && d->tile.bn == 256 &&
                          !d->tile.persistent && !d->tile.pingpong);
                    CHECK(d->smem == moe_gemm_sm90_smem(&d->tile, d->tile.bn) &&
                          d->smem == 4 * (128 + 256) * 64 * 2 + 16 * 4);
                    continue;
                }
                CHECK(d->threads == 32 * d->tile.warps_m * d->tile.warps_n && d->tile.bm == 128 && d->tile.consumers == 0);
                CHECK(d->smem == d->tile.stages * (wgrad ? d->tile.bk * (d->tile.bm + 8) + d->tile.bk * (d->tile.bn + 8)
                                                         : d->tile.bm * (d->tile.bk + 8) + d->tile.bk * (d->tile.bn + 8)) * 2);
            }
        CHECK(moe_plan_bgemm(&tp, MOE_ARCH_SM80) != NULL);
        /* each arch its own kernels */
        for (int i = 0; i < MOE_BGEMM_COUNT; i++)
            CHECK(strcmp(moe_plan_bgemm(&tp, MOE_ARCH_SM80)[i].name, moe_plan_bgemm(&tp, MOE_ARCH_SM90A)[i].name) != 0);
        const moe_kernel_desc_t *b = moe_plan_bgemm(&tp, MOE_ARCH_SM90A);
        unsigned g[3];
        moe_family_grid(&b[0], &tp.spec, 4096, 77, g); /* dgrad_down: F / bn x the row tiles (bn 256 on sm_90a) */
        CHECK(g[0] == 1 && g[1] == 77 && g[2] == 1);
        moe_family_grid(&b[1], &tp.spec, 4096, 77, g); /* dgrad_up: H / bn x the row tiles */
        CHECK(g[0] == 2 && g[1] == 77 && g[2] == 1);
        moe_family_grid(&moe_plan_bgemm(&tp, MOE_ARCH_SM80)[1], &tp.spec, 4096, 77, g); /* sm_80: bn 128 */
        CHECK(g[0] == 3 && g[1] == 77 && g[2] == 1);
        moe_family_grid(&b[2], &tp.spec, 4096, 0, g); /* wgrad_up: H / bn x 2F / bm x slots (bn 256) */
        CHECK(g[0] == 2 && g[1] == 3 && g[2] == 8);
        moe_family_grid(&b[3], &tp.spec, 4096, 0, g); /* wgrad_down: F / bn x H / bm x slots */
        CHECK(g[0] == 1 && g[1] == 3 && g[2] == 8);
        moe_family_grid(&moe_plan_bgemm(&tp, MOE_ARCH_SM80)[2], &tp.spec, 4096, 0, g); /* sm_80: bn 128 */
        CHECK(g[0] == 3 && g[1] == 3 && g[2] == 8);
        /* a 64-row block: the dgrads follow it, the wgrads keep their 128 rows */
        CHECK(plan_of(&tp, "name = 'tr' experts = 64 top_k = 2 hidden = 264 ffn = 136 tokens = 512 "
                           "training = true\n") == 0);
        CHECK(tp.align == 64 && moe_plan_bgemm(&tp, MOE_ARCH_SM80)[0].tile.bm == 64 &&
              moe_plan_bgemm(&tp, MOE_ARCH_SM80)[2].tile.bm == 128);
        CHECK(moe_plan_bgemm(&tp, MOE_ARCH_SM90A)[2].tile.bm == 128 && moe_plan_bgemm(&tp, MOE_ARCH_SM90A)[2].threads == 384);
        for (int i = 0; i < 2; i++) { /* both dgrads with a 64-row block: the ping-pong, two warpgroups a tile
                                        * each, two staging tiles' room */
            const moe_kernel_desc_t *d = &moe_plan_bgemm(&tp, MOE_ARCH_SM90A)[i];
            CHECKF(d->tile.bm == 64 && d->tile.consumers == 2 && d->tile.persistent && d->tile.pingpong &&
                   d->threads == 384 && strstr(d->name, "_sm90a_tma_pingpong_m64n256k64s4c2g8") &&
                   d->smem == 4 * (64 + 256) * 64 * 2 + 2 * 64 * (128 + 8) * 2 + 16 * 4, "%s", d->name);
            unsigned g[3];
            moe_family_grid(d, &tp.spec, 512, 40, g); /* the tile grid; the launcher caps it at the SMs */
            CHECK(g[0] == (i == 0 ? 1u : 2u) && g[1] == 40 && g[2] == 1); /* N: F = 136, H = 264 */
        }
        moe_plan_desc_free(&tp);
    }

    CASE("the workspace: regions in order, 256-byte aligned, the total");
    for (int i = 1; i < MOE_WS_COUNT; i++)
        CHECK(pd.ws[i].offset >= pd.ws[i - 1].offset + pd.ws[i - 1].bytes && pd.ws[i].offset % 256 == 0);
    CHECK(pd.ws_bytes >= pd.ws[MOE_WS_COUNT - 1].offset + pd.ws[MOE_WS_COUNT - 1].bytes && pd.ws_bytes % 256 == 0);

    CASE("training: a plan without it has no backward set");
    CHECK(pd.has_bwd == 0 && pd.bwd[0].name[0] == 0);

    CASE("one plan: the mesh tables and the EP part are built with the kernels");
    CHECK(pd.mesh.world == 1 && pd.mesh.nheld == 8 && moe_plan_ep_desc(&pd) == NULL);
    CHECK(plan_of(&pd, ep4) == 0);
    {
        const moe_ep_desc_t *ep = moe_plan_ep_desc(&pd);
        CHECK(pd.mesh.world == 4 && ep && ep->ep == 4 && ep->nheld == pd.mesh.nheld && ep->nheld == 16);
        for (int i = 0; ep && i < MOE_EK_COUNT; i++)
            CHECK((int)ep->k[i].family == MOE_K_EP_FIRST + i && ep->k[i].threads > 0);
        CHECK(ep && strstr(ep->k[MOE_EK_SEND_PLAN].name, "p4s16c0"));
        moe_ep_grid(ep, &pd, MOE_EK_ROWS, 1000, 17, g);
        CHECK(g[0] == 3);
    }

    CASE("one plan: an EP part that cannot be built fails the plan, which is left empty");
    {
        moe_spec_t s;
        moe_diag_t sd;
        char err[256];
        moe_plan_desc_free(&pd);
        CHECK(moe_spec_load(&s, "e.moe", ep4, &(moe_override_t){"tokens=1000000"}, 1, &sd) == 0);
        CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) != 0 &&
                   strstr(err, "dispatch.mode"), "%s", err);
        CHECK(pd.mesh.ranks == NULL);
    }
    CASE("one plan: too many experts for the route kernel fails the plan, naming the family's limit");
    {
        moe_spec_t s;
        moe_diag_t sd;
        char err[256];
        moe_plan_desc_free(&pd);
        if (moe_spec_load(&s, "e.moe", "name = 'big' experts = 2048 top_k = 2 hidden = 128 ffn = 64", NULL, 0, &sd) ==
            0)
            CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) != 0 &&
                       strstr(err, "at most 1024 experts"), "%s", err);
    }
    moe_plan_desc_free(&pd);
    test_training();
    test_ep_training();
    test_workspace();
    test_route_fuse();
    return check_report("test_plan");
}
