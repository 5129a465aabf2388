/* ep_bwd.c — training on an expert-parallel rank: the training forward on
 * the EP saved region and the backward as the forward's transfer lists
 * reversed. See ep_bwd.h; docs/DESIGN.md, "Expert-parallel backward". */
#define _POSIX_C_SOURCE 200809L
#include "ep_bwd.h"

#include "bgemm.h"
#include "error.h"
#include "launch_geom.h"

#include <stdint.h>
#include <stdlib.h>

moe_status moe_ep_bwd_load(moe_ep_t *ep) {
    if (!ep->dispatch || !ep->training)
        return MOE_OK;
    const int S = ep->ed->nheld;
    int *id = malloc(sizeof(int) * (size_t)S);
    if (!id)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    for (int j = 0; j < S; j++)
        id[j] = j;
    CUresult r = moe_cu.cuMemAlloc(&ep->ident_dev, sizeof(int) * (size_t)S);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyHtoD(ep->ident_dev, id, sizeof(int) * (size_t)S);
    free(id);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "the EP backward's slot table: %s", moe_cu_error_string(r));
    return MOE_OK;
}

moe_status moe_bwd_router_step(const moe_launcher_t *l, const moe_backward_args *a, int T, int input, CUdeviceptr dxs,
                               CUdeviceptr row_of, CUdeviceptr topk_w, CUdeviceptr topk_idx, CUdeviceptr logits,
                               CUdeviceptr dw, CUdeviceptr dlogits, CUdeviceptr scratch, size_t scratch_bytes,
                               CUstream st) {
    const int beta = a->accumulate;
    CUdeviceptr none = 0;
    moe_status rc;
    if (input) { /* dw[t, k] = <x[t], dXs[row]>: bwd_dys on (x, dXs), writing dw only */
        void *args[] = {(void *)&a->x, &dxs, &row_of, &topk_w, (void *)&T, &none, &dw};
        if ((rc = moe_launch_kernel(l, MOE_K_BWD_DYS, T, 0, st, args, NULL)))
            return rc;
    }
    /* the router's own input (router.input = "separate"): d router_w from router_x, its term of the input
     * gradient into d_router_x (the dx kernel's second output); per-expert scales (router.expert_scale): the
     * router kernel reads them and leaves dw·w' in dw's routed entries, which escale sums per expert */
    const moe_spec_t *s = &l->pd->spec;
    const int own = s->router.input == MOE_ROUTER_INPUT_SEPARATE, escale = s->router.expert_scale;
    void *ar[] = {&logits, &topk_idx, &topk_w, &dw, (void *)&T, &dlogits, (void *)&a->router_expert_scale};
    void *ax[] = {&dxs, &row_of, &topk_w, &dlogits, (void *)&a->router_w, (void *)&a->shared_gate, (void *)&T,
                  (void *)&a->dx, (void *)&a->d_router_x};
    /* d router_w over token splits (their partial sums in scratch), then the splits summed in order */
    int splits = moe_dwr_splits(T, moe_spec_router_columns(s), moe_spec_dwr_columns(s), scratch_bytes), phase = 0;
    void *aw[] = {&dlogits, own ? (void *)&a->router_x : (void *)&a->x, (void *)&T, (void *)&beta,
                  (void *)&a->d_router_w, (void *)&a->d_logit_bias, (void *)&a->d_shared_gate, &scratch, &splits,
                  &phase};
    void *ae[] = {&dw, &topk_idx, (void *)&T, (void *)&beta, (void *)&a->d_expert_scale};
    if ((rc = moe_launch_kernel(l, MOE_K_BWD_ROUTER, T, 0, st, ar, NULL)) ||
        (escale && (rc = moe_launch_kernel(l, MOE_K_BWD_ESCALE, T, 0, st, ae, NULL))) ||
        (rc = moe_launch_kernel(l, MOE_K_BWD_DX, T, 0, st, ax, NULL)) ||
        (rc = moe_launch_kernel(l, MOE_K_BWD_DWR, T, splits, st, aw, NULL)))
        return rc;
    if (splits > 1) {
        phase = 1;
        if ((rc = moe_launch_kernel(l, MOE_K_BWD_DWR, T, 1, st, aw, NULL)))
            return rc;
    }
    return MOE_OK;
}

moe_status moe_ep_bwd_run_step(const moe_ep_t *ep, const moe_launcher_t *l, const moe_backward_args *a, CUstream st,
                               int step, moe_ep_call_t *c) {
    const moe_plan_desc_t *pd = l->pd;
    const moe_ep_desc_t *ed = ep->ed;
    const moe_spec_t *s = &pd->spec;
    const int P = ed->ep, S = ed->nheld, T = a->tokens, recompute = a->recompute_u, beta = a->accumulate;
    const long long row_bytes = 2LL * s->hidden;
    if (!l->bwd_fn[MOE_K_BWD_SLOT_ROWS - MOE_K_BWD_FIRST])
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_backward: kernel '%s' is missing from the plan's module (compiled "
                        "by an older moegen?); the expert-parallel backward needs it",
                        l->bwd[MOE_K_BWD_SLOT_ROWS - MOE_K_BWD_FIRST].name);
    moe_ws_region_t svr[MOE_ES_COUNT], bwr[MOE_EB_COUNT];
    moe_ep_saved_layout(ed, pd, T, recompute, svr);
    moe_ep_bwd_ws_layout(ed, pd, T, recompute, bwr);
    CUdeviceptr sv[MOE_ES_COUNT], bw[MOE_EB_COUNT];
    for (int i = 0; i < MOE_ES_COUNT; i++)
        sv[i] = (CUdeviceptr)(uintptr_t)a->saved + svr[i].offset;
    for (int i = 0; i < MOE_EB_COUNT; i++)
        bw[i] = (CUdeviceptr)(uintptr_t)a->workspace + bwr[i].offset;
    const int input = s->router.apply == MOE_APPLY_INPUT; /* the weight scaled the expert's input */
    CUdeviceptr none = 0;
    moe_status rc;
    c->nx = 0;
    switch (step) {
    case 0: { /* home: dys and dw per (t, k); the dys rows go out as the forward's rows did */
        if ((rc = moe_ep_read_sizes(ed, sv[MOE_ES_SEND_COUNTS], sv[MOE_ES_RECV_COUNTS], st, c)))
            return rc;
        { /* each held slot's rows (the kept ones in capacity mode), for the wgrads and bias sums */
            int sources = P, slots = S;
            void *args[] = {&sv[MOE_ES_CHUNK_ROWS], &sources, &slots, &bw[MOE_EB_SLOT_ROWS]};
            if ((rc = moe_launch_kernel(l, MOE_K_BWD_SLOT_ROWS, T, S, st, args, NULL)))
                return rc;
        }
        void *args[] = {(void *)&a->dy, &sv[MOE_ES_SEND], &sv[MOE_ES_ROW_OF], &sv[MOE_ES_TOPK_W], (void *)&T,
                        &bw[MOE_EB_HOME], input ? &none : &bw[MOE_EB_DW]};
        if ((rc = moe_launch_kernel(l, MOE_K_BWD_DYS, T, 0, st, args, NULL)))
            return rc;
        moe_ep_block_xfers(c, P, row_bytes, bw[MOE_EB_HOME], c->send_rows, bw[MOE_EB_STAGE], c->recv_rows);
        return MOE_OK;
    }
    case 1: { /* expert side: the dgrads and wgrads on the receive layout; the dXs rows go home */
        int dir = 0;
        void *ra[] = {&dir, &bw[MOE_EB_STAGE], &bw[MOE_EB_DYS], &sv[MOE_ES_SRC_BASE], &sv[MOE_ES_CHUNK_SRC],
                      &sv[MOE_ES_CHUNK_DST], &sv[MOE_ES_CHUNK_ROWS]};
        if ((rc = moe_launch_kernel(l, MOE_K_EP_ROWS, T, c->recv_total, st, ra, NULL)))
            return rc;
        long long nt = moe_max_tiles(c->recv_total, 1, S, pd->align); /* as the forward's FFN ran them */
        if (nt < 1)
            nt = 1;
        CUdeviceptr u = recompute ? bw[MOE_EB_U] : sv[MOE_ES_U];
        if (recompute) { /* U again, from the saved received rows: the training forward's up GEMM, as it ran
                          * (runtime/ep.c), its activation output into dU's region (dgrad_down's, next) */
            CUdeviceptr scratch = bw[MOE_EB_DU];
            void *args[] = {&sv[MOE_ES_XR], (void *)&a->w1p, (void *)&a->b1p, &sv[MOE_ES_TILES],
                            &sv[MOE_ES_NUM_TILES], &scratch, &u};
            if ((rc = moe_launch_kernel(l, MOE_K_GEMM_UP, T, nt, st, args, NULL)))
                return rc;
        }
        /* the weight gradients by held slot j: the receive layout's slots, through the identity table */
        moe_launcher_t lb = *l;
        lb.slot_table = ep->ident_dev;
        CUdeviceptr w1p = (CUdeviceptr)(uintptr_t)a->w1p, w2 = (CUdeviceptr)(uintptr_t)a->w2;
        const moe_bgemm_args base = {.tokens = T, .grid_tiles = nt, .tiles = sv[MOE_ES_TILES],
                                     .num_tiles = sv[MOE_ES_NUM_TILES], .offsets = sv[MOE_ES_SLOT_OFF],
                                     .counts = bw[MOE_EB_SLOT_ROWS]};
        moe_bgemm_args g[MOE_BGEMM_KINDS];
        for (int i = 0; i < MOE_BGEMM_KINDS; i++)
            g[i] = base;
        g[MOE_BGEMM_DGRAD_DOWN].a = bw[MOE_EB_DYS], g[MOE_BGEMM_DGRAD_DOWN].b = w2;
        g[MOE_BGEMM_DGRAD_DOWN].u = u, g[MOE_BGEMM_DGRAD_DOWN].out = bw[MOE_EB_DU];
        g[MOE_BGEMM_DGRAD_UP].a = bw[MOE_EB_DU], g[MOE_BGEMM_DGRAD_UP].b = w1p;
        g[MOE_BGEMM_DGRAD_UP].out = bw[MOE_EB_DXS];
        g[MOE_BGEMM_WGRAD_UP].a = bw[MOE_EB_DU], g[MOE_BGEMM_WGRAD_UP].b = sv[MOE_ES_XR];
        g[MOE_BGEMM_WGRAD_UP].out = (CUdeviceptr)(uintptr_t)a->dw1p, g[MOE_BGEMM_WGRAD_UP].beta = beta;
        g[MOE_BGEMM_WGRAD_DOWN].a = bw[MOE_EB_DYS], g[MOE_BGEMM_WGRAD_DOWN].b = sv[MOE_ES_HBUF];
        g[MOE_BGEMM_WGRAD_DOWN].out = (CUdeviceptr)(uintptr_t)a->dw2, g[MOE_BGEMM_WGRAD_DOWN].beta = beta;
        for (int i = 0; i < MOE_BGEMM_KINDS; i++)
            if ((rc = moe_bgemm_launch(&lb, (moe_bgemm_kind)i, &g[i], st)))
                return rc;
        if (s->ffn_bias) { /* each held slot's column sums of dU and dys */
            int n1 = 2 * s->ffn, n2 = s->hidden;
            CUdeviceptr db1 = (CUdeviceptr)(uintptr_t)a->db1p, db2 = (CUdeviceptr)(uintptr_t)a->db2;
            void *a1[] = {&bw[MOE_EB_DU], &n1, &sv[MOE_ES_SLOT_OFF], &bw[MOE_EB_SLOT_ROWS], (void *)&beta, &db1};
            void *a2[] = {&bw[MOE_EB_DYS], &n2, &sv[MOE_ES_SLOT_OFF], &bw[MOE_EB_SLOT_ROWS], (void *)&beta, &db2};
            if ((rc = moe_launch_kernel(&lb, MOE_K_BWD_COLSUM, T, n1, st, a1, NULL)) ||
                (rc = moe_launch_kernel(&lb, MOE_K_BWD_COLSUM, T, n2, st, a2, NULL)))
                return rc;
        }
        dir = 1;
        ra[2] = &bw[MOE_EB_DXS];
        if ((rc = moe_launch_kernel(l, MOE_K_EP_ROWS, T, c->recv_total, st, ra, NULL)))
            return rc;
        moe_ep_block_xfers(c, P, row_bytes, bw[MOE_EB_STAGE], c->recv_rows, bw[MOE_EB_HOME], c->send_rows);
        return MOE_OK;
    }
    case 2: { /* home: the router, dx, d router_w and d logit_bias, as on one device */
        /* the null row: a (t, k) that capacity mode dropped reads zeros (it added nothing to y) */
        CU_CHECK(moe_cu.cuMemsetD8Async(bw[MOE_EB_HOME] + (size_t)(moe_ep_send_rows(ed, s, T) * row_bytes), 0,
                                        (size_t)row_bytes, st));
        return moe_bwd_router_step(l, a, T, input, bw[MOE_EB_HOME], sv[MOE_ES_ROW_OF], sv[MOE_ES_TOPK_W],
                                   sv[MOE_ES_TOPK_IDX], sv[MOE_ES_LOGITS], bw[MOE_EB_DW], bw[MOE_EB_DLOGITS],
                                   bw[MOE_EB_DWR_PART], bwr[MOE_EB_DWR_PART].bytes, st);
    }
    }
    return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_bwd_run_step: no step %d", step);
}

moe_status moe_ep_forward_train(const moe_ep_t *ep, const moe_launcher_t *l, const moe_train_forward_args *ta,
                                CUstream st) {
    if (ep->unconnected)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_forward_train: this plan has no communicator (a test plan whose "
                        "caller moves the data)");
    const moe_ep_train_t tr = {(CUdeviceptr)(uintptr_t)ta->saved, ta->recompute_u != 0};
    return moe_ep_forward_steps(ep, l, NULL, &ta->fwd, &tr, st);
}

moe_status moe_ep_backward(const moe_ep_t *ep, const moe_launcher_t *l, const moe_backward_args *a, CUstream st) {
    if (ep->unconnected)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_backward: this plan has no communicator (a test plan whose caller "
                        "moves the data)");
    moe_ep_call_t *c = malloc(sizeof *c);
    if (!c)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status rc = MOE_OK;
    for (int step = 0; step < MOE_EP_BWD_STEPS && !rc; step++) {
        rc = moe_ep_bwd_run_step(ep, l, a, st, step, c);
        if (!rc && c->nx)
            rc = moe_ep_send_recv(ep, c, st);
    }
    free(c);
    return rc;
}
