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
 *   wr             [E + Z, H]        router weight (Z = spec->zero_experts, 0 mostly)
 *   sel_bias       fp32 [E + Z]      selection only; read iff spec->router.bias
 *   logit_bias     fp32 [E + Z]      added to logits; read iff spec->router.logit_bias
 *   w1             [E, 2F, H]        plain layout: rows 0..F-1 gate, F..2F-1 up
 *   w2             [E, H, F]
 *   b1, b2         [E, 2F], [E, H]   read iff spec->ffn_bias
 *   topk_idx/w     [T, top_k]        slot (t, k) is row t*top_k + k; an index >= E is a
 *                                    zero expert: it adds w·x[t] (docs/DESIGN.md, "Zero experts")
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

#include "fp8.h"    /* moe_e4m3_to_float, moe_float_to_e4m3, moe_fp8_quantize_block */
#include "half.h"   /* moe_half_to_float, moe_float_to_half */
#include "spec.h"

/* The fp8 layer's expert weights (spec quant.weights = "fp8_e4m3"; docs/
 * DESIGN.md, "FP8"), in the checkpoint's plain layout, w = e4m3 · scale:
 *   w1q  e4m3 [E, 2F, H]    rows 0..F-1 gate, F..2F-1 up (as w1)
 *   w1s  fp32 [E, 2F/128, H/128] (scaling "block"), [E, 2F] ("channel")
 *   w2q  e4m3 [E, H, F]
 *   w2s  fp32 [E, H/128, F/128] ("block"), [E, H] ("channel")
 * moe_ref_fp8_weights makes them from bf16 weights. */
typedef struct {
    const uint8_t *w1q, *w2q;
    const float *w1s, *w2s;
} moe_ref_fp8_t;

typedef struct {
    const uint16_t *x, *wr, *w1, *w2, *b1, *b2;
    const float *sel_bias, *logit_bias;
    int tokens;                        /* T: rows of x */
    const uint16_t *ws1, *ws2, *wsg;   /* the shared expert (spec shared.ffn), see above */
    const moe_ref_fp8_t *fp8;          /* the expert weights with quant.weights = "fp8_e4m3" (w1, w2 unread) */
    const int *given_ids;              /* router.select = "given": the caller's ids [T, top_k] */
    const float *given_w;              /* router.score = "given": the caller's weights [T, top_k] */
    const uint16_t *router_x;          /* router.input = "separate": the logits' input [T, HR] (x otherwise;
                                        * HR = router.hidden where it is set, else H; wr is then [E, HR]) */
    const float *expert_scale;         /* router.expert_scale: fp32 [E], the final weights' factor */
    const float *wr32;                 /* router.weight_dtype = "fp32": the router weight [E + Z, H] (wr unread) */
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
 * selection scores s [T, E + Z] (for softmax-only routing: the
 * probabilities). With zero experts (Z > 0) the router scores E + Z experts,
 * every step as above over all of them.
 * Given routing (router.select = "given"): entry (t, k)'s expert is
 * in->given_ids[t, k], or, for an id outside 0..E-1, expert 0 with weight 0
 * (dropped); the weight is p at it (router.score = "given": in->given_w[t,
 * k], and x and wr are not read), then renormalized over the token's
 * entries if asked, times scale. scores, if asked, are the plain scores p
 * (zeros with "given" weights).
 * With router.input = "separate" the logits read in->router_x in place of
 * in->x; with router.expert_scale every weight above is multiplied by
 * in->expert_scale[its expert] last (a dropped entry stays 0). */
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
 *        + Σ_k topk_w[t,k] * x[t]         over the zero experts' slots (e >= E, spec
 *                                         zero_experts), after the routed experts; no rows
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
 *   hs(t) = round(act(a[0..F_s), a[F_s..2F_s)))   act the shared expert's
 *                                    (moe_spec_shared_activation: shared.limit, shared.unclamped)
 *   os(t) = round(hs(t)·Ws2ᵀ)            fp32 accumulation, rounded once
 * Writes the listed rows of g_out [T], hs_out [T, F_s] and os_out [T, H]
 * (each may be NULL; with hs_out and os_out NULL only g is computed, and
 * ws1/ws2 are not read). Non-zero when the spec has no shared expert. */
int moe_ref_shared(const moe_spec_t *s, const moe_ref_inputs_t *in, const int *token_list, int ntokens,
                   float *g_out, uint16_t *hs_out, uint16_t *os_out);

/* ---- the fp8 layer (quant.weights = "fp8_e4m3") ----------------------------
 *
 * moe_ref_ffn with an fp8 spec reads in->fp8 instead of w1/w2 and does, per
 * slot (t, k) with expert e:
 *   xi as above (bf16)
 *   xq, xsc = moe_ref_fp8_quantize_rows(xi)   e4m3 per 128 columns
 *   a = moe_ref_fp8_gemm(xq, xsc, W1q[e], W1s[e]) (+ b1[e])
 *   h = act(gate, up) in fp32, NOT rounded to bf16
 *   hq, hsc = moe_ref_fp8_quantize_rows(h)    the down GEMM's input
 *   o = round(moe_ref_fp8_gemm(hq, hsc, W2q[e], W2s[e]) (+ b2[e]))
 *   y as above
 * h_out, when non-NULL, gets round(e4m3(hq) · hsc), the dequantized input
 * of the down GEMM. A shared expert with fp8 weights is not modelled (the
 * call fails). */

/* Quantize P rows of K floats (K a multiple of MOE_FP8_BLOCK), each per
 * block of MOE_FP8_BLOCK columns with moe_fp8_quantize_block: q [P, K]
 * e4m3, sc [P, K / 128]. */
void moe_ref_fp8_quantize_rows(const float *v, int P, int K, uint8_t *q, float *sc);

/* One quantized GEMM with fp32 accumulation promoted per K block:
 *   C[p, n] = Σ_kb fl32(Σ_{k in kb} e4m3(aq[p,k]) · e4m3(wq[n,k])) · (asc[p,kb] · ws(n, kb))
 * kb over K / 128 blocks of 128, the inner sum in fp32 (eight partial sums,
 * fixed order), the outer in fp32 in increasing kb; ws(n, kb) is
 * ws[(n/128)·(K/128) + kb] for the spec's quant.scaling "block" and ws[n]
 * for "channel". aq [P, K], asc [P, K/128], wq [N, K], C [P, N]. Non-zero
 * for a spec without fp8 weights or K not a multiple of 128. */
int moe_ref_fp8_gemm(const moe_spec_t *s, const uint8_t *aq, const float *asc, int P, const uint8_t *wq,
                     const float *ws, int N, int K, float *C);

/* The fp8 weights of an fp8 spec from bf16 weights w1 [E, 2F, H], w2
 * [E, H, F] (moe_fp8_quantize_weight per expert, per the spec's
 * quant.scaling); the caller owns f's four arrays (free them). Non-zero on
 * a spec without fp8 weights or out of memory. */
int moe_ref_fp8_weights(const moe_spec_t *s, const uint16_t *w1, const uint16_t *w2, moe_ref_fp8_t *f);
void moe_ref_fp8_free(moe_ref_fp8_t *f);

/* The spec's FFN activation of one (gate, up) pair, as moe_ref_ffn applies
 * it before rounding: computed in double, returned as float. */
/* d act / d gate and d act / d up at (gate, up) before the clamps, in
 * double (the backward's act'): zero where a clamp cut the value. */
void moe_ref_activation_grad(const moe_spec_t *s, double gate, double up, double *dgate, double *dup);
float moe_ref_activation(const moe_spec_t *s, float gate, float up);

/* Tokens per expert: counts[e] = number of slots (t, k) with topk_idx == e,
 * over `tokens` tokens, counts [E]; a zero expert's slot (E <= e < E + Z)
 * counts nowhere. Non-zero if an index is out of [0, E + Z). */
int moe_ref_counts(const moe_spec_t *s, const int *topk_idx, int tokens, int *counts);

/* Whether two selections agree up to near-ties. idx_a is the reference
 * selection and scores_ref [T, E + Z] its selection scores (as moe_ref_route
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

/* ---- the backward (issue #19; docs/DESIGN.md, "Backward, exactly") ------
 *
 * Notation: slot (t, k) is row r = t*top_k + k of the per-row arrays (the
 * GPU's expert-major rows, re-indexed by row_of[t,k]); e = topk_idx[t,k];
 * w = topk_w[t,k]; R() rounds to spec->dtype; "fp32" values are stored as
 * float. The forward the backward differentiates (moe_ref_ffn's):
 *   xs  = x[t]           (router.apply = "input": R(x[t]·R(w)))
 *   U   = xs·W1[e]ᵀ + b1[e]              fp32, [2F] gate then up
 *   A   = R(act(U))                      [F]   (clamp on the fp32 U)
 *   O   = R(A·W2[e]ᵀ + b2[e])            [H]
 *   y[t] = Σ_k w·O (weight 1 with apply = "input") + g(t)·Os(t)
 * Rounded mode (flags 0), the points the GPU backward mirrors, given dy
 * [T, H] in dtype; every sum is taken in double and stored as noted:
 *   dys = R(w·dy[t])                     (apply = "input": dy[t])
 *   dw[t,k] = Σ_h dy[t,h]·O[h]           fp32 (apply = "input": Σ_h dXs[h]·x[t,h])
 *   dA  = dys·W2[e]                      fp32, [F]
 *   Ur  = R(U)                           the saved (or recomputed) pre-activation
 *   dU  = R(act'(Ur) ⊙ dA)               [2F]; act' is zero where the clamp
 *                                         cut Ur: gate > limit, |up| > limit
 *                                         (at equality the gradient passes, as
 *                                         torch.clamp's)
 *   dXs = R(dU·W1[e])                    [H]
 *   dW1[e] = Σ dUᵀ·xs, db1[e] = Σ dU, dW2[e] = Σ dysᵀ·A, db2[e] = Σ dys
 *                                         over e's rows, fp32
 *   router: p = softmax / sigmoid of the logits l = x·Wrᵀ (+ logit_bias),
 *   capped (router.logit_softcap = c: l ← c·tanh(l / c)), in double;
 *   w = scale·p_e (/ Σ_selected p with renormalize), so
 *     dp_e = scale·dw_k (no renormalize), or
 *     dp_e = (scale/S)·(dw_k − Σ_j dw_j·p_j/S), S = Σ_selected p
 *     (zero for unselected experts), then
 *     dlogits = p ⊙ (dp − ⟨p, dp⟩) (softmax) or dp ⊙ p(1−p) (sigmoid)   fp32
 *     (times 1 − tanh²(l / c) under a logit cap)
 *   dlogit_bias = Σ_t dlogits[t], dWr = dlogitsᵀ·x        fp32
 *   shared expert (one FFN of size F_s on the unsplit weights, the input x,
 *   weight g): the same chain with dys_s = R(g·dy), giving dWs1, dWs2 and
 *   dXs_s; gate "sigmoid": dg = Σ_h dy·Os (fp32), dz = dg·g(1−g),
 *   dwsg = Σ_t dz·x[t]
 *   dx[t] = R(Σ_k dXs (apply = "input": ·R(w)) + dXs_s + Σ_e dlogits·Wr[e]
 *             + dz·wsg)                   summed in double, rounded once
 *   router.input = "separate": the logits read rx = router_x, so dWr =
 *   dlogitsᵀ·rx and the router's term goes to d_router_x[t] =
 *   R(Σ_e dlogits·Wr[e]) instead of dx;
 *   router.expert_scale: the weight is w = w'·c_e (w' as above, fp32; c the
 *   scales), so d c_e = Σ_{(t,k): e} dw_k·w'_k (fp32) and w' gets dw_k·c_e
 * The selection (topk_idx) is moe_ref_route's and a constant of the
 * backward; router.bias moves only the selection and gets no gradient.
 * Exact mode (MOE_REF_EXACT): the same chain with no rounding at all (every
 * R() and fp32 store is the identity, w and g in double): the exact
 * gradient of moe_ref_forward_exact's y at the given (half-valued) point,
 * for finite differences. Outputs are float in both modes. */

/* Where moe_ref_backward writes the gradients; each may be NULL (not
 * wanted). Layouts are ref.h's plain ones, fp32. */
typedef struct {
    float *dx;            /* [T, H]  (rounded mode: dtype values)  */
    float *dwr;           /* [E, H]  router weight                 */
    float *dw1;           /* [E, 2F, H]                            */
    float *db1;           /* [E, 2F]; written iff spec->ffn_bias   */
    float *dw2;           /* [E, H, F]                             */
    float *db2;           /* [E, H]; written iff spec->ffn_bias    */
    float *dlogit_bias;   /* [E]; written iff router.logit_bias    */
    float *dws1;          /* [2F_s, H]; written iff shared.ffn     */
    float *dws2;          /* [H, F_s]; written iff shared.ffn      */
    float *dwsg;          /* [H]; written iff shared.gate = "sigmoid" */
    float *d_router_x;    /* [T, H]; written iff router.input = "separate" (rounded mode: dtype values);
                           * dx then has no router term */
    float *d_expert_scale; /* [E]; written iff router.expert_scale */
} moe_ref_grads_t;

/* The intermediates of moe_ref_backward, for checking a GPU backward stage
 * by stage; each may be NULL. Per-row arrays are indexed by slot
 * r = t*top_k + k (routed entries only), in the plain order (gate columns
 * 0..F-1, up F..2F-1); the values are those named in the notation above
 * (rounded mode: the dtype-rounded values, as floats). */
typedef struct {
    int *topk_idx;        /* [T, top_k]  the selection used         */
    float *topk_w;        /* [T, top_k]  w (fp32 in rounded mode)   */
    float *u;             /* [T*k, 2F]   Ur                         */
    float *a;             /* [T*k, F]    A                          */
    float *o;             /* [T*k, H]    O                          */
    float *dys;           /* [T*k, H]                               */
    float *da;            /* [T*k, F]    dA (fp32)                  */
    float *du;            /* [T*k, 2F]                              */
    float *dxs;           /* [T*k, H]                               */
    float *dw;            /* [T, top_k]                             */
    float *dlogits;       /* [T, E]                                 */
    float *shared_g;      /* [T]  g (1 for gate "none"); iff shared.ffn */
    float *shared_dg;     /* [T]  dg;                  iff shared.ffn */
    float *shared_dg_abs; /* [T]  Σ_h |dy·O_shared|, dg's terms' magnitudes (its rounding error's scale); may be NULL */
} moe_ref_bwd_stages_t;

#define MOE_REF_EXACT 1   /* moe_ref_backward flag: no rounding, see above */

/* Gradients of L = Σ dy ⊙ y through the layer moe_ref_ffn computes, for all
 * in->tokens tokens, routed with moe_ref_route. dy is [T, H] in dtype. g
 * must be non-NULL; st may be NULL. Memory: the inputs one expert at a time
 * as doubles, plus per-row scratch for one expert's rows. Returns 0, or
 * non-zero (writing nothing) on bad arguments or when out of memory. Uses
 * OpenMP threads when built with -fopenmp. */
int moe_ref_backward(const moe_spec_t *s, const moe_ref_inputs_t *in, const uint16_t *dy, int flags,
                     const moe_ref_grads_t *g, const moe_ref_bwd_stages_t *st);

/* The inputs as doubles (same layouts and conditions as moe_ref_inputs_t),
 * for moe_ref_forward_exact. */
typedef struct {
    const double *x, *wr, *w1, *w2, *b1, *b2;
    const double *logit_bias;
    int tokens;
    const double *ws1, *ws2, *wsg;
    const int *given_ids;              /* router.select = "given": the caller's ids [T, top_k] (topk_idx is
                                        * them with the dropped ones at expert 0) */
    const double *router_x;            /* router.input = "separate": [T, H] */
    const double *expert_scale;        /* router.expert_scale: [E] */
} moe_ref_inputs_f64_t;

/* The layer's output y [T, H] in double with no rounding anywhere (the
 * forward MOE_REF_EXACT differentiates), for the given selection topk_idx
 * [T, top_k] (a constant: finite differences keep it fixed; with given
 * routing in->given_ids too, whose out-of-range ids are dropped). Router
 * weights, activation and shared gate as moe_ref_ffn's, in double.
 * Returns 0, or non-zero on bad arguments or when out of memory. */
int moe_ref_forward_exact(const moe_spec_t *s, const moe_ref_inputs_f64_t *in, const int *topk_idx,
                          double *y);

#endif
