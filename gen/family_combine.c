/* family_combine.c — the combine kernel (templates/combine.lua):
 * y[t] = sum over k of w(t, k) * out[row(t, k)], per_block tokens per block. */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    k->per_block = 8;
    return 0;
}

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    (void)k;
    snprintf(out, n, "%s_combine_%s_h%dk%d", s->name, moe_dtype_name(s->dtype), s->hidden, moe_spec_entries(s));
}

/* x: blocks of per_block tokens; y: the split of H for few tokens
 * (moe_combine_split; the kernel reads gridDim.y). */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(tokens, k->per_block);
    g[1] = moe_combine_split(tokens, s->hidden);
}

static const moe_family_variant_t variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "combine", .code = "combine", .geometry = geometry},
};

const moe_family_t moe_family_combine = {.id = MOE_K_COMBINE, .name = "combine", .variants = variants,
                                         .nvariants = 1, .spell = spell, .grid = grid};
