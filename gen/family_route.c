/* family_route.c — the route kernel (templates/route.lua): logits, scores,
 * top-k, weights and the per-expert counts, per_block tokens per block,
 * H split across blocks for few tokens (gen/launch_geom.h, moe_route_split). */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    const int E = c->spec->experts;
    if (E > 1024) {
        snprintf(err, errlen, "experts (%d): the route kernel handles at most 1024 experts", E);
        return 1;
    }
    /* logit columns: one per expert, and the shared expert's gate logit */
    const int L = moe_spec_router_columns(c->spec);
    k->threads = 256;
    k->per_block = 32;
    if (L > 256) /* logits of 32 tokens x L no longer fit 48 KB of static shared memory */
        k->smem = 20480 + 128 * ((L + 255) / 256 * 256 + 8);
    return 0;
}

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    /* a shared expert adds its slots (s) and, gated, its gate (g) */
    char sh[24] = "";
    if (s->shared.ffn)
        snprintf(sh, sizeof sh, "s%d%s", moe_spec_shared_slots(s), s->shared.gate == MOE_SHARED_GATE_SIGMOID ? "g" : "");
    snprintf(out, n, "%s_route_%s_e%dk%d%s_t%d", s->name, moe_dtype_name(s->dtype), s->experts, s->top_k, sh,
             k->per_block);
}

/* x: blocks of per_block tokens; y: the split of H for few tokens
 * (moe_route_split; the kernel reads gridDim.y). */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(tokens, k->per_block);
    g[1] = moe_route_split(tokens, k->per_block, s->hidden);
}

static const moe_family_variant_t variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "route", .code = "route", .geometry = geometry},
};

const moe_family_t moe_family_route = {.id = MOE_K_ROUTE, .name = "route", .variants = variants, .nvariants = 1,
                                       .spell = spell, .grid = grid};
