/* bgemm.c — the backward grouped GEMMs' launch: the arguments checked and
 * laid out as templates/gemm_grad.lua's kernels take them, launched through
 * moe_launch_kernel with their family's grid. See bgemm.h. */
#include "bgemm.h"

#include "error.h"

_Static_assert(MOE_BGEMM_KINDS == MOE_BGEMM_COUNT, "one backward GEMM family per kind (gen/family.h)");

static const char *const kind_names[MOE_BGEMM_KINDS] = {"dgrad_down", "dgrad_up", "wgrad_up", "wgrad_down"};

moe_status moe_bgemm_launch(const moe_launcher_t *l, moe_bgemm_kind kind, const moe_bgemm_args *a, CUstream st) {
    if (!l || !a || (unsigned)kind >= MOE_BGEMM_KINDS)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_bgemm_launch: %s", !l ? "no launcher" : !a ? "no arguments"
                                                                                            : "unknown kind");
    const char *what = kind_names[kind];
    if (!l->bgemm)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_bgemm_launch(%s): the plan has no backward kernels (the spec needs "
                                             "training = true)", what);
    if (!l->bgemm_fn[kind])
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_bgemm_launch(%s): kernel '%s' is missing from the plan's module "
                                             "(compiled by an older moegen?)", what, l->bgemm[kind].name);
    const int wgrad = kind == MOE_BGEMM_WGRAD_UP || kind == MOE_BGEMM_WGRAD_DOWN;
    const char *missing = !a->a ? "a" : !a->b ? "b" : !a->out ? "out"
                        : kind == MOE_BGEMM_DGRAD_DOWN && !a->u ? "u"
                        : wgrad && !a->offsets ? "offsets" : wgrad && !a->counts ? "counts"
                        : !wgrad && !a->tiles ? "tiles" : !wgrad && !a->num_tiles ? "num_tiles" : NULL;
    if (missing)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_bgemm_launch(%s): %s is NULL", what, missing);
    if (wgrad && (a->out & 15u))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_bgemm_launch(%s): out (%p) is not 16-byte aligned (the sm_90a "
                        "kernel stores it through a TMA tensor map)", what, (void *)(uintptr_t)a->out);
    if (a->beta != 0 && (wgrad ? a->beta != 1 : 1))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_bgemm_launch(%s): beta is %d; %s", what, a->beta,
                        wgrad ? "0 (write) or 1 (accumulate)" : "the dgrads write (beta 0)");
    if (a->tokens < 0 || a->tokens > l->pd->spec.tokens)
        return moe_fail(a->tokens < 0 ? MOE_ERR_INVALID_ARG : MOE_ERR_CAPACITY,
                        "moe_bgemm_launch(%s): %d tokens (the plan's capacity is %d)", what, a->tokens,
                        l->pd->spec.tokens);
    CUdeviceptr pa = a->a, pb = a->b, pu = a->u, tiles = a->tiles, nt = a->num_tiles, off = a->offsets,
                cnt = a->counts, out = a->out, slot_of = l->slot_table;
    int beta = a->beta, nslots = l->slots; /* the wgrads' slots (an EP rank's held experts) */
    void *dgrad_down[] = {&pa, &pb, &pu, &tiles, &nt, &out};
    void *dgrad_up[] = {&pa, &pb, &tiles, &nt, &out};
    void *wgrad_args[] = {&pa, &pb, &off, &cnt, &slot_of, &out, &beta, &nslots};
    void **args = kind == MOE_BGEMM_DGRAD_DOWN ? dgrad_down : kind == MOE_BGEMM_DGRAD_UP ? dgrad_up : wgrad_args;
    /* the dgrads' row tiles (the wgrads': their rows' extent), the caller's, or every tile `tokens` can fill */
    long long n = a->grid_tiles > 0 ? a->grid_tiles : wgrad ? 0 : moe_launcher_tiles(l, a->tokens);
    if (!wgrad && n <= 0)
        n = 1; /* 0 tokens: one row of CTAs that find no tile */
    return moe_launch_kernel(l, MOE_K_BGEMM_FIRST + (int)kind, a->tokens, n, st, args, NULL);
}
