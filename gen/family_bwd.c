/* family_bwd.c — the backward's own kernels (everything of the backward
 * but its four grouped GEMMs, which are bgemm's, and the U it recomputes
 * when the training forward did not save it, which is the forward's up
 * GEMM's): templates/bwd.lua's row and router kernels (docs/DESIGN.md,
 * "Backward"), the fp32 add of moe_reduce_scatter_grads' accumulate and an EP rank's rows per held slot
 * (docs/DESIGN.md, "Expert-parallel backward"). All arch-neutral: the plan builds them once, into
 * moe_plan_desc_t.bwd, and only when spec.training is set. */
#include "family.h"
#include "launch_geom.h"

#include <stdio.h>

/* ---- the row and router kernels: a warp per row or token (dx: a block of tokens x columns) -------------- */

static int warp_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    k->per_block = 8; /* one warp each */
    return 0;
}

/* dx: a block of tokens x columns (moe_bwd_dx_cols): 32 x 256 on tensor cores, else 8 tokens x 8 columns a thread */
static int dx_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    k->threads = 256;
    k->per_block = moe_bwd_router_mma(c->spec) ? MOE_BWD_DX_MMA_TOKENS : 8;
    return 0;
}

static int block_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    k->threads = 256;
    return 0;
}

static void dys_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_dys_%s_h%dk%d", c->spec->name, moe_dtype_name(c->spec->dtype), c->spec->hidden,
             moe_spec_entries(c->spec));
}

static void router_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_router_e%dk%d", c->spec->name, c->spec->experts, moe_spec_entries(c->spec));
}

static void dx_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_dx_%s_h%de%dk%d", c->spec->name, moe_dtype_name(c->spec->dtype), c->spec->hidden,
             c->spec->experts, moe_spec_entries(c->spec));
}

static void dwr_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_dwr_%s_h%de%d", c->spec->name, moe_dtype_name(c->spec->dtype), c->spec->hidden,
             c->spec->experts);
}

static void colsum_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_colsum_%s", c->spec->name, moe_dtype_name(c->spec->dtype));
}

static void unpack_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_unpack_f%d_h%d", c->spec->name, c->spec->ffn, c->spec->hidden);
}

static void slot_rows_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_slot_rows", c->spec->name);
}

static void escale_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_escale_e%dk%d", c->spec->name, c->spec->experts, moe_spec_entries(c->spec));
}

static void accum_spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    (void)k;
    snprintf(out, n, "%s_bwd_accum", c->spec->name);
}

/* a warp per (token, entry) row */
static void dys_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(moe_routed_rows(tokens, moe_spec_entries(s)), k->per_block);
}

/* a warp per token */
static void token_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)s, (void)n;
    g[0] = moe_blocks(tokens, k->per_block);
}

/* per_block tokens x moe_bwd_dx_cols columns of H a block (templates/bwd.lua's dx) */
static void dx_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)n;
    g[0] = moe_blocks(tokens, k->per_block);
    g[1] = moe_blocks(s->hidden, moe_bwd_dx_cols(s, k));
}

/* MOE_BWD_DWR_COLS hidden columns (and, with router.logit_bias, the ones
 * column H that gives d logit_bias) x MOE_BWD_DWR_EXPERTS experts per block
 * x n token splits (moe_dwr_splits; 1 for the splits' sum) */
static void dwr_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)k, (void)tokens;
    g[0] = moe_blocks(moe_spec_dwr_columns(s), MOE_BWD_DWR_COLS);
    g[1] = moe_blocks(moe_spec_router_columns(s), MOE_BWD_DWR_EXPERTS); /* and the shared gate's row */
    g[2] = n > 1 ? (unsigned)n : 1;
}

/* n columns, 32 per block, x one block row per weight slot */
static void colsum_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)k, (void)tokens;
    g[0] = moe_blocks(n, 32);
    g[1] = (unsigned)moe_spec_slots(s);
}

/* a block per routed expert */
static void expert_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)k, (void)tokens, (void)n;
    g[0] = (unsigned)s->experts;
}

/* n elements, one per thread, grid-stride (the runtime caps it) */
static void unpack_grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)s, (void)tokens;
    g[0] = moe_blocks(n, k->threads);
}

static const moe_family_variant_t warp_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "bwd", .code = "bwd", .geometry = warp_geometry},
};
static const moe_family_variant_t dx_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "bwd", .code = "bwd", .geometry = dx_geometry},
};
static const moe_family_variant_t block_variants[] = {
    {.archs = MOE_ALL_ARCHES, .tmpl = "bwd", .code = "bwd", .geometry = block_geometry},
};

const moe_family_t moe_family_bwd_dys = {.id = MOE_K_BWD_DYS, .name = "bwd_dys", .variants = warp_variants,
                                         .nvariants = 1, .spell = dys_spell, .grid = dys_grid};
const moe_family_t moe_family_bwd_router = {.id = MOE_K_BWD_ROUTER, .name = "bwd_router", .variants = warp_variants,
                                            .nvariants = 1, .spell = router_spell, .grid = token_grid};
const moe_family_t moe_family_bwd_dx = {.id = MOE_K_BWD_DX, .name = "bwd_dx", .variants = dx_variants,
                                        .nvariants = 1, .spell = dx_spell, .grid = dx_grid};
const moe_family_t moe_family_bwd_dwr = {.id = MOE_K_BWD_DWR, .name = "bwd_dwr", .variants = block_variants,
                                         .nvariants = 1, .spell = dwr_spell, .grid = dwr_grid};
const moe_family_t moe_family_bwd_colsum = {.id = MOE_K_BWD_COLSUM, .name = "bwd_colsum",
                                            .variants = block_variants, .nvariants = 1, .spell = colsum_spell,
                                            .grid = colsum_grid};
const moe_family_t moe_family_bwd_accum = {.id = MOE_K_BWD_ACCUM, .name = "bwd_accum", .variants = block_variants,
                                           .nvariants = 1, .spell = accum_spell, .grid = unpack_grid};
const moe_family_t moe_family_bwd_slot_rows = {.id = MOE_K_BWD_SLOT_ROWS, .name = "bwd_slot_rows",
                                               .variants = block_variants, .nvariants = 1, .spell = slot_rows_spell,
                                               .grid = unpack_grid};
const moe_family_t moe_family_bwd_escale = {.id = MOE_K_BWD_ESCALE, .name = "bwd_escale",
                                            .variants = block_variants, .nvariants = 1, .spell = escale_spell,
                                            .grid = expert_grid};
const moe_family_t moe_family_bwd_unpack = {.id = MOE_K_BWD_UNPACK, .name = "bwd_unpack",
                                            .variants = block_variants, .nvariants = 1, .spell = unpack_spell,
                                            .grid = unpack_grid};
