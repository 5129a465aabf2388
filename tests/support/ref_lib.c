/* ref_lib.c — the CPU reference (ref.c) behind a small C ABI for ctypes:
 * build/libmoegen_ref.so (`make ref-lib`), used by bench/check_models.py to
 * check moegen's semantics against Hugging Face transformers' MoE blocks on
 * a machine without a GPU, and by bench/check_backward.py to check the
 * backward reference against torch autograd. Test support: not part of the
 * shipped library.
 *
 * The ABI takes only plain pointers and ints, so Python never mirrors
 * moe_spec_t (which grows as keys are added). Tensors are ref.h's: half
 * values as uint16_t bit patterns of the spec's dtype, W1 in the plain
 * layout [E, 2F, H] (gate rows, then up rows), W2 [E, H, F]. */
#include <stdio.h>
#include <string.h>

#include "ref.h"
#include "spec.h"

/* Inputs of moe_reflib_forward; pointers the spec does not use may be NULL. */
typedef struct {
    int tokens;
    const uint16_t *x;           /* [T, H] */
    const uint16_t *wr;          /* [E + Z, H], Z = zero_experts */
    const float *sel_bias;       /* [E + Z], router.bias */
    const float *logit_bias;     /* [E + Z], router.logit_bias */
    const uint16_t *w1, *w2;     /* [E, 2F, H] plain, [E, H, F] */
    const uint16_t *b1, *b2;     /* [E, 2F] plain, [E, H]; ffn_bias */
    const uint16_t *ws1, *ws2;   /* the shared expert, unsplit: [2F_s, H] (gate rows, then up), [H, F_s]; shared.ffn */
    const uint16_t *wsg;         /* [H] w_gate; shared.gate = "sigmoid" */
    const int *given_ids;        /* [T, top_k] the caller's experts; router.select = "given" */
    const float *given_w;        /* [T, top_k] the caller's weights; router.score = "given" */
    const uint16_t *router_x;    /* [T, H] the logits' input; router.input = "separate" */
    const float *expert_scale;   /* [E] the weights' per-expert factor; router.expert_scale */
    const float *wr32;           /* [E + Z, H] the router weight in fp32; router.weight_dtype = "fp32" */
} moe_reflib_inputs_t;

static void put_err(char *err, int errlen, const char *msg) {
    if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s", msg);
}

/* Load and validate the spec at `path`; on success write its shape to
 * shape[0..6] = experts, top_k, hidden, ffn, tokens, dtype (0 bf16, 1 fp16),
 * zero_experts (the router scores experts + zero_experts) and return 0. On failure return 2 with the loader's "FILE:LINE: error:"
 * message in err. */
int moe_reflib_shape(const char *path, int *shape, char *err, int errlen) {
    moe_spec_t s;
    moe_diag_t d;
    if (!path || !shape) { put_err(err, errlen, "moe_reflib_shape: NULL argument"); return 1; }
    if (moe_spec_load(&s, path, NULL, NULL, 0, &d)) { put_err(err, errlen, d.msg); return 2; }
    shape[0] = s.experts; shape[1] = s.top_k; shape[2] = s.hidden;
    shape[3] = s.ffn; shape[4] = s.tokens; shape[5] = (int)s.dtype; shape[6] = s.zero_experts;
    return 0;
}

/* The whole layer on the CPU for the spec at `path`: moe_ref_route, then
 * moe_ref_ffn over all tokens. Writes y [T, H] (fp32, the reference's
 * accumulation before any final rounding), topk_idx and topk_w [T, top_k],
 * and scores [T, E + zero_experts] (the selection scores) when non-NULL. Returns 0; 2 when
 * the spec does not load, 1 when the reference refuses the inputs, with a
 * message in err. */
int moe_reflib_forward(const char *path, const moe_reflib_inputs_t *a, float *y,
                       int *topk_idx, float *topk_w, float *scores, char *err, int errlen) {
    moe_spec_t s;
    moe_diag_t d;
    if (!path || !a) { put_err(err, errlen, "moe_reflib_forward: NULL argument"); return 1; }
    if (moe_spec_load(&s, path, NULL, NULL, 0, &d)) { put_err(err, errlen, d.msg); return 2; }
    if (a->tokens < 1 || a->tokens > s.tokens) {
        put_err(err, errlen, "moe_reflib_forward: tokens outside 1..the spec's tokens");
        return 1;
    }
    moe_ref_inputs_t in = { .x = a->x, .wr = a->wr, .w1 = a->w1, .w2 = a->w2, .b1 = a->b1,
                            .b2 = a->b2, .sel_bias = a->sel_bias, .logit_bias = a->logit_bias,
                            .tokens = a->tokens, .ws1 = a->ws1, .ws2 = a->ws2, .wsg = a->wsg,
                            .given_ids = a->given_ids, .given_w = a->given_w, .router_x = a->router_x,
                            .expert_scale = a->expert_scale, .wr32 = a->wr32 };
    if (moe_ref_route(&s, &in, topk_idx, topk_w, scores)) {
        put_err(err, errlen, "moe_ref_route refused the inputs (a NULL tensor the spec needs?)");
        return 1;
    }
    if (moe_ref_ffn(&s, &in, topk_idx, topk_w, NULL, 0, y, NULL, NULL)) {
        put_err(err, errlen, "moe_ref_ffn refused the inputs (a NULL tensor the spec needs?)");
        return 1;
    }
    return 0;
}

/* Where moe_reflib_backward writes; each may be NULL (not wanted). fp32,
 * the plain layouts of ref.h: dx [T, H], dwr [E, H], dw1 [E, 2F, H],
 * db1 [E, 2F], dw2 [E, H, F], db2 [E, H], dlogit_bias [E], dws1 [2F_s, H],
 * dws2 [H, F_s], dwsg [H], d_router_x [T, H] (router.input = "separate"), d_expert_scale [E]
 * (router.expert_scale). */
typedef struct {
    float *dx, *dwr, *dw1, *db1, *dw2, *db2, *dlogit_bias, *dws1, *dws2, *dwsg, *d_router_x, *d_expert_scale;
} moe_reflib_grads_t;

/* The layer's backward on the CPU (moe_ref_backward, docs/DESIGN.md,
 * "Backward, exactly") for the spec in `text` (or, when text is NULL, the
 * file at `path`; path names the spec in messages either way): the
 * gradients of Σ dy ⊙ y for dy [T, H] (spec dtype), rounded as the GPU
 * backward (exact = 0) or exact in double (exact = 1). Writes the selection
 * topk_idx and weights topk_w [T, top_k] when non-NULL. Returns 0; 2 when
 * the spec does not load, 1 when the reference refuses the inputs, with a
 * message in err. */
int moe_reflib_backward(const char *path, const char *text, const moe_reflib_inputs_t *a, const uint16_t *dy,
                        int exact, const moe_reflib_grads_t *g, int *topk_idx, float *topk_w, char *err,
                        int errlen) {
    moe_spec_t s;
    moe_diag_t d;
    if (!path || !a || !g) { put_err(err, errlen, "moe_reflib_backward: NULL argument"); return 1; }
    if (moe_spec_load(&s, path, text, NULL, 0, &d)) { put_err(err, errlen, d.msg); return 2; }
    if (a->tokens < 1 || a->tokens > s.tokens) {
        put_err(err, errlen, "moe_reflib_backward: tokens outside 1..the spec's tokens");
        return 1;
    }
    moe_ref_inputs_t in = { .x = a->x, .wr = a->wr, .w1 = a->w1, .w2 = a->w2, .b1 = a->b1,
                            .b2 = a->b2, .sel_bias = a->sel_bias, .logit_bias = a->logit_bias,
                            .tokens = a->tokens, .ws1 = a->ws1, .ws2 = a->ws2, .wsg = a->wsg,
                            .given_ids = a->given_ids, .given_w = a->given_w, .router_x = a->router_x,
                            .expert_scale = a->expert_scale, .wr32 = a->wr32 };
    moe_ref_grads_t gr = { .dx = g->dx, .dwr = g->dwr, .dw1 = g->dw1, .db1 = g->db1, .dw2 = g->dw2,
                           .db2 = g->db2, .dlogit_bias = g->dlogit_bias, .dws1 = g->dws1, .dws2 = g->dws2,
                           .dwsg = g->dwsg, .d_router_x = g->d_router_x, .d_expert_scale = g->d_expert_scale };
    moe_ref_bwd_stages_t st = { .topk_idx = topk_idx, .topk_w = topk_w };
    if (moe_ref_backward(&s, &in, dy, exact ? MOE_REF_EXACT : 0, &gr, &st)) {
        put_err(err, errlen, "moe_ref_backward refused the inputs (a NULL tensor the spec needs?)");
        return 1;
    }
    return 0;
}
