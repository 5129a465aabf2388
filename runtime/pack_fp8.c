/* pack_fp8.c — the fp8 weight packs on the host (docs/DESIGN.md, "FP8"):
 * e4m3 weights and their scales as a checkpoint ships them
 * (moe_plan_pack_fp8), and bf16 weights quantized into that format
 * (moe_plan_pack_quantize). Rows land where gen/pack_geom.h puts a 16-bit
 * pack's; the scales keep the checkpoint's row order (fp8_geom below). */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "error.h"
#include "fp8.h"
#include "half.h"
#include "moe_internal.h"
#include "pack_geom.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A pairing granule never straddles a scale block: each packed row of w1q
 * has the one scale of the plain row it came from, so the scales can keep
 * the checkpoint's row order while the rows are paired. */
_Static_assert(MOE_FP8_BLOCK % MOE_PAIR_GRANULE == 0, "gate/up granules stay inside the 128-row scale blocks");

/* The fp8 geometry of tensor t (W1 or W2) for spec s: N x K per slot, the
 * scale block br x bc (128 x 128, or 1 x K per row), the scale grid
 * sr x sc per slot. */
typedef struct {
    long long N, K, br, bc, sr, sc;
} fp8_geom_t;

static fp8_geom_t fp8_geom(const moe_spec_t *s, int t) {
    fp8_geom_t g;
    moe_pack_dims(t, s->ffn, s->hidden, &g.N, &g.K);
    const int block = s->quant.scaling == MOE_SCALING_BLOCK;
    g.br = block ? MOE_FP8_BLOCK : 1;
    g.bc = block ? MOE_FP8_BLOCK : g.K;
    g.sr = g.N / g.br;
    g.sc = g.K / g.bc;
    return g;
}

/* The argument checks both packs share: an fp8 spec, W1 or W2. */
static moe_status check_fp8(const moe_plan_desc_t *pd, const moe_pack_args *a, const char *fn) {
    if (!pd || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (!moe_spec_fp8(&pd->spec))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec's expert weights are not fp8 (quant.weights is \"none\")",
                        fn);
    if (a->tensor != MOE_TENSOR_W1 && a->tensor != MOE_TENSOR_W2)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor %d: fp8 weights are W1 and W2 (the biases stay bf16: "
                        "moe_plan_pack)", fn, (int)a->tensor);
    return MOE_OK;
}

/* The slots written of the weights (bytes at dst) and of their scales
 * (floats at dst_scales) must not overlap. */
static moe_status check_dst_overlap(const moe_pack_args *a, const fp8_geom_t *g, const void *dst,
                                    const float *dst_scales, const char *fn) {
    const uintptr_t q0 = (uintptr_t)dst + (uintptr_t)(a->first * g->N * g->K), qn = (uintptr_t)(a->count * g->N * g->K);
    const uintptr_t s0 = (uintptr_t)(dst_scales + a->first * g->sr * g->sc), sn = (uintptr_t)(a->count * g->sr * g->sc * 4);
    if (q0 < s0 + sn && s0 < q0 + qn)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the scales overlap the weights they are packed beside", fn);
    return MOE_OK;
}

/* Plain row r (W1: gate rows, then up) of source expert e: the source and
 * its row there. */
static const moe_pack_src *plain_row(const moe_pack_args *a, long long r, long long half, long long *row) {
    const int up = a->tensor == MOE_TENSOR_W1 && r >= half;
    *row = up ? r - half : r;
    return &a->src[up];
}

/* The checks of moe_plan_pack_fp8(_async) (fn names the call). */
static moe_status check_pack(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a,
                             const moe_pack_args *sc, const void *dst, const float *dst_scales, const char *fn) {
    moe_status rc = check_fp8(pd, a, fn);
    if (rc)
        return rc;
    if (!sc || sc->tensor != a->tensor || sc->first != a->first || sc->count != a->count)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the scales must describe the same tensor, first and count as the "
                        "weights", fn);
    const fp8_geom_t g = fp8_geom(&pd->spec, (int)a->tensor);
    if ((rc = moe_pack_check_dims(pd, slots, a, dst, fn, g.N, g.K, 1, 1)) ||
        (rc = moe_pack_check_dims(pd, slots, sc, dst_scales, fn, g.sr, g.sc, 4, 4)))
        return rc;
    return check_dst_overlap(a, &g, dst, dst_scales, fn);
}

/* The checks of moe_plan_pack_quantize(_async). */
static moe_status check_quantize(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a,
                                 const void *dst, const float *dst_scales, const char *fn) {
    moe_status rc = check_fp8(pd, a, fn);
    if (rc)
        return rc;
    const fp8_geom_t g = fp8_geom(&pd->spec, (int)a->tensor);
    if ((rc = moe_pack_check_dims(pd, slots, a, dst, fn, g.N, g.K, 2, 1)))
        return rc;
    if (!dst_scales)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    return check_dst_overlap(a, &g, dst, dst_scales, fn);
}

moe_status moe_pack_fp8_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a,
                             const moe_pack_args *sc, void *dst, float *dst_scales) {
    moe_status rc = check_pack(pd, slots, a, sc, dst, dst_scales, "moe_plan_pack_fp8");
    if (rc)
        return rc;
    const int t = (int)a->tensor;
    const fp8_geom_t g = fp8_geom(&pd->spec, t);
    const long long F = pd->spec.ffn;
    uint8_t *d = (uint8_t *)dst + (long long)a->first * g.N * g.K;
    for (long long e = 0; e < a->count; e++)
        for (long long pr = 0; pr < g.N; pr++, d += g.K) {
            long long row;
            const moe_pack_src *s = &a->src[moe_pack_source(t, pr, F, &row)];
            const uint8_t *from = (const uint8_t *)s->ptr + e * s->expert + row * s->row;
            if (s->col == 1)
                memcpy(d, from, (size_t)g.K);
            else
                for (long long c = 0; c < g.K; c++)
                    d[c] = from[c * s->col];
        }
    float *ds = dst_scales + (long long)a->first * g.sr * g.sc;
    for (long long e = 0; e < a->count; e++)
        for (long long r = 0; r < g.sr; r++, ds += g.sc) {
            long long row;
            const moe_pack_src *s = plain_row(sc, r, g.sr / 2, &row);
            for (long long c = 0; c < g.sc; c++)
                ds[c] = ((const float *)s->ptr)[e * s->expert + row * s->row + c * s->col];
        }
    return MOE_OK;
}

moe_status moe_pack_quantize_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a, void *dst,
                                  float *dst_scales) {
    moe_status rc = check_quantize(pd, slots, a, dst, dst_scales, "moe_plan_pack_quantize");
    if (rc)
        return rc;
    const int t = (int)a->tensor;
    const fp8_geom_t g = fp8_geom(&pd->spec, t);
    const long long F = pd->spec.ffn, half = g.N / 2;
    for (long long e = 0; e < a->count; e++) {
        const long long slot = a->first + e;
        uint8_t *q = (uint8_t *)dst + slot * g.N * g.K;
        float *ss = dst_scales + slot * g.sr * g.sc;
        for (long long rb = 0; rb < g.sr; rb++)
            for (long long cb = 0; cb < g.sc; cb++) {
                float amax = MOE_FP8_AMAX_MIN;
                for (long long r = rb * g.br; r < (rb + 1) * g.br; r++) {
                    long long row;
                    const moe_pack_src *s = plain_row(a, r, half, &row);
                    const uint16_t *from = (const uint16_t *)s->ptr + e * s->expert + row * s->row;
                    for (long long c = cb * g.bc; c < (cb + 1) * g.bc; c++) {
                        const float v = fabsf(moe_half_to_float(from[c * s->col], MOE_DTYPE_BF16));
                        if (v > amax)
                            amax = v;
                    }
                }
                const float mul = MOE_E4M3_MAX / amax;
                ss[rb * g.sc + cb] = amax / MOE_E4M3_MAX;
                for (long long r = rb * g.br; r < (rb + 1) * g.br; r++) {
                    long long row;
                    const moe_pack_src *s = plain_row(a, r, half, &row);
                    const uint16_t *from = (const uint16_t *)s->ptr + e * s->expert + row * s->row;
                    uint8_t *to = q + (t == MOE_TENSOR_W1 ? moe_pack_row(r, F) : r) * g.K;
                    for (long long c = cb * g.bc; c < (cb + 1) * g.bc; c++)
                        to[c] = moe_float_to_e4m3(moe_half_to_float(from[c * s->col], MOE_DTYPE_BF16) * mul);
                }
            }
    }
    return MOE_OK;
}

/* ---- on the device (templates/pack.lua's fp8 kernels) -------------------- */

static moe_status launch(const moe_plan *p, CUfunction fn, const char *what, unsigned blocks, CUstream st,
                         void **args) {
    const moe_launcher_t *l = &p->launcher;
    if (!fn)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the plan's module has no %s_%s kernel: compile it again, or pack on "
                        "the host", what, l->pack->name, what);
    CUresult r = moe_cu.cuLaunchKernel(fn, blocks, 1, 1, (unsigned)l->pack->threads, 1, 1, 0, st, args, NULL);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "launching %s_%s (%u blocks): %s", l->pack->name, what, blocks,
                        moe_cu_error_string(r));
    return MOE_OK;
}

/* blocks of a grid-stride kernel over n elements */
static unsigned stride_blocks(const moe_plan *p, long long n) {
    long long b = (n + p->launcher.pack->threads - 1) / p->launcher.pack->threads, cap = 32LL * (p->launcher.sms > 0 ? p->launcher.sms : 4);
    return (unsigned)(b < cap ? b : cap);
}

moe_status moe_pack_fp8_device(const moe_plan *p, long long slots, const moe_pack_args *a, const moe_pack_args *sc,
                               void *dst, float *dst_scales, void *stream) {
    const char *fn = "moe_plan_pack_fp8_async";
    moe_status rc = check_pack(&p->pd, slots, a, sc, dst, dst_scales, fn);
    if (rc)
        return rc;
    const fp8_geom_t g = fp8_geom(&p->pd.spec, (int)a->tensor);
    if (a->count == 0)
        return MOE_OK;
    if (!p->launcher.pack8_fn || !p->launcher.scales_fn)
        return launch(p, NULL, "e4m3", 0, NULL, NULL);
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    int tensor = (int)a->tensor;
    long long first = a->first, count = a->count, sr = g.sr, scn = g.sc;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, q0 = (CUdeviceptr)(uintptr_t)a->src[0].ptr,
                q1 = (CUdeviceptr)(uintptr_t)(a->src[1].ptr ? a->src[1].ptr : a->src[0].ptr);
    moe_pack_stride_t t0 = {a->src[0].expert, a->src[0].row, a->src[0].col},
                      t1 = {a->src[1].expert, a->src[1].row, a->src[1].col};
    void *args[] = {&tensor, &d, &q0, &q1, &t0, &t1, &first, &count};
    if ((rc = launch(p, p->launcher.pack8_fn, "e4m3", stride_blocks(p, count * g.N * g.K), (CUstream)stream, args)))
        return rc;
    CUdeviceptr ds = (CUdeviceptr)(uintptr_t)dst_scales, c0 = (CUdeviceptr)(uintptr_t)sc->src[0].ptr,
                c1 = (CUdeviceptr)(uintptr_t)(sc->src[1].ptr ? sc->src[1].ptr : sc->src[0].ptr);
    moe_pack_stride_t u0 = {sc->src[0].expert, sc->src[0].row, sc->src[0].col},
                      u1 = {sc->src[1].expert, sc->src[1].row, sc->src[1].col};
    void *sargs[] = {&tensor, &ds, &c0, &c1, &u0, &u1, &first, &count, &sr, &scn};
    return launch(p, p->launcher.scales_fn, "scales", stride_blocks(p, count * sr * scn), (CUstream)stream, sargs);
}

moe_status moe_pack_quantize_device(const moe_plan *p, long long slots, const moe_pack_args *a, void *dst,
                                    float *dst_scales, void *stream) {
    const char *fn = "moe_plan_pack_quantize_async";
    moe_status rc = check_quantize(&p->pd, slots, a, dst, dst_scales, fn);
    if (rc)
        return rc;
    const fp8_geom_t g = fp8_geom(&p->pd.spec, (int)a->tensor);
    if (a->count == 0)
        return MOE_OK;
    const long long blocks = (long long)a->count * g.sr * g.sc;
    if (blocks > 0x7FFFFFFFLL)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: %lld scale blocks in one call, more than a grid holds: pack fewer "
                        "slots at a time", fn, blocks);
    if (!p->launcher.quantize_fn)
        return launch(p, NULL, "quantize", 0, NULL, NULL);
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    int tensor = (int)a->tensor;
    long long first = a->first, count = a->count;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, ds = (CUdeviceptr)(uintptr_t)dst_scales,
                s0 = (CUdeviceptr)(uintptr_t)a->src[0].ptr,
                s1 = (CUdeviceptr)(uintptr_t)(a->src[1].ptr ? a->src[1].ptr : a->src[0].ptr);
    moe_pack_stride_t t0 = {a->src[0].expert, a->src[0].row, a->src[0].col},
                      t1 = {a->src[1].expert, a->src[1].row, a->src[1].col};
    void *args[] = {&tensor, &d, &ds, &s0, &s1, &t0, &t1, &first, &count};
    return launch(p, p->launcher.quantize_fn, "quantize", (unsigned)blocks, (CUstream)stream, args);
}
