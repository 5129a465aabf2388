/* family_permute.c — the two permute kernels, both in templates/permute.lua:
 * permute_plan (one block: counts -> offsets aligned to the GEMM bm, the
 * tile table) and permute_scatter (token rows -> expert-major rows, the row
 * map, per_block tokens per block: a warp per token, each x row read once
 * and stored to its entries' rows; fp8: a block per token, quantized by
 * all its warps). */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int plan_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 1024;
    return 0;
}

static void plan_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_permute_plan_e%d_a%d", c->spec->name, moe_spec_slots(c->spec), c->align);
}

static int scatter_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    k->threads = 256;
    /* fp8: a block per token, its 128-column block pairs spread over the 8 warps (each a DRAM round trip and
     * K stores; 8 tokens a block left 28 pairs a warp at H = 7168) */
    k->per_block = moe_spec_fp8(c->spec) ? 1 : 8;
    return 0;
}

static void scatter_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    (void)k;
    /* with fp8 weights the rows are written quantized (e4m3 + a scale per 128 columns); with zero experts
     * (entries of index >= experts: x to the token's row after the slots' rows) e and z, the experts and the
     * zero experts */
    char z[32] = "";
    if (s->zero_experts)
        snprintf(z, sizeof z, "_e%dz%d", s->experts, s->zero_experts);
    /* gx: with the gathered up GEMM (moe_spec_gather) it takes src_of and, given one, writes the maps alone */
    snprintf(out, n, "%s_permute_scatter_%s_h%dk%d%s%s", s->name, moe_spec_fp8(s) ? "e4m3" : moe_dtype_name(s->dtype),
             s->hidden, moe_spec_entries(s), z, moe_spec_gather(s) ? "_gx" : "");
}

static void scatter_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    (void)s;
    g[0] = moe_blocks(tokens, k->per_block);
}

/* the template emits both kernels: each expansion gets both names */
static void push(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set) {
    (void)k;
    moe_lua_set_str(L, "plan_kernel", set[MOE_K_PERMUTE_PLAN].name);
    moe_lua_set_int(L, "plan_threads", set[MOE_K_PERMUTE_PLAN].threads);
    moe_lua_set_str(L, "scatter_kernel", set[MOE_K_PERMUTE_SCATTER].name);
    moe_lua_set_int(L, "scatter_threads", set[MOE_K_PERMUTE_SCATTER].threads);
    moe_lua_set_int(L, "scatter_rows", set[MOE_K_PERMUTE_SCATTER].per_block);
    moe_lua_set_int(L, "gather", moe_spec_gather(c->spec));
}

static const moe_family_variant_t plan_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "permute", .code = "permute", .geometry = plan_geometry},
};
static const moe_family_variant_t scatter_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "permute", .code = "permute", .geometry = scatter_geometry},
};

const moe_family_t moe_family_permute_plan = {.id = MOE_K_PERMUTE_PLAN, .name = "permute_plan",
                                              .variants = plan_variants, .nvariants = 1, .spell = plan_spell,
                                              .push = push};
const moe_family_t moe_family_permute_scatter = {.id = MOE_K_PERMUTE_SCATTER, .name = "permute_scatter",
                                                 .variants = scatter_variants, .nvariants = 1,
                                                 .spell = scatter_spell, .grid = scatter_grid, .push = push};
