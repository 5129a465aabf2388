/* test_pack.c — weight packing on the host, no GPU: the packed layout's
 * index mapping (gen/pack_geom.h) against README's formula; every
 * checkpoint layout moe_plan_pack_layout knows, built element by element
 * from the same random logical weights (never zero), packed and compared
 * with the plain-layout pack; subsets of slots (one expert at a time, shared
 * experts in slots past E) leaving the other slots untouched; and the
 * argument errors. The device pack is test_gpu's `pack` case. */
#include "check.h"
#include "moe_internal.h"
#include "pack_geom.h"
#include "plan.h"
#include "spec.h"
#include "tuning.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POISON 0xdeadu

static uint64_t rng = 0x9e3779b97f4a7c15ull;
/* a random non-zero 16-bit word */
static uint16_t rnd16(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    uint16_t v = (uint16_t)(rng >> 24);
    return v == 0 || v == POISON ? 0x3f80 : v;
}

static uint16_t *alloc16(size_t n) {
    uint16_t *p = malloc(n * 2 + 2);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static void poison(uint16_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = POISON;
}

static int plan_of(moe_plan_desc_t *pd, const char *spec) {
    moe_spec_t s;
    moe_diag_t d;
    char err[256];
    if (moe_spec_load(&s, "t.moe", spec, NULL, 0, &d))
        return fprintf(stderr, "%s\n", d.msg), 1;
    return moe_plan_desc_build(pd, &s, moe_tuning_default(), err, sizeof err) ? (fprintf(stderr, "%s\n", err), 1)
                                                                               : 0;
}

/* The logical weights of E experts: gate, up [E, F, H], w2 [E, H, F], b1
 * gate, up [E, F], b2 [E, H]. */
typedef struct {
    long long E, F, H;
    uint16_t *gate, *up, *w2, *bg, *bu, *b2;
} weights_t;

#define G_(w, e, f, h) (w)->gate[((e) * (w)->F + (f)) * (w)->H + (h)]
#define U_(w, e, f, h) (w)->up[((e) * (w)->F + (f)) * (w)->H + (h)]
#define W2_(w, e, h, f) (w)->w2[((e) * (w)->H + (h)) * (w)->F + (f)]

static void weights_init(weights_t *w, long long E, long long F, long long H) {
    *w = (weights_t){E, F, H, alloc16(E * F * H), alloc16(E * F * H), alloc16(E * H * F), alloc16(E * F),
                     alloc16(E * F), alloc16(E * H)};
    for (long long i = 0; i < E * F * H; i++)
        w->gate[i] = rnd16(), w->up[i] = rnd16(), w->w2[i] = rnd16();
    for (long long i = 0; i < E * F; i++)
        w->bg[i] = rnd16(), w->bu[i] = rnd16();
    for (long long i = 0; i < E * H; i++)
        w->b2[i] = rnd16();
}

static void weights_free(weights_t *w) {
    free(w->gate), free(w->up), free(w->w2), free(w->bg), free(w->bu), free(w->b2);
}

/* The expected packed tensors, written from README's statement of the
 * layout ("packed row 16j + i is gate row 8j + i for i < 8, up row
 * 8j + i - 8 otherwise"), not from pack_geom.h, into slots first ..
 * first + E - 1 of buffers of `slots` slots. */
static void expect_w1(const weights_t *w, long long first, uint16_t *out) {
    for (long long e = 0; e < w->E; e++)
        for (long long pr = 0; pr < 2 * w->F; pr++) {
            long long j = pr / 16, i = pr % 16, f = 8 * j + (i < 8 ? i : i - 8);
            for (long long h = 0; h < w->H; h++)
                out[((first + e) * 2 * w->F + pr) * w->H + h] = i < 8 ? G_(w, e, f, h) : U_(w, e, f, h);
        }
}

static void expect_b1(const weights_t *w, long long first, uint16_t *out) {
    for (long long e = 0; e < w->E; e++)
        for (long long pr = 0; pr < 2 * w->F; pr++) {
            long long j = pr / 16, i = pr % 16, f = 8 * j + (i < 8 ? i : i - 8);
            out[(first + e) * 2 * w->F + pr] = i < 8 ? w->bg[e * w->F + f] : w->bu[e * w->F + f];
        }
}

static void expect_w2(const weights_t *w, long long first, uint16_t *out) {
    memcpy(out + first * w->H * w->F, w->w2, (size_t)(w->E * w->H * w->F) * 2);
}

static void expect_b2(const weights_t *w, long long first, uint16_t *out) {
    memcpy(out + first * w->H, w->b2, (size_t)(w->E * w->H) * 2);
}

/* A checkpoint tensor in layout L built from w element by element (two for
 * the separate layouts: *a gate, *b up). */
static void build_layout(const weights_t *w, moe_layout L, uint16_t **a, uint16_t **b) {
    const long long E = w->E, F = w->F, H = w->H;
    *a = *b = NULL;
    switch (L) {
    case MOE_LAYOUT_W1_FUSED: /* [E, 2F, H] */
        *a = alloc16(E * 2 * F * H);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                for (long long h = 0; h < H; h++)
                    (*a)[(e * 2 * F + f) * H + h] = G_(w, e, f, h), (*a)[(e * 2 * F + F + f) * H + h] = U_(w, e, f, h);
        break;
    case MOE_LAYOUT_W1_FUSED_T: /* [E, H, 2F] */
        *a = alloc16(E * 2 * F * H);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                for (long long h = 0; h < H; h++)
                    (*a)[(e * H + h) * 2 * F + f] = G_(w, e, f, h), (*a)[(e * H + h) * 2 * F + F + f] = U_(w, e, f, h);
        break;
    case MOE_LAYOUT_W1_INTERLEAVED: /* [E, 2F, H], gate even rows */
        *a = alloc16(E * 2 * F * H);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                for (long long h = 0; h < H; h++)
                    (*a)[(e * 2 * F + 2 * f) * H + h] = G_(w, e, f, h),
                    (*a)[(e * 2 * F + 2 * f + 1) * H + h] = U_(w, e, f, h);
        break;
    case MOE_LAYOUT_W1_INTERLEAVED_T: /* [E, H, 2F], gate even columns */
        *a = alloc16(E * 2 * F * H);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                for (long long h = 0; h < H; h++)
                    (*a)[(e * H + h) * 2 * F + 2 * f] = G_(w, e, f, h),
                    (*a)[(e * H + h) * 2 * F + 2 * f + 1] = U_(w, e, f, h);
        break;
    case MOE_LAYOUT_W1_SEPARATE: /* [E, F, H] each: the logical layout itself */
        *a = alloc16(E * F * H), *b = alloc16(E * F * H);
        memcpy(*a, w->gate, (size_t)(E * F * H) * 2), memcpy(*b, w->up, (size_t)(E * F * H) * 2);
        break;
    case MOE_LAYOUT_W1_SEPARATE_T: /* [E, H, F] each */
        *a = alloc16(E * F * H), *b = alloc16(E * F * H);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                for (long long h = 0; h < H; h++)
                    (*a)[(e * H + h) * F + f] = G_(w, e, f, h), (*b)[(e * H + h) * F + f] = U_(w, e, f, h);
        break;
    case MOE_LAYOUT_B1_FUSED:
        *a = alloc16(E * 2 * F);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                (*a)[e * 2 * F + f] = w->bg[e * F + f], (*a)[e * 2 * F + F + f] = w->bu[e * F + f];
        break;
    case MOE_LAYOUT_B1_INTERLEAVED:
        *a = alloc16(E * 2 * F);
        for (long long e = 0; e < E; e++)
            for (long long f = 0; f < F; f++)
                (*a)[e * 2 * F + 2 * f] = w->bg[e * F + f], (*a)[e * 2 * F + 2 * f + 1] = w->bu[e * F + f];
        break;
    case MOE_LAYOUT_B1_SEPARATE:
        *a = alloc16(E * F), *b = alloc16(E * F);
        memcpy(*a, w->bg, (size_t)(E * F) * 2), memcpy(*b, w->bu, (size_t)(E * F) * 2);
        break;
    case MOE_LAYOUT_W2: /* [E, H, F] */
        *a = alloc16(E * H * F);
        memcpy(*a, w->w2, (size_t)(E * H * F) * 2);
        break;
    case MOE_LAYOUT_W2_T: /* [E, F, H] */
        *a = alloc16(E * H * F);
        for (long long e = 0; e < E; e++)
            for (long long h = 0; h < H; h++)
                for (long long f = 0; f < F; f++)
                    (*a)[(e * F + f) * H + h] = W2_(w, e, h, f);
        break;
    default: /* MOE_LAYOUT_B2 */
        *a = alloc16(E * H);
        memcpy(*a, w->b2, (size_t)(E * H) * 2);
        break;
    }
}

static const char *const layout_names[MOE_LAYOUT_COUNT] = {
    "W1_FUSED", "W1_FUSED_T", "W1_INTERLEAVED", "W1_INTERLEAVED_T", "W1_SEPARATE", "W1_SEPARATE_T",
    "B1_FUSED", "B1_INTERLEAVED", "B1_SEPARATE", "W2", "W2_T", "B2"};

/* Elements of one slot of the tensor layout L packs into. */
static long long slot_elems(const weights_t *w, moe_layout L) {
    return L <= MOE_LAYOUT_W1_SEPARATE_T ? 2 * w->F * w->H : L <= MOE_LAYOUT_B1_SEPARATE ? 2 * w->F
           : L <= MOE_LAYOUT_W2_T                         ? w->H * w->F
                                                          : w->H;
}

static void expect(const weights_t *w, moe_layout L, long long first, uint16_t *out) {
    if (L <= MOE_LAYOUT_W1_SEPARATE_T)
        expect_w1(w, first, out);
    else if (L <= MOE_LAYOUT_B1_SEPARATE)
        expect_b1(w, first, out);
    else if (L <= MOE_LAYOUT_W2_T)
        expect_w2(w, first, out);
    else
        expect_b2(w, first, out);
}

/* Elements that differ between a and b, n elements. */
static long long diff(const uint16_t *a, const uint16_t *b, long long n) {
    long long d = 0;
    for (long long i = 0; i < n; i++)
        d += a[i] != b[i];
    return d;
}

/* Pack every layout of w, all experts at once into slots off .. off+E-1 of
 * a poisoned buffer of `slots` slots, and one expert at a time from a
 * pointer at that expert (a checkpoint's tensor per expert), and compare
 * with the expected pack (the other slots keep their poison). */
static void check_layouts(const moe_plan_desc_t *pd, const weights_t *w, long long slots, long long off) {
    for (int L = 0; L < MOE_LAYOUT_COUNT; L++) {
        uint16_t *a, *b;
        build_layout(w, (moe_layout)L, &a, &b);
        const long long n = slot_elems(w, (moe_layout)L) * slots;
        uint16_t *got = alloc16((size_t)n), *want = alloc16((size_t)n);
        poison(want, (size_t)n);
        expect(w, (moe_layout)L, off, want);
        moe_pack_args args;
        for (int one = 0; one < 2; one++) {
            poison(got, (size_t)n);
            int ok = 1;
            for (long long e = 0; e < (one ? w->E : 1) && ok; e++) {
                /* one expert: the source pointers at expert e, as a checkpoint's per-expert tensor would be */
                long long se = moe_pack_layout(pd, (moe_layout)L, a, b, 0, 1, &args) ? 0 : args.src[0].expert;
                ok = moe_pack_layout(pd, (moe_layout)L, one ? a + e * se : a, one && b ? b + e * se : b,
                                     (int)(off + e), one ? 1 : (int)w->E, &args) == MOE_OK &&
                     moe_pack_host(pd, slots, &args, got) == MOE_OK;
            }
            CHECKF(ok, "%s: %s", layout_names[L], moe_last_error());
            long long d = diff(got, want, n);
            CHECKF(d == 0, "%s (%s, slots %lld..%lld of %lld): %lld of %lld elements differ", layout_names[L],
                   one ? "an expert at a time" : "all experts", off, off + w->E - 1, slots, d, n);
        }
        free(a), free(b), free(got), free(want);
    }
}

int main(void) {
    CASE("pack_geom.h: the pairing is README's, a permutation, and moe_unpack_row inverts moe_pack_row");
    for (long long F = 8; F <= 72; F += 8) {
        int ok = 1;
        char *seen = calloc((size_t)(2 * F), 1);
        for (long long r = 0; r < 2 * F; r++) {
            long long pr = moe_pack_row(r, F), f = r < F ? r : r - F;
            long long want = (f / 8) * 16 + (r < F ? 0 : 8) + f % 8;
            ok &= pr == want && pr >= 0 && pr < 2 * F && !seen[pr] && moe_unpack_row(pr, F) == r;
            if (pr >= 0 && pr < 2 * F)
                seen[pr] = 1;
        }
        free(seen);
        CHECKF(ok, "F = %lld", F);
    }
    CHECK(MOE_PAIR_GRANULE == 8);

    moe_plan_desc_t pd;
    const char *spec = "name = 'pk'\nexperts = 6\ntop_k = 2\nhidden = 24\nffn = 40\ntokens = 64\n";
    if (plan_of(&pd, spec))
        return fprintf(stderr, "the test spec does not plan\n"), 1;
    CHECK(pd.pair_granule == MOE_PAIR_GRANULE);
    weights_t w;
    weights_init(&w, 6, 40, 24);

    CASE("every layout, all experts and one at a time, equals the plain-layout pack");
    check_layouts(&pd, &w, 6, 0);

    CASE("a subset of slots: experts 0..2 into slots 3..5 of 8; the other slots untouched");
    weights_t w3 = w;
    w3.E = 3; /* the first three experts of w: strides per expert are unchanged */
    check_layouts(&pd, &w3, 8, 3);

    CASE("a shared expert of F_s = 3F as 3 experts in slots E..E+2");
    {
        const long long E = 6, m = 3, F = 40, H = 24, Fs = m * F;
        uint16_t *gate = alloc16(Fs * H), *up = alloc16(Fs * H), *down = alloc16(H * Fs);
        for (long long i = 0; i < Fs * H; i++)
            gate[i] = rnd16(), up[i] = rnd16(), down[i] = rnd16();
        const long long n1 = (E + m) * 2 * F * H, n2 = (E + m) * H * F;
        uint16_t *w1p = alloc16(n1), *w2p = alloc16(n2), *want1 = alloc16(n1), *want2 = alloc16(n2);
        poison(w1p, n1), poison(w2p, n2), poison(want1, n1), poison(want2, n2);
        /* gate_proj [Fs, H] is gate [m, F, H]; down_proj [H, Fs] is w2 (j, h, f) = down[h][j F + f] */
        weights_t sh = {m, F, H, gate, up, alloc16(m * H * F), NULL, NULL, NULL};
        for (long long j = 0; j < m; j++)
            for (long long h = 0; h < H; h++)
                for (long long f = 0; f < F; f++)
                    sh.w2[(j * H + h) * F + f] = down[h * Fs + j * F + f];
        expect_w1(&sh, E, want1);
        expect_w2(&sh, E, want2);
        moe_pack_args a1, a2;
        int ok = moe_pack_layout(&pd, MOE_LAYOUT_W1_SEPARATE, gate, up, (int)E, (int)m, &a1) == MOE_OK &&
                 moe_pack_host(&pd, E + m, &a1, w1p) == MOE_OK &&
                 moe_pack_layout(&pd, MOE_LAYOUT_W2, down, NULL, (int)E, (int)m, &a2) == MOE_OK;
        a2.src[0].expert = F, a2.src[0].row = Fs, a2.src[0].col = 1;
        ok = ok && moe_pack_host(&pd, E + m, &a2, w2p) == MOE_OK;
        CHECKF(ok, "%s", moe_last_error());
        CHECKF(diff(w1p, want1, n1) == 0, "shared W1: %lld elements differ", diff(w1p, want1, n1));
        CHECKF(diff(w2p, want2, n2) == 0, "shared W2: %lld elements differ", diff(w2p, want2, n2));
        CHECK(moe_pack_host(&pd, E, &a1, w1p) == MOE_ERR_INVALID_ARG); /* the slots past E need a plan that has them */
        free(gate), free(up), free(down), free(w1p), free(w2p), free(want1), free(want2), free(sh.w2);
    }

    CASE("argument errors: refused with a message, the destination untouched");
    {
        uint16_t *src = alloc16(6 * 80 * 24), *dst = alloc16(6 * 80 * 24);
        for (long long i = 0; i < 6 * 80 * 24; i++)
            src[i] = rnd16();
        poison(dst, 6 * 80 * 24);
        moe_pack_args good, a;
        CHECK(moe_pack_layout(&pd, MOE_LAYOUT_W1_FUSED, src, NULL, 0, 6, &good) == MOE_OK);
        CHECK(moe_pack_host(NULL, 6, &good, dst) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_host(&pd, 6, NULL, dst) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_host(&pd, 6, &good, NULL) == MOE_ERR_INVALID_ARG);
        a = good, a.src[1].ptr = NULL;
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "up pointer is NULL"));
        a = good, a.tensor = (moe_tensor)4;
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "not a moe_tensor"));
        a = good, a.first = -1, a.count = 1;
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "outside"));
        a = good, a.first = 1; /* slots 1..6 of 6 */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "slots 1 .. 6"));
        a = good, a.count = -1;
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG);
        a = good, a.first = 2147483647, a.count = 2147483647; /* the sum overflows an int */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG);
        a = good, a.src[1].row = -24;
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "negative stride"));
        a = good, a.src[0].expert = INT64_MAX / 4; /* 5 experts past it overflow 64 bits */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "address space"));
        a = good, a.src[0].col = INT64_MAX / 16; /* 23 columns past it */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "address space"));
        a = good, a.src[0].expert = INT64_MAX / 10 ; /* fits in elements, not in bytes */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_host(&pd, 6, &good, src) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "overlaps"));
        a = good, a.count = 1; /* expert 0's source spans src[0 .. 2FH); a slot 0 at src + FH overlaps it */
        CHECK(moe_pack_host(&pd, 6, &a, src + 40 * 24) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "overlaps"));
        CHECK(moe_pack_layout(&pd, MOE_LAYOUT_COUNT, src, NULL, 0, 6, &a) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_layout(&pd, MOE_LAYOUT_W1_SEPARATE, src, NULL, 0, 6, &a) == MOE_ERR_INVALID_ARG &&
              strstr(moe_last_error(), "needs the up tensor"));
        CHECK(moe_pack_layout(&pd, MOE_LAYOUT_W2, src, src, 0, 6, &a) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_layout(&pd, MOE_LAYOUT_W2, NULL, NULL, 0, 6, &a) == MOE_ERR_INVALID_ARG);
        CHECK(moe_pack_layout(NULL, MOE_LAYOUT_W2, src, NULL, 0, 6, &a) == MOE_ERR_INVALID_ARG);
        long long touched = 0;
        for (long long i = 0; i < 6 * 80 * 24; i++)
            touched += dst[i] != POISON;
        CHECKF(touched == 0, "%lld elements written by refused calls", touched);
        a = good, a.count = 0; /* nothing to do */
        CHECK(moe_pack_host(&pd, 6, &a, dst) == MOE_OK);
        free(src), free(dst);
    }

    CASE("the public calls refuse a NULL plan");
    moe_pack_args a = {0};
    CHECK(moe_plan_pack(NULL, &a, &a) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_pack_async(NULL, &a, &a, NULL) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_pack_layout(NULL, MOE_LAYOUT_W2, &a, NULL, 0, 1, &a) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_pack_w1(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_pack_b1(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);

    weights_free(&w);
    moe_plan_desc_free(&pd);
    return check_report("test_pack");
}
