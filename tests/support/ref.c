/* ref.c — the CPU reference of one MoE layer (see ref.h for the contract).
 *
 * Routing works in double up to the selection score, which is rounded to
 * fp32 (the precision the GPU selects in). The FFN accumulates in fp32 and
 * rounds the intermediate and the expert output to the spec's dtype, exactly
 * where the GPU stores them. Expert GEMMs run expert by expert over the slots
 * routed to that expert, converting each block of weight rows to float once
 * and reusing it for every slot, so the cost is that of the GEMMs proper.
 * The backward (moe_ref_backward, moe_ref_forward_exact) is the last
 * section, in double throughout. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#define REF_OMP(x) _Pragma(#x)
static int ref_threads(void) { return omp_get_max_threads(); }
static int ref_thread(void) { return omp_get_thread_num(); }
#else
#define REF_OMP(x)
static int ref_threads(void) { return 1; }
static int ref_thread(void) { return 0; }
#endif

/* Weight rows converted to float at a time, per thread. */
#define REF_ROW_BLOCK 16

/* The router's scores of one token's logits p[0..E), in place, in double:
 * softmax over the experts, sigmoid, or sqrt(softplus(l)) with softplus as
 * max(l, 0) + log1p(exp(-|l|)); sparsemixer's are the logits themselves
 * (docs/DESIGN.md, "Routing, exactly"). */
static float ref_round(double v, moe_dtype_t dt) { return moe_half_to_float(moe_float_to_half((float)v, dt), dt); }

/* router.logit_softcap = c > 0: the logit l becomes c·tanh(l / c) before
 * the score (Laguna); *d (if non-NULL) gets the derivative 1 − tanh²(l / c),
 * 1 without a cap. */
static double ref_cap(const moe_spec_t *s, double l, double *d) {
    const double c = s->router.logit_softcap;
    if (!(c > 0)) {
        if (d) *d = 1.0;
        return l;
    }
    const double u = tanh(l / c);
    if (d) *d = 1.0 - u * u;
    return c * u;
}

static void ref_scores(moe_score_t score, double *p, int E, moe_dtype_t dt) {
    if (score == MOE_SCORE_SOFTMAX) {
        double m = p[0], sum = 0;
        for (int e = 1; e < E; e++) if (p[e] > m) m = p[e];
        for (int e = 0; e < E; e++) { p[e] = exp(p[e] - m); sum += p[e]; }
        for (int e = 0; e < E; e++) p[e] /= sum;
    } else if (score == MOE_SCORE_SQRTSOFTPLUS) {
        for (int e = 0; e < E; e++) p[e] = sqrt(fmax(p[e], 0.0) + log1p(exp(-fabs(p[e]))));
    } else if (score == MOE_SCORE_SPARSEMIXER) { /* the logits in the dtype, as the model computes them */
        for (int e = 0; e < E; e++) p[e] = ref_round(p[e], dt);
    } else {
        for (int e = 0; e < E; e++) p[e] = 1.0 / (1.0 + exp(-p[e]));
    }
}

/* ---- checks ------------------------------------------------------------ */

/* Zero experts (spec.h, moe_spec_scored): what the spec check allows with
 * them (no groups, shared expert, apply = input, sparsemixer or fp8). */
static int zero_ok(const moe_spec_t *s) {
    return s->zero_experts == 0 ||
           (s->zero_experts > 0 && s->router.groups <= 1 && s->shared.ffn == 0 &&
            s->router.apply == MOE_APPLY_OUTPUT && s->router.score != MOE_SCORE_SPARSEMIXER && !moe_spec_fp8(s));
}

static int spec_ok(const moe_spec_t *s) {
    return s && s->experts >= 1 && s->top_k >= 1 && s->top_k <= s->experts && zero_ok(s) &&
           s->hidden >= 1 && s->ffn >= 1 &&
           (s->dtype == MOE_DTYPE_BF16 || s->dtype == MOE_DTYPE_FP16);
}

/* Group-limited routing parameters; 0 if usable. groups <= 1 means off. */
static int groups_ok(const moe_spec_t *s) {
    int g = s->router.groups, kg = s->router.topk_groups, take = s->router.group_topk;
    if (g <= 1) return 0;
    if (s->experts % g) return 1;
    int per_group = s->experts / g;
    if (kg < 1 || kg > g) return 1;
    if (take < 1 || take > per_group || s->top_k > kg * per_group) return 1;
    return 0;
}

/* ---- routing ----------------------------------------------------------- */

/* Index of the largest v[i] with mask[i] set, i in [lo, hi); lower index on
 * ties; -1 if none. NaN never displaces a candidate already held. */
static int argmax_f(const float *v, const unsigned char *mask, int lo, int hi) {
    int best = -1;
    for (int i = lo; i < hi; i++)
        if (mask[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* One token's router scores p [E] in double: its logits x·Wrᵀ from the
 * rows as floats (wrf [E, H], xr [H]), plus logit_bias (may be NULL),
 * capped, then the spec's score. */
static void token_scores(const moe_spec_t *s, const float *wrf, const float *xr, const float *logit_bias, int E,
                         int H, double *p) {
    for (int e = 0; e < E; e++) {
        const float *w = wrf + (size_t)e * H;
        double acc = 0;
        for (int h = 0; h < H; h++) acc += (double)xr[h] * (double)w[h];
        p[e] = ref_cap(s, acc + (logit_bias ? (double)logit_bias[e] : 0.0), NULL);
    }
    ref_scores(s->router.score, p, E, s->dtype);
}

/* The rows the logits read: router_x with router.input = "separate", else x. */
static const uint16_t *router_input(const moe_spec_t *s, const moe_ref_inputs_t *in) {
    return s->router.input == MOE_ROUTER_INPUT_SEPARATE ? in->router_x : in->x;
}

/* The router weight [n rows, H] as floats: router.weight_dtype = "fp32"'s wr32 as it is, else wr's halves. */
static void router_weight(const moe_spec_t *s, const moe_ref_inputs_t *in, float *wrf, size_t n) {
    if (s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32) memcpy(wrf, in->wr32, n * sizeof(float));
    else moe_half_row_to_float(in->wr, wrf, n, s->dtype);
}

/* Whether the router weight the spec reads is there. */
static int router_weight_present(const moe_spec_t *s, const moe_ref_inputs_t *in) {
    return s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32 ? in->wr32 != NULL : in->wr != NULL;
}

/* Entry weight w of expert e, final: × the expert's scale (router.expert_scale). */
static float expert_scaled(const moe_spec_t *s, const moe_ref_inputs_t *in, int e, double w) {
    return (float)(s->router.expert_scale ? (float)w * in->expert_scale[e] : w);
}

/* Given routing (ref.h, moe_ref_route): the caller's ids, each weighted by
 * the score at it or by the caller's weight; out-of-range ids dropped. */
static int route_given(const moe_spec_t *s, const moe_ref_inputs_t *in, int *topk_idx, float *topk_w,
                       float *scores) {
    /* H here: the router's width (router.hidden where it is set: router_x [T, H], wr [E, H]) */
    const int E = s->experts, K = s->top_k, H = moe_spec_router_hidden(s), T = in->tokens;
    const int given_w = s->router.score == MOE_SCORE_GIVEN;
    if (!in->given_ids || (given_w && !in->given_w) || (!given_w && (!router_input(s, in) || !router_weight_present(s, in))) ||
        K > 32 || s->router.bias || s->router.groups > 1 || s->router.score == MOE_SCORE_SPARSEMIXER || s->zero_experts)
        return 1;
    if ((s->router.logit_bias && !in->logit_bias) || (s->router.expert_scale && !in->expert_scale)) return 1;
    double *p = malloc((size_t)E * sizeof(double));
    float *xr = malloc((size_t)H * sizeof(float));
    float *wrf = given_w ? NULL : malloc((size_t)E * H * sizeof(float));
    if (!p || !xr || (!given_w && !wrf)) { free(p); free(xr); free(wrf); return 1; }
    if (!given_w) router_weight(s, in, wrf, (size_t)E * H);
    for (int t = 0; t < T; t++) {
        if (!given_w) { /* the router's scores, as moe_ref_route computes them */
            moe_half_row_to_float(router_input(s, in) + (size_t)t * H, xr, (size_t)H, s->dtype);
            token_scores(s, wrf, xr, s->router.logit_bias ? in->logit_bias : NULL, E, H, p);
        }
        if (scores)
            for (int e = 0; e < E; e++) scores[(size_t)t * E + e] = given_w ? 0.0f : (float)p[e];
        int *idx = topk_idx + (size_t)t * K;
        float *wout = topk_w + (size_t)t * K;
        double w[32], wsum = 0; /* top_k <= 32 (spec_schema.h, MOE_LIMIT_TOP_K) */
        for (int k = 0; k < K; k++) {
            const int id = in->given_ids[(size_t)t * K + k], drop = id < 0 || id >= E;
            idx[k] = drop ? 0 : id;
            w[k] = drop ? 0.0 : given_w ? (double)in->given_w[(size_t)t * K + k] : p[id];
            wsum += w[k];
        }
        for (int k = 0; k < K; k++)
            wout[k] = expert_scaled(s, in, idx[k],
                                    (float)((s->router.renormalize && wsum > 0 ? w[k] / wsum : w[k]) * s->router.scale));
    }
    free(p); free(xr); free(wrf);
    return 0;
}

int moe_ref_route(const moe_spec_t *s, const moe_ref_inputs_t *in,
                  int *topk_idx, float *topk_w, float *scores) {
    if (!spec_ok(s) || !in || in->tokens < 0 || !topk_idx || !topk_w) return 1;
    if (groups_ok(s)) return 1;
    if (in->tokens == 0) return 0;
    if (s->router.select == MOE_SELECT_GIVEN) return route_given(s, in, topk_idx, topk_w, scores);
    if (!router_input(s, in) || !router_weight_present(s, in)) return 1;
    if (s->router.expert_scale && (!in->expert_scale || s->zero_experts)) return 1;
    if (s->router.bias && !in->sel_bias) return 1;
    if (s->router.logit_bias && !in->logit_bias) return 1;

    /* E here: the scored experts, the zero experts' included (index >= s->experts: the identity) */
    /* H here: the router's width, the logits' k (router.hidden where it is set: router_x [T, H], wr [E, H]) */
    const int E = moe_spec_scored(s), K = s->top_k, H = moe_spec_router_hidden(s), T = in->tokens;
    const int G = s->router.groups > 1 ? s->router.groups : 1;
    const int KG = G > 1 ? s->router.topk_groups : 1;
    const int per_group = E / G, take = G > 1 ? s->router.group_topk : 0;
    const moe_dtype_t dt = s->dtype;
    const float *sel_bias = s->router.bias ? in->sel_bias : NULL;
    const float *logit_bias = s->router.logit_bias ? in->logit_bias : NULL;

    /* Per thread: x row [H] f32, p [E] f64, s [E] f32, group scores [G] f64,
     * masks [E] and [G]. */
    const int nth = ref_threads();
    const size_t scratch = (size_t)H * sizeof(float) + (size_t)E * sizeof(double) +
                           (size_t)E * sizeof(float) + (size_t)G * sizeof(double) +
                           (size_t)E + (size_t)G + 16;
    const size_t stride = (scratch + 15) & ~(size_t)15;
    float *wrf = malloc((size_t)E * H * sizeof(float));
    unsigned char *tmp = malloc(stride * (size_t)nth);
    if (!wrf || !tmp) { free(wrf); free(tmp); return 1; }
    router_weight(s, in, wrf, (size_t)E * H);

    REF_OMP(omp parallel for schedule(static))
    for (int t = 0; t < T; t++) {
        unsigned char *base = tmp + stride * (size_t)ref_thread();
        double *p = (double *)base;
        double *gscore = p + E;
        float *xr = (float *)(gscore + G);
        float *sv = xr + H;
        unsigned char *cand = (unsigned char *)(sv + E);
        unsigned char *gkeep = cand + E;

        moe_half_row_to_float(router_input(s, in) + (size_t)t * H, xr, (size_t)H, dt);
        token_scores(s, wrf, xr, logit_bias, E, H, p);
        for (int e = 0; e < E; e++) {
            sv[e] = (float)(p[e] + (sel_bias ? (double)sel_bias[e] : 0.0));
            cand[e] = 1;
        }
        if (scores) memcpy(scores + (size_t)t * E, sv, (size_t)E * sizeof(float));

        if (G > 1) {
            /* Group score: sum of the group's top `take` (group_topk)
             * selection scores (cand is scratch here); keep the best KG
             * groups, ties to the lower group. */
            for (int g = 0; g < G; g++) {
                double sum = 0;
                for (int j = 0; j < take; j++) {
                    int b = argmax_f(sv, cand, g * per_group, (g + 1) * per_group);
                    sum += sv[b];
                    cand[b] = 0;
                }
                gscore[g] = sum;
                gkeep[g] = 0;
            }
            for (int j = 0; j < KG; j++) {
                int b = -1;
                for (int g = 0; g < G; g++)
                    if (!gkeep[g] && (b < 0 || gscore[g] > gscore[b])) b = g;
                gkeep[b] = 1;
            }
            for (int e = 0; e < E; e++) cand[e] = gkeep[e / per_group];
        }

        int *idx = topk_idx + (size_t)t * K;
        float *wout = topk_w + (size_t)t * K;
        double wsum = 0;
        for (int j = 0; j < K; j++) {
            int b = argmax_f(sv, cand, 0, E);
            idx[j] = b;
            cand[b] = 0;
            wsum += p[b];
        }
        for (int j = 0; j < K; j++) {
            double w = p[idx[j]];
            if (s->router.score == MOE_SCORE_SPARSEMIXER) {
                /* slot j's weight, in the dtype's arithmetic as the model runs it: the softmax at its logit l
                 * over the logits l_e with R(R(l - l_e) / max(|l_e|, l)) not above R(2 jitter_eps) (R: rounded
                 * to the dtype; a 0/0 kept), without the experts of the slots before it; rounded to the dtype */
                const float l = (float)p[idx[j]], band = ref_round(2 * s->router.jitter_eps, dt);
                double z = 0;
                for (int e = 0; e < E; e++) {
                    int before = 0;
                    for (int q = 0; q < j; q++) before |= idx[q] == e;
                    const float le = (float)p[e];
                    if (before || ref_round(ref_round(l - le, dt) / fmaxf(fabsf(le), l), dt) > band)
                        continue;
                    z += exp((double)le - l);
                }
                w = ref_round(1.0 / z, dt);
            }
            if (s->router.renormalize && wsum > 0) w /= wsum;
            wout[j] = expert_scaled(s, in, idx[j], (float)(w * s->router.scale));
        }
    }
    free(tmp);
    free(wrf);
    return 0;
}

int moe_ref_counts(const moe_spec_t *s, const int *topk_idx, int tokens, int *counts) {
    if (!s || s->experts < 1 || s->top_k < 1 || s->zero_experts < 0 || tokens < 0 || !counts) return 1;
    if (tokens > 0 && !topk_idx) return 1;
    const size_t n = (size_t)tokens * s->top_k;
    for (size_t i = 0; i < n; i++)
        if (topk_idx[i] < 0 || topk_idx[i] >= moe_spec_scored(s)) return 1;
    memset(counts, 0, (size_t)s->experts * sizeof(int));
    for (size_t i = 0; i < n; i++)   /* a zero expert (index >= experts) has no slot to count */
        if (topk_idx[i] < s->experts) counts[topk_idx[i]]++;
    return 0;
}

/* ---- expert FFN -------------------------------------------------------- */

/* fp32 dot product with eight partial sums (fixed order, vectorizable). */
static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/* C[p, n] = A[p, :]·W[n, :] for p < P, n < N; W is half [N, Kd], A float
 * [P, Kd], C float [P, N]. wbuf holds REF_ROW_BLOCK * Kd floats per thread. */
static void gemm_nt(const uint16_t *W, int N, int Kd, moe_dtype_t dt,
                    const float *A, int P, float *C, float *wbuf) {
    const int nblk = (N + REF_ROW_BLOCK - 1) / REF_ROW_BLOCK;
    REF_OMP(omp parallel for schedule(dynamic))
    for (int b = 0; b < nblk; b++) {
        float *wb = wbuf + (size_t)ref_thread() * REF_ROW_BLOCK * Kd;
        const int n0 = b * REF_ROW_BLOCK;
        const int nb = N - n0 < REF_ROW_BLOCK ? N - n0 : REF_ROW_BLOCK;
        moe_half_row_to_float(W + (size_t)n0 * Kd, wb, (size_t)nb * Kd, dt);
        for (int p = 0; p < P; p++) {
            const float *ar = A + (size_t)p * Kd;
            float *cr = C + (size_t)p * N + n0;
            for (int j = 0; j < nb; j++) cr[j] = dot_f32(ar, wb + (size_t)j * Kd, Kd);
        }
    }
}

/* The gate's unit in double: swiglu's g·sigmoid(alpha·g), or geglu's gelu
 * with the tanh approximation (PyTorch's gelu(approximate='tanh')). */
static double act_unit(const moe_activation_t *a, double g) {
    if (a->kind == MOE_ACT_RELU2) return g > 0 ? g * g : 0.0;
    if (a->kind == MOE_ACT_GEGLU) return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    return g / (1.0 + exp(-a->alpha * g));
}

/* activation.kind on the clamped pair (spec.h), in double: up clamped to
 * [-limit, limit], the gate clamped at limit before the unit, or the unit's
 * value after it (activation.clamp = "after"). */
static double act_value(const moe_activation_t *a, double g, double u) {
    const int lim = a->limit > 0, after = lim && a->clamp == MOE_CLAMP_AFTER;
    if (lim) {
        if (!after && g > a->limit) g = a->limit;
        if (u > a->limit) u = a->limit;
        if (u < -a->limit) u = -a->limit;
    }
    double v = act_unit(a, g);
    if (after && v > a->limit) v = a->limit;
    if (a->kind == MOE_ACT_RELU2) return v;   /* relu(gate)^2: up unused */
    return (u + a->up_offset) * v;
}

static float activation(const moe_activation_t *act, float gate, float up) {
    return (float)act_value(act, gate, up);
}

float moe_ref_activation(const moe_spec_t *s, float gate, float up) { return activation(&s->activation, gate, up); }

/* ---- the fp8 layer ------------------------------------------------------- */

void moe_ref_fp8_quantize_rows(const float *v, int P, int K, uint8_t *q, float *sc) {
    const int nb = K / MOE_FP8_BLOCK;
    for (int p = 0; p < P; p++)
        for (int b = 0; b < nb; b++) {
            const size_t o = (size_t)p * K + (size_t)b * MOE_FP8_BLOCK;
            sc[(size_t)p * nb + b] = moe_fp8_quantize_block(v + o, MOE_FP8_BLOCK, q + o);
        }
}

int moe_ref_fp8_gemm(const moe_spec_t *s, const uint8_t *aq, const float *asc, int P, const uint8_t *wq,
                     const float *ws, int N, int K, float *C) {
    if (!s || !moe_spec_fp8(s) || K < MOE_FP8_BLOCK || K % MOE_FP8_BLOCK || P < 0 || N < 1) return 1;
    if (P == 0) return 0;
    if (!aq || !asc || !wq || !ws || !C) return 1;
    const int nb = K / MOE_FP8_BLOCK, block = s->quant.scaling == MOE_SCALING_BLOCK;
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = moe_e4m3_to_float((uint8_t)i);
    float *af = malloc((size_t)P * K * sizeof(float));
    float *wbuf = malloc((size_t)ref_threads() * K * sizeof(float));
    if (!af || !wbuf) { free(af); free(wbuf); return 1; }
    for (size_t i = 0; i < (size_t)P * K; i++) af[i] = lut[aq[i]];
    REF_OMP(omp parallel for schedule(dynamic, 16))
    for (int n = 0; n < N; n++) {
        float *wr = wbuf + (size_t)ref_thread() * K;
        for (int k = 0; k < K; k++) wr[k] = lut[wq[(size_t)n * K + k]];
        const float *wsn = block ? ws + (size_t)(n / MOE_FP8_BLOCK) * nb : ws + n;
        for (int p = 0; p < P; p++) {
            const float *ar = af + (size_t)p * K;
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const float part = dot_f32(ar + (size_t)b * MOE_FP8_BLOCK, wr + (size_t)b * MOE_FP8_BLOCK, MOE_FP8_BLOCK);
                acc += part * (asc[(size_t)p * nb + b] * wsn[block ? b : 0]);
            }
            C[(size_t)p * N + n] = acc;
        }
    }
    free(af); free(wbuf);
    return 0;
}

void moe_ref_fp8_free(moe_ref_fp8_t *f) {
    if (!f) return;
    free((void *)f->w1q); free((void *)f->w2q); free((void *)f->w1s); free((void *)f->w2s);
    *f = (moe_ref_fp8_t){0};
}

int moe_ref_fp8_weights(const moe_spec_t *s, const uint16_t *w1, const uint16_t *w2, moe_ref_fp8_t *f) {
    if (!s || !moe_spec_fp8(s) || !w1 || !w2 || !f) return 1;
    const long long E = s->experts, F = s->ffn, H = s->hidden, B = MOE_FP8_BLOCK;
    const int block = s->quant.scaling == MOE_SCALING_BLOCK;
    const long long s1 = block ? (2 * F / B) * (H / B) : 2 * F, s2 = block ? (H / B) * (F / B) : H;
    uint8_t *q1 = malloc((size_t)(E * 2 * F * H)), *q2 = malloc((size_t)(E * H * F));
    float *sc1 = malloc((size_t)(E * s1) * sizeof(float)), *sc2 = malloc((size_t)(E * s2) * sizeof(float));
    *f = (moe_ref_fp8_t){q1, q2, sc1, sc2};
    if (!q1 || !q2 || !sc1 || !sc2) { moe_ref_fp8_free(f); return 1; }
    REF_OMP(omp parallel for schedule(static))
    for (long long e = 0; e < E; e++) {
        moe_fp8_quantize_weight(w1 + e * 2 * F * H, H, 2 * F, H, block ? B : 1, block ? B : H, q1 + e * 2 * F * H,
                                sc1 + e * s1);
        moe_fp8_quantize_weight(w2 + e * H * F, F, H, F, block ? B : 1, block ? B : F, q2 + e * H * F, sc2 + e * s2);
    }
    return 0;
}

/* The fp8 weight scales of expert e: W1's and W2's. */
static const float *fp8_w1s(const moe_spec_t *s, const moe_ref_fp8_t *f, int e) {
    const size_t F = (size_t)s->ffn, H = (size_t)s->hidden, B = MOE_FP8_BLOCK;
    return f->w1s + (size_t)e * (s->quant.scaling == MOE_SCALING_BLOCK ? (2 * F / B) * (H / B) : 2 * F);
}
static const float *fp8_w2s(const moe_spec_t *s, const moe_ref_fp8_t *f, int e) {
    const size_t F = (size_t)s->ffn, H = (size_t)s->hidden, B = MOE_FP8_BLOCK;
    return f->w2s + (size_t)e * (s->quant.scaling == MOE_SCALING_BLOCK ? (H / B) * (F / B) : H);
}

/* ---- the shared expert -------------------------------------------------- */

/* Tokens of the shared expert's GEMMs at a time (bounds the 2F_s-wide rows). */
#define REF_SHARED_CHUNK 64

/* The shared expert on tokens toks[0..n), compactly: g [n], hs [n, F_s],
 * os [n, H] (any may be NULL). The formula of moe_ref_shared (ref.h). */
static int shared_ffn(const moe_spec_t *s, const moe_ref_inputs_t *in, const int *toks, int n, float *g,
                      uint16_t *hs, uint16_t *os) {
    const int H = s->hidden, FS = s->shared.ffn, C = REF_SHARED_CHUNK;
    const moe_dtype_t dt = s->dtype;
    const int gated = s->shared.gate == MOE_SHARED_GATE_SIGMOID;
    const moe_activation_t sact = moe_spec_shared_activation(s); /* shared.limit, shared.unclamped */
    if ((hs || os) && (!in->ws1 || !in->ws2)) return 1;
    if (gated && !in->wsg) return 1;
    const int kmax = H > FS ? H : FS;
    float *xe = malloc((size_t)C * H * sizeof(float)), *a = malloc((size_t)C * 2 * FS * sizeof(float));
    float *hf = malloc((size_t)C * FS * sizeof(float)), *oc = malloc((size_t)C * H * sizeof(float));
    float *wg = malloc((size_t)H * sizeof(float));
    float *wbuf = malloc((size_t)ref_threads() * REF_ROW_BLOCK * kmax * sizeof(float));
    int rc = 1;
    if (!xe || !a || !hf || !oc || !wg || !wbuf) goto done;
    if (gated) moe_half_row_to_float(in->wsg, wg, (size_t)H, dt);
    for (int c0 = 0; c0 < n; c0 += C) {
        const int P = n - c0 < C ? n - c0 : C;
        for (int p = 0; p < P; p++) {
            float *xr = xe + (size_t)p * H;
            moe_half_row_to_float(in->x + (size_t)toks[c0 + p] * H, xr, (size_t)H, dt);
            if (g) {
                double acc = 0;
                for (int h = 0; gated && h < H; h++) acc += (double)xr[h] * (double)wg[h];
                g[c0 + p] = gated ? (float)(1.0 / (1.0 + exp(-acc))) : 1.0f;
            }
        }
        if (!hs && !os) continue;   /* the gate alone */
        gemm_nt(in->ws1, 2 * FS, H, dt, xe, P, a, wbuf);
        for (int p = 0; p < P; p++)
            for (int f = 0; f < FS; f++) {
                const float *ar = a + (size_t)p * 2 * FS;
                uint16_t hq = moe_float_to_half(activation(&sact, ar[f], ar[FS + f]), dt);
                if (hs) hs[(size_t)(c0 + p) * FS + f] = hq;
                hf[(size_t)p * FS + f] = moe_half_to_float(hq, dt);
            }
        gemm_nt(in->ws2, H, FS, dt, hf, P, oc, wbuf);
        for (int p = 0; os && p < P; p++)
            for (int h = 0; h < H; h++)
                os[(size_t)(c0 + p) * H + h] = moe_float_to_half(oc[(size_t)p * H + h], dt);
    }
    rc = 0;
done:
    free(xe); free(a); free(hf); free(oc); free(wg); free(wbuf);
    return rc;
}

int moe_ref_shared(const moe_spec_t *s, const moe_ref_inputs_t *in, const int *token_list, int ntokens,
                   float *g_out, uint16_t *hs_out, uint16_t *os_out) {
    if (!spec_ok(s) || !in || in->tokens < 0 || s->shared.ffn <= 0) return 1;
    const int T = in->tokens, n = token_list ? ntokens : T, H = s->hidden, FS = s->shared.ffn;
    if (n < 0) return 1;
    if (n == 0) return 0;
    if (!in->x) return 1;
    int *toks = malloc((size_t)n * sizeof(int));
    float *g = malloc((size_t)n * sizeof(float));
    uint16_t *hs = hs_out ? malloc((size_t)n * FS * 2) : NULL, *os = os_out ? malloc((size_t)n * H * 2) : NULL;
    int rc = 1;
    if (!toks || !g || (hs_out && !hs) || (os_out && !os)) goto done;
    for (int i = 0; i < n; i++) {
        toks[i] = token_list ? token_list[i] : i;
        if (toks[i] < 0 || toks[i] >= T) goto done;
    }
    if (shared_ffn(s, in, toks, n, g, hs, os)) goto done;
    for (int i = 0; i < n; i++) {
        const size_t t = (size_t)toks[i];
        if (g_out) g_out[t] = g[i];
        if (hs_out) memcpy(hs_out + t * FS, hs + (size_t)i * FS, (size_t)FS * 2);
        if (os_out) memcpy(os_out + t * H, os + (size_t)i * H, (size_t)H * 2);
    }
    rc = 0;
done:
    free(toks); free(g); free(hs); free(os);
    return rc;
}

int moe_ref_ffn(const moe_spec_t *s, const moe_ref_inputs_t *in,
                const int *topk_idx, const float *topk_w,
                const int *token_list, int ntokens,
                float *y, uint16_t *h_out, uint16_t *o_out) {
    if (!spec_ok(s) || !in || in->tokens < 0) return 1;
    const int E = s->experts, K = s->top_k, H = s->hidden, F = s->ffn, T = in->tokens;
    const int n = token_list ? ntokens : T;
    if (n < 0) return 1;
    if (n == 0) return 0;
    const int fp8 = moe_spec_fp8(s);
    const moe_ref_fp8_t *f8 = in->fp8;
    if (!in->x || !topk_idx || !topk_w || !y) return 1;
    if (fp8 ? !f8 || !f8->w1q || !f8->w2q || !f8->w1s || !f8->w2s || s->shared.ffn > 0 || H % MOE_FP8_BLOCK ||
                  F % MOE_FP8_BLOCK
            : !in->w1 || !in->w2)
        return 1;
    if (s->ffn_bias && (!in->b1 || !in->b2)) return 1;
    const moe_dtype_t dt = s->dtype;

    int rc = 1;
    int *cnt = calloc((size_t)E + 1, sizeof(int));
    int *slot = malloc((size_t)n * K * sizeof(int));
    unsigned char *seen = token_list ? calloc((size_t)T, 1) : NULL;
    float *xe = NULL, *a = NULL, *hf = NULL, *oc = NULL, *wbuf = NULL, *qsc = NULL;
    uint8_t *q8 = NULL;
    if (!cnt || !slot || (token_list && !seen)) goto done;

    /* Validate the tokens and their slots, count slots per expert. */
    for (int i = 0; i < n; i++) {
        int t = token_list ? token_list[i] : i;
        if (t < 0 || t >= T) goto done;
        if (seen) { if (seen[t]) goto done; seen[t] = 1; }
        for (int k = 0; k < K; k++) {
            int e = topk_idx[(size_t)t * K + k];
            if (e < 0 || e >= moe_spec_scored(s)) goto done;
            if (e < E) cnt[e + 1]++;   /* a zero expert: no rows (below, after the routed sum) */
        }
    }
    int maxp = 0;
    for (int e = 0; e < E; e++) {
        if (cnt[e + 1] > maxp) maxp = cnt[e + 1];
        cnt[e + 1] += cnt[e];
    }
    /* Slots grouped by expert, in token-list order within an expert. */
    {
        int *fill = malloc((size_t)E * sizeof(int));
        if (!fill) goto done;
        memcpy(fill, cnt, (size_t)E * sizeof(int));
        for (int i = 0; i < n; i++) {
            int t = token_list ? token_list[i] : i;
            for (int k = 0; k < K; k++) {
                size_t sl = (size_t)t * K + k;
                if (topk_idx[sl] < E) slot[fill[topk_idx[sl]]++] = (int)sl;
            }
        }
        free(fill);
    }

    const int kmax = H > F ? H : F;
    xe = malloc((size_t)maxp * H * sizeof(float));
    a = malloc((size_t)maxp * 2 * F * sizeof(float));
    hf = malloc((size_t)maxp * F * sizeof(float));
    oc = malloc((size_t)maxp * H * sizeof(float));
    wbuf = malloc((size_t)ref_threads() * REF_ROW_BLOCK * kmax * sizeof(float));
    if (!xe || !a || !hf || !oc || !wbuf) goto done;
    if (fp8) { /* the quantized GEMM input (x, then h) and its scales */
        q8 = malloc((size_t)maxp * kmax);
        qsc = malloc((size_t)maxp * (kmax / MOE_FP8_BLOCK) * sizeof(float));
        if (!q8 || !qsc) goto done;
    }

    for (int i = 0; i < n; i++) {
        int t = token_list ? token_list[i] : i;
        memset(y + (size_t)t * H, 0, (size_t)H * sizeof(float));
    }

    for (int e = 0; e < E; e++) {
        const int P = cnt[e + 1] - cnt[e];
        const int *sl = slot + cnt[e];
        if (P == 0) continue;
        for (int p = 0; p < P; p++) {
            float *xr = xe + (size_t)p * H;
            moe_half_row_to_float(in->x + (size_t)(sl[p] / K) * H, xr, (size_t)H, dt);
            if (s->router.apply == MOE_APPLY_INPUT) { /* the expert's input is round(x·round(w)) */
                const float w = moe_half_to_float(moe_float_to_half(topk_w[sl[p]], dt), dt);
                for (int h = 0; h < H; h++) xr[h] = moe_half_to_float(moe_float_to_half(xr[h] * w, dt), dt);
            }
        }

        if (fp8) {
            moe_ref_fp8_quantize_rows(xe, P, H, q8, qsc);
            if (moe_ref_fp8_gemm(s, q8, qsc, P, f8->w1q + (size_t)e * 2 * F * H, fp8_w1s(s, f8, e), 2 * F, H, a))
                goto done;
        } else {
            gemm_nt(in->w1 + (size_t)e * 2 * F * H, 2 * F, H, dt, xe, P, a, wbuf);
        }

        const uint16_t *b1 = s->ffn_bias ? in->b1 + (size_t)e * 2 * F : NULL;
        REF_OMP(omp parallel for schedule(static))
        for (int p = 0; p < P; p++) {
            const float *ar = a + (size_t)p * 2 * F;
            for (int f = 0; f < F; f++) {
                float g = ar[f], u = ar[F + f];
                if (b1) { g += moe_half_to_float(b1[f], dt); u += moe_half_to_float(b1[F + f], dt); }
                const float hv = activation(&s->activation, g, u);
                if (fp8) { /* kept in fp32 for the quantization below */
                    hf[(size_t)p * F + f] = hv;
                    continue;
                }
                uint16_t hq = moe_float_to_half(hv, dt);
                if (h_out) h_out[(size_t)sl[p] * F + f] = hq;
                hf[(size_t)p * F + f] = moe_half_to_float(hq, dt);
            }
        }

        if (fp8) {
            moe_ref_fp8_quantize_rows(hf, P, F, q8, qsc);
            for (int p = 0; h_out && p < P; p++)
                for (int f = 0; f < F; f++)
                    h_out[(size_t)sl[p] * F + f] = moe_float_to_half(
                        moe_e4m3_to_float(q8[(size_t)p * F + f]) * qsc[(size_t)p * (F / MOE_FP8_BLOCK) + f / MOE_FP8_BLOCK], dt);
            if (moe_ref_fp8_gemm(s, q8, qsc, P, f8->w2q + (size_t)e * H * F, fp8_w2s(s, f8, e), H, F, oc))
                goto done;
        } else {
            gemm_nt(in->w2 + (size_t)e * H * F, H, F, dt, hf, P, oc, wbuf);
        }

        const uint16_t *b2 = s->ffn_bias ? in->b2 + (size_t)e * H : NULL;
        for (int p = 0; p < P; p++) {
            const float w = s->router.apply == MOE_APPLY_INPUT ? 1.0f : topk_w[sl[p]];
            const float *orow = oc + (size_t)p * H;
            float *yr = y + (size_t)(sl[p] / K) * H;
            for (int h = 0; h < H; h++) {
                float o = orow[h];
                if (b2) o += moe_half_to_float(b2[h], dt);
                uint16_t oq = moe_float_to_half(o, dt);
                if (o_out) o_out[(size_t)sl[p] * H + h] = oq;
                yr[h] += w * moe_half_to_float(oq, dt);
            }
        }
    }
    if (s->zero_experts > 0) /* zero experts, after the routed sum: y[t] += w · x[t] (x in the dtype, exact in fp32) */
        for (int i = 0; i < n; i++) {
            const int t = token_list ? token_list[i] : i;
            for (int k = 0; k < K; k++) {
                if (topk_idx[(size_t)t * K + k] < E) continue;
                const float w = topk_w[(size_t)t * K + k];
                for (int h = 0; h < H; h++) y[(size_t)t * H + h] += w * moe_half_to_float(in->x[(size_t)t * H + h], dt);
            }
        }
    if (s->shared.ffn > 0) { /* y[t] += g(t) * os(t), after the routed sum */
        int *toks = malloc((size_t)n * sizeof(int));
        float *g = malloc((size_t)n * sizeof(float));
        uint16_t *os = malloc((size_t)n * H * 2);
        int bad = !toks || !g || !os;
        for (int i = 0; !bad && i < n; i++) toks[i] = token_list ? token_list[i] : i;
        bad = bad || shared_ffn(s, in, toks, n, g, NULL, os);
        for (int i = 0; !bad && i < n; i++)
            for (int h = 0; h < H; h++)
                y[(size_t)toks[i] * H + h] += g[i] * moe_half_to_float(os[(size_t)i * H + h], dt);
        free(toks); free(g); free(os);
        if (bad) goto done;
    }
    rc = 0;
done:
    free(q8); free(qsc);
    free(wbuf); free(oc); free(hf); free(a); free(xe);
    free(seen); free(slot); free(cnt);
    return rc;
}

/* ---- comparing selections ---------------------------------------------- */

static int in_set(const int *v, int k, int e) {
    for (int j = 0; j < k; j++) if (v[j] == e) return 1;
    return 0;
}

static int set_valid(const int *v, int k, int E) {
    for (int j = 0; j < k; j++) {
        if (v[j] < 0 || v[j] >= E) return 0;
        for (int i = 0; i < j; i++) if (v[i] == v[j]) return 0;
    }
    return 1;
}

int moe_ref_route_agree(const moe_spec_t *s, const int *idx_a, const int *idx_b,
                        const float *scores_ref, int tokens, float tie_eps,
                        int *bad_token) {
    if (bad_token) *bad_token = -1;
    if (!s || s->experts < 1 || s->top_k < 1 || s->top_k > s->experts || s->zero_experts < 0 || tokens < 0) return 0;
    if (tokens > 0 && (!idx_a || !idx_b || !scores_ref)) return 0;
    const int E = moe_spec_scored(s), K = s->top_k;   /* the zero experts are selected as any other */
    for (int t = 0; t < tokens; t++) {
        const int *a = idx_a + (size_t)t * K, *b = idx_b + (size_t)t * K;
        const float *sc = scores_ref + (size_t)t * E;
        int ok = set_valid(a, K, E) && set_valid(b, K, E);
        if (ok) {
            float kth = sc[a[0]];
            for (int j = 1; j < K; j++) if (sc[a[j]] < kth) kth = sc[a[j]];
            for (int j = 0; ok && j < K; j++) {
                if (!in_set(b, K, a[j]) && !(fabsf(sc[a[j]] - kth) <= tie_eps)) ok = 0;
                if (!in_set(a, K, b[j]) && !(fabsf(sc[b[j]] - kth) <= tie_eps)) ok = 0;
            }
        }
        if (!ok) {
            if (bad_token) *bad_token = t;
            return 0;
        }
    }
    return 1;
}

/* ---- the backward (ref.h, "the backward"; docs/DESIGN.md, "Backward, exactly")
 *
 * One core, layer(), runs the forward and, given dy, the backward: the
 * routed experts one at a time (each expert's weights converted to double
 * once), then the shared expert as one more pass over all tokens, then the
 * router. Every sum is taken in double. In the rounded mode values are
 * rounded exactly at the points ref.h lists (the GPU backward's); in the
 * exact mode nothing is rounded, so the result is the exact gradient of
 * moe_ref_forward_exact, which runs the same core without dy. Inputs come
 * as half bit patterns (moe_ref_backward) or as doubles
 * (moe_ref_forward_exact); src_t reads either. */

/* A tensor given as half bit patterns, floats or doubles (one non-NULL). */
typedef struct {
    const uint16_t *h;
    const float *f;
    const double *d;
} src_t;

static int present(src_t s) { return s.h || s.f || s.d; }

static void load(src_t s, size_t off, size_t n, moe_dtype_t dt, double *out) {
    if (s.d) memcpy(out, s.d + off, n * sizeof(double));
    else if (s.f) for (size_t i = 0; i < n; i++) out[i] = s.f[off + i];
    else for (size_t i = 0; i < n; i++) out[i] = moe_half_to_float(s.h[off + i], dt);
}

typedef struct {
    const moe_spec_t *s;
    int T, rounded;
    src_t x, wr, lb, w1, w2, b1, b2, ws1, ws2, wsg;
    src_t rx, es;                     /* router.input = "separate": the logits' input; router.expert_scale */
    const int *idx;                   /* [T, K], distinct experts per token (given routing: any) */
    const int *given;                 /* router.select = "given": the caller's ids [T, K] (its out-of-range
                                       * ones dropped: weight 0, no gradient), else NULL */
    const double *dy;                 /* [T, H]; NULL: forward only */
    double *y;                        /* [T, H] or NULL */
    const moe_ref_grads_t *g;         /* NULL: forward only */
    const moe_ref_bwd_stages_t *st;   /* may be NULL */
} layer_t;

/* Whether entry i is dropped: given routing's id outside 0..E-1. */
static int dropped(const layer_t *L, size_t i) {
    return L->given && (L->given[i] < 0 || L->given[i] >= L->s->experts);
}

/* R(): to the dtype through fp32, as the GPU rounds an fp32 value. */
static double rnd(const layer_t *L, double v) {
    return L->rounded ? moe_half_to_float(moe_float_to_half((float)v, L->s->dtype), L->s->dtype) : v;
}

/* An fp32 store. */
static double r32(const layer_t *L, double v) { return L->rounded ? (double)(float)v : v; }

/* Double dot product with four partial sums (fixed order). */
static double dot(const double *a, const double *b, int n) {
    double acc[4] = {0, 0, 0, 0}, tail = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) tail += a[i] * b[i];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]) + tail;
}

/* y += a·x (y and x do not overlap). */
static void axpy(double *restrict y, const double *restrict x, double a, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* The activation on the clamped pair, in double (act_value above). */
static double act(const moe_activation_t *a, double g, double u) { return act_value(a, g, u); }

/* Its partial derivatives in gate and up at (g, u), before the clamp: zero
 * where the clamp cut the value (g > limit; u > limit or u < -limit); at
 * equality the derivative passes, as torch.clamp's does. */
static void act_grad(const moe_activation_t *a, double g, double u, double *dg, double *du) {
    int gcut = 0, ucut = 0;
    const int after = a->limit > 0 && a->clamp == MOE_CLAMP_AFTER;
    if (a->limit > 0) {
        if (!after && g > a->limit) { g = a->limit; gcut = 1; }
        if (u > a->limit) { u = a->limit; ucut = 1; }
        if (u < -a->limit) { u = -a->limit; ucut = 1; }
    }
    const double up = u + a->up_offset;
    double v, dv;   /* the unit and its derivative at g */
    if (a->kind == MOE_ACT_RELU2) {   /* relu(g)^2, up unused (spec check: no limit, no up_offset) */
        *dg = g > 0 ? 2.0 * g : 0.0;
        *du = 0.0;
        return;
    }
    if (a->kind == MOE_ACT_GEGLU) {
        const double k = 0.7978845608028654, c = 0.044715;
        const double th = tanh(k * (g + c * g * g * g));
        v = 0.5 * g * (1.0 + th);
        dv = 0.5 * (1.0 + th) + 0.5 * g * (1.0 - th * th) * k * (1.0 + 3.0 * c * g * g);
    } else {
        const double sg = 1.0 / (1.0 + exp(-a->alpha * g));
        v = g * sg;
        dv = sg + a->alpha * g * sg * (1.0 - sg);
    }
    if (after && v > a->limit) { v = a->limit; gcut = 1; }   /* min(unit, limit): cut above, passes at equality */
    *dg = gcut ? 0.0 : up * dv;
    *du = ucut ? 0.0 : v;
}

void moe_ref_activation_grad(const moe_spec_t *s, double gate, double up, double *dgate, double *dup) {
    act_grad(&s->activation, gate, up, dgate, dup);
}

/* ---- one expert's rows ------------------------------------------------- */

/* One pass: an FFN of size F over n rows, row i taking token tok[i] with
 * weight wt[i]. W1 [2F, H], W2 [H, F], b1 [2F] and b2 [H] (NULL: none) in
 * double. slot[i] is the row's index in the per-row stage arrays (NULL: not
 * recorded). scaled_input: router.apply = "input". Outputs: the forward
 * adds into L->y; the backward adds into dx [T, H] and writes dwt [n] (dw,
 * or dg for the shared expert), dwt_abs [n] when not NULL (the sum of the
 * magnitudes of dwt's terms, the scale its rounding error is relative to)
 * and dW1, db1, dW2, db2 (overwritten). */
typedef struct {
    int F, n, scaled_input;
    const moe_activation_t *ac; /* the pass's activation (the shared expert's may be its own); NULL: the spec's */
    const double *W1, *W2, *b1, *b2;
    const int *tok, *slot;
    const double *wt;
    double *dwt, *dwt_abs, *dW1, *db1, *dW2, *db2;
} pass_t;

/* Scratch for a pass of up to `rows` rows and intermediate size F. */
typedef struct {
    double *xs, *u, *a, *o, *dys, *da, *du, *dxs;
} scratch_t;

static void scratch_free(scratch_t *sc) {
    free(sc->xs); free(sc->u); free(sc->a); free(sc->o);
    free(sc->dys); free(sc->da); free(sc->du); free(sc->dxs);
}

static int scratch_alloc(scratch_t *sc, int rows, int H, int F) {
    const size_t n = rows > 0 ? (size_t)rows : 1;
    sc->xs = malloc(n * H * sizeof(double));
    sc->u = malloc(n * 2 * F * sizeof(double));
    sc->a = malloc(n * F * sizeof(double));
    sc->o = malloc(n * H * sizeof(double));
    sc->dys = malloc(n * H * sizeof(double));
    sc->da = malloc(n * F * sizeof(double));
    sc->du = malloc(n * 2 * F * sizeof(double));
    sc->dxs = malloc(n * H * sizeof(double));
    if (sc->xs && sc->u && sc->a && sc->o && sc->dys && sc->da && sc->du && sc->dxs) return 0;
    scratch_free(sc);
    return 1;
}

static void put(float *dst, size_t off, const double *src, size_t n) {
    if (dst) for (size_t i = 0; i < n; i++) dst[off + i] = (float)src[i];
}

static void run_pass(const layer_t *L, const pass_t *P, const double *X, double *dx, const scratch_t *sc) {
    const int H = L->s->hidden, F = P->F, F2 = 2 * F, n = P->n;
    const moe_activation_t *ac = P->ac ? P->ac : &L->s->activation;
    const moe_ref_bwd_stages_t *st = P->slot ? L->st : NULL;

    /* Rows are independent, and the tokens of one pass distinct, so the
     * rows of y and dx they add into are too. */
    REF_OMP(omp parallel for schedule(static))
    for (int i = 0; i < n; i++) {
        const int t = P->tok[i];
        const double w = P->wt[i];
        const double *xt = X + (size_t)t * H;
        double *xs = sc->xs + (size_t)i * H, *u = sc->u + (size_t)i * F2, *a = sc->a + (size_t)i * F;
        double *o = sc->o + (size_t)i * H;
        if (P->scaled_input) {
            const double rw = rnd(L, w);
            for (int h = 0; h < H; h++) xs[h] = rnd(L, xt[h] * rw);
        } else {
            memcpy(xs, xt, (size_t)H * sizeof(double));
        }
        for (int j = 0; j < F2; j++) u[j] = r32(L, dot(xs, P->W1 + (size_t)j * H, H) + (P->b1 ? P->b1[j] : 0.0));
        for (int f = 0; f < F; f++) a[f] = rnd(L, act(ac, u[f], u[F + f]));
        for (int h = 0; h < H; h++) o[h] = rnd(L, dot(a, P->W2 + (size_t)h * F, F) + (P->b2 ? P->b2[h] : 0.0));
        if (L->y) {
            const double wo = P->scaled_input ? 1.0 : w;
            for (int h = 0; h < H; h++) L->y[(size_t)t * H + h] += wo * o[h];
        }
        if (!L->dy) continue;

        const double *dyt = L->dy + (size_t)t * H;
        double *dys = sc->dys + (size_t)i * H, *da = sc->da + (size_t)i * F, *du = sc->du + (size_t)i * F2;
        double *dxs = sc->dxs + (size_t)i * H;
        for (int h = 0; h < H; h++) dys[h] = P->scaled_input ? dyt[h] : rnd(L, w * dyt[h]);
        if (!P->scaled_input) P->dwt[i] = r32(L, dot(dyt, o, H));
        if (!P->scaled_input && P->dwt_abs) {
            double m = 0;
            for (int h = 0; h < H; h++) m += fabs(dyt[h] * o[h]);
            P->dwt_abs[i] = m;
        }
        for (int f = 0; f < F; f++) da[f] = 0;
        for (int h = 0; h < H; h++) {
            const double *w2 = P->W2 + (size_t)h * F;
            axpy(da, w2, dys[h], F);
        }
        for (int f = 0; f < F; f++) {
            da[f] = r32(L, da[f]);
            double dg, dup;
            act_grad(ac, rnd(L, u[f]), rnd(L, u[F + f]), &dg, &dup);
            du[f] = rnd(L, dg * da[f]);
            du[F + f] = rnd(L, dup * da[f]);
        }
        for (int h = 0; h < H; h++) dxs[h] = 0;
        for (int j = 0; j < F2; j++) {
            const double *w1 = P->W1 + (size_t)j * H;
            axpy(dxs, w1, du[j], H);
        }
        for (int h = 0; h < H; h++) dxs[h] = rnd(L, dxs[h]);
        double *dxt = dx + (size_t)t * H;
        if (P->scaled_input) {
            P->dwt[i] = r32(L, dot(dxs, xt, H));
            const double rw = rnd(L, w);
            for (int h = 0; h < H; h++) dxt[h] += dxs[h] * rw;
        } else {
            for (int h = 0; h < H; h++) dxt[h] += dxs[h];
        }
    }

    if (st) /* the stages, rounded mode's values as stored */
        for (int i = 0; i < n; i++) {
            const size_t r = (size_t)P->slot[i];
            if (st->u) for (int j = 0; j < F2; j++) st->u[r * F2 + j] = (float)rnd(L, sc->u[(size_t)i * F2 + j]);
            put(st->a, r * F, sc->a + (size_t)i * F, (size_t)F);
            put(st->o, r * H, sc->o + (size_t)i * H, (size_t)H);
            if (!L->dy) continue;
            put(st->dys, r * H, sc->dys + (size_t)i * H, (size_t)H);
            put(st->da, r * F, sc->da + (size_t)i * F, (size_t)F);
            put(st->du, r * F2, sc->du + (size_t)i * F2, (size_t)F2);
            put(st->dxs, r * H, sc->dxs + (size_t)i * H, (size_t)H);
        }
    if (!L->dy) return;

    /* Weight gradients: sums over the pass's rows, in row order. */
    REF_OMP(omp parallel for schedule(static))
    for (int j = 0; j < F2; j++) {
        double *dw1 = P->dW1 + (size_t)j * H, db = 0;
        for (int h = 0; h < H; h++) dw1[h] = 0;
        for (int i = 0; i < n; i++) {
            const double d = sc->du[(size_t)i * F2 + j];
            const double *xs = sc->xs + (size_t)i * H;
            axpy(dw1, xs, d, H);
            db += d;
        }
        P->db1[j] = db;
    }
    REF_OMP(omp parallel for schedule(static))
    for (int h = 0; h < H; h++) {
        double *dw2 = P->dW2 + (size_t)h * F, db = 0;
        for (int f = 0; f < F; f++) dw2[f] = 0;
        for (int i = 0; i < n; i++) {
            const double d = sc->dys[(size_t)i * H + h];
            const double *a = sc->a + (size_t)i * F;
            axpy(dw2, a, d, F);
            db += d;
        }
        P->db2[h] = db;
    }
}

/* ---- the layer ----------------------------------------------------------- */

/* Forward (into L->y, if non-NULL) and, when L->dy, backward (into L->g and
 * L->st). Everything is allocated before the first output is written, so a
 * failure (out of memory) writes nothing. Returns 0 or 1. */
static int layer(const layer_t *L) {
    const moe_spec_t *s = L->s;
    const int E = s->experts, K = s->top_k, H = s->hidden, F = s->ffn, T = L->T;
    const int FS = s->shared.ffn, gated = FS > 0 && s->shared.gate == MOE_SHARED_GATE_SIGMOID;
    const int FM = FS > F ? FS : F, NM = T > 1 ? T : 1;
    const moe_dtype_t dt = s->dtype;
    const moe_ref_grads_t *G = L->dy ? L->g : NULL;
    const moe_ref_bwd_stages_t *st = L->st;
    int rc = 1;

    double *X = malloc((size_t)NM * H * sizeof(double)), *Wr = malloc((size_t)E * H * sizeof(double));
    double *p = malloc((size_t)NM * E * sizeof(double)), *w = malloc((size_t)NM * K * sizeof(double));
    double *dw = malloc((size_t)NM * K * sizeof(double)), *dx = calloc((size_t)NM * H, sizeof(double));
    double *W1 = malloc((size_t)2 * FM * H * sizeof(double)), *W2 = malloc((size_t)H * FM * sizeof(double));
    double *b1 = malloc((size_t)2 * FM * sizeof(double)), *b2 = malloc((size_t)H * sizeof(double));
    double *dW1 = malloc((size_t)2 * FM * H * sizeof(double)), *dW2 = malloc((size_t)H * FM * sizeof(double));
    double *db1 = malloc((size_t)2 * FM * sizeof(double)), *db2 = malloc((size_t)H * sizeof(double));
    double *gs = malloc((size_t)NM * sizeof(double)), *dg = malloc((size_t)NM * sizeof(double));
    double *dga = malloc((size_t)NM * sizeof(double));
    double *dWr = calloc((size_t)E * H, sizeof(double)), *dlb = calloc((size_t)E, sizeof(double));
    double *dl = malloc((size_t)E * sizeof(double)), *dp = malloc((size_t)E * sizeof(double));
    double *wsg = malloc((size_t)H * sizeof(double)), *dwsg = calloc((size_t)H, sizeof(double));
    int *cnt = calloc((size_t)E + 1, sizeof(int)), *tok = malloc((size_t)NM * sizeof(int));
    int *slot = malloc((size_t)NM * K * sizeof(int)), *all = malloc((size_t)NM * sizeof(int));
    double *wt = malloc((size_t)NM * K * sizeof(double));
    double *capd = malloc((size_t)NM * E * sizeof(double)); /* the logit cap's derivative (1 without one) */
    int *fill = malloc((size_t)E * sizeof(int));
    /* router.input = "separate": the logits' rows RX (X otherwise) and the router's term of the input gradient
     * drx; router.expert_scale: the scales c, the weights before them w' and d c */
    const int own = s->router.input == MOE_ROUTER_INPUT_SEPARATE, escale = s->router.expert_scale;
    double *RX = own ? malloc((size_t)NM * H * sizeof(double)) : X;
    double *drx = own ? calloc((size_t)NM * H, sizeof(double)) : dx;
    double *es = escale ? malloc((size_t)E * sizeof(double)) : NULL, *des = calloc((size_t)E, sizeof(double));
    double *wpre = malloc((size_t)NM * K * sizeof(double));
    scratch_t sc = {0};
    if (!X || !Wr || !p || !w || !dw || !dx || !W1 || !W2 || !b1 || !b2 || !dW1 || !dW2 || !db1 || !db2 ||
        !gs || !dg || !dga || !dWr || !dlb || !dl || !dp || !wsg || !dwsg || !cnt || !tok || !slot || !all || !wt ||
        !capd || !fill || !RX || !drx || (escale && !es) || !des || !wpre)
        goto done;

    /* Rows per expert, and the largest pass. */
    for (int i = 0; i < T * K; i++) cnt[L->idx[i] + 1]++;
    int maxp = FS > 0 ? T : 0;
    for (int e = 0; e < E; e++) {
        if (cnt[e + 1] > maxp) maxp = cnt[e + 1];
        cnt[e + 1] += cnt[e];
    }
    if (scratch_alloc(&sc, maxp, H, FM)) goto done;

    /* The router: logits and probabilities in double, the weights. */
    load(L->x, 0, (size_t)T * H, dt, X);
    if (own) load(L->rx, 0, (size_t)T * H, dt, RX);
    if (escale) load(L->es, 0, (size_t)E, dt, es);
    load(L->wr, 0, (size_t)E * H, dt, Wr);
    double *lb = dl;   /* scratch until the backward */
    if (s->router.logit_bias) load(L->lb, 0, (size_t)E, dt, lb);
    for (int t = 0; t < T; t++) {
        double *pt = p + (size_t)t * E;
        for (int e = 0; e < E; e++)
            pt[e] = ref_cap(s, dot(RX + (size_t)t * H, Wr + (size_t)e * H, H) + (s->router.logit_bias ? lb[e] : 0.0),
                            capd + (size_t)t * E + e);
        ref_scores(s->router.score, pt, E, s->dtype);
        double S = 0;
        for (int k = 0; k < K; k++)
            if (!dropped(L, (size_t)t * K + k)) S += pt[L->idx[(size_t)t * K + k]];
        for (int k = 0; k < K; k++) {
            double v = dropped(L, (size_t)t * K + k) ? 0.0 : pt[L->idx[(size_t)t * K + k]];
            if (s->router.renormalize && S > 0) v /= S;
            wpre[(size_t)t * K + k] = r32(L, v * s->router.scale);
            w[(size_t)t * K + k] = escale ? r32(L, wpre[(size_t)t * K + k] * es[L->idx[(size_t)t * K + k]])
                                          : wpre[(size_t)t * K + k];
        }
    }
    if (gated) load(L->wsg, 0, (size_t)H, dt, wsg);
    for (int t = 0; t < T; t++) {
        all[t] = t;
        gs[t] = gated ? r32(L, 1.0 / (1.0 + exp(-dot(X + (size_t)t * H, wsg, H)))) : 1.0;
    }
    if (L->y) memset(L->y, 0, (size_t)T * H * sizeof(double));

    /* The routed experts: rows in token order within an expert. */
    {
        memcpy(fill, cnt, (size_t)E * sizeof(int));
        for (int i = 0; i < T * K; i++) slot[fill[L->idx[i]]++] = i;
    }
    for (int e = 0; e < E; e++) {
        const int n = cnt[e + 1] - cnt[e];
        const int *sl = slot + cnt[e];
        if (n == 0) {
            if (G) {   /* no rows: zero gradients */
                memset(dW1, 0, (size_t)2 * F * H * sizeof(double));
                memset(dW2, 0, (size_t)H * F * sizeof(double));
                memset(db1, 0, (size_t)2 * F * sizeof(double));
                memset(db2, 0, (size_t)H * sizeof(double));
            }
        } else {
            load(L->w1, (size_t)e * 2 * F * H, (size_t)2 * F * H, dt, W1);
            load(L->w2, (size_t)e * H * F, (size_t)H * F, dt, W2);
            if (s->ffn_bias) {
                load(L->b1, (size_t)e * 2 * F, (size_t)2 * F, dt, b1);
                load(L->b2, (size_t)e * H, (size_t)H, dt, b2);
            }
            for (int i = 0; i < n; i++) { tok[i] = sl[i] / K; wt[i] = w[sl[i]]; }
            double *dwe = dg;   /* dw of this pass's rows, scattered below */
            pass_t P = { .F = F, .n = n, .scaled_input = s->router.apply == MOE_APPLY_INPUT,
                         .W1 = W1, .W2 = W2, .b1 = s->ffn_bias ? b1 : NULL, .b2 = s->ffn_bias ? b2 : NULL,
                         .tok = tok, .slot = sl, .wt = wt, .dwt = dwe,
                         .dW1 = dW1, .db1 = db1, .dW2 = dW2, .db2 = db2 };
            run_pass(L, &P, X, dx, &sc);
            if (L->dy) for (int i = 0; i < n; i++) dw[sl[i]] = dwe[i];
        }
        if (G) {
            put(G->dw1, (size_t)e * 2 * F * H, dW1, (size_t)2 * F * H);
            put(G->dw2, (size_t)e * H * F, dW2, (size_t)H * F);
            if (s->ffn_bias) {
                put(G->db1, (size_t)e * 2 * F, db1, (size_t)2 * F);
                put(G->db2, (size_t)e * H, db2, (size_t)H);
            }
        }
    }

    /* The shared expert: one pass over every token, weight g, input x. */
    if (FS > 0) {
        load(L->ws1, 0, (size_t)2 * FS * H, dt, W1);
        load(L->ws2, 0, (size_t)H * FS, dt, W2);
        const moe_activation_t sact = moe_spec_shared_activation(s);
        pass_t P = { .F = FS, .n = T, .ac = &sact, .W1 = W1, .W2 = W2, .tok = all, .wt = gs, .dwt = dg,
                     .dwt_abs = dga, .dW1 = dW1, .db1 = db1, .dW2 = dW2, .db2 = db2 };
        if (T > 0) run_pass(L, &P, X, dx, &sc);
        else if (G) { memset(dW1, 0, (size_t)2 * FS * H * sizeof(double)); memset(dW2, 0, (size_t)H * FS * sizeof(double)); }
        if (G) {
            put(G->dws1, 0, dW1, (size_t)2 * FS * H);
            put(G->dws2, 0, dW2, (size_t)H * FS);
        }
        if (gated && L->dy)
            for (int t = 0; t < T; t++) {
                const double dz = dg[t] * gs[t] * (1.0 - gs[t]);
                for (int h = 0; h < H; h++) {
                    dwsg[h] += dz * X[(size_t)t * H + h];
                    dx[(size_t)t * H + h] += dz * wsg[h];
                }
            }
        if (st && st->shared_g) put(st->shared_g, 0, gs, (size_t)T);
        if (st && st->shared_dg && L->dy) put(st->shared_dg, 0, dg, (size_t)T);
        if (st && st->shared_dg_abs && L->dy) put(st->shared_dg_abs, 0, dga, (size_t)T);
        if (G && gated) put(G->dwsg, 0, dwsg, (size_t)H);
    }

    /* The router's backward: dw -> dp -> dlogits, per token. */
    if (L->dy) {
        for (int t = 0; t < T; t++) {
            const double *pt = p + (size_t)t * E;
            const int *ix = L->idx + (size_t)t * K;
            double wk[32];   /* dw at the weights before the expert scales (top_k <= 32) */
            for (int k = 0; k < K; k++) {
                const size_t i = (size_t)t * K + k;
                if (escale && !dropped(L, i)) des[ix[k]] += dw[i] * wpre[i];
                wk[k] = escale ? dw[i] * es[ix[k]] : dw[i];
            }
            const double sc_ = s->router.scale;
            for (int e = 0; e < E; e++) dp[e] = 0;
            /* an expert given twice gets both entries' terms; a dropped entry (weight 0, not p) none */
            const size_t t0 = (size_t)t * K;
            if (s->router.renormalize) {
                double S = 0, c = 0;
                for (int k = 0; k < K; k++) if (!dropped(L, t0 + k)) S += pt[ix[k]];
                for (int k = 0; k < K; k++) if (!dropped(L, t0 + k)) c += wk[k] * pt[ix[k]] / S;
                for (int k = 0; k < K; k++) if (!dropped(L, t0 + k)) dp[ix[k]] += sc_ / S * (wk[k] - c);
            } else {
                for (int k = 0; k < K; k++) if (!dropped(L, t0 + k)) dp[ix[k]] += sc_ * wk[k];
            }
            const double *cd = capd + (size_t)t * E; /* through the logit cap, if any */
            if (s->router.score == MOE_SCORE_SOFTMAX) {
                const double d = dot(pt, dp, E);
                for (int e = 0; e < E; e++) dl[e] = r32(L, pt[e] * (dp[e] - d) * cd[e]);
            } else if (s->router.score == MOE_SCORE_SQRTSOFTPLUS) {
                /* s = sqrt(softplus(l)): ds/dl = sigmoid(l) / (2 s), and sigmoid(l) = 1 - exp(-s^2) */
                for (int e = 0; e < E; e++)
                    dl[e] = r32(L, pt[e] > 0 ? dp[e] * -expm1(-pt[e] * pt[e]) / (2 * pt[e]) * cd[e] : 0.0);
            } else {
                for (int e = 0; e < E; e++) dl[e] = r32(L, dp[e] * pt[e] * (1.0 - pt[e]) * cd[e]);
            }
            const double *xt = RX + (size_t)t * H;
            double *dxt = drx + (size_t)t * H;
            for (int e = 0; e < E; e++) {
                const double *wr = Wr + (size_t)e * H;
                double *dwr = dWr + (size_t)e * H;
                dlb[e] += dl[e];
                for (int h = 0; h < H; h++) { dwr[h] += dl[e] * xt[h]; dxt[h] += dl[e] * wr[h]; }
            }
            if (st && st->dlogits) put(st->dlogits, (size_t)t * E, dl, (size_t)E);
        }
        if (st && st->dw) put(st->dw, 0, dw, (size_t)T * K);
        for (size_t i = 0; i < (size_t)T * H; i++) dx[i] = rnd(L, dx[i]);
        put(G->dx, 0, dx, (size_t)T * H);
        if (own) {
            for (size_t i = 0; i < (size_t)T * H; i++) drx[i] = rnd(L, drx[i]);
            put(G->d_router_x, 0, drx, (size_t)T * H);
        }
        if (escale) {
            for (int e = 0; e < E; e++) des[e] = r32(L, des[e]);
            put(G->d_expert_scale, 0, des, (size_t)E);
        }
        put(G->dwr, 0, dWr, (size_t)E * H);
        if (s->router.logit_bias) put(G->dlogit_bias, 0, dlb, (size_t)E);
    }
    if (st && st->topk_idx) memcpy(st->topk_idx, L->idx, (size_t)T * K * sizeof(int));
    if (st && st->topk_w) put(st->topk_w, 0, w, (size_t)T * K);
    rc = 0;
done:
    scratch_free(&sc);
    free(X); free(Wr); free(p); free(w); free(dw); free(dx); free(W1); free(W2); free(b1); free(b2);
    free(dW1); free(dW2); free(db1); free(db2); free(gs); free(dg); free(dga); free(dWr); free(dlb); free(dl);
    free(dp); free(wsg); free(dwsg); free(cnt); free(tok); free(slot); free(all); free(wt); free(capd); free(fill);
    if (own) {
        free(RX);
        free(drx);
    }
    free(es); free(des); free(wpre);
    return rc;
}

/* ---- entry points -------------------------------------------------------- */

/* The backward and the exact forward: no zero experts (inference only, gen/spec_check.c). */
static int spec_usable(const moe_spec_t *s) {   /* fp32 router weights: inference only */
    return s && s->experts >= 1 && s->top_k >= 1 && s->top_k <= s->experts && s->zero_experts == 0 &&
           s->router.weight_dtype == MOE_ROUTER_WEIGHT_DTYPE &&
           s->hidden >= 1 && s->ffn >= 1 &&
           s->shared.ffn >= 0 && (s->dtype == MOE_DTYPE_BF16 || s->dtype == MOE_DTYPE_FP16);
}

/* Every index in [0, E) and distinct within its token (given routing:
 * repeats allowed). */
static int selection_ok(const moe_spec_t *s, const int *idx, int T, int repeats) {
    const int E = s->experts, K = s->top_k;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int e = idx[(size_t)t * K + k];
            if (e < 0 || e >= E) return 0;
            for (int j = 0; j < k && !repeats; j++) if (idx[(size_t)t * K + j] == e) return 0;
        }
    return 1;
}

/* Whether the layer's tensors the spec reads are all present. */
static int inputs_present(const layer_t *L) {
    const moe_spec_t *s = L->s;
    if (L->T == 0) return 1;
    if (!present(L->x) || !present(L->wr) || !present(L->w1) || !present(L->w2)) return 0;
    if (s->ffn_bias && (!present(L->b1) || !present(L->b2))) return 0;
    if (s->router.logit_bias && !present(L->lb)) return 0;
    if (s->shared.ffn > 0 && (!present(L->ws1) || !present(L->ws2))) return 0;
    if (s->shared.ffn > 0 && s->shared.gate == MOE_SHARED_GATE_SIGMOID && !present(L->wsg)) return 0;
    if (s->router.input == MOE_ROUTER_INPUT_SEPARATE && !present(L->rx)) return 0;
    if (s->router.expert_scale && !present(L->es)) return 0;
    return 1;
}

int moe_ref_backward(const moe_spec_t *s, const moe_ref_inputs_t *in, const uint16_t *dy, int flags,
                     const moe_ref_grads_t *g, const moe_ref_bwd_stages_t *st) {
    if (!spec_usable(s) || !in || in->tokens < 0 || !g || (flags & ~MOE_REF_EXACT)) return 1;
    if (s->router.score == MOE_SCORE_SPARSEMIXER) return 1;   /* inference only (gen/spec_check.c) */
    const int T = in->tokens, K = s->top_k, H = s->hidden;
    if (T > 0 && !dy) return 1;
    layer_t L = { .s = s, .T = T, .rounded = !(flags & MOE_REF_EXACT),
                  .x = { .h = in->x }, .wr = { .h = in->wr }, .lb = { .f = in->logit_bias },
                  .w1 = { .h = in->w1 }, .w2 = { .h = in->w2 }, .b1 = { .h = in->b1 }, .b2 = { .h = in->b2 },
                  .ws1 = { .h = in->ws1 }, .ws2 = { .h = in->ws2 }, .wsg = { .h = in->wsg }, .g = g, .st = st,
                  .rx = { .h = in->router_x }, .es = { .f = in->expert_scale } };
    if (!inputs_present(&L)) return 1;
    const size_t NM = T > 1 ? (size_t)T : 1;
    int *idx = malloc(NM * K * sizeof(int));
    float *w32 = malloc(NM * K * sizeof(float));
    double *dyd = malloc(NM * H * sizeof(double));
    int rc = 1;
    if (!idx || !w32 || !dyd) goto done;
    if (T > 0 && moe_ref_route(s, in, idx, w32, NULL)) goto done;
    for (size_t i = 0; i < (size_t)T * H; i++) dyd[i] = moe_half_to_float(dy[i], s->dtype);
    L.idx = idx;
    L.given = s->router.select == MOE_SELECT_GIVEN ? in->given_ids : NULL;
    L.dy = dyd;
    rc = layer(&L);
done:
    free(idx); free(w32); free(dyd);
    return rc;
}

int moe_ref_forward_exact(const moe_spec_t *s, const moe_ref_inputs_f64_t *in, const int *topk_idx,
                          double *y) {
    if (!spec_usable(s) || !in || in->tokens < 0) return 1;
    if (in->tokens == 0) return 0;
    const int given = s->router.select == MOE_SELECT_GIVEN;
    if (!topk_idx || !y || !selection_ok(s, topk_idx, in->tokens, given) || (given && !in->given_ids)) return 1;
    layer_t L = { .s = s, .T = in->tokens, .rounded = 0, .x = { .d = in->x }, .wr = { .d = in->wr },
                  .lb = { .d = in->logit_bias }, .w1 = { .d = in->w1 }, .w2 = { .d = in->w2 },
                  .b1 = { .d = in->b1 }, .b2 = { .d = in->b2 }, .ws1 = { .d = in->ws1 },
                  .ws2 = { .d = in->ws2 }, .wsg = { .d = in->wsg }, .idx = topk_idx, .y = y,
                  .given = given ? in->given_ids : NULL, .rx = { .d = in->router_x },
                  .es = { .d = in->expert_scale } };
    if (!inputs_present(&L)) return 1;
    return layer(&L);
}
