/* pack.c — weight packing: checkpoint layouts (strided sources) into the
 * tensors the GEMMs read, on the host (moe_plan_pack) and on the device
 * (moe_plan_pack_async, the plan's pack kernel, templates/pack.lua). Where
 * each element lands is gen/pack_geom.h's, shared with the kernel. */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "error.h"
#include "moe_internal.h"
#include "pack_geom.h"

#include <stdint.h>
#include <string.h>

_Static_assert((int)MOE_TENSOR_W1 == MOE_PACK_W1 && (int)MOE_TENSOR_B1 == MOE_PACK_B1 && (int)MOE_TENSOR_W2 == MOE_PACK_W2 &&
                   (int)MOE_TENSOR_B2 == MOE_PACK_B2,
               "moe.h's moe_tensor and pack_geom.h's tensors agree");

static const char *const tensor_names[] = {"W1", "b1", "W2", "b2"};

/* Bytes from a source's base to one past its last element read (its span),
 * elements of esize bytes, or -1 when that overflows 64 bits. */
static int64_t src_span(const moe_pack_src *s, int64_t count, int64_t rows, int64_t cols, int esize) {
    int64_t a, b, c, off;
    if (__builtin_mul_overflow(count - 1, s->expert, &a) || __builtin_mul_overflow(rows - 1, s->row, &b) ||
        __builtin_mul_overflow(cols - 1, cols > 1 ? s->col : 0, &c) || __builtin_add_overflow(a, b, &off) ||
        __builtin_add_overflow(off, c, &off) || __builtin_add_overflow(off, 1, &off) ||
        __builtin_mul_overflow(off, esize, &off))
        return -1;
    return off;
}

static int overlaps(uintptr_t a, int64_t an, uintptr_t b, int64_t bn) {
    return a < b + (uintptr_t)bn && b < a + (uintptr_t)an;
}

moe_status moe_pack_check(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a, const void *dst,
                          const char *fn) {
    if (!pd || !a || !dst)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if ((unsigned)a->tensor > MOE_TENSOR_B2)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor %d is not a moe_tensor", fn, (int)a->tensor);
    long long R, C;
    moe_pack_dims((int)a->tensor, pd->spec.ffn, pd->spec.hidden, &R, &C);
    return moe_pack_check_dims(pd, slots, a, dst, fn, R, C, 2, 2);
}

moe_status moe_pack_check_dims(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a, const void *dst,
                               const char *fn, long long R, long long C, int esrc, int edst) {
    if (!pd || !a || !dst)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if ((unsigned)a->tensor > MOE_TENSOR_B2)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor %d is not a moe_tensor", fn, (int)a->tensor);
    const int t = (int)a->tensor, nsrc = t == MOE_PACK_W1 || t == MOE_PACK_B1 ? 2 : 1;
    const char *tn = tensor_names[t];
    if (a->first < 0 || a->count < 0 || (long long)a->first + a->count > slots)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: %s slots %d .. %lld are outside the plan's %lld weight slots", fn, tn,
                        a->first, (long long)a->first + a->count - 1, slots);
    const int64_t srows = nsrc == 2 ? R / 2 : R; /* rows of a source: half of W1's and b1's (gate, up), all of W2's and b2's */
    const int64_t dbase = (int64_t)a->first * R * C * edst, dbytes = (int64_t)a->count * R * C * edst;
    for (int i = 0; i < nsrc; i++) {
        const moe_pack_src *s = &a->src[i];
        const char *sn = nsrc == 2 ? (i ? "up" : "gate") : "source";
        if (!s->ptr)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: the %s %s pointer is NULL", fn, tn, sn);
        if (s->expert < 0 || s->row < 0 || s->col < 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: the %s %s has a negative stride (%lld, %lld, %lld)", fn, tn, sn,
                            (long long)s->expert, (long long)s->row, (long long)s->col);
        if (a->count == 0)
            continue;
        int64_t span = src_span(s, a->count, srows, C, esrc);
        if (span < 0 || (uintptr_t)s->ptr + (uintptr_t)span < (uintptr_t)s->ptr)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: the %s %s's strides (%lld, %lld, %lld) over %d experts reach past "
                            "the address space", fn, tn, sn, (long long)s->expert, (long long)s->row,
                            (long long)s->col, a->count);
        if (overlaps((uintptr_t)s->ptr, span, (uintptr_t)dst + (uintptr_t)dbase, dbytes))
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: the %s %s overlaps the slots it is packed into", fn, tn, sn);
    }
    return MOE_OK;
}

moe_status moe_pack_host(const moe_plan_desc_t *pd, long long slots, const moe_pack_args *a, void *dst) {
    moe_status rc = moe_pack_check(pd, slots, a, dst, "moe_plan_pack");
    if (rc)
        return rc;
    const int t = (int)a->tensor;
    const long long F = pd->spec.ffn, H = pd->spec.hidden;
    long long R, C;
    moe_pack_dims(t, F, H, &R, &C);
    uint16_t *d = (uint16_t *)dst + (long long)a->first * R * C;
    for (long long e = 0; e < a->count; e++)
        for (long long pr = 0; pr < R; pr++, d += C) {
            long long row;
            const moe_pack_src *s = &a->src[moe_pack_source(t, pr, F, &row)];
            const uint16_t *from = (const uint16_t *)s->ptr + e * s->expert + row * s->row;
            if (C == 1 || s->col == 1)
                memcpy(d, from, (size_t)C * 2);
            else
                for (long long c = 0; c < C; c++)
                    d[c] = from[c * s->col];
        }
    return MOE_OK;
}

moe_status moe_pack_layout(const moe_plan_desc_t *pd, moe_layout layout, const void *src, const void *up, int first,
                           int count, moe_pack_args *a) {
    if (!pd || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_layout: NULL argument");
    if ((unsigned)layout >= MOE_LAYOUT_COUNT)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_layout: layout %d is not a moe_layout", (int)layout);
    const int separate = layout == MOE_LAYOUT_W1_SEPARATE || layout == MOE_LAYOUT_W1_SEPARATE_T ||
                         layout == MOE_LAYOUT_B1_SEPARATE;
    if (!src || !up != !separate)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_layout: %s", !src ? "the source is NULL"
                        : separate ? "a separate layout needs the up tensor" : "up is only for the separate layouts");
    const int64_t F = pd->spec.ffn, H = pd->spec.hidden;
    const uint16_t *p = src, *u = up;
    /* {tensor, gate: base, strides (expert, row, col); up: base} */
    struct { moe_tensor t; const uint16_t *g; int64_t se, sr, sc; const uint16_t *u; } L;
    switch (layout) {
    case MOE_LAYOUT_W1_FUSED:         L = (__typeof__(L)){MOE_TENSOR_W1, p, 2 * F * H, H, 1, p + F * H}; break;
    case MOE_LAYOUT_W1_FUSED_T:       L = (__typeof__(L)){MOE_TENSOR_W1, p, 2 * F * H, 1, 2 * F, p + F}; break;
    case MOE_LAYOUT_W1_INTERLEAVED:   L = (__typeof__(L)){MOE_TENSOR_W1, p, 2 * F * H, 2 * H, 1, p + H}; break;
    case MOE_LAYOUT_W1_INTERLEAVED_T: L = (__typeof__(L)){MOE_TENSOR_W1, p, 2 * F * H, 2, 2 * F, p + 1}; break;
    case MOE_LAYOUT_W1_SEPARATE:      L = (__typeof__(L)){MOE_TENSOR_W1, p, F * H, H, 1, u}; break;
    case MOE_LAYOUT_W1_SEPARATE_T:    L = (__typeof__(L)){MOE_TENSOR_W1, p, F * H, 1, F, u}; break;
    case MOE_LAYOUT_B1_FUSED:         L = (__typeof__(L)){MOE_TENSOR_B1, p, 2 * F, 1, 0, p + F}; break;
    case MOE_LAYOUT_B1_INTERLEAVED:   L = (__typeof__(L)){MOE_TENSOR_B1, p, 2 * F, 2, 0, p + 1}; break;
    case MOE_LAYOUT_B1_SEPARATE:      L = (__typeof__(L)){MOE_TENSOR_B1, p, F, 1, 0, u}; break;
    case MOE_LAYOUT_W2:               L = (__typeof__(L)){MOE_TENSOR_W2, p, H * F, F, 1, NULL}; break;
    case MOE_LAYOUT_W2_T:             L = (__typeof__(L)){MOE_TENSOR_W2, p, H * F, 1, H, NULL}; break;
    default:                          L = (__typeof__(L)){MOE_TENSOR_B2, p, H, 1, 0, NULL}; break;
    }
    *a = (moe_pack_args){.tensor = L.t, .first = first, .count = count};
    a->src[0] = (moe_pack_src){L.g, L.se, L.sr, L.sc};
    if (L.u)
        a->src[1] = (moe_pack_src){L.u, L.se, L.sr, L.sc};
    return MOE_OK;
}

/* ---- the public entry points ------------------------------------------- */

/* The slots a pack may write: the plan's experts and shared-expert slots
 * (a whole checkpoint packed before sharding) or the slots the rank holds
 * with them (the extent of the GEMMs' B operand, launch.h), whichever is
 * more. */
static long long plan_slots(const moe_plan *p) {
    const long long all = moe_spec_slots(&p->pd.spec);
    return p->launcher.slots > all ? p->launcher.slots : all;
}

moe_status moe_plan_pack_layout(const moe_plan *p, moe_layout layout, const void *src, const void *up, int first,
                                int count, moe_pack_args *a) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_layout: plan is NULL");
    return moe_pack_layout(&p->pd, layout, src, up, first, count, a);
}

moe_status moe_plan_pack(const moe_plan *p, const moe_pack_args *a, void *dst) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack: plan is NULL");
    return moe_pack_host(&p->pd, plan_slots(p), a, dst);
}

moe_status moe_plan_pack_async(const moe_plan *p, const moe_pack_args *a, void *dst, void *stream) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_async: plan is NULL");
    moe_status rc = moe_pack_check(&p->pd, plan_slots(p), a, dst, "moe_plan_pack_async");
    if (rc)
        return rc;
    const moe_launcher_t *l = &p->launcher;
    if (!l->pack_fn)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_plan_pack_async: the plan's module has no %s kernel (a folder "
                        "compiled before moegen emitted it): compile it again, or pack on the host (moe_plan_pack)",
                        l->pack->name);
    long long R, C;
    moe_pack_dims((int)a->tensor, p->pd.spec.ffn, p->pd.spec.hidden, &R, &C);
    const long long n = (long long)a->count * R * C;
    if (n == 0)
        return MOE_OK;
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    int tensor = (int)a->tensor;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s0 = (CUdeviceptr)(uintptr_t)a->src[0].ptr,
                s1 = (CUdeviceptr)(uintptr_t)(a->src[1].ptr ? a->src[1].ptr : a->src[0].ptr);
    moe_pack_stride_t st0 = {a->src[0].expert, a->src[0].row, a->src[0].col},
                      st1 = {a->src[1].expert, a->src[1].row, a->src[1].col};
    long long first = a->first, count = a->count;
    void *args[] = {&tensor, &d, &s0, &s1, &st0, &st1, &first, &count};
    return moe_launch_kernel(l, MOE_K_PACK, 0, n, (CUstream)stream, args, NULL);
}

moe_status moe_plan_pack_fp8(const moe_plan *p, const moe_pack_args *a, const moe_pack_args *scales, void *dst,
                             float *dst_scales) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_fp8: plan is NULL");
    return moe_pack_fp8_host(&p->pd, plan_slots(p), a, scales, dst, dst_scales);
}

moe_status moe_plan_pack_quantize(const moe_plan *p, const moe_pack_args *a, void *dst, float *dst_scales) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_quantize: plan is NULL");
    return moe_pack_quantize_host(&p->pd, plan_slots(p), a, dst, dst_scales);
}

moe_status moe_plan_pack_fp8_async(const moe_plan *p, const moe_pack_args *a, const moe_pack_args *scales, void *dst,
                                   float *dst_scales, void *stream) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_fp8_async: plan is NULL");
    return moe_pack_fp8_device(p, plan_slots(p), a, scales, dst, dst_scales, stream);
}

moe_status moe_plan_pack_quantize_async(const moe_plan *p, const moe_pack_args *a, void *dst, float *dst_scales,
                                        void *stream) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_quantize_async: plan is NULL");
    return moe_pack_quantize_device(p, plan_slots(p), a, dst, dst_scales, stream);
}

moe_status moe_plan_pack_w1(const moe_plan *p, const uint16_t *w1, uint16_t *w1p) {
    if (!p || !w1 || !w1p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_w1: NULL argument");
    moe_pack_args a;
    moe_status rc = moe_pack_layout(&p->pd, MOE_LAYOUT_W1_FUSED, w1, NULL, 0, p->pd.spec.experts, &a);
    return rc ? rc : moe_pack_host(&p->pd, plan_slots(p), &a, w1p);
}

moe_status moe_plan_pack_b1(const moe_plan *p, const uint16_t *b1, uint16_t *b1p) {
    if (!p || !b1 || !b1p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_b1: NULL argument");
    moe_pack_args a;
    moe_status rc = moe_pack_layout(&p->pd, MOE_LAYOUT_B1_FUSED, b1, NULL, 0, p->pd.spec.experts, &a);
    return rc ? rc : moe_pack_host(&p->pd, plan_slots(p), &a, b1p);
}

moe_status moe_plan_pack_shared(const moe_plan *p, const uint16_t *w1s, const uint16_t *w2s, uint16_t *w1p,
                                uint16_t *w2) {
    if (!p || !w1s || !w2s || !w1p || !w2)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_shared: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    if (!s->shared.ffn)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_shared: the spec has no shared expert (shared.ffn)");
    const int64_t F = s->ffn, FS = s->shared.ffn, H = s->hidden;
    /* slot E + j: gate rows jF .. of w1s [2F_s, H] and the up rows F_s + jF ..;
     * columns jF .. of w2s [H, F_s] */
    moe_pack_args a = {.tensor = MOE_TENSOR_W1, .first = s->experts, .count = moe_spec_shared_slots(s)};
    a.src[0] = (moe_pack_src){w1s, F * H, H, 1};
    a.src[1] = (moe_pack_src){w1s + FS * H, F * H, H, 1};
    moe_status rc = moe_pack_host(&p->pd, plan_slots(p), &a, w1p);
    if (rc)
        return rc;
    a.tensor = MOE_TENSOR_W2;
    a.src[0] = (moe_pack_src){w2s, F, FS, 1};
    a.src[1] = (moe_pack_src){NULL, 0, 0, 0};
    return moe_pack_host(&p->pd, plan_slots(p), &a, w2);
}
