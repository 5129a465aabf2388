/* family_pack.c — the device-side weight pack: one checkpoint tensor
 * (strided gate and up sources, or one source for W2 and b2) gathered into
 * `count` slots of the packed tensor the GEMMs read, on a stream. One
 * thread per packed element, grid-stride; where each element comes from is
 * gen/pack_geom.h's (pasted into the .cu, shared with the host pack).
 *
 * The plan builds it once (moe_plan_desc_t.pack), arch-neutral; emission
 * expands templates/pack.lua for it into every .cu. The runtime caps the
 * grid at 32 blocks per SM, a device fact. */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    return 0;
}

/* The pack depends on F and H only (and copies 16-bit words whatever the
 * dtype); the name spells them. */
static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    (void)k;
    snprintf(out, n, "%s_pack_%s_f%d_h%d", s->name, moe_dtype_name(s->dtype), s->ffn, s->hidden);
}

/* n packed elements, one per thread */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)s, (void)tokens;
    g[0] = moe_blocks(n, k->threads);
}

static const moe_family_variant_t variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "pack", .code = "pack", .geometry = geometry},
};

const moe_family_t moe_family_pack = {.id = MOE_K_PACK, .name = "pack", .variants = variants, .nvariants = 1,
                                      .spell = spell, .grid = grid};
