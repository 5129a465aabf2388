/* ref.c — the CPU reference of one MoE layer (see ref.h for the contract).
 *
 * Routing works in double up to the selection score, which is rounded to
 * fp32 (the precision the GPU selects in). The FFN accumulates in fp32 and
 * rounds the intermediate and the expert output to the spec's dtype, exactly
 * where the GPU stores them. Expert GEMMs run expert by expert over the slots
 * routed to that expert, converting each block of weight rows to float once
 * and reusing it for every slot, so the cost is that of the GEMMs proper. */
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

/* ---- checks ------------------------------------------------------------ */

static int spec_ok(const moe_spec_t *s) {
    return s && s->experts >= 1 && s->top_k >= 1 && s->top_k <= s->experts &&
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

int moe_ref_route(const moe_spec_t *s, const moe_ref_inputs_t *in,
                  int *topk_idx, float *topk_w, float *scores) {
    if (!spec_ok(s) || !in || in->tokens < 0 || !topk_idx || !topk_w) return 1;
    if (groups_ok(s)) return 1;
    if (in->tokens == 0) return 0;
    if (!in->x || !in->wr) return 1;
    if (s->router.bias && !in->sel_bias) return 1;
    if (s->router.logit_bias && !in->logit_bias) return 1;

    const int E = s->experts, K = s->top_k, H = s->hidden, T = in->tokens;
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
    moe_half_row_to_float(in->wr, wrf, (size_t)E * H, dt);

    REF_OMP(omp parallel for schedule(static))
    for (int t = 0; t < T; t++) {
        unsigned char *base = tmp + stride * (size_t)ref_thread();
        double *p = (double *)base;
        double *gscore = p + E;
        float *xr = (float *)(gscore + G);
        float *sv = xr + H;
        unsigned char *cand = (unsigned char *)(sv + E);
        unsigned char *gkeep = cand + E;

        moe_half_row_to_float(in->x + (size_t)t * H, xr, (size_t)H, dt);
        for (int e = 0; e < E; e++) {
            const float *w = wrf + (size_t)e * H;
            double acc = 0;
            for (int h = 0; h < H; h++) acc += (double)xr[h] * (double)w[h];
            p[e] = acc + (logit_bias ? (double)logit_bias[e] : 0.0);
        }
        if (s->router.score == MOE_SCORE_SOFTMAX) {
            double m = p[0], sum = 0;
            for (int e = 1; e < E; e++) if (p[e] > m) m = p[e];
            for (int e = 0; e < E; e++) { p[e] = exp(p[e] - m); sum += p[e]; }
            for (int e = 0; e < E; e++) p[e] /= sum;
        } else {
            for (int e = 0; e < E; e++) p[e] = 1.0 / (1.0 + exp(-p[e]));
        }
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
            if (s->router.renormalize && wsum > 0) w /= wsum;
            wout[j] = (float)(w * s->router.scale);
        }
    }
    free(tmp);
    free(wrf);
    return 0;
}

int moe_ref_counts(const moe_spec_t *s, const int *topk_idx, int tokens, int *counts) {
    if (!s || s->experts < 1 || s->top_k < 1 || tokens < 0 || !counts) return 1;
    if (tokens > 0 && !topk_idx) return 1;
    const size_t n = (size_t)tokens * s->top_k;
    for (size_t i = 0; i < n; i++)
        if (topk_idx[i] < 0 || topk_idx[i] >= s->experts) return 1;
    memset(counts, 0, (size_t)s->experts * sizeof(int));
    for (size_t i = 0; i < n; i++) counts[topk_idx[i]]++;
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

/* activation.kind on the clamped pair (spec.h): swiglu, or geglu with the
 * tanh approximation of gelu (PyTorch's gelu(approximate='tanh')). */
static float activation(const moe_activation_t *act, float gate, float up) {
    double g = gate, u = up;
    if (act->limit > 0) {
        if (g > act->limit) g = act->limit;
        if (u > act->limit) u = act->limit;
        if (u < -act->limit) u = -act->limit;
    }
    if (act->kind == MOE_ACT_GEGLU)
        return (float)((u + act->up_offset) * 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))));
    return (float)((u + act->up_offset) * g / (1.0 + exp(-act->alpha * g)));
}

float moe_ref_activation(const moe_spec_t *s, float gate, float up) { return activation(&s->activation, gate, up); }

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
                uint16_t hq = moe_float_to_half(activation(&s->activation, ar[f], ar[FS + f]), dt);
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
    if (!in->x || !in->w1 || !in->w2 || !topk_idx || !topk_w || !y) return 1;
    if (s->ffn_bias && (!in->b1 || !in->b2)) return 1;
    const moe_dtype_t dt = s->dtype;

    int rc = 1;
    int *cnt = calloc((size_t)E + 1, sizeof(int));
    int *slot = malloc((size_t)n * K * sizeof(int));
    unsigned char *seen = token_list ? calloc((size_t)T, 1) : NULL;
    float *xe = NULL, *a = NULL, *hf = NULL, *oc = NULL, *wbuf = NULL;
    if (!cnt || !slot || (token_list && !seen)) goto done;

    /* Validate the tokens and their slots, count slots per expert. */
    for (int i = 0; i < n; i++) {
        int t = token_list ? token_list[i] : i;
        if (t < 0 || t >= T) goto done;
        if (seen) { if (seen[t]) goto done; seen[t] = 1; }
        for (int k = 0; k < K; k++) {
            int e = topk_idx[(size_t)t * K + k];
            if (e < 0 || e >= E) goto done;
            cnt[e + 1]++;
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
                slot[fill[topk_idx[sl]]++] = (int)sl;
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

        gemm_nt(in->w1 + (size_t)e * 2 * F * H, 2 * F, H, dt, xe, P, a, wbuf);

        const uint16_t *b1 = s->ffn_bias ? in->b1 + (size_t)e * 2 * F : NULL;
        REF_OMP(omp parallel for schedule(static))
        for (int p = 0; p < P; p++) {
            const float *ar = a + (size_t)p * 2 * F;
            for (int f = 0; f < F; f++) {
                float g = ar[f], u = ar[F + f];
                if (b1) { g += moe_half_to_float(b1[f], dt); u += moe_half_to_float(b1[F + f], dt); }
                uint16_t hq = moe_float_to_half(activation(&s->activation, g, u), dt);
                if (h_out) h_out[(size_t)sl[p] * F + f] = hq;
                hf[(size_t)p * F + f] = moe_half_to_float(hq, dt);
            }
        }

        gemm_nt(in->w2 + (size_t)e * H * F, H, F, dt, hf, P, oc, wbuf);

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
    if (!s || s->experts < 1 || s->top_k < 1 || s->top_k > s->experts || tokens < 0) return 0;
    if (tokens > 0 && (!idx_a || !idx_b || !scores_ref)) return 0;
    const int E = s->experts, K = s->top_k;
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
