/* ref.h — the CPU reference of one whole MoE layer, in plain C11: test
 * support (build/libmoegen_test.a), not part of the shipped library.
 *
 * What the GPU tests check generated kernels against (docs/DESIGN.md, "Routing,
 * exactly" and "Kernels"). It reads the same half-precision inputs the GPU
 * reads and follows the same rounding points: the SwiGLU intermediate and the
 * down-projection output are rounded to the spec's dtype, as the GPU stores
 * them; everything else is accumulated at least in fp32.
 *
 * Data conventions (the project's ABI):
 *   half values    uint16_t bit patterns of spec->dtype (bf16 or fp16)
 *   x              [T, H]
 *   wr             [E, H]            router weight
 *   sel_bias       fp32 [E]          selection only; read iff spec->router.bias
 *   logit_bias     fp32 [E]          added to logits; read iff spec->router.logit_bias
 *   w1             [E, 2F, H]        plain layout: rows 0..F-1 gate, F..2F-1 up
 *   w2             [E, H, F]
 *   b1, b2         [E, 2F], [E, H]   read iff spec->ffn_bias
 *   topk_idx/w     [T, top_k]        slot (t, k) is row t*top_k + k
 *   ws1            [2F_s, H]         the shared expert's W1, unsplit (gate rows, then up rows);
 *                                    read iff spec->shared.ffn (F_s = shared.ffn)
 *   ws2            [H, F_s]          the shared expert's W2, unsplit
 *   wsg            [H]               w_gate; read iff shared.gate = "sigmoid"
 *
 * No function here prints, exits or keeps state; all return 0 on success and
 * non-zero on bad arguments (NULL where data is needed, sizes < 1, indices
 * out of range) or when out of memory, writing nothing in that case. */
#ifndef MOEGEN_REF_H
#define MOEGEN_REF_H

#include <stdint.h>

#include "half.h"   /* moe_half_to_float, moe_float_to_half */
#include "spec.h"

typedef struct {
    const uint16_t *x, *wr, *w1, *w2, *b1, *b2;
    const float *sel_bias, *logit_bias;
    int tokens;                        /* T: rows of x */
    const uint16_t *ws1, *ws2, *wsg;   /* the shared expert (spec shared.ffn), see above */
} moe_ref_inputs_t;

/* Route in->tokens tokens: logits, scores, (group-limited) top-k, weights.
 * Logits are accumulated in double from the half inputs, softmax/sigmoid are
 * computed in double; the selection score s = p (+ sel_bias) is rounded to
 * fp32 and the top-k is taken on those fp32 values, sorted by descending s,
 * ties toward the lower expert (and, for groups, the lower group) index.
 * Group-limited (router.groups > 1): a group's score is the sum of its top
 * router.group_topk selection scores (2: DeepSeek-V3; 1: DeepSeek-V2's
 * maximum); the best router.topk_groups groups are kept and the top-k is
 * taken among their experts only.
 * Writes topk_idx [T, k], topk_w [T, k] (p at the selected experts,
 * renormalized if asked, times scale) and, if scores is non-NULL, the
 * selection scores s [T, E] (for softmax-only routing: the probabilities). */
int moe_ref_route(const moe_spec_t *s, const moe_ref_inputs_t *in,
                  int *topk_idx, float *topk_w, float *scores);

/* The expert FFN and combine for the tokens in token_list[0..ntokens)
 * (distinct, each in [0, in->tokens)); token_list NULL means all tokens, and
 * ntokens is then ignored. For each slot (t, k) with expert e = topk_idx:
 *   xi = x[t], or with router.apply = "input" round(x[t]·round(topk_w[t,k]))
 *   a = xi·W1[e]ᵀ (+ b1[e])             fp32 accumulation, 2F values
 *   gate, up = a[0..F), a[F..2F)          clamped when activation.limit > 0
 *   h = round(act(gate, up))             activation.kind (spec.h), e.g. swiglu:
 *                                         (up + up_offset) * gate * sigmoid(alpha * gate)
 *   o = round(h·W2[e]ᵀ (+ b2[e]))         fp32 accumulation
 *   y[t] = Σ_k topk_w[t,k] * o(t,k)       fp32, summed in ascending expert order
 *                                         (weight 1 with router.apply = "input")
 *        + g(t) * os(t)                   with a shared expert (spec shared.ffn), added last
 *                                         in fp32: moe_ref_shared's g and os (the shared
 *                                         expert's input is x, whatever router.apply)
 * where round() is to spec->dtype. topk_idx and topk_w hold the routed
 * entries only ([T, top_k]); the shared expert is computed here, directly
 * from in->ws1/ws2/wsg, not through the kernels' slot split. Writes only the listed rows of y [T, H]
 * and, when non-NULL, of h_out [T*k, F] and o_out [T*k, H]; every other row
 * is left as it was. Uses OpenMP threads when built with -fopenmp. */
int moe_ref_ffn(const moe_spec_t *s, const moe_ref_inputs_t *in,
                const int *topk_idx, const float *topk_w,
                const int *token_list, int ntokens,
                float *y, uint16_t *h_out, uint16_t *o_out);

/* The shared expert alone (spec shared.ffn = F_s), for the tokens in
 * token_list[0..ntokens) (NULL: all tokens), as one FFN of size F_s on the
 * unsplit weights:
 *   g(t)  = 1, or sigmoid(x[t]·w_gate) (shared.gate = "sigmoid"), the dot
 *           product and sigmoid in double, returned as float
 *   a     = x[t]·Ws1ᵀ                    fp32 accumulation, 2F_s values
 *   hs(t) = round(act(a[0..F_s), a[F_s..2F_s)))
 *   os(t) = round(hs(t)·Ws2ᵀ)            fp32 accumulation, rounded once
 * Writes the listed rows of g_out [T], hs_out [T, F_s] and os_out [T, H]
 * (each may be NULL; with hs_out and os_out NULL only g is computed, and
 * ws1/ws2 are not read). Non-zero when the spec has no shared expert. */
int moe_ref_shared(const moe_spec_t *s, const moe_ref_inputs_t *in, const int *token_list, int ntokens,
                   float *g_out, uint16_t *hs_out, uint16_t *os_out);

/* The spec's FFN activation of one (gate, up) pair, as moe_ref_ffn applies
 * it before rounding: computed in double, returned as float. */
float moe_ref_activation(const moe_spec_t *s, float gate, float up);

/* Tokens per expert: counts[e] = number of slots (t, k) with topk_idx == e,
 * over `tokens` tokens. Non-zero if an index is out of [0, E). */
int moe_ref_counts(const moe_spec_t *s, const int *topk_idx, int tokens, int *counts);

/* Whether two selections agree up to near-ties. idx_a is the reference
 * selection and scores_ref [T, E] its selection scores (as moe_ref_route
 * writes them). Per token, the two index sets (order ignored) must be equal,
 * or every expert in one set but not the other must have a reference score
 * within tie_eps (absolute) of the k-th selected score, min over idx_a of
 * scores_ref. An index out of range or repeated within a token disagrees.
 * Returns 1 when every token agrees; otherwise 0 with *bad_token (if
 * non-NULL) set to the first disagreeing token, or -1 for bad arguments.
 * Group-limited routing: a near-tie between groups can swap experts whose
 * own scores are far apart, which this reports as a disagreement. */
int moe_ref_route_agree(const moe_spec_t *s, const int *idx_a, const int *idx_b,
                        const float *scores_ref, int tokens, float tie_eps,
                        int *bad_token);

#endif
