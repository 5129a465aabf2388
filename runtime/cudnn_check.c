/* cudnn_check.c — the plan-time self-check of the cuDNN path against the
 * generated kernels, and the probe for tests and notes. See cudnn.h. */
#define _GNU_SOURCE
#include "cudnn_impl.h"

#include "error.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if MOE_HAVE_CUDNN_H

/* The self-check's rows: a few experts get rows (one crossing an M tile,
 * one a single row), the rest none — an empty expert between non-empty
 * ones and runs of empty ones, so offsets repeat; the padded total fits M. */
static int check_layout(const moe_cudnn_t *c, int *counts, int *offsets) {
    const int E = c->pd->spec.experts, A = c->pd->align;
    const int want[5][2] = {{0, A + 3}, {2, 1}, {E / 2, 17}, {E - 1, 5}, {E / 3, 2 * A - 1}};
    memset(counts, 0, sizeof(int) * (size_t)E);
    for (int i = 0; i < 5; i++)
        if (want[i][0] != 1 && want[i][0] < E && !counts[want[i][0]])
            counts[want[i][0]] = want[i][1];
    for (;;) {
        long long total = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = (int)total;
            total += (counts[e] + A - 1) / A * A;
        }
        offsets[E] = (int)total;
        if (total <= c->M)
            break;
        int big = 0; /* shrink the largest until it fits */
        for (int e = 1; e < E; e++)
            if (counts[e] > counts[big])
                big = e;
        if (counts[big] <= 1)
            return 0;
        counts[big] /= 2;
    }
    int rows = 0;
    for (int e = 0; e < E; e++)
        rows += counts[e];
    return rows;
}

/* Normalized L2 of a vs b over the routed rows, width W; NaN when any
 * value is not finite (poison left, or a wrong result). */
static double compare_rows(const moe_cudnn_t *c, CUdeviceptr a, CUdeviceptr b, long long W, const int *counts,
                           const int *offsets, double *maxabs) {
    const moe_spec_t *s = &c->pd->spec;
    double num = 0, den = 0;
    *maxabs = 0;
    int bad = 0;
    for (int e = 0; e < s->experts && !bad; e++) {
        if (!counts[e])
            continue;
        size_t n = (size_t)counts[e] * (size_t)W;
        uint16_t *ha = malloc(n * 2), *hb = malloc(n * 2);
        size_t off = (size_t)offsets[e] * (size_t)W * 2;
        if (!ha || !hb || moe_cu.cuMemcpyDtoH(ha, a + off, n * 2) != CUDA_SUCCESS ||
            moe_cu.cuMemcpyDtoH(hb, b + off, n * 2) != CUDA_SUCCESS) {
            bad = 1;
        } else {
            for (size_t i = 0; i < n; i++) {
                float x = moe_half_to_float(ha[i], s->dtype), y = moe_half_to_float(hb[i], s->dtype);
                if (!isfinite(x) || !isfinite(y)) {
                    bad = 1;
                    break;
                }
                num += (double)(x - y) * (x - y);
                den += (double)y * y;
                if (fabs(x - y) > *maxabs)
                    *maxabs = fabs(x - y);
            }
        }
        free(ha);
        free(hb);
    }
    if (bad)
        return NAN;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* See cudnn_impl.h. */
moe_status moe_cudnn_self_check(moe_cudnn_t *c, const int cand[MOE_STAGE_COUNT], int ok[MOE_STAGE_COUNT],
                                char why[MOE_STAGE_COUNT][1024]) {
    const moe_spec_t *s = &c->pd->spec;
    const long long E = s->experts, H = s->hidden, F = s->ffn, M = c->M;
    const double tol = s->dtype == MOE_DTYPE_BF16 ? MOE_CUDNN_CHECK_TOL_BF16 : MOE_CUDNN_CHECK_TOL_FP16;
    int *counts = calloc((size_t)E, sizeof(int)), *offsets = calloc((size_t)E + 1, sizeof(int));
    int *tiles = calloc((size_t)(M / c->pd->align + E + 1) * 4, sizeof(int));
    moe_status rc = MOE_OK;
    enum { XS, W, U, HC, HG, OC, OG, OFF, TILES, NT, CWS, SKP, SKT, NBUF };
    CUdeviceptr b[NBUF] = {0};
    if (!counts || !offsets || !tiles) {
        rc = moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    int rows = check_layout(c, counts, offsets);
    if (rows == 0) {
        rc = moe_fail(MOE_ERR_UNSUPPORTED, "the cuDNN self-check found no ragged case that fits %lld rows", M);
        goto done;
    }
    int ntiles = 0, empty = 0, A = c->pd->align;
    for (int e = 0; e < E; e++) {
        empty += counts[e] == 0;
        for (int r = 0; r < counts[e]; r += A, ntiles++) {
            tiles[4 * ntiles] = e;
            tiles[4 * ntiles + 1] = offsets[e] + r;
            tiles[4 * ntiles + 2] = counts[e] - r < A ? counts[e] - r : A;
            tiles[4 * ntiles + 3] = 0;
        }
    }
    size_t cws = c->st[0].ws > c->st[1].ws ? c->st[0].ws : c->st[1].ws;
    const int up = cand[MOE_STAGE_UP], down = cand[MOE_STAGE_DOWN];
    /* split-K GEMMs (tile.splitk): their partials and zeroed tickets over the launcher's tiles */
    long long sk_partials = 0, sk_tickets = 0;
    for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++) {
        long long pp, tt;
        moe_gemm_splitk_space(&c->l->kernels[k], s, moe_launcher_tiles(c->l, (int)s->tokens), &pp, &tt);
        sk_partials = pp > sk_partials ? pp : sk_partials;
        sk_tickets = tt > sk_tickets ? tt : sk_tickets;
    }
    const size_t bytes[NBUF] = {(size_t)(M * H * 2), (size_t)(E * 2 * F * H * 2), up ? (size_t)(M * 2 * F * 2) : 16,
                                up ? (size_t)(M * F * 2) : 16, (size_t)(M * F * 2), down ? (size_t)(M * H * 2) : 16,
                                down ? (size_t)(M * H * 2) : 16,
                                (size_t)(E + 1) * 4, (size_t)ntiles * 16 + 16, 4, cws ? cws : 16,
                                (size_t)sk_partials * 4 + 16, (size_t)sk_tickets * 4 + 16};
    size_t total = 0;
    for (int i = 0; i < NBUF; i++) {
        total += up256(bytes[i]);
        CUresult r = moe_cu.cuMemAlloc(&b[i], bytes[i]);
        if (r != CUDA_SUCCESS) {
            rc = moe_fail(MOE_ERR_NO_MEMORY, "the cuDNN self-check could not allocate %zu bytes of device memory "
                          "(%zu in all: a weight set and the stage buffers at %lld rows): %s", bytes[i], total, M,
                          moe_cu_error_string(r));
            goto done;
        }
    }
    CUresult r = moe_cu.cuMemcpyHtoD(b[OFF], offsets, bytes[OFF]);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyHtoD(b[TILES], tiles, (size_t)ntiles * 16 + 16);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyHtoD(b[NT], &ntiles, 4);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemsetD8(b[SKT], 0, bytes[SKT]);
    if (r != CUDA_SUCCESS || !moe_cudnn_fill(c, b[XS], (unsigned long long)(M * H), 1, 1.0f) ||
        !moe_cudnn_fill(c, b[W], (unsigned long long)(E * 2 * F * H), 2, 2.0f / sqrtf((float)H))) {
        rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check's inputs: %s", moe_cu_error_string(r));
        goto done;
    }
    /* up: the generated kernel, and cuDNN + SwiGLU into poisoned buffers */
    {
        CUdeviceptr nul = 0;
        /* a training plan's ubuf: none; split-K's partials and tickets after it (never with ubuf); a gathering
         * up GEMM's x and src_of last, NULL: its rows from XS as the other kernels' (runtime/ffn.c) */
        void *args[] = {&b[XS], &b[W], &nul, &b[TILES], &b[NT], &b[HG], &nul, &nul, &nul, &nul};
        if (c->l->kernels[MOE_K_GEMM_UP].tile.splitk)
            args[6] = &b[SKP], args[7] = &b[SKT];
        if ((rc = moe_launch_kernel(c->l, MOE_K_GEMM_UP, s->tokens, 0, NULL, args, NULL)))
            goto done;
    }
    if (cand[MOE_STAGE_UP]) {
        moe_cu.cuMemsetD8(b[U], 0xff, bytes[U]);
        moe_cu.cuMemsetD8(b[HC], 0xff, bytes[HC]);
        if ((rc = moe_dn_exec(c, MOE_STAGE_UP, b[XS], (void *)(uintptr_t)b[W], b[OFF], b[U], b[CWS], NULL)) ||
            (rc = moe_cudnn_launch_swiglu(c, b[U], b[HC], b[OFF], M, NULL)))
            goto done;
    }
    if ((r = moe_cu.cuCtxSynchronize()) != CUDA_SUCCESS) {
        rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check (up stage) faulted: %s", moe_cu_error_string(r));
        goto done;
    }
    double err, maxabs;
    if (cand[MOE_STAGE_UP]) {
        err = compare_rows(c, b[HC], b[HG], F, counts, offsets, &maxabs);
        ok[MOE_STAGE_UP] = err <= tol;
        snprintf(why[MOE_STAGE_UP], 1024, "self-check %s: error %.2e (max abs %.3g) %s %.0e on %d routed rows, "
                 "%d of %lld experts empty", ok[MOE_STAGE_UP] ? "passed" : "FAILED", err, maxabs,
                 ok[MOE_STAGE_UP] ? "<=" : "not <=", tol, rows, empty, E);
    }
    if (cand[MOE_STAGE_DOWN]) {
        /* down: both from the generated up output, weights refilled as [E, H, F] */
        CUdeviceptr nul = 0;
        int none = 0;
        void *args[11] = {&b[HG], &b[W], &nul, &b[TILES], &b[NT], &b[OG], &b[SKP], &b[SKT]}; /* split-K: the last 2 */
        if (c->l->kernels[MOE_K_GEMM_DOWN].tile.gemv) /* the gemv grid's: the folded combine's five, y NULL (off) */
            args[6] = &nul, args[7] = &nul, args[8] = &none, args[9] = &nul, args[10] = &nul;
        moe_cu.cuMemsetD8(b[OC], 0xff, bytes[OC]);
        if (!moe_cudnn_fill(c, b[W], (unsigned long long)(E * H * F), 3, 2.0f / sqrtf((float)F))) {
            rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check's down weights");
            goto done;
        }
        if ((rc = moe_launch_kernel(c->l, MOE_K_GEMM_DOWN, s->tokens, 0, NULL, args, NULL)) ||
            (rc = moe_dn_exec(c, MOE_STAGE_DOWN, b[HG], (void *)(uintptr_t)b[W], b[OFF], b[OC], b[CWS], NULL)))
            goto done;
        if ((r = moe_cu.cuCtxSynchronize()) != CUDA_SUCCESS) {
            rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check (down stage) faulted: %s", moe_cu_error_string(r));
            goto done;
        }
        err = compare_rows(c, b[OC], b[OG], H, counts, offsets, &maxabs);
        ok[MOE_STAGE_DOWN] = err <= tol;
        snprintf(why[MOE_STAGE_DOWN], 1024, "self-check %s: error %.2e (max abs %.3g) %s %.0e on %d routed rows, "
                 "%d of %lld experts empty", ok[MOE_STAGE_DOWN] ? "passed" : "FAILED", err, maxabs,
                 ok[MOE_STAGE_DOWN] ? "<=" : "not <=", tol, rows, empty, E);
    }
done:
    for (int i = 0; i < NBUF; i++)
        if (b[i])
            moe_cu.cuMemFree(b[i]);
    free(counts);
    free(offsets);
    free(tiles);
    return rc;
}

#endif /* MOE_HAVE_CUDNN_H */

int moe_cudnn_probe(const moe_plan_desc_t *pd, int stage, const char *path, char *report, size_t n) {
    int version = 0;
    char why[900];
    if (moe_cudnn_load(path, &version, why, sizeof why)) {
        snprintf(report, n, "not loaded: %s", why);
        return -1;
    }
#if !MOE_HAVE_CUDNN_H
    (void)pd; (void)stage;
    return -1;
#else
    moe_cudnn_t *c = moe_cudnn_new(pd, MOE_ARCH_SM90A, NULL);
    if (!c) {
        snprintf(report, n, "out of memory");
        return -1;
    }
    char v[32];
    moe_cudnn_version_string(version, v, sizeof v);
    int rc = -1;
    if (!moe_dn_ok(moe_dn.cudnnCreate(&c->handle), "cudnnCreate", why, sizeof why)) {
        c->handle = NULL;
        snprintf(report, n, "cuDNN %s: %s", v, why);
    } else if (!moe_dn_build(c, stage, why, sizeof why)) {
        snprintf(report, n, "cuDNN %s, %s stage (%s, M %lld): %s", v, moe_cudnn_stage_names[stage],
                 moe_dtype_name(c->pd->spec.dtype), c->M, why);
    } else {
        snprintf(report, n, "cuDNN %s, %s stage (%s, M %lld): finalized, engine %lld, workspace %zu bytes", v,
                 moe_cudnn_stage_names[stage], moe_dtype_name(c->pd->spec.dtype), c->M, c->st[stage].engine,
                 c->st[stage].ws);
        rc = 0;
    }
    moe_cudnn_destroy(c);
    return rc;
#endif
}
