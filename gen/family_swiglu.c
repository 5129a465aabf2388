/* family_swiglu.c — the cuDNN path's standalone activation: h [rows, F] =
 * SwiGLU of the packed matmul output u [rows, 2F] (gate/up in granules of
 * 8, paired), eight columns per thread, grid-stride.
 *
 * The plan builds it once (moe_plan_desc_t.swiglu); emission expands
 * templates/swiglu.lua for it. The runtime caps the grid at
 * 32 blocks per SM, a device fact. */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    return 0;
}

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    (void)k;
    snprintf(out, n, "%s_swiglu_%s_f%d", s->name, moe_dtype_name(s->dtype), s->ffn);
}

/* n rows of F / 8 eight-column groups, one per thread */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)tokens;
    g[0] = moe_blocks(n * (s->ffn / 8), k->threads);
}

static const moe_family_variant_t variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "swiglu", .code = "swiglu", .geometry = geometry},
};

const moe_family_t moe_family_swiglu = {.id = MOE_K_SWIGLU, .name = "swiglu", .variants = variants, .nvariants = 1,
                                        .spell = spell, .grid = grid};
