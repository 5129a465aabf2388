/* ep_data.h — what the expert-parallel tests share: the layer's random
 * inputs (the same on every rank for a seed) and the comparison of one
 * rank's output with the CPU reference of the whole, unsharded layer. */
#ifndef MOEGEN_EP_DATA_H
#define MOEGEN_EP_DATA_H

#include "ref.h"
#include "spec.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t ep_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void ep_fill(uint16_t *d, size_t n, float scale, uint64_t *s) {
    for (size_t i = 0; i < n; i++)
        d[i] = moe_float_to_half(((float)(ep_rng(s) >> 40) / (float)(1 << 24) * 2.f - 1.f) * scale, MOE_DTYPE_BF16);
}

/* The whole layer: x for `world` ranks of T tokens, router, plain W1, W2;
 * with given routing (router.select = "given") the caller's ids for every
 * rank's tokens, [world * T, top_k], one in 16 out of range (dropped), and
 * with router.score = "given" their weights. */
typedef struct {
    uint16_t *x, *wr, *w1, *w2;
    int *ids;
    float *gw;
} ep_layer_t;

static int ep_layer_make(ep_layer_t *l, const moe_spec_t *s, int world, int T, uint64_t seed) {
    size_t H = (size_t)s->hidden, F = (size_t)s->ffn, E = (size_t)s->experts;
    l->ids = NULL, l->gw = NULL;
    l->x = malloc(2 * (size_t)world * T * H);
    l->wr = malloc(2 * E * H);
    l->w1 = malloc(2 * E * 2 * F * H);
    l->w2 = malloc(2 * E * H * F);
    if (!l->x || !l->wr || !l->w1 || !l->w2)
        return -1;
    ep_fill(l->x, (size_t)world * T * H, 1.f, &seed);
    ep_fill(l->wr, E * H, 0.2f, &seed);
    ep_fill(l->w1, E * 2 * F * H, 0.08f, &seed);
    ep_fill(l->w2, E * H * F, 0.1f, &seed);
    if (s->router.select == MOE_SELECT_GIVEN) {
        const size_t n = (size_t)world * T * s->top_k;
        l->ids = malloc(sizeof(int) * n);
        l->gw = malloc(sizeof(float) * n);
        if (!l->ids || !l->gw)
            return -1;
        for (size_t i = 0; i < n; i++) {
            const uint64_t u = ep_rng(&seed);
            l->ids[i] = (u & 15) == 0 ? ((u >> 4) & 1 ? -1 : (int)E) : (int)((u >> 8) % E);
            l->gw[i] = (float)(ep_rng(&seed) >> 40) / (float)(1 << 24) + 1e-3f;
        }
    }
    return 0;
}

/* The ids out of range among rank r's (given routing). */
static inline long long ep_layer_dropped(const ep_layer_t *l, const moe_spec_t *s, int r, int T) {
    long long n = 0;
    for (size_t i = 0; l->ids && i < (size_t)T * s->top_k; i++) {
        const int id = l->ids[(size_t)r * T * s->top_k + i];
        n += id < 0 || id >= s->experts;
    }
    return n;
}

static void ep_layer_free(ep_layer_t *l) { free(l->x), free(l->wr), free(l->w1), free(l->w2), free(l->ids), free(l->gw); }

/* Normalized L2 error of rank r's y [T, H] against the reference on its
 * tokens; *unwritten counts NaNs (the poison). bias (may be NULL): the
 * spec's b1, b2, sel_bias and logit_bias, and with fp8 weights the fp8
 * weights (the quantized recipe). Returns -1 on failure. */
static double ep_layer_error(const ep_layer_t *l, const moe_spec_t *s, int r, int T, const uint16_t *y,
                             int *unwritten, const moe_ref_inputs_t *bias) {
    size_t H = (size_t)s->hidden, K = (size_t)s->top_k;
    float *yref = malloc(sizeof(float) * T * H), *tw = malloc(sizeof(float) * T * K);
    int *ti = malloc(sizeof(int) * T * K);
    double e = -1;
    moe_ref_inputs_t in = {.x = l->x + (size_t)r * T * H, .wr = l->wr, .w1 = l->w1, .w2 = l->w2, .tokens = T,
                           .given_ids = l->ids ? l->ids + (size_t)r * T * K : NULL,
                           .given_w = l->gw ? l->gw + (size_t)r * T * K : NULL};
    if (bias) {
        in.b1 = bias->b1;
        in.b2 = bias->b2;
        in.sel_bias = bias->sel_bias;
        in.logit_bias = bias->logit_bias;
        in.fp8 = bias->fp8;
    }
    if (yref && tw && ti && !moe_ref_route(s, &in, ti, tw, NULL) && !moe_ref_ffn(s, &in, ti, tw, NULL, 0, yref, NULL, NULL)) {
        double num = 0, den = 0;
        *unwritten = 0;
        for (size_t i = 0; i < (size_t)T * H; i++) {
            float g = moe_half_to_float(y[i], MOE_DTYPE_BF16);
            *unwritten += isnan(g);
            num += (g - yref[i]) * (double)(g - yref[i]);
            den += (double)yref[i] * yref[i];
        }
        e = sqrt(num / (den > 0 ? den : 1));
    }
    free(yref), free(tw), free(ti);
    return e;
}

#endif
