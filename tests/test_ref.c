/* test_ref.c — the CPU reference (tests/support/ref.c) on cases small enough to
 * check by hand, plus exhaustive conversion round trips and a randomized
 * cross-check of the blocked FFN against a naive loop.
 *
 * Expected values were worked out by hand (and checked with a few lines of
 * Python); the derivation is in the comment above each number. σ is the
 * logistic sigmoid. All inputs are small multiples of 0.25/0.5, exact in
 * bf16 and fp16. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "plan.h" /* moe_plan_shared_w1_row: the shared expert's split */
#include "ref.h"

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

/* A spec with plain defaults: bf16, softmax, no renormalize, no groups,
 * scale 1, plain SwiGLU, no biases. */
static moe_spec_t mkspec(int E, int k, int H, int F) {
    moe_spec_t s;
    memset(&s, 0, sizeof s);
    strcpy(s.name, "test");
    s.experts = E; s.top_k = k; s.hidden = H; s.ffn = F; s.tokens = 16;
    s.dtype = MOE_DTYPE_BF16;
    s.router.score = MOE_SCORE_SOFTMAX;
    s.router.groups = 1; s.router.topk_groups = 1; s.router.group_topk = 2;
    s.router.scale = 1.0;
    s.activation.alpha = 1.0;
    return s;
}

static void to_half(const float *src, uint16_t *dst, size_t n, moe_dtype_t dt) {
    for (size_t i = 0; i < n; i++) dst[i] = moe_float_to_half(src[i], dt);
}

/* Route tokens whose logits are given directly: token t has x = unit vector
 * on column t, and wr[e][t] = logits[t][e], so l[t][e] = logits[t][e] (e over
 * the scored experts: the zero experts' too). */
static int route_logits(const moe_spec_t *s, int T, const float *logits,
                        const float *sel_bias, const float *logit_bias,
                        int *idx, float *w, float *scores) {
    const int E = moe_spec_scored(s), H = s->hidden;
    float *x = calloc((size_t)T * H, sizeof(float)), *wr = calloc((size_t)E * H, sizeof(float));
    uint16_t *xh = malloc((size_t)T * H * 2), *wrh = malloc((size_t)E * H * 2);
    for (int t = 0; t < T; t++) {
        x[(size_t)t * H + t] = 1.0f;
        for (int e = 0; e < E; e++) wr[(size_t)e * H + t] = logits[t * E + e];
    }
    to_half(x, xh, (size_t)T * H, s->dtype);
    to_half(wr, wrh, (size_t)E * H, s->dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.wr = wrh; in.sel_bias = sel_bias; in.logit_bias = logit_bias; in.tokens = T;
    int rc = moe_ref_route(s, &in, idx, w, scores);
    free(x); free(wr); free(xh); free(wrh);
    return rc;
}

static void test_conversions(void) {
    const moe_dtype_t B = MOE_DTYPE_BF16, H = MOE_DTYPE_FP16;
    CASE("bf16 conversions");
    CHECK(moe_float_to_half(1.0f, B) == 0x3F80);
    CHECK(moe_float_to_half(-2.5f, B) == 0xC020);          /* -1.25 * 2^1 */
    CHECK(moe_float_to_half(65504.0f, B) == 0x4780);       /* 0x477FE000: rounds up to 65536 */
    CHECK(moe_float_to_half(INFINITY, B) == 0x7F80);
    CHECK(moe_float_to_half(-INFINITY, B) == 0xFF80);
    CHECK(moe_float_to_half(3.4e38f, B) == 0x7F80);        /* above max bf16 + half ulp: inf */
    CHECK(isnan(moe_half_to_float(moe_float_to_half(NAN, B), B)));
    CHECK(moe_float_to_half(1.0f + 0x1p-8f, B) == 0x3F80);          /* tie, even is 1.0 */
    CHECK(moe_float_to_half(1.0f + 3 * 0x1p-8f, B) == 0x3F82);      /* tie between ..81, ..82: even */
    CHECK(moe_float_to_half(1.0f + 0x1p-8f + 0x1p-20f, B) == 0x3F81); /* above the tie */
    CHECK(moe_float_to_half(0x1p-130f, B) == 0x0008);               /* subnormal, exact */
    CHECK(moe_half_to_float(0x0001, B) == 0x1p-133f);               /* smallest subnormal */
    CHECK(moe_half_to_float(0xC020, B) == -2.5f);
    CHECK(moe_half_to_float(0x7F80, B) == INFINITY);
    CHECK(signbit(moe_half_to_float(moe_float_to_half(-0.0f, B), B)));

    CASE("fp16 conversions");
    CHECK(moe_float_to_half(1.0f, H) == 0x3C00);
    CHECK(moe_float_to_half(-2.5f, H) == 0xC100);
    CHECK(moe_float_to_half(65504.0f, H) == 0x7BFF);       /* max finite */
    CHECK(moe_float_to_half(65519.0f, H) == 0x7BFF);       /* below the 65520 tie */
    CHECK(moe_float_to_half(65520.0f, H) == 0x7C00);       /* tie with odd 0x3FF: up, to inf */
    CHECK(moe_float_to_half(1e6f, H) == 0x7C00);
    CHECK(moe_float_to_half(INFINITY, H) == 0x7C00);
    CHECK(moe_float_to_half(-INFINITY, H) == 0xFC00);
    {
        uint16_t n = moe_float_to_half(NAN, H);
        CHECK((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0);
        CHECK(isnan(moe_half_to_float(n, H)));
    }
    CHECK(moe_float_to_half(1.0f + 0x1p-11f, H) == 0x3C00);         /* tie, even is 1.0 */
    CHECK(moe_float_to_half(1.0f + 3 * 0x1p-11f, H) == 0x3C02);     /* tie, even is ..02 */
    CHECK(moe_float_to_half(1.0f + 0x1p-11f + 0x1p-20f, H) == 0x3C01);
    CHECK(moe_float_to_half(0x1p-24f, H) == 0x0001);                /* smallest subnormal */
    CHECK(moe_float_to_half(0x1p-25f, H) == 0x0000);                /* tie with 0: even */
    CHECK(moe_float_to_half(0x1p-25f * 1.0001f, H) == 0x0001);      /* above that tie */
    CHECK(moe_float_to_half(1.5f * 0x1p-24f, H) == 0x0002);         /* tie 1 vs 2: even */
    CHECK(moe_float_to_half(1023 * 0x1p-24f, H) == 0x03FF);         /* largest subnormal */
    CHECK(moe_float_to_half(1023.75f * 0x1p-24f, H) == 0x0400);     /* rounds up to min normal */
    CHECK(moe_float_to_half(0x1p-14f, H) == 0x0400);
    CHECK(moe_float_to_half(-0x1p-24f, H) == 0x8001);
    CHECK(moe_half_to_float(0x0001, H) == 0x1p-24f);
    CHECK(moe_half_to_float(0x03FF, H) == 1023 * 0x1p-24f);
    CHECK(moe_half_to_float(0x7BFF, H) == 65504.0f);
    CHECK(moe_half_to_float(0xFC00, H) == -INFINITY);
    CHECK(isnan(moe_half_to_float(0x7E00, H)));
    CHECK(signbit(moe_half_to_float(0x8000, H)) && moe_half_to_float(0x8000, H) == 0.0f);

    CASE("half round trips, all 65536 patterns");
    int bad_b = 0, bad_h = 0;
    for (uint32_t v = 0; v < 0x10000u; v++) {
        uint16_t u = (uint16_t)v;
        float fb = moe_half_to_float(u, B), fh = moe_half_to_float(u, H);
        if (isnan(fb) ? !isnan(moe_half_to_float(moe_float_to_half(fb, B), B))
                      : moe_float_to_half(fb, B) != u) bad_b++;
        if (isnan(fh) ? !isnan(moe_half_to_float(moe_float_to_half(fh, H), H))
                      : moe_float_to_half(fh, H) != u) bad_h++;
    }
    CHECKF(bad_b == 0, "%d bf16 patterns", bad_b);
    CHECKF(bad_h == 0, "%d fp16 patterns", bad_h);
}

static void test_route_softmax(void) {
    CASE("softmax + renormalize, accumulation and a tie");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.router.renormalize = true;
    /* Token 0: x = [1, 0.5, 0.25, 0...], wr rows chosen so that
     *   l0 = 1*1                   = 1
     *   l1 = 1*0.5 + 0.5*(-1)      = 0
     *   l2 = 1*1 + 0.5*1 + 0.25*2  = 2
     *   l3 = 1*(-1)                = -1
     * softmax p = e^l / (e^2 + e + 1 + e^-1) = {0.2368828, 0.0871443, 0.6439143, 0.0320586};
     * top-2 = [2, 0]; renormalized w2 = e^2/(e^2+e) = σ(1) = 0.7310586, w0 = 0.2689414.
     * Token 1: x = unit on column 7, wr[:,7] = {0.25, 0.5, 0.5, 2}: top-2 = [3, then
     * the 1-vs-2 tie at 0.5 goes to the lower index 1]; w3 = σ(1.5) = 0.8175745,
     * w1 = 0.1824255. */
    float x[2][8] = {{1, 0.5f, 0.25f, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 1}};
    float wr[4][8] = {{1, 0, 0, 0, 0, 0, 0, 0.25f},
                      {0.5f, -1, 0, 0, 0, 0, 0, 0.5f},
                      {1, 1, 2, 0, 0, 0, 0, 0.5f},
                      {-1, 0, 0, 0, 0, 0, 0, 2}};
    uint16_t xh[16], wrh[32];
    to_half(&x[0][0], xh, 16, s.dtype);
    to_half(&wr[0][0], wrh, 32, s.dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.wr = wrh; in.tokens = 2;
    int idx[4]; float w[4], sc[8];
    CHECK(moe_ref_route(&s, &in, idx, w, sc) == 0);
    CHECK(idx[0] == 2 && idx[1] == 0);
    CHECKF(NEAR(w[0], 0.7310586, 1e-6) && NEAR(w[1], 0.2689414, 1e-6), "w = %.7f %.7f", w[0], w[1]);
    CHECK(NEAR(sc[0], 0.2368828, 1e-6) && NEAR(sc[1], 0.0871443, 1e-6) &&
          NEAR(sc[2], 0.6439143, 1e-6) && NEAR(sc[3], 0.0320586, 1e-6));
    CHECK(idx[2] == 3 && idx[3] == 1);
    CHECKF(NEAR(w[2], 0.8175745, 1e-6) && NEAR(w[3], 0.1824255, 1e-6), "w = %.7f %.7f", w[2], w[3]);
    CHECK(sc[5] == sc[6]);                                 /* the tie is exact */

    CASE("softmax without renormalize");
    s.router.renormalize = false;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    /* w = p itself: 0.6439143, 0.2368828 */
    CHECK(idx[0] == 2 && idx[1] == 0 && NEAR(w[0], 0.6439143, 1e-6) && NEAR(w[1], 0.2368828, 1e-6));

    CASE("scale");
    s.router.renormalize = true;
    s.router.scale = 2.5;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    /* 2.5 * 0.7310586 = 1.8276464, 2.5 * 0.2689414 = 0.6723536 */
    CHECKF(NEAR(w[0], 1.8276464, 1e-6) && NEAR(w[1], 0.6723536, 1e-6), "w = %.7f %.7f", w[0], w[1]);

    CASE("tie at k = 1 goes to the lower index");
    {
        moe_spec_t s1 = mkspec(4, 1, 8, 8);
        s1.router.renormalize = true;
        const float l[4] = {0.5f, 1, 0.25f, 1};            /* experts 1 and 3 tie */
        CHECK(route_logits(&s1, 1, l, NULL, NULL, idx, w, NULL) == 0);
        CHECK(idx[0] == 1 && w[0] == 1.0f);
    }
}

/* Gemma 4's router (router.input = "separate", router.expert_scale): the
 * logits read router_x, not x; the final weights × expert_scale[e]. */
static void test_route_own_input(void) {
    CASE("router.input = \"separate\": the logits read router_x; x is not read");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.router.renormalize = true;
    s.router.input = MOE_ROUTER_INPUT_SEPARATE;
    /* router_x as test_route_softmax's token 0 (top-2 = [2, 0], w = 0.7310586, 0.2689414); x the reverse choice */
    float rx[8] = {1, 0.5f, 0.25f, 0, 0, 0, 0, 0}, x[8] = {-1, -0.5f, -0.25f, 0, 0, 0, 0, 0};
    float wr[4][8] = {{1, 0, 0, 0, 0, 0, 0, 0}, {0.5f, -1, 0, 0, 0, 0, 0, 0}, {1, 1, 2, 0, 0, 0, 0, 0},
                      {-1, 0, 0, 0, 0, 0, 0, 0}};
    uint16_t rxh[8], xh[8], wrh[32];
    to_half(rx, rxh, 8, s.dtype);
    to_half(x, xh, 8, s.dtype);
    to_half(&wr[0][0], wrh, 32, s.dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.router_x = rxh; in.wr = wrh; in.tokens = 1;
    int idx[2]; float w[2];
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    CHECKF(idx[0] == 2 && idx[1] == 0 && NEAR(w[0], 0.7310586, 1e-6) && NEAR(w[1], 0.2689414, 1e-6),
           "idx %d %d, w = %.7f %.7f", idx[0], idx[1], w[0], w[1]);
    in.router_x = NULL;   /* required */
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) != 0);
    in.router_x = rxh;
    in.x = NULL;          /* the route never reads x */
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0 && idx[0] == 2);

    CASE("router.expert_scale: after renormalization and scale, per expert");
    s.router.expert_scale = true;
    s.router.scale = 2.0;
    const float es[4] = {0.5f, 9.0f, 1.5f, 9.0f};
    in.expert_scale = es;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    /* 2 · 1.5 · 0.7310586 = 2.1931758; 2 · 0.5 · 0.2689414 = 0.2689414 (the scale does not enter the sum) */
    CHECKF(idx[0] == 2 && idx[1] == 0 && NEAR(w[0], 2.1931758, 1e-6) && NEAR(w[1], 0.2689414, 1e-6),
           "w = %.7f %.7f", w[0], w[1]);
    in.expert_scale = NULL;   /* required */
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) != 0);

    CASE("router.expert_scale with given ids: a dropped entry stays 0");
    s.router.select = MOE_SELECT_GIVEN;
    const int ids[2] = {3, 7};   /* 7: out of range, dropped */
    in.given_ids = ids;
    in.expert_scale = es;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    /* renormalized over the kept entry: weight 1, × 2 × es[3] = 18 */
    CHECKF(idx[0] == 3 && idx[1] == 0 && NEAR(w[0], 18.0, 1e-5) && w[1] == 0.0f, "idx %d %d, w = %.7f %.7f", idx[0],
           idx[1], w[0], w[1]);
}

static void test_route_sparsemixer(void) {
    CASE("sparsemixer (Phi-3.5-MoE): each slot's softmax over the logits within a relative 2 eps, in bf16");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.router.score = MOE_SCORE_SPARSEMIXER;
    s.router.jitter_eps = 0.01;   /* the band R(0.02) = 0.020019531 in bf16 */
    /* l = {2, 1.96875, 1, -0.5} (bf16 values). Slot 0, t = 2: expert 1 is within the band ((2 - 1.96875) / 2 =
     * 0.015625), 2 and 3 are not (0.5, 1.25): w0 = R(1 / (1 + exp(-0.03125))) = R(0.5078118) = 0.5078125.
     * Slot 1, t = 1.96875, expert 0 left out: 2 is outside ((1.96875 - 1) / 1.96875 = 0.49), so w1 = 1.
     * Not renormalized: the two sum to 1.51. A band of eps 0.005 (R(0.01) = 0.010009766) leaves expert 1 out
     * of slot 0's softmax too: w0 = 1. */
    const float l[4] = {2, 1.96875f, 1, -0.5f};
    int idx[2]; float w[2], sc[4];
    CHECK(route_logits(&s, 1, l, NULL, NULL, idx, w, sc) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 1 && w[0] == 0.5078125f && w[1] == 1.0f, "idx %d %d, w = %.9g %.9g", idx[0],
           idx[1], w[0], w[1]);
    s.router.jitter_eps = 0.005;
    CHECK(route_logits(&s, 1, l, NULL, NULL, idx, w, sc) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 1 && w[0] == 1.0f && w[1] == 1.0f, "w = %.9g %.9g", w[0], w[1]);
    /* all logits equal and zero: (0 - 0) / max(0, 0) is 0/0, kept (torch keeps it): each slot's softmax spreads
     * over what is left, 1/4 and 1/3 */
    const float z[4] = {0, 0, 0, 0};
    s.router.jitter_eps = 0.01;
    CHECK(route_logits(&s, 1, z, NULL, NULL, idx, w, sc) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 1 && w[0] == 0.25f && NEAR(w[1], 1.0 / 3, 2e-3), "w = %.9g %.9g", w[0], w[1]);
}

static void test_route_zero_experts(void) {
    CASE("zero experts (LongCat-Flash): softmax over E + Z, selection with the bias, weight p·scale");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.zero_experts = 2;   /* scored experts 0..5: 0..3 routed, 4 and 5 zero */
    s.router.bias = true;
    s.router.scale = 6.0;
    /* Token 0, l = {2, 1, 0, -1, 1.5, 0.5}: p = softmax over all six = {0.419698532, 0.154398461, 0.056800020,
     *   0.020895559, 0.254560027, 0.093647401}; no bias: top-2 = {0, 4 (a zero expert)}, w = 6p =
     *   {2.518191190, 1.527360164} (not renormalized).
     *   The selection bias, +0.1 on zero expert 5, leaves it behind expert 4 here (s5 = 0.193647401).
     * Token 1, l = {0.5, 1, 0, 0, -1, 0.25}: p = {0.205604214, 0.338984042, 0.124705260, 0.124705260,
     *   0.045876501, 0.160124723}; s = p + b: expert 1 (0.338984042), then zero expert 5 (0.260124723) where
     *   without the bias expert 0 (0.205604214) would be second: w = 6p = {2.033904250, 0.960748339} (the bias
     *   moves the selection, never the weight). */
    const float l[2][6] = {{2, 1, 0, -1, 1.5f, 0.5f}, {0.5f, 1, 0, 0, -1, 0.25f}};
    const float bias[6] = {0, 0, 0, 0, 0, 0.1f};
    int idx[4];
    float w[4], sc[12];
    CHECK(route_logits(&s, 2, &l[0][0], bias, NULL, idx, w, sc) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 4 && idx[2] == 1 && idx[3] == 5, "idx %d %d %d %d", idx[0], idx[1], idx[2], idx[3]);
    CHECKF(NEAR(w[0], 2.518191190, 2e-6) && NEAR(w[1], 1.527360164, 2e-6) && NEAR(w[2], 2.033904250, 2e-6) &&
           NEAR(w[3], 0.960748339, 2e-6), "w = %.9g %.9g %.9g %.9g", w[0], w[1], w[2], w[3]);
    CHECKF(NEAR(sc[6 + 5], 0.260124723, 1e-6) && NEAR(sc[4], 0.254560027, 1e-6), "scores [T, E + Z]: %.9g %.9g",
           sc[11], sc[4]);
    /* without zero experts the same logits' first four route among themselves: a different selection */
    moe_spec_t s0 = s;
    s0.zero_experts = 0;
    const float l0[4] = {2, 1, 0, -1};
    int idx0[2];
    float w0[2];
    CHECK(route_logits(&s0, 1, l0, bias, NULL, idx0, w0, NULL) == 0 && idx0[0] == 0 && idx0[1] == 1);

    CASE("zero experts: counts leave them out; route_agree takes them as experts");
    int counts[4];
    CHECK(moe_ref_counts(&s, idx, 2, counts) == 0);
    CHECKF(counts[0] == 1 && counts[1] == 1 && counts[2] == 0 && counts[3] == 0, "counts %d %d %d %d", counts[0],
           counts[1], counts[2], counts[3]);
    int other[4] = {4, 0, 5, 1}, far[4] = {0, 4, 1, 2};
    CHECK(moe_ref_route_agree(&s, idx, other, sc, 2, 1e-6f, NULL) == 1);   /* the same sets, another order */
    int bad = -2;
    CHECK(moe_ref_route_agree(&s, idx, far, sc, 2, 1e-6f, &bad) == 0 && bad == 1);   /* 2 (0.1247) for zero expert 5 */
    int out[4] = {0, 6, 5, 1};   /* 6 is past the scored experts */
    CHECK(moe_ref_counts(&s, out, 2, counts) != 0);

    CASE("zero experts: what the spec check refuses, the reference refuses");
    moe_spec_t sg = s;
    sg.router.groups = 2; sg.router.topk_groups = 1;
    CHECK(route_logits(&sg, 2, &l[0][0], bias, NULL, idx, w, NULL) != 0);
    moe_spec_t si = s;
    si.router.apply = MOE_APPLY_INPUT;
    CHECK(route_logits(&si, 2, &l[0][0], bias, NULL, idx, w, NULL) != 0);
}

static void test_route_biases(void) {
    CASE("sigmoid + selection bias changes selection, not weights");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.router.score = MOE_SCORE_SIGMOID;
    s.router.bias = true;
    /* l = {1, 0, 2, -1}: p = σ(l) = {0.7310586, 0.5, 0.8807971, 0.2689414}.
     * Zero bias: top-2 = [2, 0], w = p = {0.8807971, 0.7310586}.
     * bias = {0, 0.5, 0, 0}: s = {0.7310586, 1.0, 0.8807971, 0.2689414},
     * top-2 = [1, 2], and w = p (not s) = {0.5, 0.8807971}. */
    const float l[4] = {1, 0, 2, -1};
    const float zero[4] = {0, 0, 0, 0}, bias[4] = {0, 0.5f, 0, 0};
    int idx[2]; float w[2], sc[4];
    CHECK(route_logits(&s, 1, l, zero, NULL, idx, w, sc) == 0);
    CHECK(idx[0] == 2 && idx[1] == 0 && NEAR(w[0], 0.8807971, 1e-6) && NEAR(w[1], 0.7310586, 1e-6));
    CHECK(route_logits(&s, 1, l, bias, NULL, idx, w, sc) == 0);
    CHECK(idx[0] == 1 && idx[1] == 2);
    CHECKF(NEAR(w[0], 0.5, 1e-6) && NEAR(w[1], 0.8807971, 1e-6), "w = %.7f %.7f", w[0], w[1]);
    CHECK(NEAR(sc[1], 1.0, 1e-6) && NEAR(sc[0], 0.7310586, 1e-6));   /* scores include the bias */
    CHECK(route_logits(&s, 1, l, NULL, NULL, idx, w, sc) != 0);       /* bias flag set, no bias */

    CASE("logit bias moves weights");
    moe_spec_t g = mkspec(4, 2, 8, 8);
    g.router.renormalize = true;
    g.router.logit_bias = true;
    /* l + logit_bias = {1, 0, 2, -1} + {0, 0, -1, 0} = {1, 0, 1, -1}:
     * p = {0.3994863, 0.1469628, 0.3994863, 0.0540646}; experts 0 and 2 tie,
     * so top-2 = [0, 2], w = {0.5, 0.5} (without the logit bias: [2, 0],
     * {0.7310586, 0.2689414}). */
    const float lb[4] = {0, 0, -1, 0};
    CHECK(route_logits(&g, 1, l, NULL, lb, idx, w, sc) == 0);
    CHECK(idx[0] == 0 && idx[1] == 2);
    CHECKF(NEAR(w[0], 0.5, 1e-6) && NEAR(w[1], 0.5, 1e-6), "w = %.7f %.7f", w[0], w[1]);
    CHECK(NEAR(sc[0], 0.3994863, 1e-6) && NEAR(sc[3], 0.0540646, 1e-6));

    CASE("router.logit_softcap bends the logits before the score (Laguna): the selection changes");
    moe_spec_t q = mkspec(4, 2, 8, 8);
    q.router.score = MOE_SCORE_SIGMOID;
    q.router.bias = true;
    q.router.renormalize = true;
    q.router.logit_softcap = 1.0;
    /* l = {1, 0, 2, -1} -> tanh(l) = {0.7615942, 0, 0.9640276, -0.7615942};
     * p = σ = {0.6816997, 0.5, 0.7239275, 0.3183003}; with bias {0, 0.2, 0, 0}
     * the scores are {0.6816997, 0.7, 0.7239275, 0.3183003}: top-2 = [2, 1],
     * w = {0.7239275, 0.5} / 1.2239275 = {0.5914791, 0.4085209}. Uncapped,
     * σ(l) = {0.7310586, 0.5, 0.8807971, 0.2689414} picks [2, 0]. */
    const float b2[4] = {0, 0.2f, 0, 0};
    CHECK(route_logits(&q, 1, l, b2, NULL, idx, w, sc) == 0);
    CHECKF(idx[0] == 2 && idx[1] == 1, "idx %d %d", idx[0], idx[1]);
    CHECKF(NEAR(w[0], 0.5914791, 1e-6) && NEAR(w[1], 0.4085209, 1e-6), "w = %.7f %.7f", w[0], w[1]);
    CHECK(NEAR(sc[0], 0.6816997, 1e-6) && NEAR(sc[3], 0.3183003, 1e-6));
    q.router.logit_softcap = 0;
    CHECK(route_logits(&q, 1, l, b2, NULL, idx, w, sc) == 0);
    CHECK(idx[0] == 2 && idx[1] == 0);
}

static void test_route_groups(void) {
    CASE("group-limited: two medium experts beat one large one");
    moe_spec_t s = mkspec(8, 4, 8, 8);
    s.router.score = MOE_SCORE_SIGMOID;
    s.router.groups = 4;
    s.router.topk_groups = 2;
    s.router.renormalize = true;
    s.router.scale = 2.5;
    /* Groups {0,1} {2,3} {4,5} {6,7}; group score = sum of its top
     * group_topk = 2 (the default).
     * Token 0: l = {4, -4, 1, 1, 0.5, 0.5, -1, -2},
     *   p = {0.9820138, 0.0179862, 0.7310586, 0.7310586, 0.6224593, 0.6224593,
     *        0.2689414, 0.1192029}
     *   group scores = {1.0 (σ(4)+σ(-4)), 1.4621172, 1.2449187, 0.3881443}
     *   kept groups 1, 2 -> top-4 = [2, 3, 4, 5] (ties to the lower index),
     *   though expert 0 has the largest score of all.
     *   w = 2.5 * p / (2σ(1) + 2σ(0.5) = 2.7070358) = {0.6751468, 0.6751468, 0.5748532, 0.5748532}
     * Token 1: l = {2, 2, 1, 1, 1, 1, 0, 0}: group scores {1.7615942, 1.4621172,
     *   1.4621172, 1.0}; groups 1 and 2 tie for second place -> group 1.
     *   top-4 = [0, 1, 2, 3], w = 2.5 * p / (2σ(2) + 2σ(1)) =
     *   {0.6830614, 0.6830614, 0.5669386, 0.5669386} */
    const float l[2][8] = {{4, -4, 1, 1, 0.5f, 0.5f, -1, -2}, {2, 2, 1, 1, 1, 1, 0, 0}};
    int idx[8]; float w[8], sc[16];
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, sc) == 0);
    CHECK(idx[0] == 2 && idx[1] == 3 && idx[2] == 4 && idx[3] == 5);
    CHECKF(NEAR(w[0], 0.6751468, 1e-6) && NEAR(w[1], 0.6751468, 1e-6) &&
           NEAR(w[2], 0.5748532, 1e-6) && NEAR(w[3], 0.5748532, 1e-6),
           "w = %.7f %.7f %.7f %.7f", w[0], w[1], w[2], w[3]);
    CHECK(NEAR(sc[0], 0.9820138, 1e-6));                  /* scores are not masked */
    CHECK(idx[4] == 0 && idx[5] == 1 && idx[6] == 2 && idx[7] == 3);
    CHECKF(NEAR(w[4], 0.6830614, 1e-6) && NEAR(w[6], 0.5669386, 1e-6), "w = %.7f %.7f", w[4], w[6]);

    CASE("group_topk 1 (DeepSeek-V2): a group scores its maximum");
    s.router.group_topk = 1;
    /* Token 0 again: group scores = maxima {σ(4) = 0.9820138, σ(1) = 0.7310586,
     *   σ(0.5) = 0.6224593, σ(-1) = 0.2689414} -> groups 0, 1 kept ->
     *   top-4 = [0, 2, 3, 1] (2 before 3 on the tie), sum of p = 2.4621172,
     *   w = 2.5 * p / 2.4621172 = {0.9971233, 0.7423069, 0.7423069, 0.0182630}
     *   (with group_topk 2 the same token took [2, 3, 4, 5]). */
    CHECK(route_logits(&s, 1, &l[0][0], NULL, NULL, idx, w, NULL) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 2 && idx[2] == 3 && idx[3] == 1, "idx = %d %d %d %d", idx[0], idx[1], idx[2],
           idx[3]);
    CHECKF(NEAR(w[0], 0.9971233, 1e-6) && NEAR(w[1], 0.7423069, 1e-6) && NEAR(w[2], 0.7423069, 1e-6) &&
           NEAR(w[3], 0.0182630, 1e-6), "w = %.7f %.7f %.7f %.7f", w[0], w[1], w[2], w[3]);
    s.router.group_topk = 2;

    CASE("the same scores without groups");
    s.router.groups = 1; s.router.topk_groups = 1;
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) == 0);
    /* top-4 of p: 0 (0.982), 2, 3 (0.731), 4 (0.622, before 5 on the tie) */
    CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 3 && idx[3] == 4);

    CASE("counts");
    s.router.groups = 4; s.router.topk_groups = 2;
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) == 0);
    int counts[8];
    CHECK(moe_ref_counts(&s, idx, 2, counts) == 0);
    /* [2,3,4,5] + [0,1,2,3] */
    const int want[8] = {1, 1, 2, 2, 1, 1, 0, 0};
    CHECK(memcmp(counts, want, sizeof want) == 0);
    idx[3] = 8;
    CHECK(moe_ref_counts(&s, idx, 2, counts) != 0);

    CASE("group parameters that cannot work are refused");
    s.router.groups = 3;                                   /* 8 % 3 != 0 */
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) != 0);
    s.router.groups = 4; s.router.topk_groups = 5;
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) != 0);
    s.router.topk_groups = 2; s.router.group_topk = 3;     /* groups of 2 experts */
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) != 0);
    s.router.group_topk = 0;
    CHECK(route_logits(&s, 2, &l[0][0], NULL, NULL, idx, w, NULL) != 0);

    CASE("group-limited with top_k not a multiple of topk_groups: 12 experts, top-3, 4 groups keeping 2");
    moe_spec_t u = mkspec(12, 3, 8, 8);
    u.router.score = MOE_SCORE_SIGMOID;
    u.router.groups = 4; u.router.topk_groups = 2;
    /* Groups {0,1,2} {3,4,5} {6,7,8} {9,10,11}; no renormalize, so w = σ(l).
     * l = {3, -3, -3, 1, 1, -3, 2, 0.5, -3, -1, -1, -1}:
     *   σ(3) = 0.9525741, σ(-3) = 0.0474259, σ(1) = 0.7310586, σ(2) = 0.8807971,
     *   σ(0.5) = 0.6224593, σ(-1) = 0.2689414.
     * group_topk 2: group scores {1.0, 1.4621172, 1.5032564, 0.5378828} ->
     *   groups 2, 1 kept -> top-3 = [6, 3, 4], w = {0.8807971, 0.7310586, 0.7310586};
     *   expert 0, the best of all, is not taken.
     * group_topk 1: group scores {0.9525741, 0.7310586, 0.8807971, 0.2689414} ->
     *   groups 0, 2 kept -> top-3 = [0, 6, 7], w = {0.9525741, 0.8807971, 0.6224593}. */
    const float lu[12] = {3, -3, -3, 1, 1, -3, 2, 0.5f, -3, -1, -1, -1};
    CHECK(route_logits(&u, 1, lu, NULL, NULL, idx, w, NULL) == 0);
    CHECKF(idx[0] == 6 && idx[1] == 3 && idx[2] == 4, "idx = %d %d %d", idx[0], idx[1], idx[2]);
    CHECKF(NEAR(w[0], 0.8807971, 1e-6) && NEAR(w[1], 0.7310586, 1e-6) && NEAR(w[2], 0.7310586, 1e-6),
           "w = %.7f %.7f %.7f", w[0], w[1], w[2]);
    u.router.group_topk = 1;
    CHECK(route_logits(&u, 1, lu, NULL, NULL, idx, w, NULL) == 0);
    CHECKF(idx[0] == 0 && idx[1] == 6 && idx[2] == 7, "idx = %d %d %d", idx[0], idx[1], idx[2]);
    CHECKF(NEAR(w[0], 0.9525741, 1e-6) && NEAR(w[1], 0.8807971, 1e-6) && NEAR(w[2], 0.6224593, 1e-6),
           "w = %.7f %.7f %.7f", w[0], w[1], w[2]);
    u.router.group_topk = 3;                               /* a group of 3 scores all of it */
    CHECK(route_logits(&u, 1, lu, NULL, NULL, idx, w, NULL) == 0);
    /* sums {0.0474259*2 + 0.9525741 = 1.0474259, 1.5095431, 1.5506823, 0.8068242} -> groups 2, 1 */
    CHECKF(idx[0] == 6 && idx[1] == 3 && idx[2] == 4, "idx = %d %d %d", idx[0], idx[1], idx[2]);
    u.router.group_topk = 4;                               /* more than a group holds */
    CHECK(route_logits(&u, 1, lu, NULL, NULL, idx, w, NULL) != 0);
}

/* Weights for the structured FFN cases (H = 16, F = 8): expert e has
 * gate row f = g[e] on column f, up row f = u[e] on column 8 + f, and down
 * row h = d[e] on column h % 8, negated for h >= 8. So for token x:
 *   gate_f = g*x[f], up_f = u*x[8+f], o[h] = d*h[h%8], o[h+8] = -o[h]. */
static void structured_weights(int E, const float *g, const float *u, const float *d,
                               float *w1, float *w2) {
    const int H = 16, F = 8;
    memset(w1, 0, sizeof(float) * E * 2 * F * H);
    memset(w2, 0, sizeof(float) * E * H * F);
    for (int e = 0; e < E; e++) {
        for (int f = 0; f < F; f++) {
            w1[((size_t)e * 2 * F + f) * H + f] = g[e];
            w1[((size_t)e * 2 * F + F + f) * H + 8 + f] = u[e];
        }
        for (int h = 0; h < H; h++)
            w2[((size_t)e * H + h) * F + h % 8] = h < 8 ? d[e] : -d[e];
    }
}

static void test_ffn_plain(void) {
    CASE("plain SwiGLU, bf16 rounding of h and o");
    moe_spec_t s = mkspec(4, 2, 16, 8);
    const float g[4] = {1, 2, 0.5f, 1}, u[4] = {1, 1, 2, -1}, d[4] = {1, 0.5f, 2, 0.25f};
    float w1[4 * 16 * 16], w2[4 * 16 * 8];
    structured_weights(4, g, u, d, w1, w2);
    /* x[t] = [gate part | up part]; the third token only serves the subset case. */
    const float x[3][16] = {{1, 2, -1, 0, 0, 0, 0, 0, 1, 0.5f, 2, 3, 0, 0, 0, 0},
                            {0.5f, -2, 4, 1, 0, 0, 0, 0, 2, 1, -1, 0.5f, 0, 0, 0, 0},
                            {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
    uint16_t xh[48], w1h[4 * 16 * 16], w2h[4 * 16 * 8];
    to_half(&x[0][0], xh, 48, s.dtype);
    to_half(w1, w1h, 4 * 16 * 16, s.dtype);
    to_half(w2, w2h, 4 * 16 * 8, s.dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.w1 = w1h; in.w2 = w2h; in.tokens = 2;
    /* token 0 -> experts 1 (w 0.75), 2 (w 0.25); token 1 -> 3 (0.5), 0 (0.5) */
    int idx[6] = {1, 2, 3, 0, 0, 1};
    float tw[6] = {0.75f, 0.25f, 0.5f, 0.5f, 0.5f, 0.5f};
    float y[48];
    uint16_t hbuf[6 * 8], obuf[6 * 16];
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, hbuf, obuf) == 0);
    /* Token 0, expert 1 (g 2, u 1, d 0.5), f = 0..3:
     *   gate = {2, 4, -2, 0}, up = {1, 0.5, 2, 3}
     *   h = up*gate*σ(gate) = {1.7615942, 1.9640276, -0.4768117, 0} -> bf16 {1.7578125, 1.9609375, -0.4765625, 0}
     *   o = 0.5*h = {0.87890625, 0.98046875, -0.23828125, 0} (exact)
     * Token 0, expert 2 (g 0.5, u 2, d 2):
     *   gate = {0.5, 1, -0.5, 0}, up = {2, 1, 4, 6}
     *   h = {0.6224593, 0.7310586, -0.7550813, 0} -> bf16 {0.62109375, 0.73046875, -0.75390625, 0}
     *   o = 2*h = {1.2421875, 1.4609375, -1.5078125, 0}
     * y0[0..3] = 0.75*o(e1) + 0.25*o(e2) = {0.9697265625, 1.1005859375, -0.5556640625, 0},
     * y0[8..11] = -y0[0..3], everything else 0 (f = 3: gate 0 kills up 3).
     * Token 1, expert 3 (g 1, u -1, d 0.25): gate = {0.5, -2, 4, 1}, up = {-2, -1, 1, -0.5}
     *   h = {-0.6224593, 0.2384058, 3.9280552, -0.3655293} -> bf16 {-0.62109375, 0.23828125, 3.921875, -0.365234375}
     *   o = h/4 = {-0.1552734375, 0.0595703125, 0.98046875, -0.09130859375}
     * Token 1, expert 0 (g 1, u 1, d 1): h = o = -(expert 3's h)
     * y1[0..3] = 0.5*(o(e3) + o(e0)) = 0.5*(3/4)*h(e0) = {0.23291015625, -0.08935546875, -1.470703125, 0.136962890625} */
    const float y0[4] = {0.9697265625f, 1.1005859375f, -0.5556640625f, 0};
    const float y1[4] = {0.23291015625f, -0.08935546875f, -1.470703125f, 0.136962890625f};
    int ok = 1;
    for (int h = 0; h < 16; h++) {
        float e0 = h % 8 < 4 ? (h < 8 ? y0[h % 8] : -y0[h % 8]) : 0;
        float e1 = h % 8 < 4 ? (h < 8 ? y1[h % 8] : -y1[h % 8]) : 0;
        if (!NEAR(y[h], e0, 1e-6) || !NEAR(y[16 + h], e1, 1e-6)) {
            ok = 0;
            fprintf(stderr, "  h=%d: y0 %.9g (want %.9g), y1 %.9g (want %.9g)\n", h, y[h], e0, y[16 + h], e1);
        }
    }
    CHECK(ok);
    /* slot (0,0) is expert 1: h bits, o bits */
    CHECK(moe_half_to_float(hbuf[0], s.dtype) == 1.7578125f);
    CHECK(moe_half_to_float(hbuf[2], s.dtype) == -0.4765625f);
    CHECK(moe_half_to_float(hbuf[3 * 8 + 0], s.dtype) == 0.62109375f);   /* slot (1,1): expert 0 */
    CHECK(moe_half_to_float(obuf[1 * 16 + 1], s.dtype) == 1.4609375f);   /* slot (0,1): expert 2 */
    CHECK(moe_half_to_float(obuf[2 * 16 + 8], s.dtype) == 0.1552734375f); /* slot (1,0), h = 8: -o[0] */

    CASE("router.apply = \"input\": the weight scales the expert's input, the rows sum with weight 1");
    {
        moe_spec_t si = mkspec(4, 2, 16, 8);
        si.router.apply = MOE_APPLY_INPUT;
        const float xi[16] = {1, 3, -1.5f, 0.75f, 0, 0, 0, 0, 1, 0.5f, 2, 3, 0, 0, 0, 0};
        uint16_t xih[16];
        to_half(xi, xih, 16, si.dtype);
        moe_ref_inputs_t ii = {0};
        ii.x = xih; ii.w1 = w1h; ii.w2 = w2h; ii.tokens = 1;
        const int iidx[2] = {1, 2};
        const float itw[2] = {0.3f, 0.7f};
        float yi[16];
        uint16_t hi[2 * 8];
        CHECK(moe_ref_ffn(&si, &ii, iidx, itw, NULL, 0, yi, hi, NULL) == 0);
        /* Slot 0, expert 1 (g 2, u 1, d 0.5), w = 0.3 -> bf16 0.30078125:
         *   xin = round(x·0.30078125): gate part {0.30078125, 0.90234375, -0.451171875, 0.2255859375},
         *     up part {0.30078125, 0.150390625, 0.6015625, 0.90234375}
         *   gate = {0.6015625, 1.8046875, -0.90234375, 0.451171875}, up = the up part
         *   h = up·gate·σ(gate) = {0.1168889, 0.2330632, -0.1566400, 0.2487121}
         *     -> bf16 {0.11669921875, 0.2333984375, -0.15625, 0.2490234375}
         *   o = h/2 = {0.058349609375, 0.11669921875, -0.078125, 0.12451171875}
         * Slot 1, expert 2 (g 0.5, u 2, d 2), w = 0.7 -> bf16 0.69921875:
         *   xin: gate part {0.69921875, 2.09375 (3·0.69921875 = 2.09765625 rounded), -1.046875, 0.5234375},
         *     up part {0.69921875, 0.349609375, 1.3984375, 2.09375}
         *   gate = {0.349609375, 1.046875, -0.5234375, 0.26171875}, up = {1.3984375, 0.69921875, 2.796875, 4.1875}
         *   h = {0.2867550, 0.5418037, -0.5446754, 0.6192746} -> bf16 {0.287109375, 0.54296875, -0.54296875, 0.62109375}
         *   o = 2h = {0.57421875, 1.0859375, -1.0859375, 1.2421875}
         * y[0..3] = o(slot 0) + o(slot 1) = {0.632568359375, 1.20263671875, -1.1640625, 1.36669921875},
         * y[8..11] = -y[0..3], the rest 0 (weighting the outputs instead gives y[0] = 1.1332031). */
        const float yw[4] = {0.632568359375f, 1.20263671875f, -1.1640625f, 1.36669921875f};
        int iok = 1;
        for (int h = 0; h < 16; h++) {
            const float want = h % 8 < 4 ? (h < 8 ? yw[h % 8] : -yw[h % 8]) : 0;
            if (!NEAR(yi[h], want, 1e-6)) {
                iok = 0;
                fprintf(stderr, "  h=%d: y %.9g (want %.9g)\n", h, yi[h], want);
            }
        }
        CHECK(iok);
        CHECK(moe_half_to_float(hi[1], si.dtype) == 0.2333984375f);   /* slot 0, f = 1 */
        CHECK(moe_half_to_float(hi[8 + 3], si.dtype) == 0.62109375f); /* slot 1, f = 3 */
    }

    CASE("zero experts: an entry of index >= E adds w·x[t], no rows; a token may have no routed entry");
    {
        moe_spec_t sz = s;
        sz.zero_experts = 2;   /* indices 4 and 5 are zero experts */
        moe_ref_inputs_t iz = in;
        iz.tokens = 2;
        /* token 0 -> expert 1 (w 0.75) and zero expert 4 (w 0.25); token 1 -> zero experts 5 (0.5) and 4 (1.5) */
        const int zidx[4] = {1, 4, 5, 4};
        const float ztw[4] = {0.75f, 0.25f, 0.5f, 1.5f};
        float yz[32];
        uint16_t hz[4 * 8], oz[4 * 16];
        for (int i = 0; i < 4 * 8; i++) hz[i] = 0x7777;
        for (int i = 0; i < 4 * 16; i++) oz[i] = 0x7777;
        CHECK(moe_ref_ffn(&sz, &iz, zidx, ztw, NULL, 0, yz, hz, oz) == 0);
        /* Token 0: 0.75·o(expert 1) (above: {0.87890625, 0.98046875, -0.23828125, 0}, negated at h 8..11) +
         *   0.25·x0 (x0 = {1, 2, -1, 0, 0.., 1, 0.5, 2, 3, 0..}):
         *   h 0..3 {0.9091796875, 1.2353515625, -0.4287109375, 0}, h 8..11 {-0.4091796875, -0.6103515625,
         *   0.6787109375, 0.75}, the rest 0.
         * Token 1: (0.5 + 1.5)·x1 = 2·x1 = {1, -4, 8, 2, 0.., 4, 2, -2, 1, 0..} (no expert runs for it). */
        const float want0[16] = {0.9091796875f, 1.2353515625f, -0.4287109375f, 0, 0, 0, 0, 0,
                                 -0.4091796875f, -0.6103515625f, 0.6787109375f, 0.75f, 0, 0, 0, 0};
        const float want1[16] = {1, -4, 8, 2, 0, 0, 0, 0, 4, 2, -2, 1, 0, 0, 0, 0};
        int zok = 1;
        for (int h = 0; h < 16; h++)
            if (!NEAR(yz[h], want0[h], 1e-6) || !NEAR(yz[16 + h], want1[h], 1e-6)) {
                zok = 0;
                fprintf(stderr, "  h=%d: y0 %.9g (want %.9g), y1 %.9g (want %.9g)\n", h, yz[h], want0[h], yz[16 + h],
                        want1[h]);
            }
        CHECK(zok);
        /* slot (0,0) ran (expert 1); the zero slots' h and o rows are left as they were */
        CHECK(moe_half_to_float(hz[0], sz.dtype) == 1.7578125f && oz[0] != 0x7777);
        CHECK(hz[8] == 0x7777 && oz[16] == 0x7777 && hz[2 * 8] == 0x7777 && oz[3 * 16 + 5] == 0x7777);
        /* an index past the scored experts is refused */
        const int zbad[4] = {1, 6, 5, 4};
        CHECK(moe_ref_ffn(&sz, &iz, zbad, ztw, NULL, 0, yz, NULL, NULL) != 0);
    }

    CASE("token_list writes only the listed rows");
    in.tokens = 3;
    const float sentinel = 12345.0f;
    float ysub[48];
    uint16_t hsub[6 * 8], osub[6 * 16];
    for (int i = 0; i < 48; i++) ysub[i] = sentinel;
    memset(hsub, 0xEE, sizeof hsub);
    memset(osub, 0xEE, sizeof osub);
    const int list[2] = {2, 0};
    CHECK(moe_ref_ffn(&s, &in, idx, tw, list, 2, ysub, hsub, osub) == 0);
    CHECK(memcmp(ysub, y, 16 * sizeof(float)) == 0);      /* token 0 as before */
    int untouched = 1, row2 = 1;
    for (int h = 0; h < 16; h++) {
        if (ysub[16 + h] != sentinel) untouched = 0;
        /* token 2: x = all ones, experts 0 and 1, w 0.5 each:
         *   e0: h = σ(1) = 0.7310586 -> 0.73046875, o = h
         *   e1: h = 2σ(2) = 1.7615942 -> 1.7578125, o = 0.87890625
         *   y = 0.5*(0.73046875 + 0.87890625) = 0.8046875, negated for h >= 8 */
        if (!NEAR(ysub[32 + h], h < 8 ? 0.8046875 : -0.8046875, 1e-6)) row2 = 0;
    }
    CHECK(untouched);
    CHECK(row2);
    for (int i = 2 * 8; i < 4 * 8; i++) if (hsub[i] != 0xEEEE) untouched = 0;
    for (int i = 2 * 16; i < 4 * 16; i++) if (osub[i] != 0xEEEE) untouched = 0;
    CHECK(untouched);                                     /* token 1's slots in h_out, o_out */
    CHECK(memcmp(hsub, hbuf, 2 * 8 * sizeof(uint16_t)) == 0);

    CASE("ffn refuses bad arguments");
    const int dup[2] = {0, 0}, out_of_range[1] = {3};
    CHECK(moe_ref_ffn(&s, &in, idx, tw, dup, 2, ysub, NULL, NULL) != 0);
    CHECK(moe_ref_ffn(&s, &in, idx, tw, out_of_range, 1, ysub, NULL, NULL) != 0);
    idx[5] = 4;
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, ysub, NULL, NULL) != 0);
    idx[5] = 1;
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, NULL, NULL, NULL) != 0);
    CHECK(moe_ref_ffn(NULL, &in, idx, tw, NULL, 0, ysub, NULL, NULL) != 0);
    s.ffn_bias = true;                                    /* bias asked for, none given */
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, ysub, NULL, NULL) != 0);
}

/* The shared expert, computed directly (unsplit, F_s = 16 = 2F): gate row f
 * = 1 on column f, up row f = 0.5 on column f, W2s the identity, so
 * hs_f = 0.5·x_f²·σ(x_f) rounded, os = hs, and y = the routed sum of
 * test_ffn_plain's token 0 + g·hs. */
static void test_ffn_shared(void) {
    moe_spec_t s = mkspec(4, 2, 16, 8);
    s.shared.ffn = 16;
    const float g[4] = {1, 2, 0.5f, 1}, u[4] = {1, 1, 2, -1}, d[4] = {1, 0.5f, 2, 0.25f};
    float w1[4 * 16 * 16], w2[4 * 16 * 8], ws1[32 * 16] = {0}, ws2[16 * 16] = {0}, wsg[16] = {1};
    structured_weights(4, g, u, d, w1, w2);
    for (int f = 0; f < 16; f++) {
        ws1[f * 16 + f] = 1.0f;
        ws1[(16 + f) * 16 + f] = 0.5f;
        ws2[f * 16 + f] = 1.0f;
    }
    const float x[16] = {1, 2, -1, 0, 0, 0, 0, 0, 1, 0.5f, 2, 3, 0, 0, 0, 0};
    uint16_t xh[16], w1h[4 * 16 * 16], w2h[4 * 16 * 8], ws1h[32 * 16], ws2h[16 * 16], wsgh[16];
    to_half(x, xh, 16, s.dtype);
    to_half(w1, w1h, 4 * 16 * 16, s.dtype);
    to_half(w2, w2h, 4 * 16 * 8, s.dtype);
    to_half(ws1, ws1h, 32 * 16, s.dtype);
    to_half(ws2, ws2h, 16 * 16, s.dtype);
    to_half(wsg, wsgh, 16, s.dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.w1 = w1h; in.w2 = w2h; in.tokens = 1;
    in.ws1 = ws1h; in.ws2 = ws2h; in.wsg = wsgh;
    int idx[2] = {1, 2};
    float tw[2] = {0.75f, 0.25f};
    /* hs = bf16(0.5·x²·σ(x)) per column: x = 1: 0.3655293 -> 0.365234375; x = 2: 1.7615942 -> 1.7578125;
     * x = -1: 0.1344707 -> 0.134765625; x = 0.5: 0.0778074 -> 0.07763671875; x = 3: 4.2865836 -> 4.28125 */
    const float hs[16] = {0.365234375f, 1.7578125f, 0.134765625f, 0, 0, 0, 0, 0,
                          0.365234375f, 0.07763671875f, 1.7578125f, 4.28125f, 0, 0, 0, 0};
    /* the routed part (test_ffn_plain, token 0): y0[0..3] and its negation at 8..11 */
    const float y0[4] = {0.9697265625f, 1.1005859375f, -0.5556640625f, 0};

    CASE("shared expert, gate none: y = routed + hs");
    float y[16], gref = 0;
    uint16_t hso[16], oso[16];
    CHECK(moe_ref_shared(&s, &in, NULL, 0, &gref, hso, oso) == 0);
    CHECK(gref == 1.0f);
    int ok = 1;
    for (int h = 0; h < 16; h++)
        ok &= moe_half_to_float(hso[h], s.dtype) == hs[h] && moe_half_to_float(oso[h], s.dtype) == hs[h];
    CHECK(ok);
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, NULL, NULL) == 0);
    ok = 1;
    for (int h = 0; h < 16; h++) {
        float r = h % 8 < 4 ? (h < 8 ? y0[h % 8] : -y0[h % 8]) : 0;
        if (!NEAR(y[h], r + hs[h], 1e-6)) {
            ok = 0;
            fprintf(stderr, "  h=%d: y %.9g (want %.9g)\n", h, y[h], r + hs[h]);
        }
    }
    CHECK(ok);
    CHECK(NEAR(y[0], 1.3349609375, 1e-6) && NEAR(y[11], 4.28125, 1e-6)); /* 0.9697265625 + 0.365234375; 0 + 4.28125 */

    CASE("shared expert, gate sigmoid: y = routed + σ(x·w_gate)·hs");
    s.shared.gate = MOE_SHARED_GATE_SIGMOID; /* w_gate = e_0: g = σ(x_0) = σ(1) = 0.7310586 */
    CHECK(moe_ref_shared(&s, &in, NULL, 0, &gref, NULL, NULL) == 0);
    CHECK(NEAR(gref, 0.7310585786, 1e-7));
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, NULL, NULL) == 0);
    ok = 1;
    for (int h = 0; h < 16; h++) {
        float r = h % 8 < 4 ? (h < 8 ? y0[h % 8] : -y0[h % 8]) : 0;
        ok &= NEAR(y[h], r + 0.7310585786 * hs[h], 1e-6);
    }
    CHECK(ok);
    CHECK(NEAR(y[11], 3.1298446208, 1e-6)); /* 0.7310586 · 4.28125 */

    CASE("shared expert with router.apply = \"input\": added unscaled, weight 1");
    {
        moe_spec_t si = s, sn = s;   /* gate none (Llama 4); sn: the same layer without the shared expert */
        si.router.apply = sn.router.apply = MOE_APPLY_INPUT;
        si.shared.gate = MOE_SHARED_GATE_NONE;
        sn.shared.ffn = 0;
        float ys[16], yn[16];
        CHECK(moe_ref_ffn(&si, &in, idx, tw, NULL, 0, ys, NULL, NULL) == 0);
        CHECK(moe_ref_ffn(&sn, &in, idx, tw, NULL, 0, yn, NULL, NULL) == 0);
        int ok_in = 1, moved = 0;
        for (int h = 0; h < 16; h++) {
            float r = h % 8 < 4 ? (h < 8 ? y0[h % 8] : -y0[h % 8]) : 0;
            ok_in &= NEAR(ys[h] - yn[h], hs[h], 1e-6);
            moved |= !NEAR(yn[h], r, 1e-4);   /* the routed part did take its weight on the input */
        }
        CHECK(ok_in);
        CHECK(moved);
    }

    CASE("shared expert: missing weights and no shared expert are refused");
    in.wsg = NULL;
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, NULL, NULL) != 0);
    CHECK(moe_ref_shared(&s, &in, NULL, 0, &gref, NULL, NULL) != 0);
    s.shared.gate = MOE_SHARED_GATE_NONE;
    CHECK(moe_ref_shared(&s, &in, NULL, 0, &gref, NULL, NULL) == 0); /* gate none reads no w_gate */
    in.ws2 = NULL;
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, NULL, NULL) != 0);
    s.shared.ffn = 0;
    CHECK(moe_ref_shared(&s, &in, NULL, 0, &gref, NULL, NULL) != 0);
}

/* The kernels' form of the shared expert: m = F_s/F extra experts every
 * token visits with weight g, split as moe_plan_pack_shared splits it
 * (moe_plan_shared_w1_row, W2 columns jF..). The reference's plain routed
 * FFN over E + m experts must equal its direct shared expert up to the
 * rounding of each slot's output (the direct form rounds the sum once). */
static float frand(void);

static void test_ffn_shared_split(void) {
    CASE("shared expert: m slots of size F sum to the unsplit FFN");
    enum { E = 4, K = 2, H = 32, F = 16, M = 3, FS = M * F, T = 5 };
    moe_spec_t s = mkspec(E, K, H, F);
    s.shared.ffn = FS;
    s.shared.gate = MOE_SHARED_GATE_SIGMOID;
    moe_spec_t s2 = mkspec(E + M, K + M, H, F); /* the slots as routed experts */
    static uint16_t x[T * H], wr[E * H], w1[(E + M) * 2 * F * H], w2[(E + M) * H * F];
    static uint16_t ws1[2 * FS * H], ws2[H * FS], wsg[H];
    uint16_t *fill[] = {x, wr, w1, w2, ws1, ws2, wsg};
    const size_t nfill[] = {T * H, E * H, E * 2 * F * H, E * H * F, 2 * FS * H, H * FS, H};
    for (int i = 0; i < 7; i++)
        for (size_t j = 0; j < nfill[i]; j++)
            fill[i][j] = moe_float_to_half(frand() * (i == 0 ? 1.0f : 0.4f), s.dtype);
    for (int j = 0; j < M; j++) {
        for (int r = 0; r < 2 * F; r++)
            memcpy(w1 + ((size_t)(E + j) * 2 * F + r) * H, ws1 + moe_plan_shared_w1_row(&s, j, r) * H, H * 2);
        for (int h = 0; h < H; h++)
            memcpy(w2 + ((size_t)(E + j) * H + h) * F, ws2 + (size_t)h * FS + (size_t)j * F, F * 2);
    }
    moe_ref_inputs_t in = {.x = x, .wr = wr, .w1 = w1, .w2 = w2, .ws1 = ws1, .ws2 = ws2, .wsg = wsg, .tokens = T};
    int idx[T * K], idx2[T * (K + M)];
    float w[T * K], w2r[T * (K + M)], g[T], y[T * H], y2[T * H];
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    CHECK(moe_ref_shared(&s, &in, NULL, 0, g, NULL, NULL) == 0);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K + M; k++) {
            idx2[t * (K + M) + k] = k < K ? idx[t * K + k] : E + k - K;
            w2r[t * (K + M) + k] = k < K ? w[t * K + k] : g[t];
        }
    CHECK(moe_ref_ffn(&s, &in, idx, w, NULL, 0, y, NULL, NULL) == 0);
    CHECK(moe_ref_ffn(&s2, &in, idx2, w2r, NULL, 0, y2, NULL, NULL) == 0);
    double num = 0, den = 0;
    for (int i = 0; i < T * H; i++) {
        num += (double)(y[i] - y2[i]) * (y[i] - y2[i]);
        den += (double)y[i] * y[i];
    }
    fprintf(stderr, "  split vs direct shared expert: normalized L2 %.2e\n", sqrt(num / den));
    CHECKF(den > 0 && sqrt(num / den) < 4e-3, "split %.3e", sqrt(num / den)); /* m+1 bf16 roundings vs 1 */
    /* a wrong split (slot 0's up rows taken from slot 1) is caught by the same measure */
    for (int r = F; r < 2 * F; r++)
        memcpy(w1 + ((size_t)E * 2 * F + r) * H, ws1 + moe_plan_shared_w1_row(&s, 1, r) * H, H * 2);
    CHECK(moe_ref_ffn(&s2, &in, idx2, w2r, NULL, 0, y2, NULL, NULL) == 0);
    num = 0;
    for (int i = 0; i < T * H; i++)
        num += (double)(y[i] - y2[i]) * (y[i] - y2[i]);
    CHECKF(sqrt(num / den) > 4e-2, "a wrong split went unnoticed (%.3e)", sqrt(num / den));
}

static void test_ffn_gpt_oss(void) {
    CASE("clamped SwiGLU (gpt-oss) with ffn_bias");
    moe_spec_t s = mkspec(2, 1, 16, 8);
    s.activation.alpha = 1.702;
    s.activation.limit = 7.0;
    s.activation.up_offset = 1.0;
    s.ffn_bias = true;
    const float g[2] = {0.5f, 1}, u[2] = {0.5f, 1}, d[2] = {0.5f, 1};
    float w1[2 * 16 * 16], w2[2 * 16 * 8];
    structured_weights(2, g, u, d, w1, w2);
    const float x[16] = {10, -10, 6, 1, 0.5f, 0, 0, 0, 9, -9, 1, 8, -0.5f, 3, 0, 0};
    float b1[2][16] = {{0}}, b2[2][16] = {{0}};
    b1[1][2] = 2;           /* gate bias on f = 2 */
    b1[1][8 + 3] = 0.5f;    /* up bias on f = 3 */
    b2[1][0] = 0.25f;
    b2[1][15] = -1;
    b1[0][0] = 100;         /* expert 0 is not routed to: its bias must not matter */
    uint16_t xh[16], w1h[2 * 16 * 16], w2h[2 * 16 * 8], b1h[32], b2h[32];
    to_half(x, xh, 16, s.dtype);
    to_half(w1, w1h, 2 * 16 * 16, s.dtype);
    to_half(w2, w2h, 2 * 16 * 8, s.dtype);
    to_half(&b1[0][0], b1h, 32, s.dtype);
    to_half(&b2[0][0], b2h, 32, s.dtype);
    moe_ref_inputs_t in = {0};
    in.x = xh; in.w1 = w1h; in.w2 = w2h; in.b1 = b1h; in.b2 = b2h; in.tokens = 1;
    int idx[1] = {1};
    float tw[1] = {1.0f};
    float y[16];
    uint16_t hb[8], ob[16];
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, hb, ob) == 0);
    /* Expert 1 (all scales 1), h = (up + 1) * gate * σ(1.702 gate):
     *   f0: gate 10 -> 7, up 9 -> 7:        8*7*σ(11.914)  = 55.999625 -> bf16 56
     *   f1: gate -10 (no lower clamp), up -9 -> -7: -6*-10*σ(-17.02) = 2.4347768e-6 -> bf16 2.4288893e-6
     *       (clamping the gate at -7 would give 2.8e-4)
     *   f2: gate 6 + bias 2 = 8 -> 7, up 1:  2*7*σ(11.914)  = 13.999906 -> bf16 14
     *   f3: gate 1, up 8 + bias 0.5 -> 7:    8*1*σ(1.702)   = 6.7663661 -> bf16 6.78125
     *   f4: gate 0.5, up -0.5:               0.5*0.5*σ(0.851) = 0.1751942 -> bf16 0.1748046875
     *   f5: gate 0, up 3:                    0
     * o[h] = ±h[h%8] + b2[h]: o0 = 56 + 0.25 = 56.25, o15 = -h7 - 1 = -1 */
    const float hw[8] = {56, 2.428889274597168e-06f, 14, 6.78125f, 0.1748046875f, 0, 0, 0};
    int ok = 1;
    for (int f = 0; f < 8; f++) ok &= moe_half_to_float(hb[f], s.dtype) == hw[f];
    CHECK(ok);
    const float yw[16] = {56.25f, 2.428889274597168e-06f, 14, 6.78125f, 0.1748046875f, 0, 0, 0,
                          -56, -2.428889274597168e-06f, -14, -6.78125f, -0.1748046875f, 0, 0, -1};
    ok = 1;
    for (int h = 0; h < 16; h++)
        if (y[h] != yw[h] || moe_half_to_float(ob[h], s.dtype) != yw[h]) {
            ok = 0;
            fprintf(stderr, "  h=%d: y %.9g (want %.9g)\n", h, y[h], yw[h]);
        }
    CHECK(ok);
}

/* ---- randomized: blocked FFN vs a naive loop --------------------------- */

static uint32_t rng = 12345u;
static float frand(void) {                 /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* activation.kind = "geglu": (up + up_offset) * gelu(gate) on the clamped
 * pair, gelu the tanh approximation (PyTorch's gelu(approximate='tanh')); the
 * expected values are that formula evaluated in Python. */
static void test_activation_geglu(void) {
    CASE("activation: geglu");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.activation.kind = MOE_ACT_GEGLU;
    static const struct {
        float gate, up;
        double limit, up_offset, want;
    } v[] = {
        {1.0f, 2.0f, 0, 0, 1.6823839812165535},
        {-0.5f, 1.0f, 0, 0, -0.15428599017485606},
        {3.0f, -1.5f, 0, 1, -1.4981813039591134},
        {9.0f, -9.0f, 7, 1, -42.0}, /* both clamped to 7 */
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        s.activation.limit = v[i].limit;
        s.activation.up_offset = v[i].up_offset;
        double got = moe_ref_activation(&s, v[i].gate, v[i].up);
        CHECKF(fabs(got - v[i].want) <= 1e-6 * fabs(v[i].want), "geglu(%g, %g) = %.9g, want %.9g", v[i].gate,
               v[i].up, got, v[i].want);
    }
}

/* activation.kind = "relu2" (NemotronH): relu(gate)^2, up unused; its
 * gradient 2 relu(gate) in gate, 0 in up. */
static void test_activation_relu2(void) {
    CASE("activation: relu2");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.activation.kind = MOE_ACT_RELU2;
    static const struct {
        float gate, up;
        double want, dg;
    } v[] = {{1.5f, -3.0f, 2.25, 3.0}, {-0.5f, 7.0f, 0.0, 0.0}, {0.0f, 1.0f, 0.0, 0.0}, {3.0f, 0.0f, 9.0, 6.0}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        const double got = moe_ref_activation(&s, v[i].gate, v[i].up);
        double dg = -1, du = -1;
        moe_ref_activation_grad(&s, v[i].gate, v[i].up, &dg, &du);
        CHECKF(got == v[i].want && dg == v[i].dg && du == 0.0, "relu2(%g, %g) = %g d %g %g, want %g d %g 0",
               v[i].gate, v[i].up, got, dg, du, v[i].want, v[i].dg);
    }
}

/* activation.clamp = "after" (Step-3.7-Flash): min(act(gate), limit), up clamped as before. */
static void test_activation_clamp_after(void) {
    CASE("activation: the gate's clamp after the unit");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    s.activation.limit = 7;
    static const struct {
        int geglu, after;
        float gate, up;
        double up_offset, want;
    } v[] = {
        {0, 1, 8.0f, 2.0f, 0, 14.0},                /* silu(8) = 7.997 cut to 7 */
        {0, 0, 8.0f, 2.0f, 0, 13.987245283278392},  /* before: silu(min(8, 7)) */
        {0, 1, 3.0f, 9.0f, 0, 20.004056663271097},  /* silu(3) under the limit; up cut to 7 */
        {0, 1, -2.0f, -7.0f, 1, 1.4304350642654104}, /* a negative unit passes; up + 1 */
        {1, 1, 7.5f, 3.0f, 0, 21.0},                /* gelu(7.5) cut to 7 */
        {1, 1, 6.9f, -8.0f, 0, -48.29999999999995}, /* gelu(6.9) = 6.9: not cut; up cut to -7 */
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        s.activation.kind = v[i].geglu ? MOE_ACT_GEGLU : MOE_ACT_SWIGLU;
        s.activation.clamp = v[i].after ? MOE_CLAMP_AFTER : MOE_CLAMP_BEFORE;
        s.activation.up_offset = v[i].up_offset;
        double got = moe_ref_activation(&s, v[i].gate, v[i].up);
        CHECKF(fabs(got - v[i].want) <= 1e-6 * fabs(v[i].want), "case %zu: act(%g, %g) = %.9g, want %.9g", i,
               v[i].gate, v[i].up, got, v[i].want);
    }
}

static void naive_ffn(const moe_spec_t *s, const moe_ref_inputs_t *in, const int *idx,
                      const float *tw, int t, double *y) {
    const int H = s->hidden, F = s->ffn, K = s->top_k;
    const moe_dtype_t dt = s->dtype;
    float *hq = malloc(sizeof(float) * F);
    for (int h = 0; h < H; h++) y[h] = 0;
    for (int k = 0; k < K; k++) {
        int e = idx[t * K + k];
        for (int f = 0; f < F; f++) {
            double ga = 0, ua = 0;
            for (int h = 0; h < H; h++) {
                double xv = moe_half_to_float(in->x[(size_t)t * H + h], dt);
                ga += xv * moe_half_to_float(in->w1[((size_t)e * 2 * F + f) * H + h], dt);
                ua += xv * moe_half_to_float(in->w1[((size_t)e * 2 * F + F + f) * H + h], dt);
            }
            if (s->ffn_bias) {
                ga += moe_half_to_float(in->b1[(size_t)e * 2 * F + f], dt);
                ua += moe_half_to_float(in->b1[(size_t)e * 2 * F + F + f], dt);
            }
            double lim = s->activation.limit;
            if (lim > 0) { ga = fmin(ga, lim); ua = fmax(-lim, fmin(ua, lim)); }
            double hv = (ua + s->activation.up_offset) * ga / (1 + exp(-s->activation.alpha * ga));
            hq[f] = moe_half_to_float(moe_float_to_half((float)hv, dt), dt);
        }
        for (int h = 0; h < H; h++) {
            double o = 0;
            for (int f = 0; f < F; f++)
                o += hq[f] * (double)moe_half_to_float(in->w2[((size_t)e * H + h) * F + f], dt);
            if (s->ffn_bias) o += moe_half_to_float(in->b2[(size_t)e * H + h], dt);
            y[h] += tw[t * K + k] * (double)moe_half_to_float(moe_float_to_half((float)o, dt), dt);
        }
    }
    free(hq);
}

static void test_ffn_random(moe_dtype_t dt) {
    CASE(dt == MOE_DTYPE_BF16 ? "random bf16 FFN vs naive loop (ragged sizes)"
                              : "random fp16 FFN vs naive loop (ragged sizes)");
    /* Sizes that are not multiples of the 16-row block nor of 8. */
    const int E = 5, K = 3, H = 75, F = 37, T = 13;
    moe_spec_t s = mkspec(E, K, H, F);
    s.dtype = dt;
    s.ffn_bias = true;
    s.activation.alpha = 1.702; s.activation.limit = 1.5; s.activation.up_offset = 1;
    size_t nx = (size_t)T * H, n1 = (size_t)E * 2 * F * H, n2 = (size_t)E * H * F;
    uint16_t *x = malloc(nx * 2), *w1 = malloc(n1 * 2), *w2 = malloc(n2 * 2);
    uint16_t *b1 = malloc((size_t)E * 2 * F * 2), *b2 = malloc((size_t)E * H * 2);
    for (size_t i = 0; i < nx; i++) x[i] = moe_float_to_half(frand(), dt);
    for (size_t i = 0; i < n1; i++) w1[i] = moe_float_to_half(0.3f * frand(), dt);
    for (size_t i = 0; i < n2; i++) w2[i] = moe_float_to_half(0.3f * frand(), dt);
    for (int i = 0; i < E * 2 * F; i++) b1[i] = moe_float_to_half(0.5f * frand(), dt);
    for (int i = 0; i < E * H; i++) b2[i] = moe_float_to_half(0.1f * frand(), dt);
    int idx[13 * 3];
    float tw[13 * 3];
    for (int t = 0; t < T; t++)           /* distinct per token; expert 4 gets none */
        for (int k = 0; k < K; k++) {
            idx[t * K + k] = (t + k) % 4;
            tw[t * K + k] = 0.2f + 0.1f * (float)k;
        }
    moe_ref_inputs_t in = {0};
    in.x = x; in.w1 = w1; in.w2 = w2; in.b1 = b1; in.b2 = b2; in.tokens = T;
    float *y = malloc(nx * sizeof(float));
    double *yn = malloc((size_t)H * sizeof(double));
    CHECK(moe_ref_ffn(&s, &in, idx, tw, NULL, 0, y, NULL, NULL) == 0);
    double err = 0, mag = 0;
    for (int t = 0; t < T; t++) {
        naive_ffn(&s, &in, idx, tw, t, yn);
        for (int h = 0; h < H; h++) {
            err = fmax(err, fabs(y[(size_t)t * H + h] - yn[h]));
            mag = fmax(mag, fabs(yn[h]));
        }
    }
    /* The two differ only where a fp32 vs double sum lands h or o on the
     * other side of a rounding boundary: about one dtype ulp of one term. */
    double tol = (dt == MOE_DTYPE_BF16 ? 1.6e-2 : 2e-3) * mag;
    CHECKF(mag > 0.1 && err <= tol, "max error %.3g, max |y| %.3g", err, mag);
    free(x); free(w1); free(w2); free(b1); free(b2); free(y); free(yn);
}

/* ---- randomized: routing invariants ------------------------------------ */

static void test_route_random(void) {
    CASE("random group-limited routing invariants");
    const int E = 32, K = 6, H = 24, T = 50;
    moe_spec_t s = mkspec(E, K, H, 8);
    s.router.score = MOE_SCORE_SIGMOID;
    s.router.groups = 8; s.router.topk_groups = 3;      /* a group scores its top group_topk = 2 */
    s.router.bias = true; s.router.renormalize = true; s.router.scale = 2.5;
    uint16_t x[50 * 24], wr[32 * 24];
    float bias[32];
    for (int i = 0; i < T * H; i++) x[i] = moe_float_to_half(frand(), s.dtype);
    for (int i = 0; i < E * H; i++) wr[i] = moe_float_to_half(frand(), s.dtype);
    for (int e = 0; e < E; e++) bias[e] = 0.1f * frand();
    moe_ref_inputs_t in = {0};
    in.x = x; in.wr = wr; in.sel_bias = bias; in.tokens = T;
    int idx[50 * 6]; float w[50 * 6], sc[50 * 32];
    CHECK(moe_ref_route(&s, &in, idx, w, sc) == 0);
    int ok_sorted = 1, ok_groups = 1, ok_sum = 1, ok_agree;
    for (int t = 0; t < T; t++) {
        const int *ix = idx + t * K;
        const float *st = sc + t * E;
        unsigned groups = 0;
        double sum = 0;
        for (int k = 0; k < K; k++) {
            if (k && st[ix[k]] > st[ix[k - 1]]) ok_sorted = 0;
            groups |= 1u << (ix[k] / 4);
            sum += w[t * K + k];
        }
        int ngroups = 0;
        for (unsigned b = groups; b; b >>= 1) ngroups += (int)(b & 1u);
        if (ngroups > 3) ok_groups = 0;
        if (!NEAR(sum, 2.5, 1e-5)) ok_sum = 0;
        /* within the kept groups, nothing unselected beats the k-th score */
        for (int e = 0; e < E; e++) {
            int sel = 0;
            for (int k = 0; k < K; k++) sel |= ix[k] == e;
            if (!sel && (groups >> (e / 4) & 1) && st[e] > st[ix[K - 1]]) ok_sorted = 0;
        }
    }
    CHECK(ok_sorted);
    CHECK(ok_groups);
    CHECK(ok_sum);
    ok_agree = moe_ref_route_agree(&s, idx, idx, sc, T, 0.0f, NULL);
    CHECK(ok_agree == 1);
}

static void test_route_agree(void) {
    CASE("route_agree: near-tie swap accepted, real difference rejected");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    /* token 0: k-th selected score is 0.30; expert 2 is 1e-4 below it.
     * token 1: plain, identical sets in another order. */
    const float sc[8] = {0.5f, 0.30f, 0.2999f, 0.1f, 0.1f, 0.2f, 0.3f, 0.4f};
    const int ref[4] = {0, 1, 3, 2};
    const int swap[4] = {0, 2, 2, 3};      /* near-tie swap; order differs in token 1 */
    const int wrong[4] = {0, 3, 3, 2};     /* expert 3 (0.1) is no near-tie */
    const int dup[4] = {0, 0, 3, 2};
    const int oob[4] = {0, 1, 3, 4};
    int bad = 99;
    CHECK(moe_ref_route_agree(&s, ref, ref, sc, 2, 0.0f, &bad) == 1 && bad == -1);
    CHECK(moe_ref_route_agree(&s, ref, swap, sc, 2, 1e-3f, &bad) == 1);
    CHECK(moe_ref_route_agree(&s, ref, swap, sc, 2, 1e-5f, &bad) == 0 && bad == 0);
    CHECK(moe_ref_route_agree(&s, ref, wrong, sc, 2, 1e-3f, &bad) == 0 && bad == 0);
    CHECK(moe_ref_route_agree(&s, ref, dup, sc, 2, 1.0f, &bad) == 0 && bad == 0);
    CHECK(moe_ref_route_agree(&s, ref, oob, sc, 2, 1.0f, &bad) == 0 && bad == 1);
    CHECK(moe_ref_route_agree(&s, ref, NULL, sc, 2, 1.0f, &bad) == 0 && bad == -1);
}

static void test_route_bad_args(void) {
    CASE("route refuses bad arguments");
    moe_spec_t s = mkspec(4, 2, 8, 8);
    uint16_t x[8] = {0}, wr[32] = {0};
    moe_ref_inputs_t in = {0};
    in.x = x; in.wr = wr; in.tokens = 1;
    int idx[2]; float w[2];
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    CHECK(moe_ref_route(NULL, &in, idx, w, NULL) != 0);
    CHECK(moe_ref_route(&s, NULL, idx, w, NULL) != 0);
    CHECK(moe_ref_route(&s, &in, NULL, w, NULL) != 0);
    in.wr = NULL;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) != 0);
    in.wr = wr;
    s.top_k = 5;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) != 0);
    s.top_k = 2;
    s.router.logit_bias = true;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) != 0);
    /* all-zero logits: every expert ties, so the first two are chosen */
    s.router.logit_bias = false;
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0 && idx[0] == 0 && idx[1] == 1);
}

/* ---- the backward (moe_ref_backward) ------------------------------------ */

/* A case's own generator: uniform in [-1, 1), never exactly 0. */
static double urand(uint32_t *st) {
    *st = *st * 1664525u + 1013904223u;
    double v = (double)((*st >> 8) & 0xFFFFFF) / 8388608.0 - 1.0;
    return v != 0 ? v : 0.5;
}

/* One layer's inputs in half precision and as doubles (the same values),
 * plus dy; filled by bwd_data for a spec, a token count and a seed. */
enum { BX, BWR, BW1, BW2, BB1, BB2, BWS1, BWS2, BWSG, BDY, BRX, BN };   /* BRX: router.input's router_x */
typedef struct {
    int T;
    uint16_t *h[BN];
    double *d[BN];
    size_t n[BN];
    float sel_bias[64], logit_bias[64];
    double logit_bias_d[64];
    float expert_scale[64];   /* router.expert_scale: around 1 */
    double expert_scale_d[64];
    int *given;      /* router.select = "given": the caller's ids [T, K] (a repeat and two dropped among them) */
} bwd_data_t;

/* Scales keep logits, U and O near 1 whatever the sizes. */
static void bwd_data(bwd_data_t *D, const moe_spec_t *s, int T, uint32_t seed) {
    const int E = s->experts, H = s->hidden, F = s->ffn, FS = s->shared.ffn;
    const double sh = 1.0 / sqrt((double)H), sf = 1.0 / sqrt((double)F);
    const size_t n[BN] = { (size_t)T * H, (size_t)E * H, (size_t)E * 2 * F * H, (size_t)E * H * F,
                           (size_t)E * 2 * F, (size_t)E * H, (size_t)2 * FS * H, (size_t)H * FS, (size_t)H,
                           (size_t)T * H, (size_t)T * H };
    const double scale[BN] = { 1, 2 * sh, 2 * sh, 1.5 * sf, 0.5, 0.3, 2 * sh, 1.5 * sf, 2 * sh, 1, 1 };
    uint32_t st = seed, st2 = seed * 2654435761u + 7u;   /* st2: router_x's own stream (the others as before) */
    memset(D, 0, sizeof *D);
    D->T = T;
    for (int i = 0; i < BN; i++) {
        D->n[i] = n[i];
        D->h[i] = malloc((n[i] ? n[i] : 1) * 2);
        D->d[i] = malloc((n[i] ? n[i] : 1) * sizeof(double));
        for (size_t j = 0; j < n[i]; j++) {
            D->h[i][j] = moe_float_to_half((float)(scale[i] * urand(i == BRX ? &st2 : &st)), s->dtype);
            D->d[i][j] = moe_half_to_float(D->h[i][j], s->dtype);
        }
    }
    for (int e = 0; e < E && e < 64; e++) {
        D->sel_bias[e] = (float)(0.1 * urand(&st));
        D->logit_bias[e] = (float)(0.5 * urand(&st));
        D->logit_bias_d[e] = D->logit_bias[e];
    }
    const int TK = T * s->top_k;
    D->given = malloc((size_t)(TK > 0 ? TK : 1) * sizeof(int));
    for (int i = 0; D->given && i < TK; i++)
        D->given[i] = (int)((urand(&st) + 1.0) * 0.5 * E) % E;
    if (D->given && TK >= 4 && s->top_k >= 2) {
        D->given[1] = D->given[0];   /* token 0's expert twice */
        D->given[s->top_k] = -1;     /* dropped: token 1's first entry, the last one */
        D->given[TK - 1] = E;
    }
    for (int e = 0; e < E && e < 64; e++) {
        D->expert_scale[e] = (float)(1.0 + 0.5 * urand(&st2));
        D->expert_scale_d[e] = D->expert_scale[e];
    }
}

static void bwd_data_free(bwd_data_t *D) {
    for (int i = 0; i < BN; i++) { free(D->h[i]); free(D->d[i]); }
    free(D->given);
}

static moe_ref_inputs_t bwd_inputs(bwd_data_t *D) {
    moe_ref_inputs_t in = {0};
    in.x = D->h[BX]; in.wr = D->h[BWR]; in.w1 = D->h[BW1]; in.w2 = D->h[BW2];
    in.b1 = D->h[BB1]; in.b2 = D->h[BB2]; in.ws1 = D->h[BWS1]; in.ws2 = D->h[BWS2]; in.wsg = D->h[BWSG];
    in.sel_bias = D->sel_bias; in.logit_bias = D->logit_bias; in.tokens = D->T; in.given_ids = D->given;
    in.router_x = D->h[BRX]; in.expert_scale = D->expert_scale;
    return in;
}

/* The gradients of one run, one float array per differentiable input. */
enum { GX, GWR, GW1, GB1, GW2, GB2, GLB, GWS1, GWS2, GWSG, GRX, GES, GN };
static const char *const grad_name[GN] = { "dx", "drouter_w", "dw1", "db1", "dw2", "db2", "dlogit_bias",
                                           "dws1", "dws2", "dw_gate", "drouter_x", "dexpert_scale" };
typedef struct {
    float *v[GN];
    size_t n[GN];
    int used[GN];          /* the spec has this input */
} bwd_grads_t;

static void bwd_grads_alloc(bwd_grads_t *G, const moe_spec_t *s, int T) {
    const int E = s->experts, H = s->hidden, F = s->ffn, FS = s->shared.ffn;
    const size_t n[GN] = { (size_t)T * H, (size_t)E * H, (size_t)E * 2 * F * H, (size_t)E * 2 * F,
                           (size_t)E * H * F, (size_t)E * H, (size_t)E, (size_t)2 * FS * H, (size_t)H * FS,
                           (size_t)H, (size_t)T * H, (size_t)E };
    const int used[GN] = { 1, 1, 1, s->ffn_bias, 1, s->ffn_bias, s->router.logit_bias, FS > 0, FS > 0,
                           FS > 0 && s->shared.gate == MOE_SHARED_GATE_SIGMOID,
                           s->router.input == MOE_ROUTER_INPUT_SEPARATE, s->router.expert_scale };
    for (int i = 0; i < GN; i++) {
        G->n[i] = n[i];
        G->used[i] = used[i];
        G->v[i] = malloc((n[i] ? n[i] : 1) * sizeof(float));
        for (size_t j = 0; j < n[i]; j++) G->v[i][j] = NAN;   /* poisoned */
    }
}

static void bwd_grads_free(bwd_grads_t *G) {
    for (int i = 0; i < GN; i++) free(G->v[i]);
}

static moe_ref_grads_t bwd_grads_ptrs(bwd_grads_t *G) {
    moe_ref_grads_t g = { .dx = G->v[GX], .dwr = G->v[GWR], .dw1 = G->v[GW1], .db1 = G->v[GB1],
                          .dw2 = G->v[GW2], .db2 = G->v[GB2], .dlogit_bias = G->v[GLB],
                          .dws1 = G->v[GWS1], .dws2 = G->v[GWS2], .dwsg = G->v[GWSG],
                          .d_router_x = G->v[GRX], .d_expert_scale = G->v[GES] };
    return g;
}

/* L = Σ dy ⊙ y of the exact forward, with the selection fixed. */
static double bwd_loss(const moe_spec_t *s, bwd_data_t *D, const int *idx, double *y) {
    moe_ref_inputs_f64_t in = { .x = D->d[BX], .wr = D->d[BWR], .w1 = D->d[BW1], .w2 = D->d[BW2],
                                .b1 = D->d[BB1], .b2 = D->d[BB2], .logit_bias = D->logit_bias_d,
                                .tokens = D->T, .ws1 = D->d[BWS1], .ws2 = D->d[BWS2], .wsg = D->d[BWSG],
                                .given_ids = D->given, .router_x = D->d[BRX], .expert_scale = D->expert_scale_d };
    if (moe_ref_forward_exact(s, &in, idx, y)) return NAN;
    double L = 0;
    for (size_t i = 0; i < D->n[BDY]; i++) L += D->d[BDY][i] * y[i];
    return L;
}

/* The double array behind gradient gi. */
static double *bwd_param(bwd_data_t *D, int gi) {
    static const int of[GN] = { BX, BWR, BW1, BB1, BW2, BB2, -1, BWS1, BWS2, BWSG, BRX, -1 };
    return gi == GLB ? D->logit_bias_d : gi == GES ? D->expert_scale_d : D->d[of[gi]];
}

/* Finite differences: central, step FD_H, on the exact forward (double).
 * The exact gradient is stored as float, so the two differ by truncation
 * (FD_H^2 · L''' / 6, about 1e-9 here) plus the float store (6e-8
 * relative); FD_TOL_ABS + FD_TOL_REL·|g| is 10-100× that. Every tensor's
 * gradient reaches at least FD_MIN_GRAD somewhere (checked), so an error of
 * 1e-4 of a tensor's scale — far below what a missing term, factor or sign
 * makes — fails (checked below by corrupting one element). */
#define FD_H 1e-4
#define FD_TOL_ABS 1e-6
#define FD_TOL_REL 1e-5
#define FD_MIN_GRAD 0.05

/* Worst |fd - g| / tol over the checked elements of gradient gi (all when
 * there are at most 1536, else 768 spread over the tensor plus the
 * largest); *gmax and *fdmax get max |g| and max |fd| over them, *at and
 * *fd_at the worst element and its finite difference. */
static double fd_check(const moe_spec_t *s, bwd_data_t *D, const int *idx, double *y, int gi, const float *g,
                       size_t n, double *gmax, double *fdmax, size_t *at, double *fd_at) {
    double *v = bwd_param(D, gi), worst = 0;
    size_t big = 0;
    for (size_t j = 1; j < n; j++) if (fabsf(g[j]) > fabsf(g[big])) big = j;
    const size_t m = n <= 1536 ? n : 769;
    *gmax = *fdmax = 0;
    *at = 0;
    *fd_at = 0;
    for (size_t c = 0; c < m; c++) {
        const size_t j = n <= 1536 ? c : c == 768 ? big : (c * 7919u + 13u) % n;
        const double keep = v[j];
        v[j] = keep + FD_H;
        const double lp = bwd_loss(s, D, idx, y);
        v[j] = keep - FD_H;
        const double lm = bwd_loss(s, D, idx, y);
        v[j] = keep;
        const double fd = (lp - lm) / (2 * FD_H);
        const double r = fabs(fd - g[j]) / (FD_TOL_ABS + FD_TOL_REL * fabs(g[j]));
        if (!(r <= worst)) { worst = r; *at = j; *fd_at = fd; }   /* NaN is the worst */
        *gmax = fmax(*gmax, fabs(g[j]));
        *fdmax = fmax(*fdmax, fabs(fd));
    }
    return worst;
}

typedef struct {
    const char *name;
    moe_spec_t s;
    int T;
    uint32_t seed;
} bwd_case_t;

/* The spec variants the backward covers: routing, biases, activations,
 * router.apply, shared experts. */
static int bwd_cases(bwd_case_t *c) {
    int n = 0;
    moe_spec_t s;

    s = mkspec(4, 2, 16, 8);   /* Mixtral / Qwen3 */
    s.router.renormalize = true;
    c[n++] = (bwd_case_t){ "softmax + renormalize", s, 3, 101u };

    s = mkspec(6, 2, 16, 8);
    s.dtype = MOE_DTYPE_FP16;
    s.router.scale = 1.7; s.router.logit_bias = true;
    c[n++] = (bwd_case_t){ "softmax, no renormalize, scale, logit_bias", s, 4, 202u };

    s = mkspec(8, 2, 16, 8);   /* DeepSeek-V3's router */
    s.router.score = MOE_SCORE_SIGMOID; s.router.bias = true; s.router.renormalize = true;
    s.router.scale = 2.5; s.router.groups = 4; s.router.topk_groups = 2; s.router.group_topk = 2;
    c[n++] = (bwd_case_t){ "sigmoid, bias, groups, renormalize, scale", s, 4, 303u };

    s = mkspec(4, 2, 16, 8);   /* gpt-oss, with a limit the values reach */
    s.router.renormalize = true; s.router.logit_bias = true; s.ffn_bias = true;
    s.activation.alpha = 1.702; s.activation.limit = 0.6; s.activation.up_offset = 1;
    c[n++] = (bwd_case_t){ "clamped swiglu, ffn_bias, logit_bias", s, 5, 404u };

    s = mkspec(4, 2, 16, 8);
    s.dtype = MOE_DTYPE_FP16;
    s.activation.kind = MOE_ACT_GEGLU; s.activation.limit = 0.7; s.activation.up_offset = 0.5;
    c[n++] = (bwd_case_t){ "clamped geglu, up_offset", s, 3, 505u };

    s = mkspec(4, 2, 16, 8);   /* Llama 4's apply (with k = 2) and its ungated shared expert */
    s.router.score = MOE_SCORE_SIGMOID; s.router.apply = MOE_APPLY_INPUT;
    s.shared.ffn = 16;
    c[n++] = (bwd_case_t){ "sigmoid, apply = input, shared (ungated)", s, 4, 606u };

    s = mkspec(4, 2, 16, 8);
    s.router.renormalize = true;
    s.shared.ffn = 16; s.shared.gate = MOE_SHARED_GATE_SIGMOID;
    c[n++] = (bwd_case_t){ "softmax + renormalize, shared (sigmoid gate)", s, 4, 707u };

    s = mkspec(8, 2, 32, 16);
    s.router.score = MOE_SCORE_SIGMOID; s.router.bias = true; s.router.logit_bias = true;
    s.router.renormalize = true; s.router.groups = 2; s.router.topk_groups = 1; s.router.group_topk = 1;
    s.ffn_bias = true; s.activation.limit = 0.9; s.activation.up_offset = 1;
    s.shared.ffn = 32; s.shared.gate = MOE_SHARED_GATE_SIGMOID;
    c[n++] = (bwd_case_t){ "larger: groups, both biases, clamp, gated shared", s, 5, 809u };

    s = mkspec(8, 3, 16, 8);   /* DeepSeek-V4's router: sqrt(softplus), bias, renormalize, scale */
    s.router.score = MOE_SCORE_SQRTSOFTPLUS; s.router.bias = true; s.router.renormalize = true;
    s.router.scale = 1.5; s.shared.ffn = 8;
    c[n++] = (bwd_case_t){ "sqrtsoftplus, bias, renormalize, scale, shared", s, 4, 910u };

    s = mkspec(6, 2, 16, 8);
    s.router.score = MOE_SCORE_SQRTSOFTPLUS; s.router.logit_bias = true;
    c[n++] = (bwd_case_t){ "sqrtsoftplus, no renormalize, logit_bias", s, 4, 1011u };

    s = mkspec(8, 2, 16, 8);   /* Laguna's router with its logit cap (c small enough that tanh bends) */
    s.router.score = MOE_SCORE_SIGMOID; s.router.bias = true; s.router.renormalize = true;
    s.router.scale = 2.0; s.router.logit_softcap = 0.8;
    c[n++] = (bwd_case_t){ "sigmoid, bias, renormalize, logit_softcap", s, 4, 1113u };

    s = mkspec(6, 2, 16, 8);
    s.router.renormalize = true; s.router.logit_bias = true; s.router.logit_softcap = 0.3;
    c[n++] = (bwd_case_t){ "softmax, logit_bias, logit_softcap", s, 4, 1213u };

    s = mkspec(8, 3, 16, 8);   /* DeepSeek-V4's hash layers: the caller's ids, sqrt(softplus) at them */
    s.router.select = MOE_SELECT_GIVEN; s.router.score = MOE_SCORE_SQRTSOFTPLUS; s.router.renormalize = true;
    s.router.scale = 1.5; s.shared.ffn = 8;
    c[n++] = (bwd_case_t){ "given ids (a repeat, two dropped): sqrtsoftplus, renormalize, scale, shared", s, 4,
                           1314u };

    s = mkspec(6, 2, 16, 8);
    s.router.select = MOE_SELECT_GIVEN; s.router.logit_bias = true;
    c[n++] = (bwd_case_t){ "given ids (a repeat, two dropped): softmax, no renormalize, logit_bias", s, 4, 1415u };

    s = mkspec(4, 2, 16, 8);   /* Step-3.7-Flash's clamped layers: min(silu(gate), L), up in [-L, L] */
    s.router.renormalize = true; s.activation.limit = 0.25; s.activation.clamp = MOE_CLAMP_AFTER;
    c[n++] = (bwd_case_t){ "swiglu clamped after the unit", s, 5, 1722u };

    s = mkspec(4, 2, 16, 8);   /* Step-3.7-Flash's shared limit of its own (its slots at 1.2, the routed at 0.6) */
    s.router.renormalize = true; s.activation.limit = 0.6; s.activation.clamp = MOE_CLAMP_AFTER;
    s.shared.ffn = 16; s.shared.limit = 1.2;
    c[n++] = (bwd_case_t){ "swiglu clamped after the unit, shared.limit", s, 5, 1823u };

    s = mkspec(6, 2, 16, 8);   /* HY-V4: the routed experts clamped, the shared expert not */
    s.router.score = MOE_SCORE_SIGMOID; s.router.bias = true; s.router.renormalize = true;
    s.activation.limit = 0.6; s.shared.ffn = 8; s.shared.unclamped = true;
    c[n++] = (bwd_case_t){ "clamped swiglu, shared.unclamped", s, 4, 1925u };

    s = mkspec(6, 3, 16, 8);   /* NemotronH: relu(gate)^2, up unused; a relu2 shared expert */
    s.router.score = MOE_SCORE_SIGMOID; s.router.bias = true; s.router.renormalize = true; s.router.scale = 2.5;
    s.activation.kind = MOE_ACT_RELU2; s.shared.ffn = 16;
    c[n++] = (bwd_case_t){ "relu2 experts and shared expert, sigmoid, bias, scale", s, 4, 2025u };

    s = mkspec(6, 2, 16, 8);   /* Gemma 4's router: its own input, per-expert scales; GeGLU experts */
    s.router.renormalize = true; s.router.input = MOE_ROUTER_INPUT_SEPARATE; s.router.expert_scale = true;
    s.activation.kind = MOE_ACT_GEGLU;
    c[n++] = (bwd_case_t){ "the router's own input and per-expert scales, softmax + renormalize, geglu", s, 4,
                           1516u };

    s = mkspec(8, 3, 16, 8);
    s.router.select = MOE_SELECT_GIVEN; s.router.score = MOE_SCORE_SIGMOID; s.router.scale = 1.5;
    s.router.input = MOE_ROUTER_INPUT_SEPARATE; s.router.expert_scale = true; s.shared.ffn = 8;
    c[n++] = (bwd_case_t){ "given ids (two dropped), own input, expert scales: sigmoid, scale, shared", s, 4,
                           1617u };
    return n;
}

/* Exact-mode gradients against central finite differences of the exact
 * forward, every gradient of every case. */
static void test_backward_fd(void) {
    bwd_case_t cases[32];
    const int nc = bwd_cases(cases);
    for (int ci = 0; ci < nc; ci++) {
        const bwd_case_t *C = &cases[ci];
        const moe_spec_t *s = &C->s;
        const int T = C->T, K = s->top_k, F = s->ffn;
        char name[160];
        snprintf(name, sizeof name, "backward vs finite differences: %s", C->name);
        CASE(name);
        bwd_data_t D;
        bwd_data(&D, s, T, C->seed);
        moe_ref_inputs_t in = bwd_inputs(&D);
        bwd_grads_t G;
        bwd_grads_alloc(&G, s, T);
        moe_ref_grads_t gp = bwd_grads_ptrs(&G);
        int *idx = malloc((size_t)T * K * sizeof(int));
        float *u = malloc((size_t)T * K * 2 * F * sizeof(float));
        moe_ref_bwd_stages_t st = { .topk_idx = idx, .u = u };
        double *y = malloc((size_t)T * s->hidden * sizeof(double));
        CHECKF(moe_ref_backward(s, &in, D.h[BDY], MOE_REF_EXACT, &gp, &st) == 0, "seed %u", C->seed);

        /* A finite difference across the clamp's kink is meaningless: the
         * seeds keep every pre-activation 1e-3 (10 steps) away from it, and
         * the clamp cases cut some gates and some ups. */
        if (s->activation.limit > 0) {
            const double lim = s->activation.limit;
            int near = 0, cut_g = 0, cut_u = 0;
            for (int r = 0; r < T * K; r++)
                for (int f = 0; f < F; f++) {
                    double g = u[(size_t)r * 2 * F + f];
                    const double v = u[(size_t)r * 2 * F + F + f];
                    if (s->activation.clamp == MOE_CLAMP_AFTER)   /* the gate's kink: where its unit meets the limit */
                        g = s->activation.kind == MOE_ACT_GEGLU
                                ? 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
                                : g / (1.0 + exp(-s->activation.alpha * g));
                    near += fabs(g - lim) < 1e-3 || fabs(fabs(v) - lim) < 1e-3;
                    cut_g += g > lim;
                    cut_u += fabs(v) > lim;
                }
            CHECKF(!near && cut_g > 0 && cut_u > 0,
                   "seed %u: %d pre-activations near the limit, %d gates and %d ups cut", C->seed, near, cut_g,
                   cut_u);
        }
        for (int gi = 0; gi < GN; gi++) {
            if (!G.used[gi]) continue;
            double gmax, fdmax, wfd;
            size_t at;
            const double worst = fd_check(s, &D, idx, y, gi, G.v[gi], G.n[gi], &gmax, &fdmax, &at, &wfd);
            CHECKF(worst <= 1.0 && gmax >= FD_MIN_GRAD && fdmax >= FD_MIN_GRAD,
                   "seed %u: %s[%zu] = %.9g, finite difference %.9g (%.3g x the tolerance); max |g| %.3g, "
                   "max |fd| %.3g", C->seed, grad_name[gi], at, G.v[gi][at], wfd, worst, gmax, fdmax);
            if (gi == GW1) {   /* the check sees an error of 1e-4 of the scale */
                size_t big = 0;
                for (size_t j = 1; j < G.n[gi]; j++) if (fabsf(G.v[gi][j]) > fabsf(G.v[gi][big])) big = j;
                const float keep = G.v[gi][big];
                G.v[gi][big] += (float)(1e-4 * gmax);
                const double bad = fd_check(s, &D, idx, y, gi, G.v[gi], G.n[gi], &gmax, &fdmax, &at, &wfd);
                G.v[gi][big] = keep;
                CHECKF(bad > 1.0 && at == big, "seed %u: a dw1 off by 1e-4 of its scale passed (%.3g)", C->seed,
                       bad);
            }
        }
        free(idx); free(u); free(y);
        bwd_grads_free(&G);
        bwd_data_free(&D);
    }
}

/* Normwise relative difference of a and b, over b's norm. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* The rounded mode (what the GPU mirrors) against the exact one on the same
 * inputs: they differ by the dtype roundings along the chain (forward A, O;
 * dys, Ur, dU, dXs, dx), a few units of the dtype's unit roundoff (bf16
 * 2^-9, fp16 2^-12) normwise: worst measured over these cases 0.006 (bf16)
 * and 0.0007 (fp16). With a clamp, a U within half an ulp of the limit can
 * round across it, and the rounded mode then keeps (or cuts) a whole dU
 * element the exact one cuts (or keeps) — the contract's Ur decides; in
 * bf16 two such values in the largest case move db1 by 0.030 normwise. The
 * tolerances are 2-3× the worst. */
#define BWD_ROUNDED_TOL_BF16 1.5e-2
#define BWD_ROUNDED_TOL_BF16_CLAMP 6e-2
#define BWD_ROUNDED_TOL_FP16 2e-3

static void test_backward_rounded(moe_dtype_t dt) {
    bwd_case_t cases[32];
    const int nc = bwd_cases(cases);
    double worst_all = 0;
    for (int ci = 0; ci < nc; ci++) {
        bwd_case_t *C = &cases[ci];
        moe_spec_t *s = &C->s;
        s->dtype = dt;
        const int T = 24, K = s->top_k, E = s->experts, H = s->hidden, F = s->ffn;
        const uint32_t seed = C->seed + 1000u;
        const double tol = dt == MOE_DTYPE_FP16 ? BWD_ROUNDED_TOL_FP16
                           : s->activation.limit > 0 ? BWD_ROUNDED_TOL_BF16_CLAMP : BWD_ROUNDED_TOL_BF16;
        s->tokens = T;
        char name[160];
        snprintf(name, sizeof name, "backward rounded vs exact (%s): %s", moe_dtype_name(dt), C->name);
        CASE(name);
        bwd_data_t D;
        bwd_data(&D, s, T, seed);
        moe_ref_inputs_t in = bwd_inputs(&D);
        bwd_grads_t R, X;
        bwd_grads_alloc(&R, s, T);
        bwd_grads_alloc(&X, s, T);
        moe_ref_grads_t rp = bwd_grads_ptrs(&R), xp = bwd_grads_ptrs(&X);
        const size_t rows = (size_t)T * K;
        int *idx = malloc(rows * sizeof(int)), *idx2 = malloc(rows * sizeof(int));
        float *tw = malloc(rows * sizeof(float)), *tw2 = malloc(rows * sizeof(float));
        float *a = malloc(rows * F * sizeof(float)), *o = malloc(rows * H * sizeof(float));
        float *dys = malloc(rows * H * sizeof(float)), *du = malloc(rows * 2 * F * sizeof(float));
        float *dl = malloc((size_t)T * E * sizeof(float)), *da = malloc(rows * F * sizeof(float));
        float *dxs = malloc(rows * H * sizeof(float)), *dw = malloc(rows * sizeof(float));
        moe_ref_bwd_stages_t st = { .topk_idx = idx, .topk_w = tw, .a = a, .o = o, .dys = dys, .du = du,
                                    .dlogits = dl, .da = da, .dxs = dxs, .dw = dw };
        CHECKF(moe_ref_backward(s, &in, D.h[BDY], 0, &rp, &st) == 0, "seed %u", seed);
        CHECKF(moe_ref_backward(s, &in, D.h[BDY], MOE_REF_EXACT, &xp, NULL) == 0, "seed %u", seed);
        for (int gi = 0; gi < GN; gi++) {
            if (!R.used[gi]) continue;
            const double d = rel_diff(R.v[gi], X.v[gi], R.n[gi]);
            worst_all = fmax(worst_all, d);
            CHECKF(d <= tol, "seed %u: %s differs by %.3g normwise (tolerance %.3g)", seed, grad_name[gi], d, tol);
        }
        int dx_half = 1;   /* the rounded dx holds dtype values */
        for (size_t i = 0; i < R.n[GX]; i++)
            dx_half &= moe_half_to_float(moe_float_to_half(R.v[GX][i], dt), dt) == R.v[GX][i];
        CHECK(dx_half);

        /* The forward behind it is moe_ref_ffn's: the same selection and
         * weights, and A and O equal but where a double vs fp32 sum rounds
         * the other way (one dtype ulp, rarely). */
        uint16_t *h_out = malloc(rows * F * 2), *o_out = malloc(rows * H * 2);
        float *y = malloc((size_t)T * H * sizeof(float));
        CHECK(moe_ref_route(s, &in, idx2, tw2, NULL) == 0);
        CHECK(moe_ref_ffn(s, &in, idx2, tw2, NULL, 0, y, h_out, o_out) == 0);
        int same_sel = 1, far = 0, differ = 0;
        for (size_t r = 0; r < rows; r++) same_sel &= idx[r] == idx2[r] && tw[r] == tw2[r];
        const double ulp = dt == MOE_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
        for (size_t i = 0; i < rows * F; i++) {
            const double ref = moe_half_to_float(h_out[i], dt);
            differ += a[i] != ref;
            far += fabs(a[i] - ref) > ulp * fabs(ref);
        }
        for (size_t i = 0; i < rows * H; i++) {
            const double ref = moe_half_to_float(o_out[i], dt);
            differ += o[i] != ref;
            far += fabs(o[i] - ref) > ulp * fabs(ref);
        }
        CHECKF(same_sel && far == 0 && differ * 50 <= (int)(rows * (F + H)),
               "selection %s, %d of %zu A/O values differ, %d by more than one ulp", same_sel ? "same" : "differs",
               differ, rows * (F + H), far);

        /* The stages are the gradients' terms: db2[e] = Σ dys and db1[e] =
         * Σ dU over e's rows, drouter_w = dlogitsᵀ·x. */
        double err = 0;
        for (int e = 0; e < E && s->ffn_bias; e++) {
            for (int h = 0; h < H; h++) {
                double sum = 0;
                for (size_t r = 0; r < rows; r++) if (idx[r] == e) sum += dys[r * H + h];
                err = fmax(err, fabs(sum - R.v[GB2][(size_t)e * H + h]) / (1e-6 + fabs(sum)));
            }
            for (int j = 0; j < 2 * F; j++) {
                double sum = 0;
                for (size_t r = 0; r < rows; r++) if (idx[r] == e) sum += du[r * 2 * F + j];
                err = fmax(err, fabs(sum - R.v[GB1][(size_t)e * 2 * F + j]) / (1e-6 + fabs(sum)));
            }
        }
        for (int e = 0; e < E; e++)
            for (int h = 0; h < H; h++) {
                double sum = 0;
                for (int t = 0; t < T; t++)   /* the logits' rows: router_x with router.input = "separate" */
                    sum += (double)dl[t * E + e] *
                           D.d[s->router.input == MOE_ROUTER_INPUT_SEPARATE ? BRX : BX][(size_t)t * H + h];
                err = fmax(err, fabs(sum - R.v[GWR][(size_t)e * H + h]) / (1e-6 + fabs(sum)));
            }
        CHECKF(err <= 1e-5, "stages vs gradients: relative error %.3g", err);

        /* Each row's stages follow the rounding points from the previous
         * stage: dys = R(w·dy) exactly, dA = dys·W2[e] (fp32), dXs =
         * R(dU·W1[e]) (equal but where the sum rounds the other way: one
         * ulp, rarely), dw = Σ dy·O (apply = "input": Σ dXs·x). */
        int dys_ok = 1, dxs_far = 0, dxs_differ = 0;
        double da_err = 0, dw_err = 0;
        const int scaled = s->router.apply == MOE_APPLY_INPUT;
        for (size_t r = 0; r < rows; r++) {
            const int t = (int)(r / (size_t)K), e = idx[r];
            const uint16_t *w1 = D.h[BW1] + (size_t)e * 2 * F * H, *w2 = D.h[BW2] + (size_t)e * H * F;
            double dwr = 0;
            for (int h = 0; h < H; h++) {
                const float dyv = (float)D.d[BDY][(size_t)t * H + h];
                const float want = scaled ? dyv : moe_half_to_float(moe_float_to_half(tw[r] * dyv, dt), dt);
                dys_ok &= dys[r * H + h] == want;
                double sum = 0;
                for (int j = 0; j < 2 * F; j++)
                    sum += (double)du[r * 2 * F + j] * moe_half_to_float(w1[(size_t)j * H + h], dt);
                const double ref = moe_half_to_float(moe_float_to_half((float)sum, dt), dt);
                dxs_differ += dxs[r * H + h] != ref;
                dxs_far += fabs(dxs[r * H + h] - ref) > ulp * fabs(ref);
                dwr += scaled ? (double)dxs[r * H + h] * D.d[BX][(size_t)t * H + h] : (double)dyv * o[r * H + h];
            }
            dw_err = fmax(dw_err, fabs(dwr - dw[r]) / (1e-6 + fabs(dwr)));
            for (int f = 0; f < F; f++) {
                double sum = 0, mag = 0;
                for (int h = 0; h < H; h++) {
                    const double v = (double)dys[r * H + h] * moe_half_to_float(w2[(size_t)h * F + f], dt);
                    sum += v;
                    mag += fabs(v);
                }
                da_err = fmax(da_err, fabs(sum - da[r * F + f]) / (1e-9 + mag));
            }
        }
        CHECKF(dys_ok && da_err <= 1e-6 && dw_err <= 1e-5 && dxs_far == 0 && dxs_differ * 50 <= (int)(rows * H),
               "row stages: dys %s, dA error %.3g, dw error %.3g, %d dXs differ, %d by more than one ulp",
               dys_ok ? "exact" : "WRONG", da_err, dw_err, dxs_differ, dxs_far);
        free(idx); free(idx2); free(tw); free(tw2); free(a); free(o); free(dys); free(du); free(dl);
        free(da); free(dxs); free(dw);
        free(h_out); free(o_out); free(y);
        bwd_grads_free(&R);
        bwd_grads_free(&X);
        bwd_data_free(&D);
    }
    printf("  backward rounded (%s) vs exact: worst normwise difference %.3g\n", moe_dtype_name(dt), worst_all);
}

static void test_backward_bad_args(void) {
    CASE("backward refuses bad arguments; zero tokens give zero weight gradients");
    moe_spec_t s = mkspec(4, 2, 16, 8);
    s.ffn_bias = true;
    bwd_data_t D;
    bwd_data(&D, &s, 2, 9u);
    moe_ref_inputs_t in = bwd_inputs(&D);
    bwd_grads_t G;
    bwd_grads_alloc(&G, &s, 2);
    moe_ref_grads_t gp = bwd_grads_ptrs(&G);
    CHECK(moe_ref_backward(&s, &in, D.h[BDY], 0, &gp, NULL) == 0);
    CHECK(moe_ref_backward(NULL, &in, D.h[BDY], 0, &gp, NULL) != 0);
    CHECK(moe_ref_backward(&s, NULL, D.h[BDY], 0, &gp, NULL) != 0);
    CHECK(moe_ref_backward(&s, &in, NULL, 0, &gp, NULL) != 0);
    CHECK(moe_ref_backward(&s, &in, D.h[BDY], 0, NULL, NULL) != 0);
    CHECK(moe_ref_backward(&s, &in, D.h[BDY], 4, &gp, NULL) != 0);   /* an unknown flag */
    in.b1 = NULL;                                                     /* ffn_bias reads it */
    CHECK(moe_ref_backward(&s, &in, D.h[BDY], 0, &gp, NULL) != 0);
    in.b1 = D.h[BB1];
    in.tokens = 0;
    for (size_t j = 0; j < G.n[GW1]; j++) G.v[GW1][j] = NAN;
    CHECK(moe_ref_backward(&s, &in, NULL, 0, &gp, NULL) == 0);
    int zero = 1;
    for (size_t j = 0; j < G.n[GW1]; j++) zero &= G.v[GW1][j] == 0.0f;
    CHECK(zero);
    int idx[4] = {0, 1, 2, 2};                                        /* repeated within token 1 */
    double y[32];
    moe_ref_inputs_f64_t fin = { .x = D.d[BX], .wr = D.d[BWR], .w1 = D.d[BW1], .w2 = D.d[BW2], .b1 = D.d[BB1],
                                 .b2 = D.d[BB2], .tokens = 2 };
    CHECK(moe_ref_forward_exact(&s, &fin, idx, y) != 0);
    idx[3] = 3;
    CHECK(moe_ref_forward_exact(&s, &fin, idx, y) == 0);
    bwd_grads_free(&G);
    bwd_data_free(&D);
}

int main(void) {
    test_conversions();
    test_route_softmax();
    test_route_own_input();
    test_activation_clamp_after();
    test_route_biases();
    test_route_sparsemixer();
    test_route_zero_experts();
    test_route_groups();
    test_route_random();
    test_route_agree();
    test_route_bad_args();
    test_ffn_plain();
    test_ffn_shared();
    test_ffn_shared_split();
    test_ffn_gpt_oss();
    test_activation_geglu();
    test_activation_relu2();
    test_ffn_random(MOE_DTYPE_BF16);
    test_ffn_random(MOE_DTYPE_FP16);
    test_backward_fd();
    test_backward_rounded(MOE_DTYPE_BF16);
    test_backward_rounded(MOE_DTYPE_FP16);
    test_backward_bad_args();
    return check_report("test_ref");
}
