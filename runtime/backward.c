/* backward.c — training on one device: the training forward (the forward,
 * run on a caller-owned saved region so the backward finds its routing,
 * rows and activations there), moe_backward (the gradients of every
 * input but the selection), the saved region's queries and the unpack of
 * a packed W1 gradient. docs/DESIGN.md, "Backward", has the data flow;
 * the grouped GEMMs are runtime/bgemm.h's, the other kernels the plan's
 * backward set (gen/family_bwd.c, templates/bwd.lua); a recomputed U is the forward's up GEMM's. */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "bgemm.h"
#include "cudnn.h"
#include "ep_bwd.h"
#include "error.h"
#include "ffn.h"
#include "moe_internal.h"
#include "spec.h"

#include <stdint.h>
#include <string.h>

/* Does the plan run on an expert-parallel rank (rows move between EP ranks)? */
static int ep_rank(const moe_plan *p) { return p->ep && p->ep->dispatch; }

/* What the backward needs of the plan: the training kernels and the
 * identity slot table (slot g holds expert g: the weight gradients are
 * indexed by slot). fn prefixes the message. */
static moe_status training_ok(const moe_plan *p, const char *fn) {
    const moe_spec_t *s = &p->pd.spec;
    if (!s->training || !p->launcher.bwd)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the plan was made without training = true (spec key training), so "
                        "it has no backward kernels; set training = true in the spec", fn);
    if (!p->launcher.slot_identity && !ep_rank(p)) /* an EP rank's are by held slot (ep_bwd.c) */
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the routing table is not the identity (moe_plan_set_slot_table); "
                        "the backward indexes its weight gradients by expert", fn);
    return MOE_OK;
}

static moe_status set_ctx(const moe_plan *p) {
    CUresult r = moe_cu.cuCtxSetCurrent(p->ctx);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuCtxSetCurrent: %s", moe_cu_error_string(r));
    return MOE_OK;
}

/* ---- the saved region and the backward's workspace ----------------------- */

size_t moe_plan_saved_size(const moe_plan *p, int tokens, int recompute_u) {
    if (!p || !p->pd.spec.training || tokens < 0 || tokens > p->pd.spec.tokens)
        return 0;
    moe_ws_region_t sv[(int)MOE_SV_COUNT > (int)MOE_ES_COUNT ? (int)MOE_SV_COUNT : (int)MOE_ES_COUNT];
    if (ep_rank(p))
        return moe_ep_saved_layout(p->ep->ed, &p->pd, tokens, recompute_u != 0, sv);
    return moe_saved_layout(&p->pd, tokens, recompute_u != 0, sv);
}

size_t moe_plan_backward_workspace_size(const moe_plan *p, int tokens, int recompute_u) {
    if (!p || !p->pd.spec.training || tokens < 0 || tokens > p->pd.spec.tokens)
        return 0;
    moe_ws_region_t bw[(int)MOE_BW_COUNT > (int)MOE_EB_COUNT ? (int)MOE_BW_COUNT : (int)MOE_EB_COUNT];
    if (ep_rank(p))
        return moe_ep_bwd_ws_layout(p->ep->ed, &p->pd, tokens, recompute_u != 0, bw);
    return moe_bwd_ws_layout(&p->pd, tokens, recompute_u != 0, bw);
}

size_t moe_plan_train_workspace_size(const moe_plan *p, int tokens) {
    if (!p || !p->pd.spec.training || tokens < 0 || tokens > p->pd.spec.tokens)
        return 0;
    moe_ws_region_t r[(int)MOE_WS_COUNT > (int)MOE_EW_COUNT ? (int)MOE_WS_COUNT : (int)MOE_EW_COUNT];
    if (ep_rank(p))
        return moe_ep_train_ws_layout(p->ep->ed, &p->pd, tokens, r);
    return moe_train_ws_layout(&p->pd, tokens, r);
}

size_t moe_plan_saved_per_token(const moe_plan *p, int recompute_u) {
    if (!p || !p->pd.spec.training)
        return 0;
    if (!ep_rank(p))
        return moe_saved_per_token(&p->pd, recompute_u != 0);
    return moe_ep_saved_per_token(p->ep->ed, &p->pd, recompute_u != 0); /* an EP rank's home side */
}

moe_status moe_plan_saved_region(const moe_plan *p, int backward, int tokens, int recompute_u, const char *name,
                                 size_t *offset, size_t *bytes) {
    if (!p || !name)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_saved_region: NULL argument");
    if (!p->pd.spec.training)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_plan_saved_region: the plan was made without training = true "
                        "(spec key training)");
    if (tokens < 0 || tokens > p->pd.spec.tokens)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_saved_region: tokens = %d is outside 0..%d", tokens,
                        p->pd.spec.tokens);
    moe_ws_region_t r[32];
    _Static_assert(MOE_SV_COUNT <= 32 && MOE_BW_COUNT <= 32 && MOE_ES_COUNT <= 32 && MOE_EB_COUNT <= 32, "r");
    const int ep = ep_rank(p);
    int n = backward ? (ep ? MOE_EB_COUNT : MOE_BW_COUNT) : ep ? MOE_ES_COUNT : MOE_SV_COUNT;
    if (backward && ep)
        moe_ep_bwd_ws_layout(p->ep->ed, &p->pd, tokens, recompute_u != 0, r);
    else if (backward)
        moe_bwd_ws_layout(&p->pd, tokens, recompute_u != 0, r);
    else if (ep)
        moe_ep_saved_layout(p->ep->ed, &p->pd, tokens, recompute_u != 0, r);
    else
        moe_saved_layout(&p->pd, tokens, recompute_u != 0, r);
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].name, name)) {
            if (offset)
                *offset = r[i].offset;
            if (bytes)
                *bytes = r[i].bytes;
            return MOE_OK;
        }
    return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_saved_region: no %s region '%s'",
                    backward ? "backward workspace" : "saved", name);
}

/* ---- the training forward ------------------------------------------------ */

moe_status moe_forward_train(const moe_plan *p, const moe_train_forward_args *ta, void *stream) {
    if (!p || !ta)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_forward_train: NULL argument");
    moe_status rc = training_ok(p, "moe_forward_train");
    if (rc || (rc = moe_forward_check(p, &ta->fwd, "moe_forward_train")))
        return rc;
    if (!ta->saved || (uintptr_t)ta->saved % 256)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_forward_train: saved is required, 256-byte aligned "
                        "(moe_plan_saved_size bytes)");
    if ((rc = set_ctx(p)))
        return rc;
    if (ep_rank(p)) /* also with 0 tokens: the peers wait on it */
        return moe_ep_forward_train(p->ep, &p->launcher, ta, (CUstream)stream);
    const moe_forward_args *a = &ta->fwd;
    int T = a->tokens;
    if (T == 0)
        return MOE_OK;
    const int recompute = ta->recompute_u != 0;
    CUstream st = (CUstream)stream;
    moe_ws_region_t svr[MOE_SV_COUNT];
    moe_saved_layout(&p->pd, T, recompute, svr);
    CUdeviceptr sv[MOE_SV_COUNT], base = (CUdeviceptr)(uintptr_t)ta->saved;
    for (int i = 0; i < MOE_SV_COUNT; i++)
        sv[i] = base + svr[i].offset;
    CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace;
    moe_ws_region_t wr[MOE_WS_COUNT]; /* the training forward's workspace (moe_plan_train_workspace_size) */
    moe_train_ws_layout(&p->pd, T, wr);
    CUdeviceptr cursor = ws + wr[MOE_WS_CURSOR].offset, route_part = ws + wr[MOE_WS_ROUTE_PART].offset;
    CU_CHECK(moe_cu.cuMemsetD32Async(sv[MOE_SV_COUNTS], 0, svr[MOE_SV_COUNTS].bytes / 4, st)); /* and the tickets */
    if ((rc = moe_route_launch(p, a, sv[MOE_SV_TOPK_IDX], sv[MOE_SV_TOPK_W], sv[MOE_SV_COUNTS], route_part,
                               sv[MOE_SV_LOGITS], NULL, st, NULL)))
        return rc;
    moe_launcher_t lv; /* the GEMM variant for T, where its row block is the backward's */
    moe_plan_launcher_for(p, T, 1, &lv);
    const moe_launcher_t *l = &lv;
    {
        CUdeviceptr slot = l->slot_table;
        void *args[] = {&sv[MOE_SV_COUNTS], &slot, &sv[MOE_SV_OFFSETS], &cursor, &sv[MOE_SV_TILES],
                        &sv[MOE_SV_NUM_TILES]};
        if ((rc = moe_launch_kernel(l, MOE_K_PERMUTE_PLAN, T, 0, st, args, NULL)))
            return rc;
    }
    {
        void *args[] = {(void *)&a->x, &sv[MOE_SV_TOPK_IDX], &sv[MOE_SV_TOPK_W], &sv[MOE_SV_OFFSETS], &cursor, &T,
                        &sv[MOE_SV_XS], &sv[MOE_SV_ROW_OF]};
        if ((rc = moe_launch_kernel(l, MOE_K_PERMUTE_SCATTER, T, 0, st, args, NULL)))
            return rc;
    }
    /* the generated GEMMs only (no cuDNN scratch): the cuDNN graphs are built
     * for the plan's whole row capacity, the saved region for this call's;
     * the up GEMM's epilogue stores U too unless it is to be recomputed */
    moe_ffn_args_t f = {.tokens = T, .xs = sv[MOE_SV_XS], .tiles = sv[MOE_SV_TILES],
                        .num_tiles = sv[MOE_SV_NUM_TILES], .offsets = sv[MOE_SV_OFFSETS], .hbuf = sv[MOE_SV_HBUF],
                        .out = sv[MOE_SV_OUT], .w1p = a->w1p, .b1p = a->b1p, .w2 = a->w2, .b2 = a->b2,
                        .ubuf = recompute ? 0 : sv[MOE_SV_U]};
    if ((rc = moe_run_ffn(l, NULL, &f, st, NULL, NULL))) /* no y: the combine below reads the saved O */
        return rc;
    void *args[] = {&sv[MOE_SV_OUT], &sv[MOE_SV_ROW_OF], &sv[MOE_SV_TOPK_W], &T, (void *)&a->y};
    return moe_launch_kernel(l, MOE_K_COMBINE, T, 0, st, args, NULL);
}

/* ---- the backward --------------------------------------------------------- */

static moe_status backward_check(const moe_plan *p, const moe_backward_args *a) {
    const moe_spec_t *s = &p->pd.spec;
    if (a->tokens < 0 || a->tokens > s->tokens)
        return moe_fail(a->tokens < 0 ? MOE_ERR_INVALID_ARG : MOE_ERR_CAPACITY,
                        "moe_backward: tokens = %d is outside 0..%d (spec key tokens)", a->tokens, s->tokens);
    if (a->recompute_u != 0 && a->recompute_u != 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: recompute_u = %d; 0 or 1 (the training forward's)",
                        a->recompute_u);
    if (a->accumulate != 0 && a->accumulate != 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: accumulate = %d; 0 (write) or 1 (add)", a->accumulate);
    if (a->tokens > 0 && (!a->x || !a->dy || !a->dx))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: x, dy and dx are required (tokens = %d)", a->tokens);
    if (!a->saved || !a->workspace || !a->router_w || !a->w1p || !a->w2)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: saved, workspace, router_w, w1p and w2 are required");
    if (!a->d_router_w || !a->dw1p || !a->dw2)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: d_router_w, dw1p and dw2 are required");
    if (s->router.logit_bias && !a->d_logit_bias)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: the spec has router.logit_bias; d_logit_bias is required");
    if (s->ffn_bias && (!a->b1p || !a->b2 || !a->db1p || !a->db2))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: the spec has ffn_bias; b1p, b2, db1p and db2 are "
                        "required");
    if (s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID && (!a->shared_gate || !a->d_shared_gate))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: the spec has shared.gate = \"sigmoid\"; shared_gate and "
                        "d_shared_gate are required");
    if (s->router.input == MOE_ROUTER_INPUT_SEPARATE && a->tokens > 0 && (!a->router_x || !a->d_router_x))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: the spec has router.input = \"separate\"; router_x (the "
                        "training forward's) and d_router_x are required");
    if (s->router.expert_scale && (!a->router_expert_scale || !a->d_expert_scale))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: the spec has router.expert_scale; router_expert_scale (the "
                        "training forward's) and d_expert_scale are required");
    if (s->router.expert_scale && !p->launcher.bwd_fn[MOE_K_BWD_ESCALE - MOE_K_BWD_FIRST])
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_backward: kernel '%s' is missing from the plan's module (compiled by "
                        "an older moegen?); the scales' gradient needs it",
                        p->launcher.bwd[MOE_K_BWD_ESCALE - MOE_K_BWD_FIRST].name);
    if ((uintptr_t)a->saved % 256 || (uintptr_t)a->workspace % 256)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: saved and workspace must be 256-byte aligned");
    return MOE_OK;
}

/* Zero the weight gradients (a backward of no tokens, accumulate = 0). */
static moe_status zero_grads(const moe_plan *p, const moe_backward_args *a, CUstream st) {
    const moe_spec_t *s = &p->pd.spec;
    const size_t S = (size_t)p->launcher.slots, E = (size_t)s->experts, H = (size_t)s->hidden, F = (size_t)s->ffn;
    const size_t wb = (size_t)moe_wgrad_elem_bytes(s); /* dw1p's and dw2's element bytes; 2F·H and H·F are even */
    struct {
        void *ptr;
        size_t bytes;
    } g[] = {{a->d_router_w, 4 * E * H}, {s->router.logit_bias ? a->d_logit_bias : NULL, 4 * E},
             {a->dw1p, wb * S * 2 * F * H}, {a->dw2, wb * S * H * F},
             {s->ffn_bias ? a->db1p : NULL, 4 * S * 2 * F}, {s->ffn_bias ? a->db2 : NULL, 4 * S * H},
             {s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID ? a->d_shared_gate : NULL, 4 * H},
             {s->router.expert_scale ? a->d_expert_scale : NULL, 4 * E}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (g[i].ptr)
            CU_CHECK(moe_cu.cuMemsetD32Async((CUdeviceptr)(uintptr_t)g[i].ptr, 0, g[i].bytes / 4, st));
    return MOE_OK;
}

_Static_assert(MOE_BGEMM_KINDS == 4, "the backward's stages 2 .. 5 are the four grouped GEMMs in kind order");
const char *const moe_bwd_stage_names[MOE_BWD_STAGES] = {"recompute_u", "dys", "dgrad_down", "dgrad_up",
                                                          "wgrad_up", "wgrad_down", "bias_grads", "router"};

/* Record ev[i] (moe_backward_timed's stage marks; none without events). */
static moe_status mark(CUevent *ev, int i, CUstream st) {
    if (ev && moe_cu.cuEventRecord(ev[i], st) != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    return MOE_OK;
}

moe_status moe_backward(const moe_plan *p, const moe_backward_args *a, void *stream) {
    return moe_backward_timed(p, a, stream, NULL);
}

moe_status moe_backward_timed(const moe_plan *p, const moe_backward_args *a, void *stream,
                              CUevent ev[MOE_BWD_STAGES + 1]) {
    if (!p || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: NULL argument");
    moe_status rc = training_ok(p, "moe_backward");
    if (rc || (rc = backward_check(p, a)) || (rc = set_ctx(p)))
        return rc;
    CUstream st = (CUstream)stream;
    if (ep_rank(p)) { /* also with 0 tokens: the peers wait on it */
        if (ev)
            return moe_fail(MOE_ERR_UNSUPPORTED, "per-stage timing is for single-rank plans");
        return moe_ep_backward(p->ep, &p->launcher, a, st);
    }
    const int T = a->tokens, beta = a->accumulate, recompute = a->recompute_u;
    if (T == 0) { /* the events still mark the (empty) stages */
        for (int i = 0; i <= MOE_BWD_STAGES; i++)
            if ((rc = mark(ev, i, st)))
                return rc;
        return beta ? MOE_OK : zero_grads(p, a, st);
    }
    const moe_spec_t *s = &p->pd.spec;
    const moe_launcher_t *l = &p->launcher;
    moe_ws_region_t svr[MOE_SV_COUNT], bwr[MOE_BW_COUNT];
    moe_saved_layout(&p->pd, T, recompute, svr);
    moe_bwd_ws_layout(&p->pd, T, recompute, bwr);
    CUdeviceptr sv[MOE_SV_COUNT], bw[MOE_BW_COUNT];
    for (int i = 0; i < MOE_SV_COUNT; i++)
        sv[i] = (CUdeviceptr)(uintptr_t)a->saved + svr[i].offset;
    for (int i = 0; i < MOE_BW_COUNT; i++)
        bw[i] = (CUdeviceptr)(uintptr_t)a->workspace + bwr[i].offset;
    const long long nt = moe_launcher_tiles(&p->launcher, T); /* the training forward ran its row block */
    CUdeviceptr u = recompute ? bw[MOE_BW_U] : sv[MOE_SV_U];
    if ((rc = mark(ev, 0, st)))
        return rc;
    if (recompute) { /* U again, from the saved rows (activation checkpointing): the training forward's own
                      * up GEMM (its variant for T), so U is the bits it would have saved; its activation
                      * output goes to dU's region, which dgrad_down writes afterwards */
        moe_launcher_t lv;
        moe_plan_launcher_for(p, T, 1, &lv);
        CUdeviceptr scratch = bw[MOE_BW_DU];
        void *args[] = {&sv[MOE_SV_XS], (void *)&a->w1p, (void *)&a->b1p, &sv[MOE_SV_TILES], &sv[MOE_SV_NUM_TILES],
                        &scratch, &u};
        if ((rc = moe_launch_kernel(&lv, MOE_K_GEMM_UP, T, 0, st, args, NULL)))
            return rc;
    }
    const int input = s->router.apply == MOE_APPLY_INPUT; /* the weight scaled the expert's input */
    CUdeviceptr none = 0;
    if ((rc = mark(ev, 1, st)))
        return rc;
    { /* step 1: dys = w · dy per row (apply = "input": dy), dw = <dy, O> (apply = "input": after the GEMMs) */
        void *args[] = {(void *)&a->dy, &sv[MOE_SV_OUT], &sv[MOE_SV_ROW_OF], &sv[MOE_SV_TOPK_W], (void *)&T,
                        &bw[MOE_BW_DYS], input ? &none : &bw[MOE_BW_DW]};
        if ((rc = moe_launch_kernel(l, MOE_K_BWD_DYS, T, 0, st, args, NULL)))
            return rc;
    }
    { /* steps 2, 3, 5, 6: bgemm's grouped GEMMs (runtime/bgemm.h) */
        CUdeviceptr w1p = (CUdeviceptr)(uintptr_t)a->w1p, w2 = (CUdeviceptr)(uintptr_t)a->w2;
        const moe_bgemm_args base = {.tokens = T, .grid_tiles = nt, .tiles = sv[MOE_SV_TILES],
                                     .num_tiles = sv[MOE_SV_NUM_TILES], .offsets = sv[MOE_SV_OFFSETS],
                                     .counts = sv[MOE_SV_COUNTS]};
        moe_bgemm_args g[MOE_BGEMM_KINDS];
        for (int i = 0; i < MOE_BGEMM_KINDS; i++)
            g[i] = base;
        g[MOE_BGEMM_DGRAD_DOWN].a = bw[MOE_BW_DYS], g[MOE_BGEMM_DGRAD_DOWN].b = w2;
        g[MOE_BGEMM_DGRAD_DOWN].u = u, g[MOE_BGEMM_DGRAD_DOWN].out = bw[MOE_BW_DU];
        g[MOE_BGEMM_DGRAD_UP].a = bw[MOE_BW_DU], g[MOE_BGEMM_DGRAD_UP].b = w1p, g[MOE_BGEMM_DGRAD_UP].out = bw[MOE_BW_DXS];
        g[MOE_BGEMM_WGRAD_UP].a = bw[MOE_BW_DU], g[MOE_BGEMM_WGRAD_UP].b = sv[MOE_SV_XS];
        g[MOE_BGEMM_WGRAD_UP].out = (CUdeviceptr)(uintptr_t)a->dw1p, g[MOE_BGEMM_WGRAD_UP].beta = beta;
        g[MOE_BGEMM_WGRAD_DOWN].a = bw[MOE_BW_DYS], g[MOE_BGEMM_WGRAD_DOWN].b = sv[MOE_SV_HBUF];
        g[MOE_BGEMM_WGRAD_DOWN].out = (CUdeviceptr)(uintptr_t)a->dw2, g[MOE_BGEMM_WGRAD_DOWN].beta = beta;
        for (int i = 0; i < MOE_BGEMM_KINDS; i++) /* stages 2 .. 5 in kind order */
            if ((rc = mark(ev, 2 + i, st)) || (rc = moe_bgemm_launch(l, (moe_bgemm_kind)i, &g[i], st)))
                return rc;
    }
    if ((rc = mark(ev, 6, st)))
        return rc;
    if (s->ffn_bias) { /* the bias gradients: each slot's column sums of dU and dys */
        int n1 = 2 * s->ffn, n2 = s->hidden;
        CUdeviceptr db1 = (CUdeviceptr)(uintptr_t)a->db1p, db2 = (CUdeviceptr)(uintptr_t)a->db2;
        void *a1[] = {&bw[MOE_BW_DU], &n1, &sv[MOE_SV_OFFSETS], &sv[MOE_SV_COUNTS], (void *)&beta, &db1};
        void *a2[] = {&bw[MOE_BW_DYS], &n2, &sv[MOE_SV_OFFSETS], &sv[MOE_SV_COUNTS], (void *)&beta, &db2};
        if ((rc = moe_launch_kernel(l, MOE_K_BWD_COLSUM, T, n1, st, a1, NULL)) ||
            (rc = moe_launch_kernel(l, MOE_K_BWD_COLSUM, T, n2, st, a2, NULL)))
            return rc;
    }
    /* with apply = "input", dw from <x, dXs>; step 7: the router: d logits, then dx (rows and router term),
     * d router_w and d logit_bias */
    if ((rc = mark(ev, 7, st)) ||
        (rc = moe_bwd_router_step(l, a, T, input, bw[MOE_BW_DXS], sv[MOE_SV_ROW_OF], sv[MOE_SV_TOPK_W],
                                  sv[MOE_SV_TOPK_IDX], sv[MOE_SV_LOGITS], bw[MOE_BW_DW], bw[MOE_BW_DLOGITS],
                                  bw[MOE_BW_DWR_PART], bwr[MOE_BW_DWR_PART].bytes, st)))
        return rc;
    return mark(ev, MOE_BWD_STAGES, st);
}

/* ---- an EP rank's passes step by step (moe_internal.h) ------------------- */

moe_status moe_ep_train_step(const moe_plan *p, const moe_train_forward_args *ta, CUstream st, int step,
                             moe_ep_call_t *c) {
    if (!p || !ta)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_train_step: NULL argument");
    moe_status rc = training_ok(p, "moe_forward_train");
    if (rc || (step == 0 && (rc = moe_forward_check(p, &ta->fwd, "moe_forward_train"))) || (rc = set_ctx(p)))
        return rc;
    if (!ep_rank(p))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_train_step: the plan has no expert-parallel part");
    if (!ta->saved || (uintptr_t)ta->saved % 256)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_forward_train: saved is required, 256-byte aligned "
                        "(moe_plan_saved_size bytes)");
    const moe_ep_train_t tr = {(CUdeviceptr)(uintptr_t)ta->saved, ta->recompute_u != 0};
    return moe_ep_run_step_train(p->ep, &p->launcher, NULL, &ta->fwd, &tr, st, step, c);
}

moe_status moe_ep_bwd_step(const moe_plan *p, const moe_backward_args *a, CUstream st, int step, moe_ep_call_t *c) {
    if (!p || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_bwd_step: NULL argument");
    moe_status rc = training_ok(p, "moe_backward");
    if (rc || (rc = backward_check(p, a)) || (rc = set_ctx(p)))
        return rc;
    if (!ep_rank(p))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_bwd_step: the plan has no expert-parallel part");
    return moe_ep_bwd_run_step(p->ep, &p->launcher, a, st, step, c);
}

/* ---- the plain layout of a packed gradient -------------------------------- */

moe_status moe_plan_unpack_grad(const moe_plan *p, moe_tensor tensor, const void *src, void *dst, int count,
                                void *stream) {
    if (!p || !src || !dst)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_unpack_grad: NULL argument");
    if (!p->launcher.bwd)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_plan_unpack_grad: the plan was made without training = true (spec "
                        "key training), so it has no backward kernels");
    if (tensor != MOE_TENSOR_W1 && tensor != MOE_TENSOR_B1)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_unpack_grad: tensor %d; MOE_TENSOR_W1 or MOE_TENSOR_B1 (W2 and "
                        "b2 gradients are plain already)", (int)tensor);
    if (count < 1 || count > p->launcher.slots)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_unpack_grad: count = %d is outside 1..%lld (the weight slots)",
                        count, p->launcher.slots);
    const moe_spec_t *s = &p->pd.spec;
    long long cols = tensor == MOE_TENSOR_W1 ? s->hidden : 1, n = (long long)count * 2 * s->ffn * cols;
    const long long eb = tensor == MOE_TENSOR_W1 ? moe_wgrad_elem_bytes(s) : 4; /* dw1p fp32 or the dtype */
    const char *lo = (const char *)src, *hi = (const char *)dst;
    if (lo < hi ? lo + eb * n > hi : hi + eb * n > lo)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_unpack_grad: dst overlaps src");
    moe_status rc = set_ctx(p);
    if (rc)
        return rc;
    int t = (int)tensor;
    long long c = count;
    void *args[] = {&t, (void *)&src, (void *)&dst, &c};
    return moe_launch_kernel(&p->launcher, MOE_K_BWD_UNPACK, 0, n, (CUstream)stream, args, NULL);
}
