/* moe_forward.c — the forward pass (one device, or the expert-parallel
 * steps), the FSDP gather and the dispatch overflow check. */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "cudnn.h"
#include "ep.h"
#include "error.h"
#include "ffn.h"
#include "launch_geom.h"
#include "spec.h"

#include <stdint.h>
#include <stdlib.h>

moe_status moe_forward(const moe_plan *p, const moe_forward_args *a, void *stream) {
    return moe_forward_timed(p, a, stream, NULL);
}

/* The forward's argument checks, messages prefixed with fn. */
moe_status moe_forward_check(const moe_plan *p, const moe_forward_args *a, const char *fn) {
    if (!p || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    const moe_spec_t *s = &p->pd.spec;
    if (moe_spec_fp8(s) && (!a->w1s || !a->w2s))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has quant.weights = \"fp8_e4m3\"; w1s and w2s (the "
                        "scales of the e4m3 w1p and w2: moe_plan_pack_fp8, moe_plan_pack_quantize) are required", fn);
    if (a->tokens < 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tokens = %d; 0 or more is needed", fn, a->tokens);
    if (a->tokens > s->tokens)
        return moe_fail(MOE_ERR_CAPACITY, "%s: %d tokens exceed the plan's capacity of %d (spec key tokens)", fn,
                        a->tokens, s->tokens);
    if (a->tokens > 0 && (!a->x || !a->y))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: x and y are required (tokens = %d)", fn, a->tokens);
    const int given_w = s->router.score == MOE_SCORE_GIVEN;
    if ((!given_w && !a->router_w) || !a->w1p || !a->w2 || !a->workspace)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: %sw1p, w2 and workspace are required", fn,
                        given_w ? "" : "router_w, ");
    if (s->router.select == MOE_SELECT_GIVEN && a->tokens > 0 && (!a->topk_ids || (given_w && !a->topk_weights)))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has router.select = \"given\"%s; topk_ids (int32 [tokens, "
                        "top_k])%s required", fn, given_w ? " and router.score = \"given\"" : "",
                        given_w ? " and topk_weights (fp32 [tokens, top_k]) are" : " is");
    if (s->router.input == MOE_ROUTER_INPUT_SEPARATE && a->tokens > 0 && !a->router_x)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has router.input = \"separate\"; router_x ([tokens, %s], "
                        "the router's input) is required", fn,
                        moe_spec_router_hidden(s) != s->hidden ? "router.hidden" : "H");
    if (s->router.expert_scale && !a->router_expert_scale)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has router.expert_scale; router_expert_scale (fp32 [E]) "
                        "is required", fn);
    if (s->router.bias && !a->router_bias)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has router.bias; router_bias is required", fn);
    if (s->router.logit_bias && !a->router_logit_bias)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has router.logit_bias; router_logit_bias is required", fn);
    if (s->ffn_bias && (!a->b1p || !a->b2))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has ffn_bias; b1p and b2 are required", fn);
    if (s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID && !a->shared_gate)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec has shared.gate = \"sigmoid\"; shared_gate is required",
                        fn);
    if ((uintptr_t)a->workspace % 256)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: workspace must be 256-byte aligned", fn);
    /* the kernels read and write rows 16 bytes at a time (route and the scatter, or the gathered up GEMM's
     * cp.async, x; combine y): a misaligned pointer would fault on the device */
    const void *rows[3] = {a->x, a->y, s->router.input == MOE_ROUTER_INPUT_SEPARATE ? a->router_x : NULL};
    static const char *const row_names[3] = {"x", "y", "router_x"};
    for (int i = 0; i < 3 && a->tokens > 0; i++)
        if ((uintptr_t)rows[i] % 16)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: %s must be 16-byte aligned (it is at %p)", fn, row_names[i],
                            rows[i]);
    return MOE_OK;
}

moe_status moe_route_launch(const moe_plan *p, const moe_forward_args *a, CUdeviceptr topk_idx, CUdeviceptr topk_w,
                            CUdeviceptr counts, CUdeviceptr route_part, CUdeviceptr logits,
                            const moe_route_fuse_args_t *fuse, CUstream st, CUevent *ev) {
    int T = a->tokens;
    moe_route_fuse_args_t none = {0};
    /* the fused tail's struct, by value, then the spec's own parameters (moe_route_tail_args) */
    void *args[16] = {(void *)&a->x, (void *)&a->router_w, (void *)&a->router_bias, (void *)&a->router_logit_bias,
                      &T, &topk_idx, &topk_w, &counts, &route_part, fuse ? (void *)fuse : (void *)&none};
    moe_route_tail_args(&p->pd.spec, a, &logits, args, 10);
    return moe_launch_kernel(&p->launcher, MOE_K_ROUTE, T, 0, st, args, ev);
}

/* Does a call with launcher l and route fuse mode `fuse` run the gathered
 * up GEMM (docs/DESIGN.md, "The gathered up GEMM")? MOEGEN_GATHER not off,
 * its up GEMM one that gathers (moe_gemm_gathers), the scatter apart
 * (route's fused scatter writes xs), under auto the call's size by
 * moe_gather_tokens, and cuDNN not taking the up stage. */
static int gathers(const moe_plan *p, const moe_launcher_t *l, int fuse, const moe_ffn_args_t *f) {
    const moe_spec_t *s = &p->pd.spec;
    return p->gather && fuse < MOE_ROUTE_FUSED_SCATTER && moe_gemm_gathers(s, &l->kernels[MOE_K_GEMM_UP]) &&
           (p->gather == 1 || moe_gather_tokens(f->tokens, moe_spec_entries(s), moe_spec_slots(s), s->ffn)) &&
           !moe_ffn_cudnn(l, p->cudnn, MOE_STAGE_UP, f);
}

/* Does a call with launcher l chain (gen/family.h, moe_gemm_chains)? Its up GEMM the chain's, cuDNN not
 * taking the up stage (on one device: the expert-parallel forward runs apart). */
static int chains(const moe_plan *p, const moe_launcher_t *l, const moe_ffn_args_t *f) {
    return moe_gemm_chains(&p->pd.spec, &l->kernels[MOE_K_GEMM_UP]) && !moe_ffn_cudnn(l, p->cudnn, MOE_STAGE_UP, f);
}

int moe_forward_chains(const moe_plan *p, const moe_forward_args *a) {
    if (!p || !a || a->tokens <= 0 || p->ep->dispatch) /* an expert-parallel forward never chains */
        return 0;
    moe_launcher_t l;
    moe_plan_launcher_for(p, a->tokens, 0, &l);
    const moe_ffn_args_t f = {.tokens = a->tokens, .w1p = a->w1p, .scratch = moe_cudnn_workspace(p->cudnn) ? 1 : 0};
    return chains(p, &l, &f);
}

int moe_forward_gathers(const moe_plan *p, const moe_forward_args *a) {
    if (!p || !a || a->tokens <= 0) /* an expert-parallel plan's up GEMM never gathers (moe_spec_gather) */
        return 0;
    moe_launcher_t l;
    moe_plan_launcher_for(p, a->tokens, 0, &l);
    /* what gathers() reads of the call's stage arguments: cuDNN's decision looks at w1p and whether the
     * workspace has its scratch (any non-zero address stands for the forward's) */
    const moe_ffn_args_t f = {.tokens = a->tokens, .w1p = a->w1p, .scratch = moe_cudnn_workspace(p->cudnn) ? 1 : 0};
    return gathers(p, &l, moe_plan_route_fuse(p, a->tokens), &f);
}

moe_status moe_forward_timed(const moe_plan *p, const moe_forward_args *a, void *stream, CUevent ev[7]) {
    moe_status rc = moe_forward_check(p, a, "moe_forward");
    if (rc)
        return rc;
    CUstream st = (CUstream)stream;
    CUresult r = moe_cu.cuCtxSetCurrent(p->ctx);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuCtxSetCurrent: %s", moe_cu_error_string(r));
    if (p->ep->dispatch) {
        if (ev)
            return moe_fail(MOE_ERR_UNSUPPORTED, "per-kernel timing is for single-rank plans");
        return moe_ep_forward(p->ep, &p->launcher, p->cudnn, a, st); /* also with 0 tokens: peers wait on it */
    }
    if (a->tokens == 0) { /* an empty batch: nothing to do, y untouched; the events still mark the (empty) stages */
        for (int i = 0; ev && i <= MOE_K_COUNT; i++)
            if (moe_cu.cuEventRecord(ev[i], st) != CUDA_SUCCESS)
                return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
        return MOE_OK;
    }
    CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace;
    CUdeviceptr reg[MOE_WS_COUNT];
    moe_ws_region_t wr[MOE_WS_COUNT]; /* laid out for this call's tokens (moe_plan_workspace_size) */
    const size_t ws_bytes = moe_fwd_ws_layout(&p->pd, a->tokens, moe_cudnn_workspace(p->cudnn) > 0, wr);
    for (int i = 0; i < MOE_WS_COUNT; i++)
        reg[i] = ws + wr[i].offset;
    r = moe_cu.cuMemsetD32Async(reg[MOE_WS_COUNTS], 0, wr[MOE_WS_COUNTS].bytes / 4, st); /* and route's tickets */
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuMemsetD32Async: %s", moe_cu_error_string(r));
    int T = a->tokens;
    moe_launcher_t l; /* the GEMM variant for T (its permute plan and GEMMs); a host value, so capturable */
    moe_plan_launcher_for(p, T, 0, &l);
    /* calls of few tokens: the permute plan (and the scatter) in route's last block, by T alone (capturable) */
    const int fuse = moe_plan_route_fuse(p, T);
    const moe_route_fuse_args_t fa = {.mode = fuse, .align = l.align, .slot_of = l.slot_table,
                                      .offsets = reg[MOE_WS_OFFSETS], .cursor = reg[MOE_WS_CURSOR],
                                      .tiles = reg[MOE_WS_TILES], .num_tiles = reg[MOE_WS_NUM_TILES],
                                      .xs = reg[MOE_WS_XS], .row_of = reg[MOE_WS_ROW_OF], .xsc = reg[MOE_WS_XSC]};
    if ((rc = moe_route_launch(p, a, reg[MOE_WS_TOPK_IDX], reg[MOE_WS_TOPK_W], reg[MOE_WS_COUNTS],
                               reg[MOE_WS_ROUTE_PART], 0, &fa, st, ev)))
        return rc;
    /* a fused stage is not launched; its timing event still marks it (empty) */
    for (int k = MOE_K_PERMUTE_PLAN; ev && k <= MOE_K_PERMUTE_SCATTER; k++)
        if (k - MOE_K_PERMUTE_PLAN < fuse && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
            return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    if (fuse < MOE_ROUTE_FUSED_PLAN) {
        CUdeviceptr slot = l.slot_table;
        void *args[] = {&reg[MOE_WS_COUNTS], &slot, &reg[MOE_WS_OFFSETS], &reg[MOE_WS_CURSOR], &reg[MOE_WS_TILES],
                        &reg[MOE_WS_NUM_TILES]};
        if ((rc = moe_launch_kernel(&l, MOE_K_PERMUTE_PLAN, T, 0, st, args, ev)))
            return rc;
    }
    moe_ffn_args_t f = {.tokens = T, .xs = reg[MOE_WS_XS], .tiles = reg[MOE_WS_TILES],
                        .num_tiles = reg[MOE_WS_NUM_TILES], .offsets = reg[MOE_WS_OFFSETS],
                        .hbuf = reg[MOE_WS_HBUF], .out = reg[MOE_WS_XS], .w1p = a->w1p, .b1p = a->b1p,
                        .w2 = a->w2, .b2 = a->b2,
                        .scratch = moe_cudnn_workspace(p->cudnn) ? ws + ws_bytes : 0,
                        .xsc = reg[MOE_WS_XSC], .hsc = reg[MOE_WS_HSC], .w1s = a->w1s, .w2s = a->w2s,
                        .splitk = reg[MOE_WS_SPLITK],
                        .splitk_tickets = reg[MOE_WS_COUNTS] + 4 * moe_splitk_tickets_at(moe_spec_slots(&p->pd.spec))};
    if (gathers(p, &l, fuse, &f)) /* the up GEMM reads x through src_of; the scatter writes no rows */
        f.x = (CUdeviceptr)(uintptr_t)a->x, f.src_of = reg[MOE_WS_SRC_OF];
    if (fuse < MOE_ROUTE_FUSED_SCATTER) {
        /* with fp8 weights the scatter quantizes: e4m3 rows into xs, their scales into xsc (templates/permute.lua);
         * with moe_spec_gather it takes src_of last (0: copy the rows) */
        void *args[] = {(void *)&a->x, &reg[MOE_WS_TOPK_IDX], &reg[MOE_WS_TOPK_W], &reg[MOE_WS_OFFSETS],
                        &reg[MOE_WS_CURSOR], &T, &reg[MOE_WS_XS], &reg[MOE_WS_ROW_OF], NULL};
        if (moe_spec_fp8(&p->pd.spec))
            args[7] = &reg[MOE_WS_XSC], args[8] = &reg[MOE_WS_ROW_OF];
        else if (moe_spec_gather(&p->pd.spec))
            args[8] = &f.src_of;
        if ((rc = moe_launch_kernel(&l, MOE_K_PERMUTE_SCATTER, T, 0, st, args, ev)))
            return rc;
    }
    int combined = 0;
    {
        /* the chain (chains()): its up GEMM's grid runs the down GEMM and the combine too */
        const long long H = p->pd.spec.hidden;
        const int chain = chains(p, &l, &f);
        /* few tokens: a gemv-grid down GEMM writes y itself (gen/launch_geom.h, moe_combine_fuse_tokens) */
        if ((p->combine_fuse && moe_combine_fuse_tokens(T)) || chain) {
            f.row_of = reg[MOE_WS_ROW_OF], f.topk_w = reg[MOE_WS_TOPK_W], f.y = (CUdeviceptr)(uintptr_t)a->y;
            f.combine_tickets = reg[MOE_WS_COUNTS] + wr[MOE_WS_COUNTS].bytes - 4 * (size_t)moe_combine_tickets(H);
            if (chain)
                f.chain_done = f.combine_tickets + 4 * (size_t)moe_chain_done_at(H);
        }
        if ((rc = moe_run_ffn(&l, p->cudnn, &f, st, ev, &combined)))
            return rc;
    }
    if (combined) { /* its timing event still marks the (empty) stage */
        if (ev && moe_cu.cuEventRecord(ev[MOE_K_COMBINE], st) != CUDA_SUCCESS)
            return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    } else {
        void *args[] = {&reg[MOE_WS_XS], &reg[MOE_WS_ROW_OF], &reg[MOE_WS_TOPK_W], &T, (void *)&a->y};
        if ((rc = moe_launch_kernel(&l, MOE_K_COMBINE, T, 0, st, args, ev)))
            return rc;
    }
    if (ev && moe_cu.cuEventRecord(ev[MOE_K_COUNT], st) != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    return MOE_OK;
}

moe_status moe_gather_weights(const moe_plan *p, const moe_gather_args *g, void *stream) {
    if (!p || !g)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_gather_weights: NULL argument");
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    return moe_ep_gather(p->ep, &p->pd.spec, g, (CUstream)stream);
}

/* Quantize before gather: the rank's bf16 shard quantized by the device
 * pack straight into its place in the held buffers (first = the place's
 * slot); *q: g with the stored e4m3 and scale shards pointing there, so
 * the gather copies them nowhere and moves them with the biases. */
static moe_status quantize_in_place(const moe_plan *p, const moe_pack_args *w1, const moe_pack_args *w2,
                                    const moe_gather_args *g, void *stream, moe_gather_args *q) {
    static const char fn[] = "moe_gather_weights_fp8";
    if (!p || !w1 || !w2 || !g)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: NULL argument", fn);
    const moe_spec_t *s = &p->pd.spec;
    if (!moe_spec_fp8(s))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the spec's expert weights are not fp8 (quant.weights is \"none\"); "
                        "use moe_gather_weights", fn);
    if (g->stored.w1p || g->stored.w2 || g->stored_w1s || g->stored_w2s || g->pack)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: stored.w1p, stored.w2, stored_w1s, stored_w2s and pack must be "
                        "NULL (the bf16 sources are w1 and w2)", fn);
    const moe_mesh_plan_t *mp = p->ep->mp;
    const moe_pack_args *src[2] = {w1, w2};
    for (int i = 0; i < 2; i++)
        if (src[i]->tensor != (i ? MOE_TENSOR_W2 : MOE_TENSOR_W1) || src[i]->first != 0 ||
            src[i]->count != mp->nstored)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: %s is tensor %d, first %d, count %d; MOE_TENSOR_%s, first 0 "
                            "and count %d (the rank's stored experts) are needed", fn, i ? "w2" : "w1",
                            (int)src[i]->tensor, src[i]->first, src[i]->count, i ? "W2" : "W1", mp->nstored);
    if (!g->held_w1p || !g->held_w1s || !g->held_w2 || !g->held_w2s)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: held_w1p, held_w1s, held_w2 and held_w2s are required", fn);
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    const size_t place = (size_t)(moe_ep_fsdp_shards(mp) ? p->ep->me->fsdp_rank : 0) * (size_t)mp->nstored;
    moe_pack_args a = *w1;
    a.first = (int)place;
    moe_status rc = moe_plan_pack_quantize_async(p, &a, g->held_w1p, g->held_w1s, stream);
    a = *w2;
    a.first = (int)place;
    if (!rc)
        rc = moe_plan_pack_quantize_async(p, &a, g->held_w2, g->held_w2s, stream);
    if (rc)
        return rc;
    const size_t H = (size_t)s->hidden, F = (size_t)s->ffn;
    *q = *g;
    q->stored.w1p = (char *)g->held_w1p + place * 2 * F * H;
    q->stored.w2 = (char *)g->held_w2 + place * H * F;
    q->stored_w1s = g->held_w1s + place * moe_spec_fp8_scales(s, 0);
    q->stored_w2s = g->held_w2s + place * moe_spec_fp8_scales(s, 1);
    return MOE_OK;
}

moe_status moe_gather_weights_fp8(const moe_plan *p, const moe_pack_args *w1, const moe_pack_args *w2,
                                  const moe_gather_args *g, void *stream) {
    moe_gather_args q;
    moe_status rc = quantize_in_place(p, w1, w2, g, stream, &q);
    return rc ? rc : moe_ep_gather(p->ep, &p->pd.spec, &q, (CUstream)stream);
}

moe_status moe_plan_overflow(const moe_plan *p, const void *workspace, void *stream, long long *rows) {
    if (rows)
        *rows = 0;
    if (!p || !workspace)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_overflow: NULL argument");
    if (!p->ep->dispatch || !p->ep->ed->capacity)
        return MOE_OK;
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    CU_CHECK(moe_cu.cuStreamSynchronize((CUstream)stream));
    int n = 0;
    CU_CHECK(moe_cu.cuMemcpyDtoH(&n, (CUdeviceptr)(uintptr_t)workspace + p->ep->ed->ws[MOE_EW_OVERFLOW].offset,
                                 sizeof n));
    if (rows)
        *rows = n;
    if (n > 0)
        return moe_fail(MOE_ERR_OVERFLOW, "dispatch capacity exceeded: %d rows did not fit dispatch.capacity = %d rows "
                        "per peer (raise it, or use dispatch.mode = \"exact\"); this forward's output is wrong", n,
                        p->ep->ed->capacity);
    return MOE_OK;
}

moe_status moe_plan_routing_errors(const moe_plan *p, const void *workspace, void *stream, long long *entries) {
    if (entries)
        *entries = 0;
    if (!p || !workspace)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_routing_errors: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    if (s->router.select != MOE_SELECT_GIVEN)
        return MOE_OK;
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    CU_CHECK(moe_cu.cuStreamSynchronize((CUstream)stream));
    int n = 0; /* after the slots' counts and the fused ticket (gen/launch_geom.h, MOE_ROUTE_BAD_IDS) */
    const size_t counts = p->ep->dispatch ? p->ep->ed->ws[MOE_EW_COUNTS].offset : p->pd.ws[MOE_WS_COUNTS].offset;
    const size_t at = counts + 4 * ((size_t)moe_spec_slots(s) + MOE_ROUTE_BAD_IDS);
    CU_CHECK(moe_cu.cuMemcpyDtoH(&n, (CUdeviceptr)(uintptr_t)workspace + at, sizeof n));
    if (entries)
        *entries = n;
    if (n > 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "router.select = \"given\": %d of the last forward's topk_ids were "
                        "outside 0..%d; those entries were dropped (weight 0), so its y leaves them out", n,
                        s->experts - 1);
    return MOE_OK;
}

struct moe_ep *moe_plan_ep(const moe_plan *p) { return p->ep; }

moe_status moe_ep_step(const moe_plan *p, const moe_forward_args *a, CUstream st, int step, moe_ep_call_t *c) {
    return moe_ep_run_step(p->ep, &p->launcher, p->cudnn, a, st, step, c);
}

moe_status moe_ep_run_xfers(const moe_plan *p, const moe_ep_call_t *c, CUstream st) {
    return moe_ep_send_recv(p->ep, c, st);
}

moe_status moe_gather_prepare(const moe_plan *p, const moe_gather_args *g, CUstream st, moe_ep_call_t *c) {
    moe_gather_part_t parts[MOE_GATHER_PARTS];
    int n = 0;
    return moe_ep_gather_local(p->ep, &p->pd.spec, g, st, parts, &n, c);
}

moe_status moe_gather_prepare_fp8(const moe_plan *p, const moe_pack_args *w1, const moe_pack_args *w2,
                                  const moe_gather_args *g, CUstream st, moe_ep_call_t *c) {
    moe_gather_args q;
    moe_status rc = quantize_in_place(p, w1, w2, g, st, &q);
    return rc ? rc : moe_gather_prepare(p, &q, st, c);
}
