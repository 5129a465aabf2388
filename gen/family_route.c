/* family_route.c — the route kernel (templates/route.lua): logits, scores,
 * top-k, weights and the per-expert counts, per_block tokens per block,
 * H split across blocks for few tokens (gen/launch_geom.h, moe_route_split),
 * and for calls of few tokens the permute plan (and scatter) fused into its
 * last block (moe_route_fuse_mode).
 * The one home of the logit phase's tiling (route_tiling): the template
 * takes it as parameters and checks its shared memory against it. */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

enum {
    ROUTE_THREADS = 256,
    ROUTE_TOKENS = 32,           /* per block: two m16 tiles */
    ROUTE_SMEM_CAP = 160 * 1024, /* dynamic + static shared memory: under sm_80's 163 KB per block */
    ROUTE_STAGE_BUDGET = 96 * 1024, /* the stage ring, when more stages fit: two blocks per SM on sm_90 */
    ROUTE_STAGES_MAX = 6,
};

/* The logit phase's tiling: the block's x rows [per_block, bk] and the
 * router rows of one pass [wn * nt * 8, bk] staged together through a ring
 * of `stages` (cp.async), every warp reading both with ldmatrix; warps
 * split the pass's columns (wn, nt n8 tiles each) and the k16 steps of a
 * stage (threads / 32 / wn ways, summed in a fixed order). */
typedef struct {
    int wn, nt, npass, bk, stages, ldl, smem;
} route_tiling_t;

/* The tiling for L logit columns (smem 0 when none fits under the cap).
 * Tried in order: n8 tiles per warp at most 8, 4, 2, 1 (fewer warps
 * reading the same x rows, larger warp tiles) and the widest k step the
 * warps' split allows; the first whose ring of at least 2 stages and
 * logits fit. */
static route_tiling_t route_tiling(int L, int per_block, int threads) {
    const int nw = threads / 32, ntt = (L + 7) / 8;
    static const int ntmax[] = {8, 4, 2, 1};
    route_tiling_t r = {0};
    for (int i = 0; i < 4; i++) {
        int wn = nw;
        for (int d = nw; d >= 1; d--)
            if (nw % d == 0 && d * ntmax[i] >= ntt)
                wn = d;
        const int wk = nw / wn;
        const int npass = (ntt + wn * ntmax[i] - 1) / (wn * ntmax[i]);
        const int nt = (ntt + wn * npass - 1) / (wn * npass);
        const int totc = npass * wn * nt * 8;
        const int ldl = totc + ((8 - totc % 32) % 32 + 32) % 32; /* 8 mod 32 floats: fragment stores spread */
        const int bk = i < 2 ? (16 * wk > 64 ? 16 * wk : 64) : 32;
        if ((bk / 16) % wk)
            continue;
        const int sb = (per_block + wn * nt * 8) * (bk + 8) * 2; /* one stage: rows of bk + 8 halves */
        const int lbytes = per_block * ldl * 4;
        const int avail = ROUTE_SMEM_CAP - 8 * (L + 1) - 64;   /* less the static per-slot counts and slot_of */
        int budget = npass == 1 ? ROUTE_STAGE_BUDGET : avail - lbytes;
        if (budget > ROUTE_STAGE_BUDGET)
            budget = ROUTE_STAGE_BUDGET;
        int stages = budget / sb;
        if (stages > ROUTE_STAGES_MAX)
            stages = ROUTE_STAGES_MAX;
        if (stages < 2)
            stages = 2;
        const int ring = stages * sb;
        const int smem = npass == 1 ? (ring > lbytes ? ring : lbytes) : ring + lbytes;
        if (smem > avail)
            continue;
        r = (route_tiling_t){wn, nt, npass, bk, stages, ldl, smem};
        break;
    }
    return r;
}

static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    const int E = c->spec->experts, Z = c->spec->zero_experts;
    if (E + Z > 1024) {
        if (Z)
            snprintf(err, errlen, "zero_experts (%d): experts + zero_experts (%d) exceeds the 1024 experts the route "
                     "kernel scores", Z, E + Z);
        else
            snprintf(err, errlen, "experts (%d): the route kernel handles at most 1024 experts", E);
        return 1;
    }
    k->threads = ROUTE_THREADS;
    k->per_block = ROUTE_TOKENS;
    /* logit columns: one per scored expert (the zero experts' too), and the shared expert's gate logit */
    const route_tiling_t t = route_tiling(moe_spec_route_mma_columns(c->spec), k->per_block, k->threads);
    if (!t.smem) {
        snprintf(err, errlen, "experts (%d): the route kernel's logits do not fit its shared memory", E);
        return 1;
    }
    k->smem = t.smem;
    return 0;
}

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    const route_tiling_t t = route_tiling(moe_spec_route_mma_columns(s), k->per_block, k->threads);
    /* a shared expert adds its slots (s) and, gated, its gate (g) */
    char sh[24] = "";
    if (s->shared.ffn)
        snprintf(sh, sizeof sh, "s%d%s", moe_spec_shared_slots(s), s->shared.gate == MOE_SHARED_GATE_SIGMOID ? "g" : "");
    /* zero experts: z and their count after the experts' */
    char z[16] = "";
    if (s->zero_experts)
        snprintf(z, sizeof z, "z%d", s->zero_experts);
    /* given routing: the caller's ids (i), and its weights too (w) */
    const char *given = s->router.select != MOE_SELECT_GIVEN ? "" : s->router.score == MOE_SCORE_GIVEN ? "_iw" : "_i";
    /* the router's own input (r), a per-expert weight scale (x) */
    const char *extra = s->router.input == MOE_ROUTER_INPUT_SEPARATE ? (s->router.expert_scale ? "_rx" : "_r")
                                                                     : (s->router.expert_scale ? "_x" : "");
    /* fp32 router weights (w32) */
    const char *w32 = s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32 ? "_w32" : "";
    snprintf(out, n, "%s_route_%s_e%d%sk%d%s_t%dk%ds%d%s%s%s", s->name, moe_dtype_name(s->dtype), s->experts, z,
             s->top_k, sh, k->per_block, t.bk, t.stages, given, extra, w32);
}

/* x: blocks of per_block tokens; y: the split of H for few tokens
 * (moe_route_split; the kernel reads gridDim.y; the router's width, router.hidden where it is set), none when
 * the weights are the caller's (router.score = "given": no logits). */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(tokens, k->per_block);
    g[1] = moe_route_split(tokens, k->per_block, s->router.score == MOE_SCORE_GIVEN ? 0 : moe_spec_router_hidden(s));
}

/* the tiling, for the template (which checks k->smem against it) */
static void push(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set) {
    (void)set;
    const route_tiling_t t = route_tiling(moe_spec_route_mma_columns(c->spec), k->per_block, k->threads);
    moe_lua_set_int(L, "wn", t.wn);
    moe_lua_set_int(L, "nt", t.nt);
    moe_lua_set_int(L, "npass", t.npass);
    moe_lua_set_int(L, "bk", t.bk);
    moe_lua_set_int(L, "stages", t.stages);
    moe_lua_set_int(L, "ldl", t.ldl);
    moe_lua_set_int(L, "fuse_ticket", MOE_ROUTE_FUSE_TICKET); /* after the slots' counts (launch_geom.h) */
    moe_lua_set_int(L, "bad_ids", MOE_ROUTE_BAD_IDS);         /* given routing: the dropped ids' count */
    moe_lua_set_int(L, "mma_columns", moe_spec_route_mma_columns(c->spec)); /* x3 with fp32 router weights */
}

static const moe_family_variant_t variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "route", .code = "route", .geometry = geometry},
};

const moe_family_t moe_family_route = {.id = MOE_K_ROUTE, .name = "route", .variants = variants, .nvariants = 1,
                                       .spell = spell, .grid = grid, .push = push};
